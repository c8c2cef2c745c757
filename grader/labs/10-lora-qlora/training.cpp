// Lab 10's training and memory checks (the list of all its checks: checks.cpp beside it).
//   qlora_trains_as_engine  a two-layer model whose Linears are the student's, trained with the engine's AdamW,
//                           against the engine's own QLoRA layers on the grading's device
//   qlora_8b_on_24gb        every byte the student's process holds over a stack of its own 4-bit Linears, and
//                           Llama 3 8B's QLoRA at that rate on a 24 GB card
// Read next: host.cpp beside it (the plugin's side of each call).
#include <fmt/format.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <mutex>
#include <optional>
#include <random>

#include "core/nn/linear.h"
#include "core/nn/loss.h"
#include "core/nn/qlora.h"
#include "core/nn/simple.h"
#include "core/ops/attach.h"
#include "core/ops/cpu/nf4.h"
#include "core/optim/optimizer.h"
#include "core/util/units.h"
#include "grader/bridge/sandbox.h"
#include "grader/check.h"
#include "grader/scratch.h"
#include "grader/labs/10-lora-qlora/checks.h"

namespace fs = std::filesystem;

namespace distlab::grader {

namespace checks10 {  // named: a unity build puts several labs' checks in one unit

// ---- the training run ----

constexpr int64_t kIn = 48, kHidden = 96, kClasses = 10, kRank = 8, kBatch = 16, kSteps = 12;
constexpr float kAlpha = 16, kLr = 1e-2f;

struct Model {
  std::vector<float> w1, b1, w2, b2, A1, B1, A2, B2;
};

Model drawn_model(std::mt19937_64& rng) {
  Model m;
  m.w1 = drawn(rng, kHidden * kIn, 0.1f), m.b1 = drawn(rng, kHidden, 0.05f), m.w2 = drawn(rng, kClasses * kHidden, 0.1f);
  m.b2 = drawn(rng, kClasses, 0.05f), m.A1 = drawn(rng, kRank * kIn, 0.1f), m.A2 = drawn(rng, kRank * kHidden, 0.1f);
  m.B1 = drawn(rng, kHidden * kRank, 0.05f), m.B2 = drawn(rng, kClasses * kRank, 0.05f);  // a trained-looking B
  return m;
}

void put_values(Tensor& t, const std::vector<float>& v) { std::copy(v.begin(), v.end(), t.f32()); }
std::vector<float> get_values(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

// the engine's QLoRA Linears, as a QLoRA run holds them
// The engine's run: each step's loss, and the norm of each adapter's gradient (A1, B1, A2, B2) at that step
struct EngineRun {
  std::vector<double> losses;
  std::vector<std::array<double, 4>> grad_norms;
};

double norm_of(const std::vector<float>& v) {
  double sq = 0;
  for (float x : v) sq += double(x) * x;
  return std::sqrt(sq);
}

// The engine's run is on the grading's device (--device): on cuda its 4-bit base is dequantized by
// core/ops/cuda/nf4.cu and its GEMMs are cuBLAS's, so a GPU grading holds the student's host code to the
// engine's GPU path (within the checks' 1e-5 and 1e-4); on cuda-sim the same code path runs on the CPU.
EngineRun engine_run(const std::string& device, const Model& m, const std::vector<std::vector<float>>& xs,
                     const std::vector<std::vector<int32_t>>& ys) {
  const bool gpu = device == "cuda" || device == "cuda-sim";
  // gradings side by side (--jobs) run their checks in threads of one process: one of them on the device at a time
  static std::mutex one_at_a_time;
  std::unique_lock<std::mutex> hold(one_at_a_time, std::defer_lock);
  if (gpu) hold.lock();
  Runtime host;  // the drawn values' way in and out
  Runtime rt(gpu ? DeviceKind::cuda : DeviceKind::cpu);
  const std::unique_ptr<AttachedDevice> attached = gpu ? attach_device(rt, device, 0) : nullptr;  // outlives rt's tensors
  auto put = [&](Tensor& t, const std::vector<float>& v) {
    Tensor h = host.empty(t.shape(), Category::other, "drawn values");
    put_values(h, v);
    t.copy_from(h);
  };
  auto get = [&](const Tensor& t) {
    Tensor h = host.empty(t.shape(), Category::other, "a gradient read back");
    h.copy_from(t);
    return get_values(h);
  };
  LoraSpec spec;
  spec.r = kRank, spec.alpha = kAlpha;
  Linear l1(rt, "fc1", kIn, kHidden), l2(rt, "fc2", kHidden, kClasses);
  ReLU relu;
  for (auto [l, w, b, A, B] : {std::tuple{&l1, &m.w1, &m.b1, &m.A1, &m.B1}, std::tuple{&l2, &m.w2, &m.b2, &m.A2, &m.B2}}) {
    put(l->weight.data, *w);
    put(l->bias.data, *b);
    l->add_lora(rt, l == &l1 ? "fc1" : "fc2", spec, 1);
    put(l->lora->lora_A.data, *A);
    put(l->lora->lora_B.data, *B);
    quantize_parameter(rt, l->weight, QuantSpec{4});
  }
  l1.set_needs_input_grad(false);
  std::vector<Parameter*> params = {&l1.lora->lora_A, &l1.lora->lora_B, &l2.lora->lora_A, &l2.lora->lora_B};
  AdamW opt(params, AdamWOptions{0.9f, 0.999f, 1e-8f, 0.0f});
  EngineRun run;
  for (size_t s = 0; s < xs.size(); s++) {
    for (Parameter* p : params) p->grad = Tensor();
    Tensor x = rt.empty({kBatch, kIn}, Category::activations, "x");
    put(x, xs[s]);
    CrossEntropyLoss ce;
    run.losses.push_back(ce.forward(rt, l2.forward(rt, relu.forward(rt, l1.forward(rt, x))), ys[s]));
    l1.backward(rt, relu.backward(rt, l2.backward(rt, ce.backward(rt))));
    std::array<double, 4> norms{};
    for (size_t k = 0; k < params.size(); k++) norms[k] = norm_of(get(params[k]->grad));
    run.grad_norms.push_back(norms);
    opt.step(rt, kLr, 1.0f);
  }
  return run;
}

CheckResult qlora_trains_as_engine(CheckContext& ctx) {
  auto rng = ctx.rng({10, 7});
  const Model m = drawn_model(rng);
  std::vector<std::vector<float>> xs;
  std::vector<std::vector<int32_t>> ys;
  for (int s = 0; s < kSteps; s++) {
    xs.push_back(drawn(rng, kBatch * kIn, 1.0f));
    std::vector<int32_t> y;
    for (int i = 0; i < kBatch; i++) y.push_back(int32_t(std::uniform_int_distribution<int>(0, kClasses - 1)(rng)));
    ys.push_back(y);
  }
  const EngineRun engine = engine_run(ctx.shared.device, m, xs, ys);
  const std::vector<double>& want = engine.losses;

  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  Runtime rt;
  const std::vector<char> base1 = to_wire(engine_nf4(m.w1)), base2 = to_wire(engine_nf4(m.w2));
  call(ctx, p, labproto::kKeepBase, {1}, base1, 0, "keeping fc1's base");
  call(ctx, p, labproto::kKeepBase, {2}, base2, 0, "keeping fc2's base");
  Parameter A1 = make_parameter(rt, "fc1.lora_A.weight", {kRank, kIn}), B1 = make_parameter(rt, "fc1.lora_B.weight", {kHidden, kRank});
  Parameter A2 = make_parameter(rt, "fc2.lora_A.weight", {kRank, kHidden}), B2 = make_parameter(rt, "fc2.lora_B.weight", {kClasses, kRank});
  put_values(A1.data, m.A1), put_values(B1.data, m.B1), put_values(A2.data, m.A2), put_values(B2.data, m.B2);
  std::vector<Parameter*> params = {&A1, &B1, &A2, &B2};
  AdamW opt(params, AdamWOptions{0.9f, 0.999f, 1e-8f, 0.0f});
  const float scaling = kAlpha / float(kRank);
  struct Layer {
    int64_t id, in, out;
    Parameter *A, *B;
    const std::vector<float>* bias;
  };
  const Layer L1{1, kIn, kHidden, &A1, &B1, &m.b1}, L2{2, kHidden, kClasses, &A2, &B2, &m.b2};
  auto payload = [&](const Layer& l, const std::vector<float>& x, const std::vector<float>* dy) {
    std::vector<char> in;
    append(in, &scaling, 4);
    append(in, x);
    if (dy) append(in, *dy);
    append(in, get_values(l.A->data));
    append(in, get_values(l.B->data));
    append(in, *l.bias);
    if (dy) append(in, get_values(l.A->grad_for_accumulate())), append(in, get_values(l.B->grad_for_accumulate()));
    return in;
  };
  auto forward = [&](const Layer& l, const std::vector<float>& x) {
    return as_floats(call(ctx, p, labproto::kLoraForward, {l.id, kBatch, l.in, l.out, kRank, 1, 0}, payload(l, x, nullptr),
                          uint64_t(kBatch * l.out) * 4, "lora_forward in training"),
                     0, size_t(kBatch * l.out));
  };
  auto backward = [&](const Layer& l, const std::vector<float>& x, const std::vector<float>& dy, bool want_dx) {
    const auto b = call(ctx, p, labproto::kLoraBackward, {l.id, kBatch, l.in, l.out, kRank, 1, want_dx ? 1 : 0}, payload(l, x, &dy),
                        uint64_t(kBatch * l.in + kRank * (l.in + l.out)) * 4, "lora_backward in training");
    const size_t dx_n = want_dx ? size_t(kBatch * l.in) : 0, na = size_t(kRank * l.in), nb = size_t(l.out * kRank);
    if (b.size() != (dx_n + na + nb) * 4) throw CheckAbort("error", "lora_backward returned the wrong number of values in training");
    put_values(l.A->grad, as_floats(b, dx_n * 4, na));
    put_values(l.B->grad, as_floats(b, (dx_n + na) * 4, nb));
    return as_floats(b, 0, dx_n);
  };
  std::vector<double> got;
  for (int s = 0; s < kSteps; s++) {
    for (Parameter* q : params) q->grad = Tensor();
    std::vector<float> h = forward(L1, xs[size_t(s)]);
    for (float& v : h) v = v > 0 ? v : 0.0f;  // ReLU
    Tensor logits = rt.empty({kBatch, kClasses}, Category::activations, "logits");
    put_values(logits, forward(L2, h));
    CrossEntropyLoss ce;
    got.push_back(ce.forward(rt, logits, ys[size_t(s)]));
    std::vector<float> dh = backward(L2, h, get_values(ce.backward(rt)), true);
    for (size_t i = 0; i < dh.size(); i++) dh[i] = h[i] > 0 ? dh[i] : 0.0f;
    backward(L1, xs[size_t(s)], dh, false);
    // AdamW's step is blind to a gradient's scale (m/√v), so the losses alone would pass a backward off by a
    // constant factor: each adapter's gradient norm is held to the engine's at every step
    for (size_t k = 0; k < params.size(); k++) {
      const double yours = norm_of(get_values(params[k]->grad)), theirs = engine.grad_norms[size_t(s)][k];
      if (!(std::abs(yours - theirs) <= 1e-4 * theirs))
        return {false, fmt::format("a 48 → 96 → 10 model of two QLoRA Linears, {} AdamW steps: each adapter's gradient as the engine's", kSteps),
                fmt::format("step {}: |grad {}| = {:.7g} where the engine's is {:.7g} ({:.4g}x)", s + 1, params[k]->name, yours, theirs,
                            theirs > 0 ? yours / theirs : 0.0),
                "", "dA and dB carry the scaling (alpha / r) of the forward's adapter term; AdamW alone would never show a factor off"};
    }
    opt.step(rt, kLr, 1.0f);
  }
  std::string curve;
  for (size_t s = 0; s < got.size(); s++) curve += fmt::format("{}{:.6f}/{:.6f}", s ? ", " : "", got[s], want[s]);
  for (size_t s = 0; s < got.size(); s++)
    if (!(std::abs(got[s] - want[s]) <= 1e-5 * std::abs(want[s])))
      return {false, fmt::format("a 48 → 96 → 10 model of two QLoRA Linears (r {}, alpha {}), {} AdamW steps: every loss within 1e-5 of the engine's QLoRA",
                                 kRank, kAlpha, kSteps),
              fmt::format("step {}: {:.7f} where the engine's is {:.7f}", s + 1, got[s], want[s]), "yours/the engine's: " + curve};
  for (auto [id, sent] : {std::pair{1, &base1}, std::pair{2, &base2}}) {
    const auto now = from_wire(call(ctx, p, labproto::kBaseBytes, {id}, {}, sent->size(), "reading a base back"));
    if (!now || to_wire(*now) != *sent)
      return {false, "after training, both frozen 4-bit bases as they were", fmt::format("fc{}'s base changed", id), "",
              "only A and B train: the base has no gradient and no optimizer; a step that touches it is full fine-tuning in disguise"};
  }
  return {true, fmt::format("{} steps within 1e-5 of the engine's QLoRA, the bases untouched", kSteps), "",
          fmt::format("yours/the engine's (its run on {}): {}", ctx.shared.device, curve)};
}

// ---- memory ----

constexpr int64_t kLayers = 40, kSide = 1024;         // the stack the plugin quantizes and runs: 41.9 M weights
constexpr int64_t kLlama8bLinear = 6979321856LL;      // Llama 3 8B's Linear weights but the head
constexpr double kSlackBytes = 16.0 * (1 << 20);       // the host's own buffers, the runtime, the heap's bookkeeping
constexpr double kTransients = 6;                      // layers' worth of f32 a layer call may hold at once

// The engine's QLoRA Llama 3 8B on one card (the meta device): what it reserves, and the 4-bit Linears' share
struct Engine8b {
  double reserved = 0, linear_bytes = 0;
};

Engine8b engine_8b(CheckContext& ctx) {
  return ctx.shared.get<Engine8b>("engine:lab10 8b", [&] {
    ScratchDir dir(ctx.paths, "lab10");
    const std::string metrics = (fs::path(dir.path()) / "m.jsonl").string();
    std::vector<std::string> argv = {ctx.paths.self_exe, "train", (fs::path(ctx.paths.source_dir) / "configs/llama3-8b.toml").string(), "--device", "meta"};
    for (const char* s : {"train.steps=1", "train.micro_batch=1", "data.seq_len=2048", "model.attention=flash", "train.activation_checkpointing=full",
                          "lora.r=16", "lora.alpha=32", "lora.target_modules=all-linear", "quantization.bits=4"})
      argv.insert(argv.end(), {"--set", s});
    argv.insert(argv.end(), {"--metrics", metrics});
    SpawnOptions o;
    const RunResult r = run_to_end(argv, o, std::max(10.0, ctx.seconds_left()), 3000);
    Engine8b e;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("kind", "") == "summary") e.reserved = j.value("peak_memory_reserved", -1.0);
    }
    if (r.timed_out || !WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0 || e.reserved <= 0)
      throw CheckAbort("error", fmt::format("the engine's QLoRA run of Llama 3 8B failed:\n{}", r.output));
    e.linear_bytes = double(kLlama8bLinear) * (4.0 + 8.0 / 64 + 32.0 / (64 * 256)) / 8;
    return e;
  });
}

CheckResult qlora_8b_on_24gb(CheckContext& ctx) {
  const Engine8b e = engine_8b(ctx);
  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  auto rng = ctx.rng({10, 8});
  const int64_t n = kSide * kSide, N = 4, r = 8;
  const double psi = double(kLayers * n);
  // the work is checked too: a plugin that keeps nothing because it computes nothing holds very little.
  // Every layer's 4-bit form has its sizes and stands for its weights as NF4 does (an all-zero form is a
  // layer of W = 0, whose forward needs no dequantize); the forward and backward of the last layer and of
  // one drawn layer are held to float64 on the weight their own bytes stand for
  const int64_t probe = std::uniform_int_distribution<int64_t>(1, kLayers - 2)(rng);  // one with a dx
  Nf4Wire last, probed;
  for (int64_t l = 0; l < kLayers; l++) {  // your quantize, kept: the base the layers run on
    const std::vector<float> w = drawn(rng, n, 0.02f);
    std::vector<char> in;
    append(in, w);
    const auto q = from_wire(call(ctx, p, labproto::kQuantize, {n, l}, in, uint64_t(n) * 2 + 4096, fmt::format("quantize of layer {}", l)));
    if (!q || q->packed.size() != size_t(n / 2) || q->absmax_q.size() != size_t(n / 64) || q->absmax2.size() != size_t(n / 64 / 256))
      return {false, fmt::format("layer {}: {} bytes of indices, {} absmax indices, {} second-level absmax", l, n / 2, n / 64, n / 64 / 256),
              q ? fmt::format("{}, {} and {}", q->packed.size(), q->absmax_q.size(), q->absmax2.size()) : "an Nf4 that does not add up", ""};
    const double yours = rms_error(engine_dequantize(*q, n), w), nf4 = rms_error(engine_dequantize(engine_nf4(w), n), w);
    if (!(yours <= nf4 * 1.01 + 1e-9))
      return {false, fmt::format("layer {}: its 4-bit form stands for its weights as NF4 does (the rms error of its dequantization within 1 % of the engine's, {:.3e})", l, nf4),
              fmt::format("an rms error of {:.3e}", yours), "",
              "every layer's quantize is the weights' NF4 with double quantization, as nf4_indices and double_quant check on smaller ones"};
    if (l == kLayers - 1) last = *q;
    if (l == probe) probed = *q;
  }
  LayerCase ref{N, kSide, kSide, r, false, 2.0f};
  const float scaling = ref.scaling;
  const std::vector<float> A = drawn(rng, r * kSide, 0.05f), B = drawn(rng, kSide * r, 0.05f), zA(size_t(r * kSide), 0.0f), zB(size_t(kSide * r), 0.0f);
  std::vector<std::vector<float>> xs = {drawn(rng, N * kSide, 1.0f)};
  LayerCase mid{N, kSide, kSide, r, false, scaling};  // the drawn layer's: y now, dx on the way back
  for (int64_t l = 0; l < kLayers; l++) {  // forward through the stack, then backward
    std::vector<char> in;
    append(in, &scaling, 4);
    append(in, xs.back()), append(in, A), append(in, B);
    auto y = as_floats(call(ctx, p, labproto::kLoraForward, {l, N, kSide, kSide, r, 0, 0}, in, uint64_t(N * kSide) * 4, "lora_forward"), 0,
                       size_t(N * kSide));
    if (l == kLayers - 1 || l == probe) {
      LayerCase& c = l == probe ? mid : ref;
      c.x = xs.back(), c.A = A, c.B = B, c.dy = drawn(rng, N * kSide, 1.0f), c.dA0 = zA, c.dB0 = zB;
      reference(c, engine_dequantize(l == probe ? probed : last, n));
      if (const std::string bad = compare(y, 0, c.y, "y"); !bad.empty())
        return {false, fmt::format("layer {} of the stack: y = x Wᵀ + scaling · (x Aᵀ) Bᵀ, W what your quantize returned", l), bad, ""};
    }
    double norm = 0;
    for (float v : y) norm += double(v) * v;
    const float s = norm > 0 ? float(std::sqrt(double(N * kSide) / norm)) : 1.0f;  // kept at unit scale
    for (float& v : y) v *= s;
    xs.push_back(std::move(y));
  }
  std::vector<float> dy = ref.dy;
  for (int64_t l = kLayers - 1; l >= 0; l--) {
    std::vector<char> in;
    append(in, &scaling, 4);
    append(in, xs[size_t(l)]), append(in, dy), append(in, A), append(in, B), append(in, zA), append(in, zB);
    if (l == probe) {  // the gradient that reached the drawn layer is its dy
      mid.dy = dy;
      reference(mid, engine_dequantize(probed, n));
    }
    const auto b = call(ctx, p, labproto::kLoraBackward, {l, N, kSide, kSide, r, 0, l > 0 ? 1 : 0}, in, uint64_t(N * kSide + 2 * r * kSide) * 4,
                        "lora_backward");
    if (l > 0) dy = as_floats(b, 0, size_t(N * kSide));
    if (l == kLayers - 1 || l == probe)
      if (const std::string bad = compare(dy, 0, l == probe ? mid.dx : ref.dx, "dx"); !bad.empty())
        return {false, fmt::format("layer {} of the stack: dx = dy W + scaling · (dy B) A", l), bad, ""};
  }
  const PluginMemory mem = p.memory();
  if (mem.method.empty()) return {true, "not measured here (no memory cgroup and no /proc)", "", ""};
  const double own = std::max(0.0, double(mem.peak - mem.before_load));
  const double nf4 = psi * (4.0 + 8.0 / 64 + 32.0 / (64 * 256)) / 8;
  const double allowed = nf4 * 1.01 + kTransients * 4.0 * double(n) + kSlackBytes;
  const double per_weight = own / psi;
  // Llama 3 8B at your rate: its Linears at the bytes a weight your process held, the rest of the engine's run as it is
  const double projected = e.reserved - e.linear_bytes + per_weight * double(kLlama8bLinear);
  const double card = 24.0 * (1ll << 30), limit = (card - double(1ll << 30)) / 1.05;
  const std::string detail = fmt::format(
      "your process held {} at its peak beyond its host ({}) for {} 4-bit weights: {:.3f} bytes a weight, transients included "
      "(NF4 with double quantization: {:.3f}); at that rate Llama 3 8B's {:.2f} B Linear weights take {}, and its QLoRA run (r 16, 2,048 "
      "tokens, full checkpointing; the rest as the engine holds it) {} of a 24 GiB card's {} usable",
      format_bytes(own), mem.method == "cgroup" ? "its memory cgroup" : "resident sets", int64_t(psi), per_weight, nf4 / psi, kLlama8bLinear / 1e9,
      format_bytes(per_weight * double(kLlama8bLinear)), format_bytes(projected), format_bytes(limit));
  if (own > allowed || projected > limit)
    return {false,
            fmt::format("{} Linears of {}x{} quantized and run forward and backward: your process holds their 4-bit form (4.127 bits a weight) and one "
                        "layer's dequantized weight at a time, at most {}; Llama 3 8B's QLoRA at that rate fits one 24 GB card",
                        kLayers, kSide, kSide, format_bytes(allowed)),
            fmt::format("{} ({:.2f} bytes a weight): Llama 3 8B would need {}", format_bytes(own), per_weight, format_bytes(projected)), detail,
            "dequantize into a buffer that lives for one GEMM: a copy kept per layer (f32 or bf16), or the original weights kept beside "
            "their 4-bit form, costs 2-4 bytes a weight — what QLoRA exists to save"};
  return {true, "the 4-bit form and one layer's weight at a time; Llama 3 8B's QLoRA fits 24 GB", "", detail};
}

}  // namespace checks10

}  // namespace distlab::grader
