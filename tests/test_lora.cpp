// LoRA (core/nn/lora.h, core/models/peft.h): an adapter's forward and backward against the formula, PEFT's
// LoRA in PyTorch (tests/torch_peer.py lora) against distlab over 20 AdamW steps, merge and unmerge, the
// [lora] section through the trainer (what trains, what it holds, DDP and ZeRO over real ranks, a resume),
// the adapters split with their base under tensor parallelism, and what it refuses.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/ckpt/peft_adapter.h"
#include "core/ckpt/safetensors.h"
#include "core/models/peft.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"
#include "lora_fixtures.h"
#include "shell.h"
#include "train_harness.h"

using namespace distlab;
using namespace distlab::testing;
namespace fs = std::filesystem;

namespace {

// the tiny Llama with `seed`'s weights and adapters on q_proj, v_proj and down_proj
std::unique_ptr<Model> adapted_llama(Runtime& rt, uint64_t seed, LoraSpec& lora) {
  auto m = build_model(rt, tiny_llama());
  m->init(seed);
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  apply_lora(rt, *m, lora, seed);
  return m;
}

std::string file_text_abs(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}


}  // namespace

TEST_CASE("a LoRA adapter computes PEFT's formula: y = xWᵀ + s·(xAᵀ)Bᵀ, gradients of A, B and x, none for the frozen W",
          "[lora]") {
  Runtime rt;
  const int64_t N = 5, in = 6, out = 4, r = 2;
  Linear l(rt, "proj", in, out, true);
  Rng rng(3);
  l.init(rng);
  LoraSpec spec;
  spec.r = r, spec.alpha = 6;  // scaling 3
  l.add_lora(rt, "proj", spec, 1);
  Rng rng2(4);
  l.lora->init(rng2);
  CHECK_FALSE(l.weight.requires_grad);
  CHECK_FALSE(l.bias.requires_grad);
  CHECK(l.parameters().size() == 4);
  CHECK(l.parameters()[2]->name == "proj.lora_A.weight");
  CHECK(l.parameters()[3]->name == "proj.lora_B.weight");
  const float bound = 1.0f / std::sqrt(float(in));  // kaiming_uniform_(a=√5)
  for (float a : values(l.lora->lora_A.data)) CHECK(std::abs(a) <= bound);
  for (float b : values(l.lora->lora_B.data)) CHECK(b == 0.0f);

  Tensor x = rt.empty({N, in}, Category::activations);
  for (int64_t i = 0; i < N * in; i++) x.f32()[i] = std::sin(0.7f * float(i));
  // B = 0: the adapter adds nothing
  Tensor y0 = l.forward(rt, x);
  const std::vector<float> base = values(y0);
  l.backward(rt, rt.zeros({N, out}, Category::activations));
  for (int64_t i = 0; i < out * r; i++) l.lora->lora_B.data.f32()[i] = 0.1f * float(i + 1) - 0.35f;
  l.lora->lora_A.grad = Tensor(), l.lora->lora_B.grad = Tensor();

  Tensor y = l.forward(rt, x);
  const float* A = l.lora->lora_A.data.f32();
  const float* Bw = l.lora->lora_B.data.f32();
  std::vector<double> h(static_cast<size_t>(N * r), 0.0);
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < r; k++)
      for (int64_t i = 0; i < in; i++) h[size_t(n * r + k)] += double(x.f32()[n * in + i]) * A[k * in + i];
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < out; o++) {
      double z = 0;
      for (int64_t k = 0; k < r; k++) z += h[size_t(n * r + k)] * Bw[o * r + k];
      CHECK(y.f32()[n * out + o] == Approx(base[size_t(n * out + o)] + 3.0 * z).margin(1e-5));
    }
  Tensor dy = rt.empty({N, out}, Category::activations);
  for (int64_t i = 0; i < N * out; i++) dy.f32()[i] = std::cos(0.3f * float(i));
  Tensor dx = l.backward(rt, dy);
  CHECK_FALSE(l.weight.grad.defined());  // frozen: no gradient at all
  CHECK_FALSE(l.bias.grad.defined());
  // dB = s · dyᵀ h, dA = s · (dy B)ᵀ x, dx = dy W + s · (dy B) A
  for (int64_t o = 0; o < out; o++)
    for (int64_t k = 0; k < r; k++) {
      double g = 0;
      for (int64_t n = 0; n < N; n++) g += double(dy.f32()[n * out + o]) * h[size_t(n * r + k)];
      CHECK(l.lora->lora_B.grad.f32()[o * r + k] == Approx(3.0 * g).margin(1e-5));
    }
  std::vector<double> dh(static_cast<size_t>(N * r), 0.0);
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < r; k++)
      for (int64_t o = 0; o < out; o++) dh[size_t(n * r + k)] += 3.0 * dy.f32()[n * out + o] * Bw[o * r + k];
  for (int64_t k = 0; k < r; k++)
    for (int64_t i = 0; i < in; i++) {
      double g = 0;
      for (int64_t n = 0; n < N; n++) g += dh[size_t(n * r + k)] * x.f32()[n * in + i];
      CHECK(l.lora->lora_A.grad.f32()[k * in + i] == Approx(g).margin(1e-5));
    }
  const float* W = l.weight.data.f32();
  for (int64_t n = 0; n < N; n++)
    for (int64_t i = 0; i < in; i++) {
      double g = 0;
      for (int64_t o = 0; o < out; o++) g += double(dy.f32()[n * out + o]) * W[o * in + i];
      for (int64_t k = 0; k < r; k++) g += dh[size_t(n * r + k)] * A[k * in + i];
      CHECK(dx.f32()[n * in + i] == Approx(g).margin(1e-5));
    }
}

TEST_CASE("PEFT's LoRA in PyTorch trains as distlab's LoRA: 20 AdamW steps within fp32 rounding, the frozen base bitwise unchanged",
          "[lora][torch]") {
  INFO("Debian's python3-torch is not installed: run scripts/setup.sh --tests (apt-get install python3-torch)");
  REQUIRE(torch_installed());
  const ModelSpec spec = tiny_llama();
  const int64_t B = 2, T = 16, V = spec.vocab_size, steps = 20;
  const float lr = 3e-3f;
  for (const bool rs : {false, true}) {
    Runtime rt;
    auto m = build_model(rt, spec);
    m->init(5);
    LoraSpec lora;
    lora.r = 4, lora.alpha = 8, lora.use_rslora = rs;
    lora.target_modules = {"q_proj", "v_proj", "down_proj"};
    const auto adapted = apply_lora(rt, *m, lora, 5);
    REQUIRE(adapted.size() == 6);
    CHECK(adapted[0] == "model.layers.0.self_attn.q_proj");
    const fs::path dir = fs::temp_directory_path() / ("distlab-lora-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string init = (dir / "init.safetensors").string(), theirs = (dir / "theirs.safetensors").string(),
                      losses_txt = (dir / "losses.txt").string();
    save_model(*m, init, DType::f32);
    std::vector<std::vector<float>> before;
    for (Parameter* p : m->parameters()) before.push_back(values(p->data));

    AdamW opt(trainable(m->parameters()), AdamWOptions{0.9f, 0.999f, 1e-8f, 0.01f});
    CHECK(opt.size() == 12);  // A and B of six modules: nothing else is stepped
    std::vector<double> ours;
    for (int s = 0; s < steps; s++) {
      m->zero_grad();
      Batch b = lora_batch(s, B, T, V);
      Tensor logits = m->forward(rt, b);
      CrossEntropyLoss ce;
      ours.push_back(ce.forward(rt, logits, b.targets));
      m->backward(rt, ce.backward(rt), nullptr);
      opt.step(rt, lr, 1.0f);
    }
    const int rc = std::system(fmt::format("/usr/bin/python3 {}/tests/torch_peer.py lora {} {} {} 2 4 2 32 48 64 {} {} 10000 1e-5 4 8 {} {} {}{}",
                                           DISTLAB_SOURCE_DIR, init, theirs, losses_txt, B, T, "q_proj,v_proj,down_proj", steps, lr,
                                           rs ? " rslora" : "")
                                   .c_str());
    REQUIRE(rc == 0);
    std::ifstream in(losses_txt);
    std::vector<double> twin;
    for (double v; in >> v;) twin.push_back(v);
    REQUIRE(twin.size() == size_t(steps));
    INFO("rsLoRA " << rs);
    CHECK(max_rel_diff(ours, twin) < 2e-5);
    StFile t = read_safetensors(theirs);
    size_t i = 0;
    for (Parameter* p : m->parameters()) {
      INFO(p->name);
      REQUIRE(t.tensors.count(p->name));
      const float* w = reinterpret_cast<const float*>(t.tensors.at(p->name).bytes.data());
      const std::vector<float> now = values(p->data);
      if (!p->requires_grad) {
        CHECK(now == before[i]);  // frozen: bitwise as it started, here and in PyTorch
        CHECK(std::equal(now.begin(), now.end(), w));
      } else {
        double diff = 0, scale = 0;
        for (size_t k = 0; k < now.size(); k++) diff = std::max(diff, double(std::abs(now[k] - w[k]))), scale = std::max(scale, double(std::abs(w[k])));
        CHECK(scale > 0);
        CHECK(diff <= 2e-5 * scale + 1e-7);
      }
      i++;
    }
    fs::remove_all(dir);
  }
}

TEST_CASE("merge folds s·BA into the base weight and unmerge takes it out: the same logits, one Linear again", "[lora]") {
  const ModelSpec spec = tiny_llama();
  Runtime rt;
  auto m = build_model(rt, spec);
  m->init(2);
  LoraSpec lora;
  lora.r = 4, lora.alpha = 16;
  lora.target_modules = {"all-linear"};
  const auto adapted = apply_lora(rt, *m, lora, 2);
  CHECK(adapted.size() == 14);  // seven projections a block; the lm_head is left out, as PEFT's all-linear does
  Rng rng(7);
  for (auto& [name, l] : named_linears(*m))
    if (l->lora) init_normal(l->lora->lora_B.data, rng, 0.05f);  // a trained-looking B
  const Batch b = lora_batch(0, 1, 16, spec.vocab_size);
  const std::vector<float> with_adapters = values(m->forward(rt, b));
  const std::vector<float> w0 = values(named_linears(*m)[0].second->weight.data);
  merge_lora(*m);
  const std::vector<float> merged = values(m->forward(rt, b));
  double diff = 0;
  for (size_t i = 0; i < merged.size(); i++) diff = std::max(diff, double(std::abs(merged[i] - with_adapters[i])));
  CHECK(diff < 1e-5);
  CHECK(values(named_linears(*m)[0].second->weight.data) != w0);
  unmerge_lora(*m);
  const std::vector<float> w1 = values(named_linears(*m)[0].second->weight.data);
  for (size_t i = 0; i < w0.size(); i++) CHECK(w1[i] == Approx(w0[i]).margin(1e-6));
}

TEST_CASE("[lora] through the trainer: what trains and what it holds, DDP and ZeRO-1/2 over real ranks as one rank, a resume, the refusals",
          "[lora][train][dist]") {
  const std::string cfg = "configs/llama-tiny.toml";
  const std::string lora = "--set lora.r=8 --set lora.alpha=16 --set lora.target_modules=q_proj,v_proj,o_proj --set train.steps=8 "
                           "--set train.eval_batches=2 --set optim.warmup_steps=2 ";
  TrainRun one = train_ranks(1, cfg, lora);
  INFO(one.out);
  REQUIRE(one.code == 0);
  REQUIRE(one.losses.size() == 8);
  CHECK(one.out.find("trainable params: 5632 || all params: 130880 ") != std::string::npos);
  const nlohmann::json& s = one.summary;
  CHECK(s["lora"]["trainable_params"] == 5632);  // per block: q, o 8·(64 + 64), v 8·(64 + 32)
  CHECK(s["lora"]["modules"].size() == 6);
  // what it holds: gradients of the adapters only, AdamW's two moments of them, the whole base in params
  CHECK(s["peak_memory"]["grads"] == 5632 * 4);
  CHECK(s["peak_memory"]["optim_state"] == 2 * 5632 * 4);
  CHECK(s["peak_memory"]["params"] == int64_t(s["lora"]["all_params"]) * 4);
  for (const char* strategy : {"ddp", "zero1", "zero2"}) {
    TrainRun r = train_ranks(2, cfg, lora + "--set train.micro_batch=8 --set parallel.strategy=" + strategy);
    INFO(strategy << "\n" << r.out);
    REQUIRE(r.code == 0);
    CHECK(max_rel_diff(r.losses, one.losses) < 1e-6);
  }
  // the GPU path on the CPU (the kernel table: the frozen dW skipped, the adapter's scale): the cpu's bits
  TrainRun sim = train_ranks(1, cfg, lora + "--device cuda-sim");
  INFO(sim.out);
  REQUIRE(sim.code == 0);
  CHECK(sim.losses == one.losses);
  // torchtitan's op-level checkpointing: the adapters' x·Aᵀ rebuilt with the kept outputs, the same losses
  TrainRun op = train_ranks(1, cfg, lora + "--set train.activation_checkpointing=selective_op");
  REQUIRE(op.code == 0);
  CHECK(op.losses == one.losses);
  // bf16: the frozen base in 16 bits (2 bytes a parameter), the adapters with f32 masters and moments
  TrainRun bf16 = train_ranks(1, cfg, lora + "--set precision.mode=bf16");
  REQUIRE(bf16.code == 0);
  CHECK(bf16.summary["peak_memory"]["params"] == int64_t(s["lora"]["all_params"]) * 2);
  CHECK(bf16.summary["peak_memory"]["grads"] == 5632 * 2);
  CHECK(bf16.summary["peak_memory"]["optim_state"] == 3 * 5632 * 4);
  CHECK(max_rel_diff(bf16.losses, one.losses) < 1e-2);
  // full activation checkpointing with LoRA's dropout: the replay draws the same masks (bitwise)
  const std::string drop = lora + "--set lora.dropout=0.1 ";
  TrainRun plain = train_ranks(1, cfg, drop);
  TrainRun full = train_ranks(1, cfg, drop + "--set train.activation_checkpointing=full");
  REQUIRE(full.code == 0);
  CHECK(full.losses == plain.losses);
  CHECK(plain.losses != one.losses);  // the dropout did something
  // a resume: the frozen base comes back from the checkpoint, the losses bitwise the uninterrupted run's
  check_resume_bitwise(cfg, drop, 4, "lora");
}

TEST_CASE("[lora] under ZeRO-3 and FSDP: the frozen base sharded beside the adapters (use_orig_params), as one rank, a resume bitwise",
          "[lora][train][dist]") {
  const std::string cfg = "configs/llama-tiny.toml";
  const std::string common = "--set train.steps=6 --set train.eval_batches=2 --set optim.warmup_steps=2 --set train.micro_batch=8 ";
  const std::string lora = common + "--set lora.r=8 --set lora.alpha=16 --set lora.target_modules=q_proj,v_proj,o_proj ";
  TrainRun one = train_ranks(1, cfg, lora + "--set train.micro_batch=16");
  REQUIRE(one.code == 0);
  for (const char* strategy : {"zero3", "fsdp"}) {
    TrainRun r = train_ranks(2, cfg, lora + "--set parallel.strategy=" + strategy);
    TrainRun full = train_ranks(2, cfg, common + "--set parallel.strategy=" + strategy);  // full fine-tuning, every weight sharded
    INFO(strategy << "\n" << r.out);
    REQUIRE(r.code == 0);
    REQUIRE(full.code == 0);
    CHECK(max_rel_diff(r.losses, one.losses) < 1e-6);
    // the base is sharded as full fine-tuning's weights are: the same parameter bytes at the peak (a part
    // between uses, a unit or two gathered), plus the adapters; a base kept whole would hold more than one rank's model
    const double params = r.summary["peak_memory"]["params"].get<double>();
    CHECK(params <= full.summary["peak_memory"]["params"].get<double>() + 2 * 4 * 5632);
    CHECK(params < one.summary["peak_memory"]["params"].get<double>());
    CHECK(r.summary["peak_memory"]["grads"].get<double>() < 5632 * 4);  // the adapters' parts only
  }
  // the frozen base through a checkpoint: gathered a unit at a time for the write, each rank's part back on the read
  check_resume_bitwise(cfg, lora + "--set parallel.strategy=fsdp ", 3, "lora-fsdp", 2);
}

TEST_CASE("[lora] under tensor parallelism: A and B split with their base (PEFT's LoraParallelLinear), as one rank, dp x tp under ZeRO and FSDP, a resume bitwise",
          "[lora][train][dist][tp]") {
  const std::string cfg = "configs/llama-tiny.toml";
  const std::string common = "--set train.steps=6 --set train.eval_batches=2 --set optim.warmup_steps=2 ";
  // every Linear but the head: q, k, v, gate and up split by rows (column-parallel), o_proj and down_proj by columns
  const std::string lora = common + "--set lora.r=8 --set lora.alpha=16 --set lora.target_modules=all-linear ";
  TrainRun one = train_ranks(1, cfg, lora);
  TrainRun tp2 = train_ranks(2, cfg, lora + "--set parallel.tp=2");
  INFO(tp2.out);
  REQUIRE(one.code == 0);
  REQUIRE(tp2.code == 0);
  CHECK(max_rel_diff(tp2.losses, one.losses) < 1e-6);
  // what a rank trains: per block q, k, v, gate, up keep A whole and half of B's rows, o_proj and down_proj
  // half of A's columns and B whole — 6464 of the 9344 numbers, not 9344 / 2; the gradients of those alone
  CHECK(one.summary["lora"]["trainable_params"] == 2 * 9344);
  CHECK(tp2.summary["lora"]["trainable_params"] == 2 * 6464);
  CHECK(tp2.summary["peak_memory"]["grads"] == 2 * 6464 * 4);
  // fp16 with its loss scale: the adapters' (N, r) sums through f32, rounded once; fp32's losses within fp16's rounding
  TrainRun half = train_ranks(2, cfg, lora + "--set parallel.tp=2 --set precision.mode=fp16");
  REQUIRE(half.code == 0);
  CHECK(max_rel_diff(half.losses, one.losses) < 1e-4);
  CHECK(half.summary["peak_memory"]["grads"] == 2 * 6464 * 2);
  // data parallel beside it: gradients whole after the backward, so ZeRO and FSDP reduce them as any other's
  for (const char* strategy : {"zero2", "fsdp"}) {
    TrainRun r = train_ranks(4, cfg, lora + "--set parallel.tp=2 --set train.micro_batch=8 --set parallel.strategy=" + strategy);
    INFO(strategy << "\n" << r.out);
    REQUIRE(r.code == 0);
    CHECK(max_rel_diff(r.losses, one.losses) < 1e-6);
  }
  // GPT-2: c_attn's fused q, k, v (B's rows split in three blocks, as the weight's), the two c_proj, c_fc
  const std::string gpt = common + "--set lora.r=4 --set lora.alpha=8 --set lora.target_modules=c_attn,c_proj,c_fc ";
  TrainRun g1 = train_ranks(1, "configs/gpt-tiny.toml", gpt), g2 = train_ranks(2, "configs/gpt-tiny.toml", gpt + "--set parallel.tp=2");
  INFO(g2.out);
  REQUIRE(g1.code == 0);
  REQUIRE(g2.code == 0);
  CHECK(max_rel_diff(g2.losses, g1.losses) < 1e-6);
  // the frozen embedding and c_proj biases get no gradient on a split model either: the norm is the adapters' alone
  CHECK(g2.steps.front()["grad_norm"].get<double>() == Approx(g1.steps.front()["grad_norm"].get<double>()).epsilon(1e-5));
  // Llama's lm_head is split over the vocabulary: an adapter there splits B's rows with it
  const std::string head = common + "--set lora.r=4 --set lora.alpha=8 --set lora.target_modules=q_proj,lm_head ";
  TrainRun h1 = train_ranks(1, cfg, head), h2 = train_ranks(2, cfg, head + "--set parallel.tp=2");
  INFO(h2.out);
  REQUIRE(h2.code == 0);
  CHECK(max_rel_diff(h2.losses, h1.losses) < 1e-6);
  CHECK(h2.steps.front()["grad_norm"].get<double>() == Approx(h1.steps.front()["grad_norm"].get<double>()).epsilon(1e-5));
  // dropout on a whole input (the column-split layers') draws one rank's masks: one rank's losses. On a
  // row-split input each rank draws its own (Megatron's tensor-parallel RNG): the same run twice, bitwise,
  // and full recompute replays the masks
  const std::string col_drop = common + "--set lora.r=8 --set lora.alpha=16 --set lora.dropout=0.1 --set lora.target_modules=q_proj,v_proj,gate_proj ";
  CHECK(max_rel_diff(train_ranks(2, cfg, col_drop + "--set parallel.tp=2").losses, train_ranks(1, cfg, col_drop).losses) < 1e-6);
  const std::string row_drop = lora + "--set lora.dropout=0.1 --set parallel.tp=2 ";
  TrainRun d = train_ranks(2, cfg, row_drop), again = train_ranks(2, cfg, row_drop), full = train_ranks(2, cfg, row_drop + "--set train.activation_checkpointing=full");
  REQUIRE(d.code == 0);
  CHECK(again.losses == d.losses);
  CHECK(full.losses == d.losses);
  CHECK(d.losses != tp2.losses);
  check_resume_bitwise(cfg, row_drop, 3, "lora-tp", 2);

  // PEFT's folder and --save from the split run are one rank's (SGD: no Adam step to magnify the rounding
  // of a near-zero moment); the frozen base bitwise one rank's
  const std::string dir = scratch_path("lora-tp", "d") + "/";
  fs::create_directories(dir);
  const std::string sgd = lora + "--set optim.name=sgd --set optim.lr=0.5 ";
  TrainRun s1 = train_ranks(1, cfg, sgd + "--save-adapter " + dir + "a1 --save " + dir + "w1.safetensors");
  TrainRun s2 = train_ranks(2, cfg, sgd + "--set parallel.tp=2 --save-adapter " + dir + "a2 --save " + dir + "w2.safetensors");
  INFO(s2.out);
  REQUIRE(s1.code == 0);
  REQUIRE(s2.code == 0);
  CHECK(max_weight_diff(dir + "a1/adapter_model.safetensors", dir + "a2/adapter_model.safetensors") < 1e-6);
  StFile w1 = read_safetensors(dir + "w1.safetensors"), w2 = read_safetensors(dir + "w2.safetensors");
  REQUIRE(w1.tensors.size() == w2.tensors.size());
  int base = 0;
  for (const auto& [name, t] : w1.tensors)
    if (name.find(".lora_") == std::string::npos) {
      INFO(name);
      REQUIRE(w2.tensors.count(name));
      CHECK(w2.tensors.at(name).bytes == t.bytes);
      base++;
    }
  CHECK(base == 2 * 9 + 3);  // per block 7 Linears and 2 norms; the embedding, the final norm, the head
  // --init-adapter into a split run: each rank takes its slices of the folder, and trains as one rank does from it
  TrainRun i1 = train_ranks(1, cfg, lora + "--init-adapter " + dir + "a1"), i2 = train_ranks(2, cfg, lora + "--set parallel.tp=2 --init-adapter " + dir + "a1");
  INFO(i2.out);
  REQUIRE(i2.code == 0);
  CHECK(max_rel_diff(i2.losses, i1.losses) < 1e-6);
  CHECK(i1.losses.front() != one.losses.front());  // B is no longer zero
  fs::remove_all(dir);
}

TEST_CASE("[lora] refuses what it cannot do, naming the key", "[lora][config]") {
  const std::string toml = file_text("configs/llama-tiny.toml");
  auto fails = [&](const std::vector<std::string>& sets, const std::string& needle) { expect_train_error(toml, sets, needle); };
  fails({"lora.r=8", "lora.target_modules=q_proj,qq_proj"}, "lora.target_modules: qq_proj not found");
  fails({"lora.r=8", "quantization.bits=4", "parallel.strategy=fsdp", "dist.fake_world_size=2"}, "parallel.strategy = fsdp");
  fails({"lora.r=8", "parallel.pp=2", "dist.fake_world_size=2"}, "parallel.pp = 2");
  fails({"lora.r=8", "quantization.bits=4", "parallel.tp=2", "dist.fake_world_size=2"}, "QLoRA (quantization.bits = 4) with parallel.tp = 2");
  fails({"lora.r=-1"}, "lora.r must not be negative");
  fails({"lora.r=8", "lora.dropout=0.1", "train.activation_checkpointing=selective_op"}, "selective_op");
}

TEST_CASE("Llama 3 8B with LoRA r 16 on every Linear but the head: PEFT's count, and one 24 GB card instead of 121 GiB", "[lora][meta]") {
  const std::string toml = file_text("configs/llama3-8b.toml");
  const std::vector<std::string> sets = {"train.micro_batch=1", "data.seq_len=2048", "model.attention=flash", "train.activation_checkpointing=full"};
  std::vector<std::string> lora = sets;
  for (const char* s : {"lora.r=16", "lora.alpha=32", "lora.target_modules=all-linear"}) lora.push_back(s);
  TrainRun r = train_in_process(toml, lora, DeviceKind::meta);
  // print_trainable_parameters() of PEFT on meta-llama/Meta-Llama-3-8B, r = 16, target_modules = "all-linear"
  CHECK(r.summary["lora"]["trainable_params"] == 41943040);
  CHECK(r.summary["lora"]["all_params"] == 8072204288LL);
  CHECK(r.summary["lora"]["modules"].size() == 224);
  CHECK(r.summary["peak_memory"]["params"] == 2 * 8072204288LL);  // bf16 base, bf16 adapters
  CHECK(r.summary["peak_memory"]["optim_state"] == 3 * 4 * 41943040LL);  // f32 master + two moments
  const double gib = 1024.0 * 1024 * 1024;
  CHECK(r.summary["peak_memory_reserved"].get<double>() < 21.8 * gib);  // a 24 GiB card less 1 GiB and 5 %
  TrainRun full = train_in_process(toml, sets, DeviceKind::meta);
  CHECK(full.summary["peak_memory_reserved"].get<double>() > 100 * gib);
}

TEST_CASE("PEFT's adapter folder: distlab writes what PeftModel.from_pretrained reads (the twin's logits are ours), and reads what it writes",
          "[lora][torch][safetensors]") {
  REQUIRE(torch_installed());
  const ModelSpec spec = tiny_llama();
  Runtime rt;
  LoraSpec lora;
  lora.r = 4, lora.alpha = 12, lora.use_rslora = true;
  auto m = adapted_llama(rt, 9, lora);
  Rng rng(11);
  for (auto& [name, l] : named_linears(*m))
    if (l->lora) init_normal(l->lora->lora_B.data, rng, 0.05f);
  const fs::path dir = fs::temp_directory_path() / ("distlab-peft-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string base = (dir / "base.safetensors").string(), adapter = (dir / "adapter").string(), theirs = (dir / "theirs").string(),
                    logits_txt = (dir / "logits.txt").string();
  save_model(*m, base, DType::f32);
  save_adapter(*m, lora, adapter, DType::f32, nullptr, "");
  // PEFT's names and config
  StFile f = read_safetensors(adapter + "/adapter_model.safetensors");
  CHECK(f.tensors.size() == 12);
  CHECK(f.tensors.count("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  CHECK(f.tensors.count("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  const nlohmann::json c = nlohmann::json::parse(file_text_abs(adapter + "/adapter_config.json"));
  CHECK(c["peft_type"] == "LORA");
  CHECK(c["r"] == 4);
  CHECK(c["lora_alpha"] == 12.0);
  CHECK(c["use_rslora"] == true);
  CHECK(c["target_modules"] == nlohmann::json({"down_proj", "q_proj", "v_proj"}));

  const int64_t T = 16;
  Batch b;
  b.B = 1, b.T = T;
  for (int64_t t = 0; t < T; t++) b.tokens.push_back(int32_t(t % spec.vocab_size)), b.targets.push_back(0);
  const std::vector<float> ours = values(m->forward(rt, b));
  const int rc = std::system(fmt::format("/usr/bin/python3 {}/tests/torch_peer.py peft {} {} {} 2 4 2 32 48 64 {} 10000 1e-5 {}", DISTLAB_SOURCE_DIR, base,
                                         adapter, logits_txt, T, theirs)
                                 .c_str());
  REQUIRE(rc == 0);
  std::ifstream in(logits_txt);
  for (size_t i = 0; i < ours.size(); i++) {
    double v;
    REQUIRE(in >> v);
    INFO("logit " << i);
    CHECK(ours[i] == Approx(v).margin(2e-5));
  }
  // and back: the folder PyTorch wrote (every B doubled) loads into a fresh model of the same LoRA
  auto back = adapted_llama(rt, 9, lora);
  load_adapter(*back, lora, theirs);
  auto mine = named_linears(*m), loaded = named_linears(*back);
  for (size_t i = 0; i < mine.size(); i++)
    if (mine[i].second->lora) {
      INFO(mine[i].first);
      const std::vector<float> b0 = values(mine[i].second->lora->lora_B.data), b1 = values(loaded[i].second->lora->lora_B.data);
      for (size_t k = 0; k < b0.size(); k++) CHECK(b1[k] == 2 * b0[k]);
      CHECK(values(mine[i].second->lora->lora_A.data) == values(loaded[i].second->lora->lora_A.data));
    }
  // what does not fit is refused, naming the key
  LoraSpec other = lora;
  other.r = 8;
  auto wrong = build_model(rt, spec);
  apply_lora(rt, *wrong, other, 9);
  CHECK_THROWS_WITH(load_adapter(*wrong, other, theirs), Catch::Contains("r is 4, the run's lora.r is 8"));
  LoraSpec fewer = lora;
  fewer.target_modules = {"q_proj", "v_proj"};
  auto less = build_model(rt, spec);
  apply_lora(rt, *less, fewer, 9);
  CHECK_THROWS_WITH(load_adapter(*less, fewer, theirs), Catch::Contains("not in the model: base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"));
  fs::remove_all(dir);
}

TEST_CASE("ckpt export --merge folds a LoRA checkpoint's adapters into the plain model's weights, and --save-adapter and --init-adapter round trip",
          "[lora][ckpt][cli]") {
  const std::string cfg = "configs/llama-tiny.toml", dir = scratch_path("lora-export", "d") + "/";
  fs::create_directories(dir);
  const std::string lora = "--set lora.r=4 --set lora.alpha=8 --set lora.target_modules=all-linear --set train.steps=3 --set train.eval_batches=1 ";
  TrainRun r = train_ranks(1, cfg, lora + "--set checkpoint.dir=" + dir + "ckpt --save " + dir + "lora.safetensors --save-adapter " + dir + "adapter");
  INFO(r.out);
  REQUIRE(r.code == 0);
  auto [code, out] = shell_in_source(std::string(DISTLAB_BINARY) + " ckpt export " + dir + "ckpt --out " + dir + "merged.safetensors --merge");
  INFO(out);
  REQUIRE(code == 0);
  StFile merged = read_safetensors(dir + "merged.safetensors");
  for (const auto& [name, t] : merged.tensors) CHECK(name.find("lora_") == std::string::npos);
  // the merged file is the plain model (loaded strictly); its logits are the adapted model's
  const ModelSpec spec = llama_tiny_toml();
  Runtime rt;
  auto plain = build_model(rt, spec);
  load_model(*plain, dir + "merged.safetensors");
  auto adapted = build_model(rt, spec);
  LoraSpec l;
  l.r = 4, l.alpha = 8, l.target_modules = {"all-linear"};
  apply_lora(rt, *adapted, l, 0);
  load_model(*adapted, dir + "lora.safetensors");
  CHECK(logits_diff(rt, *adapted, *plain) < 1e-4);
  // --init-adapter: a run that starts from the saved adapters holds them (a zero learning rate keeps them)
  TrainRun again = train_ranks(1, cfg, lora + "--set optim.lr=0 --set optim.min_lr=0 --set train.steps=1 --init-adapter " + dir + "adapter --save-adapter " + dir + "again");
  INFO(again.out);
  REQUIRE(again.code == 0);
  CHECK(max_weight_diff(dir + "adapter/adapter_model.safetensors", dir + "again/adapter_model.safetensors") == 0.0);
  // without LoRA, or a folder that is not PEFT's: an error naming it
  TrainRun no_lora = train_ranks(1, cfg, "--set train.steps=1 --init-adapter " + dir + "adapter");
  CHECK(no_lora.code != 0);
  CHECK(no_lora.out.find("--init-adapter without LoRA") != std::string::npos);
  auto [c2, o2] = shell_in_source(std::string(DISTLAB_BINARY) + " ckpt export " + dir + "ckpt --out " + dir + "m2.safetensors --merge --dtype bf16");
  CHECK(c2 == 0);
  fs::remove_all(dir);
}
