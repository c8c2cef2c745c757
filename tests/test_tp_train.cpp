// Tensor parallelism end to end (core/parallel/gpt_parallel.h over the mesh of core/parallel/mesh.h):
//   - GPT-tiny trained 50 steps with parallel.tp = 2 and 4, and dp 2 × tp 2 (DDP over the dp axis), as real
//     processes: every loss within 1e-6 (relative) of the one-rank run's, and the gathered --save within
//     fp32 rounding of its weights;
//   - the communication of a step is exactly Megatron's count: 4 all-reduces of (B, T, C) per block, one for
//     the embedding and one for the lm_head's backward, three of N numbers for the vocab-parallel loss;
//   - per-rank memory (the meta device, a fake world): parameter bytes are the split matrices / t plus
//     the whole LayerNorms, wpe and row-parallel biases, to the byte; activations are W + S/t (the part
//     in the split layers halves with each doubling of t, the residual stream's does not);
//   - sequence parallel (Megatron's SP): the same losses, the collectives and bytes of the all-gathers and
//     reduce-scatters that replace the all-reduces, and activations (W + S)/t.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "core/ckpt/safetensors.h"
#include "train_harness.h"

using namespace distlab;
using namespace distlab::testing;
namespace fs = std::filesystem;

namespace {

const std::string kTpGpt = "configs/gpt-tiny.toml";  // L 2, n_head 4, C 64, V 256, T 64, micro_batch 16
const std::string kSets = "--set train.steps=50 --set train.eval_batches=2 ";

std::string tp_scratch(const std::string& name) { return scratch_path("tp", name); }

// GPT-1B's shape (vocab padded to 50304, as Megatron pads it to a multiple of 128·t), one step on meta
const std::string kGpt1b = R"(
[model]
name = "gpt"
vocab_size = 50304
block_size = 1024
n_layer = 18
n_head = 16
n_embd = 2048
[data]
name = "tokens"
seq_len = 1024
vocab = 50304
[train]
micro_batch = 4
steps = 1
[optim]
name = "adamw"
)";

// a ring all-reduce of `bytes` sends 2(t-1)/t of them from each rank
double ring(double bytes, int t) { return 2.0 * (t - 1) / t * bytes; }

}  // namespace

TEST_CASE("GPT-tiny under tensor parallel (tp 2, tp 4, dp 2 x tp 2) trains as one rank does: losses within 1e-6 over 50 steps",
          "[tp][train]") {
  const std::string ref_save = tp_scratch("one.safetensors");
  TrainRun one = train_ranks(1, kTpGpt, kSets + "--save " + ref_save);
  INFO(one.out);
  REQUIRE(one.code == 0);
  REQUIRE(one.losses.size() == 50);
  const int64_t B = 16, T = 64, C = 64, L = 2, N = B * T;

  struct Case {
    int ranks, tp;
    std::string sets;
  };
  for (const Case& c : {Case{2, 2, "--set parallel.tp=2"}, Case{4, 4, "--set parallel.tp=4"},
                        Case{4, 2, "--set parallel.tp=2 --set parallel.strategy=ddp --set train.micro_batch=8"}}) {
    const std::string save = tp_scratch(fmt::format("tp{}-{}.safetensors", c.tp, c.ranks));
    TrainRun r = train_ranks(c.ranks, kTpGpt, kSets + c.sets + " --save " + save);
    INFO(c.sets << "\n" << r.out);
    REQUIRE(r.code == 0);
    REQUIRE(r.losses.size() == 50);
    CHECK(max_rel_diff(r.losses, one.losses) < 1e-6);
    CHECK(r.summary["params"] == one.summary["params"]);        // the model's size, not a rank's
    CHECK(r.summary["mesh"]["tp"].get<int>() == c.tp);
    CHECK(max_weight_diff(save, ref_save) < 1e-4);              // measured 8e-6: AdamW's steps on rounding
    if (c.ranks == c.tp) {
      // Megatron's count for one micro-batch: 4L + 2 all-reduces of the activations (B, T, C), 3 of N
      // numbers in the loss (max, sum of exp, the target's logit), and the gradient norm's one number
      const auto& s = r.steps.back();
      CHECK(s["comm_calls"].get<int64_t>() == 4 * L + 2 + 3 + 1);
      const double want = (4 * L + 2) * ring(4.0 * N * C, c.tp) + 3 * ring(4.0 * N, c.tp) + ring(4.0, c.tp);
      CHECK(s["comm_bytes_sent"].get<double>() == Approx(want).epsilon(1e-9));
    }
    fs::remove(save);
  }
  fs::remove(ref_save);
  (void)T;
}

TEST_CASE("ZeRO on the data-parallel axis of a split model: ZeRO-1 with tp and pp, ZeRO-2 and FSDP with tp, follow DDP, and ZeRO-1 holds 0.75x its optimizer state",
          "[tp][pp][zero]") {
  const std::string base = "--set train.steps=12 --set train.eval_batches=2 --set parallel.dp=2 ";
  const std::string tp = "--set parallel.tp=2 --set train.micro_batch=8 ";
  const std::string pp = "--set parallel.pp=2 --set parallel.micro_batches=2 --set train.micro_batch=4 ";
  for (const std::string split : {tp, pp}) {
    TrainRun ddp = train_ranks(4, kTpGpt, base + split + "--set parallel.strategy=ddp");
    INFO(split << "ddp\n" << ddp.out);
    REQUIRE(ddp.code == 0);
    for (const std::string strategy : {"zero1", "zero2", "fsdp"}) {
      if (split == pp && strategy != "zero1") continue;  // refused below
      TrainRun z = train_ranks(4, kTpGpt, base + split + "--set parallel.strategy=" + strategy);
      INFO(split << strategy << "\n" << z.out);
      REQUIRE(z.code == 0);
      REQUIRE(z.losses.size() == 12);
      // the same updates (measured: bitwise), and the gradient norm (clipped at 1) counted over the parts as
      // over the whole gradients: split tensors on every TP rank, whole ones once, the tied copy never
      CHECK(max_rel_diff(z.losses, ddp.losses) < 1e-6);
      CHECK(z.steps.back()["grad_norm"].get<double>() == Approx(ddp.steps.back()["grad_norm"].get<double>()).epsilon(1e-6));
      CHECK(z.summary["params_equal_across_ranks"] == true);
      if (strategy != "zero1") continue;
      // DDP: Adam's two moments, 8 bytes per parameter; ZeRO-1: the moments and the f32 slice it steps, 12
      // bytes, on half of them
      const double opt_ddp = ddp.summary["peak_memory"]["optim_state"].get<double>(), opt_z1 = z.summary["peak_memory"]["optim_state"].get<double>();
      CHECK(opt_z1 == Approx(0.75 * opt_ddp).epsilon(0.01));
      // reduce-scatter + all-gather = one all-reduce's bytes (up to the padding of the slices)
      const double b_ddp = ddp.steps.back()["comm_bytes_sent"].get<double>(), b_z1 = z.steps.back()["comm_bytes_sent"].get<double>();
      CHECK(b_z1 == Approx(b_ddp).epsilon(0.01));
    }
  }
  // what this build does not compose is refused, saying why
  TrainRun z2 = train_ranks(4, kTpGpt, base + pp + "--set parallel.strategy=zero2 --set train.steps=1");
  CHECK(z2.code != 0);
  CHECK_THAT(z2.out, Catch::Contains("parallel.strategy zero2 with parallel.tp 1 x parallel.pp 2") && Catch::Contains("tied embedding"));
}

TEST_CASE("tensor parallel memory per rank: split weights / t plus the whole small ones, activations W + S/t", "[tp][memory]") {
  const int64_t V = 50304, Tb = 1024, C = 2048, L = 18;
  // split: wte, c_attn (w, b), attn.c_proj.weight, c_fc (w, b), mlp.c_proj.weight; whole: wpe, the norms, the
  // row-parallel biases
  const double split = double(V * C + L * (3 * C * C + 3 * C + C * C + 4 * C * C + 4 * C + 4 * C * C));
  const double whole = double(Tb * C + L * (2 * C + C + 2 * C + C) + 2 * C);
  std::vector<double> act;
  for (int t : {1, 2, 4, 8}) {
    TrainRun r = train_in_process(kGpt1b, {fmt::format("dist.fake_world_size={}", t), fmt::format("parallel.tp={}", t)}, DeviceKind::meta);
    INFO("tp " << t << "\n" << r.out);
    CHECK(r.summary["params"].get<double>() == split + whole);
    CHECK(r.summary["peak_memory"]["params"].get<double>() == 4.0 * (split / t + whole));
    CHECK(r.summary["peak_memory"]["optim_state"].get<double>() == 8.0 * (split / t + whole));
    act.push_back(r.summary["peak_memory"]["activations"].get<double>());
  }
  // W + S/t: each doubling of t saves half of what the one before saved
  CHECK(act[0] - act[1] == Approx(2 * (act[1] - act[2])).epsilon(0.01));
  CHECK(act[1] - act[2] == Approx(2 * (act[2] - act[3])).epsilon(0.01));
  CHECK(act[3] < 0.3 * act[0]);
}

TEST_CASE("tensor parallel refuses what it cannot split, naming the key", "[tp][config]") {
  auto fails = [](const std::vector<std::string>& sets, const std::string& needle) {
    try {
      train_in_process(R"(
[model]
name = "gpt"
vocab_size = 256
block_size = 64
n_layer = 2
n_head = 4
n_embd = 64
[data]
name = "tokens"
seq_len = 64
vocab = 256
[train]
micro_batch = 2
steps = 1
)", sets, DeviceKind::meta);
    } catch (const std::exception& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
      return;
    }
    FAIL("no error for " << sets.back());
  };
  fails({"dist.fake_world_size=8", "parallel.tp=8"}, "heads");                              // 4 heads over 8
  fails({"dist.fake_world_size=3", "parallel.tp=3"}, "does not split over 3");              // C 64 over 3
  fails({"dist.fake_world_size=4", "parallel.tp=3"}, "parallel.tp 3");                      // not the world
  fails({"dist.fake_world_size=2", "parallel.pp=2", "parallel.strategy=zero2"}, "before the tied embedding's two copies");  // (tp: fine)
  fails({"dist.fake_world_size=2", "parallel.tp=2", "model.vocab_size=255", "data.vocab=255"}, "vocabulary");
  fails({"parallel.sequence_parallel=true"}, "parallel.sequence_parallel is true with parallel.tp 1");
  fails({"dist.fake_world_size=2", "parallel.tp=2", "parallel.sequence_parallel=true", "lora.r=4"}, "lora.r");
  fails({"dist.fake_world_size=2", "parallel.tp=2", "parallel.sequence_parallel=true", "train.activation_checkpointing=selective_op"},
        "is true with train.activation_checkpointing = selective_op");
  fails({"dist.fake_world_size=2", "parallel.tp=2", "parallel.sequence_parallel=true", "train.micro_batch=1", "data.seq_len=63",
         "model.block_size=63"},
        "data.seq_len 63 does not split over parallel.tp 2");
}

TEST_CASE("sequence parallel (Megatron's SP on tp): GPT-tiny and Llama-tiny train as one rank within 1e-6 (tp 2 and 4, dp x tp under ZeRO-2 and "
          "FSDP, tp x pp), the stream's all-reduces split in their two halves, and the activations 1/t",
          "[tp][sp][train]") {
  const std::string sets = "--set train.steps=12 --set train.eval_batches=2 ";
  const std::string sp = "--set parallel.sequence_parallel=true ";
  TrainRun one = train_ranks(1, kTpGpt, sets);
  REQUIRE(one.code == 0);
  const int64_t N = 16 * 64, C = 64, L = 2;
  for (int t : {2, 4}) {
    TrainRun r = train_ranks(t, kTpGpt, sets + sp + fmt::format("--set parallel.tp={}", t));
    TrainRun plain = train_ranks(t, kTpGpt, sets + fmt::format("--set parallel.tp={}", t));
    INFO("tp " << t << "\n" << r.out);
    REQUIRE(r.code == 0);
    REQUIRE(plain.code == 0);
    CHECK(max_rel_diff(r.losses, one.losses) < 1e-6);
    CHECK(r.out.find("sequence parallel: the residual stream") != std::string::npos);
    // a step's collectives: per block the forward's 2 all-gathers and 2 reduce-scatters; the backward's 2
    // all-gathers of dy, 2 of the inputs again (Megatron keeps their rows only) and 2 reduce-scatters of dx;
    // the embedding's reduce-scatter and its gradient's all-gather, the lm_head's gather (twice) and its
    // reduce-scatter; the loss's 3 all-reduces of N numbers, the norm's one; the LayerNorms' weights and
    // biases, 2(2L + 1) all-reduces of C numbers. Each gather or scatter sends (t-1)/t of (N, C): 10L + 5
    // halves against plain TP's 4L + 2 all-reduces (8L + 4 halves), 1.25x the bytes for the regathers
    const auto& s = r.steps.back();
    const double half = double(t - 1) / t * 4.0 * N * C;
    CHECK(s["comm_calls"].get<int64_t>() == (10 * L + 5) + 3 + 1 + 2 * (2 * L + 1));
    CHECK(s["comm_bytes_sent"].get<double>() ==
          Approx((10 * L + 5) * half + 3 * ring(4.0 * N, t) + ring(4.0, t) + 2 * (2 * L + 1) * ring(4.0 * C, t)).epsilon(1e-9));
    // every activation on the stream is 1/t here; plain TP keeps it whole on every rank
    CHECK(r.summary["peak_memory"]["activations"].get<double>() < plain.summary["peak_memory"]["activations"].get<double>());
  }
  // the data-parallel axis beside it (its LayerNorms' gradients summed over the rows before the strategy's
  // reduction), pipeline stages (a stage sends its rows); and Llama: its RMSNorms on the rows, q, k, v and
  // gate, up reading them gathered, o_proj and down_proj scattering, with full recompute (it gathers again)
  const std::string llama = "configs/llama-tiny.toml";
  TrainRun l1 = train_ranks(1, llama, sets);
  REQUIRE(l1.code == 0);
  struct With {
    const std::string* cfg;
    const TrainRun* ref;
    int ranks;
    std::string sets;
  };
  for (const With& w : {With{&kTpGpt, &one, 4, "--set parallel.strategy=zero2 --set train.micro_batch=8 "},
                        With{&kTpGpt, &one, 4, "--set parallel.strategy=fsdp --set train.micro_batch=8 "},
                        With{&kTpGpt, &one, 4, "--set parallel.pp=2 --set parallel.strategy=ddp --set parallel.micro_batches=2 --set train.micro_batch=8 "},
                        With{&llama, &l1, 2, ""}, With{&llama, &l1, 2, "--set train.activation_checkpointing=full "},
                        With{&llama, &l1, 4, "--set parallel.strategy=fsdp --set train.micro_batch=8 "}}) {
    TrainRun r = train_ranks(w.ranks, *w.cfg, sets + sp + "--set parallel.tp=2 " + w.sets);
    INFO(*w.cfg << " " << w.sets << "\n" << r.out);
    REQUIRE(r.code == 0);
    CHECK(max_rel_diff(r.losses, w.ref->losses) < 1e-6);
  }
  // full recompute gathers the rows again: the same bits
  TrainRun sp2 = train_ranks(2, kTpGpt, sets + sp + "--set parallel.tp=2");
  TrainRun full = train_ranks(2, kTpGpt, sets + sp + "--set parallel.tp=2 --set train.activation_checkpointing=full");
  REQUIRE(full.code == 0);
  CHECK(full.losses == sp2.losses);
  // dropout on the rows: each rank its own masks (Megatron's tensor-parallel RNG), the same run twice bitwise
  TrainRun d1 = train_ranks(2, kTpGpt, sets + sp + "--set parallel.tp=2 --set model.dropout=0.1");
  TrainRun d2 = train_ranks(2, kTpGpt, sets + sp + "--set parallel.tp=2 --set model.dropout=0.1");
  REQUIRE(d1.code == 0);
  CHECK(d1.losses == d2.losses);
  CHECK(d1.losses != sp2.losses);
}

TEST_CASE("sequence parallel memory per rank: the whole stream's activations / t, where plain TP leaves W whole", "[tp][sp][memory]") {
  std::vector<double> tp, sp;
  for (int t : {2, 4, 8}) {
    const std::vector<std::string> sets = {fmt::format("dist.fake_world_size={}", t), fmt::format("parallel.tp={}", t)};
    std::vector<std::string> with_sp = sets;
    with_sp.push_back("parallel.sequence_parallel=true");
    TrainRun a = train_in_process(kGpt1b, sets, DeviceKind::meta), b = train_in_process(kGpt1b, with_sp, DeviceKind::meta);
    INFO("tp " << t << "\n" << b.out);
    CHECK(b.summary["peak_memory"]["params"] == a.summary["peak_memory"]["params"]);  // the same weights
    tp.push_back(a.summary["peak_memory"]["activations"].get<double>());
    sp.push_back(b.summary["peak_memory"]["activations"].get<double>());
  }
  // (W + S)/t: every doubling of t halves it, within what one gathered layer's input adds while it is used
  CHECK(sp[0] / sp[1] == Approx(2.0).epsilon(0.05));
  CHECK(sp[1] / sp[2] == Approx(2.0).epsilon(0.05));
  for (size_t i = 0; i < 3; i++) CHECK(sp[i] < tp[i]);
}
