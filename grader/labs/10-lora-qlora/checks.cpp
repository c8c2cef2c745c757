// Lab 10's checks: the student's NF4 and LoRA (labs/10-lora-qlora/api.h) against the engine's own.
//   nf4_code                the 16 levels against core/ops/cpu/nf4.h's (bitsandbytes' table)
//   nf4_indices             on drawn weights: every index the nearest level of w / its block's absmax, packed two a byte
//   double_quant            the absmax constants: their mean, 8-bit indices into the dynamic map, an absmax per 256
//   dequantize              the engine's 4-bit weights, dequantized by the student: level × the recovered absmax
//   lora_forward/backward   one layer on drawn shapes against a float64 reference on the engine's dequantized W;
//                           the frozen base unchanged
//   qlora_trains_as_engine  a two-layer model whose Linears are the student's, trained with the engine's AdamW,
//                           against the engine's own QLoRA layers (core/nn/qlora.h, core/nn/lora.h) on the
//                           grading's device: the losses, and each adapter's gradient norm (AdamW's step would
//                           hide a constant factor)
//   qlora_8b_on_24gb        every byte the student's process holds over a 42 M-weight stack of its own 4-bit
//                           Linears (measured from outside it, in a memory cgroup of its own), and Llama 3 8B's
//                           QLoRA at that rate on a 24 GB card; every layer's 4-bit form as good as NF4's, and a
//                           drawn layer's forward and backward, so that holding little means computing it all
// The training and memory checks are in training.cpp beside it; what both files share, in checks.h.
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

// what a level index may be: the nearest, or either neighbour when the value is this close to a midpoint
// (the order of a division or a reciprocal moves a value by an ulp, never more)
constexpr double kTie = 1e-6;


void append(std::vector<char>& out, const void* p, size_t bytes) {
  out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + bytes);
}
void append(std::vector<char>& out, const std::vector<float>& v) { append(out, v.data(), v.size() * 4); }

std::vector<char> to_wire(const Nf4Wire& q) {
  std::vector<char> out;
  const int64_t sizes[3] = {int64_t(q.packed.size()), int64_t(q.absmax_q.size()), int64_t(q.absmax2.size())};
  append(out, sizes, sizeof sizes);
  append(out, &q.offset, 4);
  append(out, q.packed.data(), q.packed.size());
  append(out, q.absmax_q.data(), q.absmax_q.size());
  append(out, q.absmax2);
  return out;
}

Nf4Wire engine_nf4(const std::vector<float>& w) {
  const Nf4Weights e = nf4_quantize_weights(w.data(), int64_t(w.size()));
  return {e.packed, e.absmax_q, e.absmax2, e.offset};
}

std::vector<float> engine_dequantize(const Nf4Wire& q, int64_t n) {
  Nf4Weights e;
  e.numel = n, e.packed = q.packed, e.absmax_q = q.absmax_q, e.absmax2 = q.absmax2, e.offset = q.offset;
  std::vector<float> out(static_cast<size_t>(n));
  nf4_dequantize_weights(e, out.data());
  return out;
}

// sqrt(mean((a - b)²)) over two vectors of one size
double rms_error(const std::vector<float>& a, const std::vector<float>& b) {
  double sq = 0;
  for (size_t i = 0; i < a.size(); i++) sq += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return a.empty() ? 0.0 : std::sqrt(sq / double(a.size()));
}

// One call into the plugin: its outputs, or a CheckAbort saying what went wrong during `during`.
std::vector<char> call(CheckContext& ctx, PluginProcess& p, labproto::Fn fn, std::initializer_list<int64_t> args, const std::vector<char>& in,
                       uint64_t max_bytes, const std::string& during) {
  wire::Frame f;
  f.op = labproto::kCall;
  f.arg[0] = fn;
  int k = 1;
  for (int64_t a : args) f.arg[k++] = a;
  p.send(f, in.data(), in.size(), ctx.deadline, during.c_str());
  wire::Frame r;
  std::vector<char> out;
  p.receive(r, out, ctx.deadline, during.c_str(), max_bytes + (64 << 10));
  if (r.op == labproto::kRaised)
    throw CheckAbort("error", fmt::format("your {} threw: {}", during, sanitize_output(std::string(out.begin(), out.end()), 1500)));
  if (r.op != labproto::kReturn) throw CheckAbort("error", fmt::format("your plugin broke the protocol during {} (opcode {})", during, r.op));
  return out;
}

std::vector<float> as_floats(const std::vector<char>& b, size_t at, size_t n) {
  std::vector<float> v(n);
  if (n) std::memcpy(v.data(), b.data() + at, n * 4);
  return v;
}

// An Nf4 as the plugin returned it; nullopt when its sizes do not add up
std::optional<Nf4Wire> from_wire(const std::vector<char>& b) {
  if (b.size() < 28) return std::nullopt;
  int64_t s[3];
  std::memcpy(s, b.data(), sizeof s);
  Nf4Wire q;
  std::memcpy(&q.offset, b.data() + 24, 4);
  if (s[0] < 0 || s[1] < 0 || s[2] < 0 || uint64_t(28 + s[0] + s[1] + 4 * s[2]) != b.size()) return std::nullopt;
  size_t at = 28;
  q.packed.assign(b.begin() + long(at), b.begin() + long(at + size_t(s[0])));
  at += size_t(s[0]);
  q.absmax_q.assign(b.begin() + long(at), b.begin() + long(at + size_t(s[1])));
  at += size_t(s[1]);
  q.absmax2 = as_floats(b, at, size_t(s[2]));
  return q;
}

std::vector<float> drawn(std::mt19937_64& rng, int64_t n, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// The weights the index checks quantize: awkward sizes (a short last block, an odd count, a block of zeros,
// outliers that own their block) and one drawn per grading
std::vector<std::vector<float>> index_cases(CheckContext& ctx) {
  auto rng = ctx.rng({10, 1});
  std::vector<std::vector<float>> cases;
  for (int64_t n : {int64_t(1), int64_t(63), int64_t(64), int64_t(65), int64_t(1001), int64_t(64 * 256 + 7),
                    int64_t(std::uniform_int_distribution<int64_t>(20000, 60000)(rng))})
    cases.push_back(drawn(rng, n, 0.02f));
  std::vector<float>& big = cases.back();
  for (size_t i = 64; i < 128 && i < big.size(); i++) big[i] = 0.0f;  // a block of zeros
  for (int k = 0; k < 5; k++) big[size_t(std::uniform_int_distribution<int64_t>(0, int64_t(big.size()) - 1)(rng))] *= 60.0f;
  return cases;
}

std::vector<float> true_absmax(const std::vector<float>& w) {
  std::vector<float> a(static_cast<size_t>((int64_t(w.size()) + 63) / 64), 0.0f);
  for (size_t i = 0; i < w.size(); i++) a[i / 64] = std::max(a[i / 64], std::fabs(w[i]));
  return a;
}

// Whether `index` is the nearest value of the ascending `code` to t (either one when t is within kTie of a midpoint)
bool is_nearest(const float* code, int n, double t, int index) {
  if (index < 0 || index >= n) return false;
  const double mine = std::abs(t - double(code[index]));
  for (int k = 0; k < n; k++)
    if (std::abs(t - double(code[k])) < mine - kTie) return false;
  return true;
}

// NF4's offset and two drawn from (0.90, 0.995): the construction, not bitsandbytes' table of 16 numbers
CheckResult nf4_code_check(CheckContext& ctx) {
  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  auto gen = ctx.rng({10, 1});
  std::uniform_real_distribution<float> drawn_offset(0.90f, 0.995f);
  std::string detail;
  for (const float offset : {kNf4Offset, drawn_offset(gen), drawn_offset(gen)}) {
    std::vector<char> in(4);
    std::memcpy(in.data(), &offset, 4);
    const std::vector<char> b = call(ctx, p, labproto::kNf4Code, {}, in, 4096 * 4, fmt::format("normal_map({:.7g})", offset));
    const std::vector<float> got = as_floats(b, 0, b.size() / 4);
    const std::array<float, 16> want = normal_map(offset);
    std::string w, seen;
    for (float x : want) w += fmt::format("{}{:.7f}", w.empty() ? "" : ", ", x);
    for (float x : got) seen += fmt::format("{}{:.7f}", seen.empty() ? "" : ", ", x);
    CheckResult r{false, fmt::format("normal_map({:.7g}): 16 levels, ascending: {}", offset, w), seen, ""};
    if (got.size() != 16) {
      r.seen = fmt::format("{} levels", got.size());
      return r;
    }
    for (int i = 0; i < 16; i++)
      if (!(std::abs(got[size_t(i)] - want[size_t(i)]) <= 1e-6)) {
        if (got[7] != 0.0f) r.hint = "0 must be a level of its own: bitsandbytes adds it, then sorts, then divides by the largest";
        else if (std::abs(got[15] - 1.0f) > 1e-6 || std::abs(got[0] + 1.0f) > 1e-6) r.hint = "divide every level by the largest one: the code spans [-1, 1]";
        else if (offset != kNf4Offset) r.hint = "the levels are the normal quantiles at points spaced from the offset given down to 1/2: a table "
                                                 "of NF4's levels is one offset's";
        return r;
      }
    detail += fmt::format("{}{:.7g}", detail.empty() ? "offsets " : ", ", offset);
  }
  return {true, "", "", detail + ": every level within 1e-6 of bitsandbytes' create_normal_map"};
}

// The student's quantize of each index case (a fresh process: nothing survives from another check)
std::vector<Nf4Wire> student_quantized(CheckContext& ctx, const std::vector<std::vector<float>>& cases) {
  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  std::vector<Nf4Wire> out;
  for (const auto& w : cases) {
    std::vector<char> in;
    append(in, w);
    const int64_t n = int64_t(w.size());
    const auto b = call(ctx, p, labproto::kQuantize, {n, -1}, in, uint64_t(n) * 2 + 4096, fmt::format("quantize of {} weights", n));
    auto q = from_wire(b);
    if (!q) throw CheckAbort("error", fmt::format("the Nf4 your quantize returned for {} weights does not add up", n));
    out.push_back(std::move(*q));
  }
  return out;
}

CheckResult nf4_indices(CheckContext& ctx) {
  const auto cases = index_cases(ctx);
  const auto got = student_quantized(ctx, cases);
  const float* code = nf4_code().data();
  for (size_t c = 0; c < cases.size(); c++) {
    const auto& w = cases[c];
    const int64_t n = int64_t(w.size());
    const std::string setup = fmt::format("{} weights (N(0, 0.02²){})", n, c + 1 == cases.size() ? ", a block of zeros, five outliers" : "");
    if (got[c].packed.size() != size_t((n + 1) / 2))
      return {false, fmt::format("{}: (n + 1) / 2 = {} bytes of indices", setup, (n + 1) / 2), fmt::format("{} bytes", got[c].packed.size()), "",
              "two 4-bit indices a byte"};
    const std::vector<float> absmax = true_absmax(w);
    int64_t wrong = 0, swapped = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
      const uint8_t byte = got[c].packed[size_t(i / 2)];
      const int level = i % 2 == 0 ? byte >> 4 : byte & 0xF, other = i % 2 == 0 ? byte & 0xF : byte >> 4;
      const float m = absmax[size_t(i / 64)];
      const double t = m > 0 ? double(w[size_t(i)]) / double(m) : 0.0;
      if (is_nearest(code, 16, t, level)) continue;
      wrong++;
      swapped += is_nearest(code, 16, t, other);
      if (first < 0) first = i;
    }
    if (wrong) {
      const uint8_t byte = got[c].packed[size_t(first / 2)];
      const int level = first % 2 == 0 ? byte >> 4 : byte & 0xF;
      const float m = absmax[size_t(first / 64)];
      CheckResult r{false, fmt::format("{}: each index the level nearest w / its block's absmax", setup),
                    fmt::format("{} of {} wrong; weight {} = {:.6g} in a block of absmax {:.6g} ({:.5f}) got level {} ({:.5f})", wrong, n, first,
                                w[size_t(first)], m, m > 0 ? w[size_t(first)] / m : 0.0f, level, code[level]),
                    ""};
      if (swapped * 2 > wrong) r.hint = "the first weight of a pair goes in the HIGH nibble (byte >> 4), the second in the low one";
      return r;
    }
  }
  return {true, "every index the nearest level of w / its block's absmax, two a byte", "", ""};
}

CheckResult double_quant(CheckContext& ctx) {
  const auto cases = index_cases(ctx);
  const auto got = student_quantized(ctx, cases);
  const auto& code8v = dynamic8_code();
  for (size_t c = 0; c < cases.size(); c++) {
    const int64_t n = int64_t(cases[c].size()), blocks = (n + 63) / 64, groups = (blocks + 255) / 256;
    const std::string setup = fmt::format("{} weights ({} blocks of 64)", n, blocks);
    const Nf4Wire& q = got[c];
    if (int64_t(q.absmax_q.size()) != blocks || int64_t(q.absmax2.size()) != groups)
      return {false, fmt::format("{}: {} absmax indices and {} second-level absmax", setup, blocks, groups),
              fmt::format("{} and {}", q.absmax_q.size(), q.absmax2.size()), "", "one 8-bit index per block of 64 weights, one f32 per 256 of those"};
    const std::vector<float> absmax = true_absmax(cases[c]);
    double mean = 0;
    for (float a : absmax) mean += a;
    mean /= double(blocks);
    if (!(std::abs(double(q.offset) - mean) <= 1e-6 * std::abs(mean) + 1e-12))
      return {false, fmt::format("{}: offset = the mean of the blocks' absmax = {:.9g}", setup, mean), fmt::format("{:.9g}", q.offset), "",
              "bitsandbytes centres the constants first: offset = their mean, and each absmax − offset is what gets 8 bits"};
    for (int64_t g = 0; g < groups; g++) {
      double top = 0;
      for (int64_t b = g * 256; b < std::min(blocks, (g + 1) * 256); b++) top = std::max(top, std::abs(double(absmax[size_t(b)]) - double(q.offset)));
      if (!(std::abs(double(q.absmax2[size_t(g)]) - top) <= 1e-6 * top + 1e-12))
        return {false, fmt::format("{}: absmax2[{}] = the largest |absmax − offset| of blocks {}..{} = {:.9g}", setup, g, g * 256,
                                   std::min(blocks, (g + 1) * 256) - 1, top),
                fmt::format("{:.9g}", q.absmax2[size_t(g)]), "", "the constants are quantized as the weights were: blockwise absmax, 256 a block"};
      for (int64_t b = g * 256; b < std::min(blocks, (g + 1) * 256); b++) {
        const double v = double(absmax[size_t(b)]) - double(q.offset), t = top > 0 ? v / double(q.absmax2[size_t(g)]) : 0.0;
        if (!is_nearest(code8v.data(), 256, t, q.absmax_q[size_t(b)]))
          return {false, fmt::format("{}: absmax_q[{}], the index of the dynamic code nearest (absmax − offset) / absmax2 = {:.6g}", setup, b, t),
                  fmt::format("index {} ({:.6g})", q.absmax_q[size_t(b)], code8v[q.absmax_q[size_t(b)]]), "",
                  "dynamic8_code() is signed: absmax − offset is negative for the blocks below the mean"};
      }
    }
  }
  return {true, "the constants: their mean as offset, (absmax − offset) as dynamic 8-bit indices, an absmax per 256", "", ""};
}

CheckResult dequantize_check(CheckContext& ctx) {
  const auto cases = index_cases(ctx);
  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  for (const auto& w : cases) {
    const int64_t n = int64_t(w.size());
    const Nf4Wire q = engine_nf4(w);
    const auto b = call(ctx, p, labproto::kDequantize, {n}, to_wire(q), uint64_t(n) * 4, fmt::format("dequantize of {} weights", n));
    if (b.size() != size_t(n) * 4) return {false, fmt::format("{} values", n), fmt::format("{} bytes", b.size()), ""};
    const std::vector<float> got = as_floats(b, 0, size_t(n)), want = engine_dequantize(q, n);
    for (int64_t i = 0; i < n; i++) {
      const double scale = std::abs(double(want[size_t(i)])) + 1e-30;
      if (!(std::abs(double(got[size_t(i)]) - double(want[size_t(i)])) <= 1e-6 * scale + 1e-12))
        return {false, fmt::format("{} weights quantized by the engine: level × (dynamic8[absmax_q] × absmax2 + offset)", n),
                fmt::format("weight {}: {:.9g} where the engine gives {:.9g}", i, got[size_t(i)], want[size_t(i)]), "",
                "the block's absmax first (dynamic8[absmax_q[b]] × absmax2[b / 256] + offset), then each weight = nf4[its level] × that"};
    }
  }
  return {true, "the engine's 4-bit weights back to level × absmax", "", ""};
}



LayerCase layer_case(std::mt19937_64& rng) {
  LayerCase c;
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  c.N = pick(1, 9), c.in = pick(40, 300), c.out = pick(40, 300), c.r = pick(1, 16), c.bias = pick(0, 1) == 1;
  c.scaling = float(pick(1, 64)) / float(c.r);
  c.w = drawn(rng, c.out * c.in, 0.05f), c.x = drawn(rng, c.N * c.in, 1.0f), c.A = drawn(rng, c.r * c.in, 0.1f);
  c.B = drawn(rng, c.out * c.r, 0.1f), c.b = drawn(rng, c.bias ? c.out : 0, 0.1f), c.dy = drawn(rng, c.N * c.out, 1.0f);
  c.dA0 = drawn(rng, c.r * c.in, 0.01f), c.dB0 = drawn(rng, c.out * c.r, 0.01f);
  reference(c, engine_dequantize(engine_nf4(c.w), c.out * c.in));
  return c;
}

// c's y, dx, dA and dB in float64, for the frozen weight W (out, in) as the layer sees it
void reference(LayerCase& c, const std::vector<float>& W) {
  auto at = [](const std::vector<float>& v, int64_t i) { return double(v[size_t(i)]); };
  std::vector<double> h(size_t(c.N * c.r), 0.0), g(size_t(c.N * c.r), 0.0);
  for (int64_t i = 0; i < c.N; i++)
    for (int64_t k = 0; k < c.r; k++)
      for (int64_t j = 0; j < c.in; j++) h[size_t(i * c.r + k)] += at(c.x, i * c.in + j) * at(c.A, k * c.in + j);
  c.y.assign(size_t(c.N * c.out), 0.0);
  for (int64_t i = 0; i < c.N; i++)
    for (int64_t o = 0; o < c.out; o++) {
      double s = c.bias ? at(c.b, o) : 0.0;
      for (int64_t j = 0; j < c.in; j++) s += at(c.x, i * c.in + j) * at(W, o * c.in + j);
      for (int64_t k = 0; k < c.r; k++) s += double(c.scaling) * h[size_t(i * c.r + k)] * at(c.B, o * c.r + k);
      c.y[size_t(i * c.out + o)] = s;
    }
  for (int64_t i = 0; i < c.N; i++)
    for (int64_t k = 0; k < c.r; k++)
      for (int64_t o = 0; o < c.out; o++) g[size_t(i * c.r + k)] += double(c.scaling) * at(c.dy, i * c.out + o) * at(c.B, o * c.r + k);
  c.dB.assign(c.dB0.begin(), c.dB0.end());
  for (int64_t o = 0; o < c.out; o++)
    for (int64_t k = 0; k < c.r; k++)
      for (int64_t i = 0; i < c.N; i++) c.dB[size_t(o * c.r + k)] += double(c.scaling) * at(c.dy, i * c.out + o) * h[size_t(i * c.r + k)];
  c.dA.assign(c.dA0.begin(), c.dA0.end());
  for (int64_t k = 0; k < c.r; k++)
    for (int64_t j = 0; j < c.in; j++)
      for (int64_t i = 0; i < c.N; i++) c.dA[size_t(k * c.in + j)] += g[size_t(i * c.r + k)] * at(c.x, i * c.in + j);
  c.dx.assign(size_t(c.N * c.in), 0.0);
  for (int64_t i = 0; i < c.N; i++)
    for (int64_t j = 0; j < c.in; j++) {
      double s = 0;
      for (int64_t o = 0; o < c.out; o++) s += at(c.dy, i * c.out + o) * at(W, o * c.in + j);
      for (int64_t k = 0; k < c.r; k++) s += g[size_t(i * c.r + k)] * at(c.A, k * c.in + j);
      c.dx[size_t(i * c.in + j)] = s;
    }
}

// "" when got is within 1e-5 of want (relative to want's largest magnitude), else where it is not
std::string compare(const std::vector<float>& got, size_t at, const std::vector<double>& want, const char* name) {
  double top = 0;
  for (double v : want) top = std::max(top, std::abs(v));
  for (size_t i = 0; i < want.size(); i++) {
    const double g = at + i < got.size() ? double(got[at + i]) : std::nan("");
    if (!(std::abs(g - want[i]) <= 1e-5 * top + 1e-9)) return fmt::format("{}[{}] = {:.7g} where {:.7g} is right", name, i, g, want[i]);
  }
  return "";
}

std::string shape_of(const LayerCase& c) {
  return fmt::format("N {}, in {}, out {}, r {}, scaling {:.4g}, {}", c.N, c.in, c.out, c.r, c.scaling, c.bias ? "a bias" : "no bias");
}

std::vector<char> layer_payload(const LayerCase& c, bool forward) {
  std::vector<char> in;
  append(in, &c.scaling, 4);
  append(in, c.x);
  if (!forward) append(in, c.dy);
  append(in, c.A);
  append(in, c.B);
  append(in, c.b);
  if (!forward) append(in, c.dA0), append(in, c.dB0);
  return in;
}

CheckResult layer_check(CheckContext& ctx, bool forward) {
  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  auto rng = ctx.rng({10, forward ? 5 : 6});
  for (int s = 0; s < 6; s++) {
    const LayerCase c = layer_case(rng);
    const Nf4Wire base = engine_nf4(c.w);
    const std::vector<char> sent = to_wire(base);
    call(ctx, p, labproto::kKeepBase, {s}, sent, 0, "keeping a base");
    const std::string setup = shape_of(c);
    if (forward) {
      const auto b = call(ctx, p, labproto::kLoraForward, {s, c.N, c.in, c.out, c.r, c.bias ? 1 : 0, 0}, layer_payload(c, true),
                          uint64_t(c.N * c.out) * 4, fmt::format("lora_forward ({})", setup));
      if (const std::string bad = compare(as_floats(b, 0, b.size() / 4), 0, c.y, "y"); !bad.empty())
        return {false, fmt::format("lora_forward ({}): y = x Wᵀ + bias + scaling · (x Aᵀ) Bᵀ, W dequantized", setup), bad, "",
                "dequantize W first (your dequantize), then the two GEMMs; scaling multiplies the adapter's term only"};
    } else {
      const bool want_dx = s % 3 != 2;
      const auto b = call(ctx, p, labproto::kLoraBackward, {s, c.N, c.in, c.out, c.r, c.bias ? 1 : 0, want_dx ? 1 : 0}, layer_payload(c, false),
                          uint64_t(c.N * c.in + c.r * c.in + c.out * c.r) * 4, fmt::format("lora_backward ({})", setup));
      const std::vector<float> got = as_floats(b, 0, b.size() / 4);
      const size_t dx_n = want_dx ? size_t(c.N * c.in) : 0;
      if (got.size() != dx_n + c.dA.size() + c.dB.size()) return {false, "dx, dA and dB", fmt::format("{} values", got.size()), ""};
      if (const std::string bad = compare(got, dx_n, c.dA, "dA"); !bad.empty())
        return {false, fmt::format("lora_backward ({}): dA += scaling · (dy B)ᵀ x, added to what dA held", setup), bad, "",
                "dA and dB accumulate (+=), as PyTorch's .grad does over micro-batches: don't overwrite them"};
      if (const std::string bad = compare(got, dx_n + c.dA.size(), c.dB, "dB"); !bad.empty())
        return {false, fmt::format("lora_backward ({}): dB += scaling · dyᵀ (x Aᵀ), added to what dB held", setup), bad, ""};
      if (want_dx)
        if (const std::string bad = compare(got, 0, c.dx, "dx"); !bad.empty())
          return {false, fmt::format("lora_backward ({}): dx = dy W + scaling · (dy B) A", setup), bad, "",
                  "the frozen W still carries the gradient to the layers below: dx needs dy W, with W dequantized again"};
    }
    const auto now = from_wire(call(ctx, p, labproto::kBaseBytes, {s}, {}, sent.size(), "reading the base back"));
    if (!now || to_wire(*now) != sent)
      return {false, "the frozen 4-bit base unchanged by a layer call", "its bytes changed", "", "W is frozen: no gradient, no update, not a byte moved"};
  }
  return {true, forward ? "y on six drawn layers within 1e-5 of float64" : "dA, dB and dx on six drawn layers within 1e-5, the base untouched", "", ""};
}

}  // namespace checks10

std::map<std::string, CheckDef> lab10_checks() {
  using namespace checks10;
  return {
      {"nf4_code", {nf4_code_check}},
      {"nf4_indices", {nf4_indices}},
      {"double_quant", {double_quant}},
      {"dequantize", {dequantize_check}},
      {"lora_forward", {[](CheckContext& c) { return layer_check(c, true); }}},
      {"lora_backward", {[](CheckContext& c) { return layer_check(c, false); }}},
      {"qlora_trains_as_engine", {qlora_trains_as_engine}},
      {"qlora_8b_on_24gb", {qlora_8b_on_24gb}},
  };
}

}  // namespace distlab::grader
