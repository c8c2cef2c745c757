// Activation checkpointing (train.activation_checkpointing; core/models/gpt.h's Block, core/nn/attention.h's
// AttentionCore):
//   - the gradients are bitwise those of no checkpointing: losses and weights equal to the bit over training
//     steps with dropout on, in fp32 and bf16, on one rank and as real processes under FSDP, tensor parallel
//     and a 1F1B pipeline (where several micro-batches' recomputes interleave with other forwards);
//   - what a block keeps is the formula's, to the byte (meta device, bf16, per block: the difference between
//     3 blocks and 1): none 32sbh + 2as²b + 16sb (Korthikanti et al. 2022 without dropout, plus LayerNorm's
//     f32 statistics), selective 32sbh + 16sb, full 2sbh (the block's input);
//   - what it costs is counted: full adds exactly one forward of every block, selective one attention core
//     forward per block;
//   - Llama's selective_op (torchtitan's op-level policy) keeps per block the input, q_proj's, v_proj's,
//     gate_proj's and down_proj's outputs and the attention's — d·sb(4C + C_kv + I) + the core's — and trains
//     bitwise as without, on one rank and under FSDP, tp 2 and a 1F1B pipeline.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include "core/models/model.h"
#include "core/models/zoo.h"
#include "core/ops/cpu/attention.h"
#include "train_harness.h"

using namespace distlab;
using namespace distlab::testing;

namespace {

const char* kGpt = R"(
[model]
name = "gpt"
vocab_size = 48
block_size = 24
n_layer = 3
n_head = 4
n_embd = 32
dropout = 0.1
[data]
name = "tokens"
seq_len = 24
vocab = 48
synthetic_tokens = 6000
[train]
micro_batch = 4
steps = 5
eval_batches = 2
threads = 1
seed = 3
[optim]
name = "adamw"
lr = 1e-2
clip_grad_norm = 1.0
)";

const char* kModes[] = {"none", "selective", "full"};

struct Step {
  double forward_flops = 0;  // the forward's, from the trace
  double flops = 0;          // forward + backward
  int64_t saved = 0;         // activations held between forward and backward
};

// A GPT (or, named "llama", a Llama) of L blocks at width C with NH heads over T positions
ModelSpec spec(const char* name, int64_t L, Checkpointing mode, int64_t T, int64_t C, int64_t NH, AttentionKernel kernel) {
  ModelSpec s;
  s.name = name;
  s.vocab_size = 64;
  s.block_size = T;
  s.n_layer = L;
  s.n_head = NH;
  s.n_embd = C;
  s.checkpointing = mode;
  s.attention = kernel;
  return s;
}

// One forward and backward of the model built on meta in bf16, micro-batch B
Step meta_step(const ModelSpec& s, int64_t B) {
  Runtime rt(DeviceKind::meta);
  rt.dtype = DType::bf16;
  std::unique_ptr<Model> m = build_model(rt, s);
  Batch b;
  b.B = B;
  b.T = s.block_size;
  b.tokens.assign(size_t(B * b.T), 1);
  b.targets.assign(size_t(B * b.T), 2);
  const int64_t before = rt.memory.current(Category::activations);
  Tensor logits = m->forward(rt, b);
  Step st;
  st.saved = rt.memory.current(Category::activations) - before - logits.nbytes();
  st.forward_flops = rt.trace.flops();
  Tensor dlogits = rt.empty(logits.shape(), Category::activations, "dlogits", rt.dtype);
  logits = Tensor();
  m->backward(rt, dlogits, nullptr);
  st.flops = rt.trace.flops();
  return st;
}

Step meta_step(int64_t L, Checkpointing mode, int64_t B, int64_t T, int64_t C, int64_t NH,
               AttentionKernel kernel = AttentionKernel::naive) {
  return meta_step(spec("gpt", L, mode, T, C, NH, kernel), B);
}

// A Llama: 4 query heads sharing 2 kv heads, SwiGLU width I
Step llama_meta_step(int64_t L, Checkpointing mode, int64_t B, int64_t T, int64_t C, int64_t I, AttentionKernel kernel) {
  ModelSpec s = spec("llama", L, mode, T, C, 4, kernel);
  s.n_kv_head = 2;
  s.intermediate_size = I;
  return meta_step(s, B);
}

}  // namespace

TEST_CASE("selective_op (torchtitan's op-level policy): a Llama block keeps d·sb(4C + C_kv + I) and the attention's, trains bitwise as none",
          "[checkpointing][llama]") {
  const int64_t B = 2, T = 64, C = 128, I = 352, Ckv = C / 2, NH = 4;
  const double d = 2, sb = double(B * T);
  for (AttentionKernel kernel : {AttentionKernel::flash, AttentionKernel::naive}) {
    const bool flash = kernel == AttentionKernel::flash;
    INFO((flash ? "flash" : "naive"));
    auto per_block = [&](Checkpointing m) {
      return double(llama_meta_step(3, m, B, T, C, I, kernel).saved - llama_meta_step(1, m, B, T, C, I, kernel).saved) / 2;
    };
    // the input, q_proj's output (rotated), v_proj's, the attention's output y, gate_proj's and down_proj's
    // outputs; and the core's own: flash's f32 log-sum-exps, or the naive kernel's probabilities
    const double core = flash ? 4.0 * NH * sb : d * NH * T * sb;
    CHECK(per_block(Checkpointing::selective_op) == d * sb * (4 * C + Ckv + I) + core);
    CHECK(per_block(Checkpointing::selective_op) < per_block(Checkpointing::none));
    CHECK(per_block(Checkpointing::full) < per_block(Checkpointing::selective_op));
    // the recompute: k_proj, o_proj and up_proj again (and the cheap ops), less than a whole forward
    auto flops_per_block = [&](Checkpointing m) {
      return (llama_meta_step(3, m, B, T, C, I, kernel).flops - llama_meta_step(1, m, B, T, C, I, kernel).flops) / 2;
    };
    const double extra = flops_per_block(Checkpointing::selective_op) - flops_per_block(Checkpointing::none);
    CHECK(extra > 2 * sb * C * (Ckv + C + I));
    CHECK(extra < flops_per_block(Checkpointing::full) - flops_per_block(Checkpointing::none));
  }
  const std::string toml = file_text("configs/llama-tiny.toml");
  for (const char* precision : {"fp32", "bf16"})
    for (const char* kernel : {"naive", "flash"}) {
      const std::vector<std::string> sets = {"train.steps=4", "train.eval_batches=1", "train.threads=1", std::string("precision.mode=") + precision,
                                             std::string("model.attention=") + kernel};
      TrainRun none = train_in_process(toml, sets);
      std::vector<std::string> op = sets;
      op.push_back("train.activation_checkpointing=selective_op");
      TrainRun r = train_in_process(toml, op);
      INFO(precision << " " << kernel);
      REQUIRE(r.losses.size() == 4);
      CHECK(r.losses == none.losses);  // bitwise
      CHECK(r.weights == none.weights);
      CHECK(r.summary["flops_per_step"].get<double>() > none.summary["flops_per_step"].get<double>());
      CHECK(r.summary["peak_memory"]["activations"].get<double>() < none.summary["peak_memory"]["activations"].get<double>());
    }
  // GPT's blocks have no such policy here: refused, with the modes that do exist
  CHECK_THROWS_WITH(train_in_process(kGpt, {"train.activation_checkpointing=selective_op"}), Catch::Contains("Llama's block"));
}

TEST_CASE("selective_op under FSDP, tensor parallel and a 1F1B pipeline: real processes, losses bitwise as without", "[checkpointing][llama][dist]") {
  const std::string sets = "--set train.steps=4 --set train.eval_batches=1 ";
  struct Case {
    const char* what;
    std::string sets;
  };
  for (const Case& c : {Case{"fsdp", "--set parallel.strategy=fsdp --set train.micro_batch=8"}, Case{"tp 2", "--set parallel.tp=2"},
                        Case{"pp 2, 1f1b", "--set parallel.pp=2 --set parallel.micro_batches=4 --set train.micro_batch=4"}}) {
    TrainRun none = train_ranks(2, "configs/llama-tiny.toml", sets + c.sets);
    TrainRun op = train_ranks(2, "configs/llama-tiny.toml", sets + c.sets + " --set train.activation_checkpointing=selective_op");
    INFO(c.what << "\n" << none.out << "\n" << op.out);
    REQUIRE(none.code == 0);
    REQUIRE(op.code == 0);
    REQUIRE(op.losses.size() == 4);
    CHECK(op.losses == none.losses);  // bitwise
  }
}

TEST_CASE("activation checkpointing: selective and full train bitwise as no checkpointing (dropout on, fp32 and bf16)", "[checkpointing]") {
  for (const char* precision : {"fp32", "bf16"}) {
    TrainRun none = train_in_process(kGpt, {std::string("precision.mode=") + precision});
    REQUIRE(none.losses.size() == 5);
    const double none_act = none.summary["peak_memory"]["activations"].get<double>();
    double last_flops = none.summary["flops_per_step"].get<double>(), last_act = none_act;
    for (const char* mode : {"selective", "full"}) {
      TrainRun r = train_in_process(kGpt, {std::string("precision.mode=") + precision, std::string("train.activation_checkpointing=") + mode});
      INFO(precision << " " << mode);
      REQUIRE(r.losses.size() == 5);
      for (size_t i = 0; i < r.losses.size(); i++) CHECK(r.losses[i] == none.losses[i]);  // bitwise
      CHECK(r.weights == none.weights);
      CHECK(r.summary["flops_per_step"].get<double>() > last_flops);  // the recompute is counted
      CHECK(r.summary["peak_memory"]["activations"].get<double>() < last_act);
      last_flops = r.summary["flops_per_step"].get<double>();
      last_act = r.summary["peak_memory"]["activations"].get<double>();
    }
  }
}

TEST_CASE("activation checkpointing: what a block keeps is the formula's to the byte, and the recompute's FLOPs are counted",
          "[checkpointing][meta]") {
  const int64_t B = 2, T = 128, C = 256, NH = 8, hs = C / NH;
  const double s = T, b = B, h = C, a = NH;
  const double expect[] = {32 * s * b * h + 2 * a * s * s * b + 16 * s * b,  // none (bf16 activations, f32 LayerNorm statistics)
                           32 * s * b * h + 16 * s * b,                      // selective: the probabilities are not kept
                           2 * s * b * h};                                   // full: the input, in bf16
  Step none1 = meta_step(1, Checkpointing::none, B, T, C, NH), none3 = meta_step(3, Checkpointing::none, B, T, C, NH);
  for (int m = 0; m < 3; m++) {
    const auto mode = Checkpointing(m);
    Step one = meta_step(1, mode, B, T, C, NH), three = meta_step(3, mode, B, T, C, NH);
    INFO(kModes[m]);
    CHECK(double(three.saved - one.saved) / 2 == expect[m]);
    // the FLOPs a block's forward and backward cost more than without checkpointing
    const double extra = (three.flops - one.flops) / 2 - (none3.flops - none1.flops) / 2;
    if (mode == Checkpointing::none) CHECK(extra == 0);
    if (mode == Checkpointing::selective) CHECK(extra == 4.0 * B * NH * T * T * hs + 5.0 * B * NH * T * T);  // attention_forward again
    if (mode == Checkpointing::full) {
      // one more forward of the block: measured as the forward FLOPs a block adds
      CHECK(extra == (none3.forward_flops - none1.forward_flops) / 2);
      CHECK(extra > 0);
    }
  }
}

TEST_CASE("activation checkpointing under FSDP, tensor parallel and a 1F1B pipeline: real processes, losses bitwise as without",
          "[checkpointing][dist]") {
  const std::string sets = "--set train.steps=6 --set train.eval_batches=2 --set model.dropout=0.1 --set model.n_layer=4 ";
  struct Case {
    const char* what;
    std::string sets;
  };
  for (const Case& c : {Case{"fsdp", "--set parallel.strategy=fsdp"}, Case{"tp 2", "--set parallel.tp=2"},
                        Case{"pp 2, 1f1b", "--set parallel.pp=2 --set parallel.micro_batches=4 --set parallel.schedule=1f1b"}}) {
    TrainRun none = train_ranks(2, "configs/gpt-tiny.toml", sets + c.sets);
    INFO(c.what << "\n" << none.out);
    REQUIRE(none.code == 0);
    REQUIRE(none.losses.size() == 6);
    for (const char* mode : {"selective", "full"}) {
      TrainRun r = train_ranks(2, "configs/gpt-tiny.toml", sets + c.sets + " --set train.activation_checkpointing=" + mode);
      INFO(mode << "\n" << r.out);
      REQUIRE(r.code == 0);
      REQUIRE(r.losses.size() == 6);
      for (size_t i = 0; i < r.losses.size(); i++) CHECK(r.losses[i] == none.losses[i]);  // bitwise
      CHECK(r.summary["peak_memory"]["activations"].get<double>() < none.summary["peak_memory"]["activations"].get<double>());
    }
  }
}

TEST_CASE("activation checkpointing: a name it does not take is refused at load, naming the key", "[checkpointing][config]") {
  try {
    parse_config(kGpt, "test.toml", {"train.activation_checkpointing=true"});
    FAIL("accepted");
  } catch (const ConfigError& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("train.activation_checkpointing"));
    CHECK_THAT(e.hint(), Catch::Contains("selective"));
  }
}

TEST_CASE("model.attention = flash: trains as naive within fp32 rounding, keeps log-sum-exps instead of the probabilities", "[checkpointing][flash]") {
  // one rank, dropout on: the same masks, the same steps; the sums differ in order only
  TrainRun naive = train_in_process(kGpt), flash = train_in_process(kGpt, {"model.attention=flash"});
  REQUIRE(flash.losses.size() == naive.losses.size());
  CHECK(max_rel_diff(flash.losses, naive.losses) < 1e-5);
  TrainRun both = train_in_process(kGpt, {"model.attention=flash", "train.activation_checkpointing=full"});
  CHECK(both.losses == flash.losses);  // checkpointing stays bitwise under flash
  // per block on meta in bf16: 32sbh + 16sb + 4asb (the f32 log-sum-exps), not 2as²b
  const int64_t B = 2, T = 128, C = 256, NH = 8;
  auto saved = [&](int64_t L) { return meta_step(L, Checkpointing::none, B, T, C, NH, AttentionKernel::flash).saved; };
  const double s = T, b = B, h = C, a = NH;
  CHECK(double(saved(3) - saved(1)) / 2 == 32 * s * b * h + 16 * s * b + 4 * a * s * b);
  // an image model has no attention to switch
  CHECK_THROWS_WITH(train_in_process(R"([model]
name = "mlp"
[data]
name = "synthetic-images"
)", {"model.attention=flash"}),
                    Catch::Contains("model.attention"));
}
