// The trainer: determinism, meta vs cpu accounting, accumulation, out-of-memory, and the CLI end to end.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/train/trainer.h"
#include "train_harness.h"
#include "core/util/error.h"

using namespace distlab;
namespace fs = std::filesystem;

namespace {

const char* kSmallCnn = R"(
[model]
name = "cifar_cnn"
batchnorm = true
[data]
name = "synthetic-images"
synthetic_train = 256
synthetic_test = 64
[train]
micro_batch = 16
steps = 6
log_every = 100
seed = 5
[optim]
name = "sgd"
lr = 0.05
momentum = 0.9
)";

const char* kTinyGpt = R"(
[model]
name = "gpt"
vocab_size = 32
block_size = 16
n_layer = 2
n_head = 2
n_embd = 16
dropout = 0.1
[data]
name = "tokens"
seq_len = 16
vocab = 32
synthetic_tokens = 4000
[train]
micro_batch = 4
steps = 5
eval_batches = 2
seed = 1
[optim]
name = "adamw"
lr = 1e-2
clip_grad_norm = 1.0
schedule = "cosine"
warmup_steps = 2
)";

using distlab::testing::TrainRun;
TrainRun train_run(const char* toml, std::vector<std::string> sets = {}, DeviceKind dev = DeviceKind::cpu) {
  return distlab::testing::train_in_process(toml, std::move(sets), dev);
}

}  // namespace

TEST_CASE("same config and seed give bitwise the same losses and weights", "[train][determinism]") {
  for (const char* toml : {kSmallCnn, kTinyGpt}) {
    TrainRun a = train_run(toml), b = train_run(toml);
    REQUIRE(a.losses.size() == b.losses.size());
    for (size_t i = 0; i < a.losses.size(); i++) CHECK(a.losses[i] == b.losses[i]);  // bitwise
    CHECK(a.weights == b.weights);
    TrainRun c = train_run(toml, {"train.seed=99"});
    CHECK(c.losses != a.losses);
  }
}

TEST_CASE("meta and cpu record the same FLOPs and memory for the same model", "[train][meta]") {
  for (const char* toml : {kSmallCnn, kTinyGpt}) {
    TrainRun cpu = train_run(toml, {"train.steps=2"}), meta = train_run(toml, {"train.steps=2"}, DeviceKind::meta);
    CHECK(cpu.summary["flops_per_step"] == meta.summary["flops_per_step"]);
    CHECK(cpu.summary["peak_memory"] == meta.summary["peak_memory"]);
    CHECK(cpu.summary["peak_memory_total"] == meta.summary["peak_memory_total"]);
    CHECK(cpu.summary["params"] == meta.summary["params"]);
    CHECK(cpu.summary["flops_per_step"].get<double>() > 0);
  }
}

TEST_CASE("accumulating k micro-batches of m equals one batch of k*m", "[train]") {
  const char* mlp = R"(
[model]
name = "mlp"
hidden = [32]
[data]
name = "synthetic-images"
synthetic_train = 128
synthetic_test = 32
[train]
micro_batch = 16
steps = 4
shuffle = false
[optim]
name = "sgd"
lr = 0.1
momentum = 0.9
)";
  TrainRun big = train_run(mlp), acc = train_run(mlp, {"train.micro_batch=4", "train.accum_steps=4"});
  REQUIRE(big.losses.size() == acc.losses.size());
  for (size_t i = 0; i < big.losses.size(); i++) CHECK(acc.losses[i] == Approx(big.losses[i]).epsilon(1e-5));
  for (size_t i = 0; i < big.weights.size(); i++)
    for (size_t j = 0; j < big.weights[i].size(); j++) REQUIRE(acc.weights[i][j] == Approx(big.weights[i][j]).margin(1e-5));
}

TEST_CASE("global_batch sets the micro-batch, contradictions are errors", "[train]") {
  TrainRun r = train_run(kSmallCnn, {"train.global_batch=32", "train.accum_steps=2", "train.steps=1"});
  CHECK(r.records.front()["samples"] == 32);  // 16 per micro-step x 2
  CHECK_THROWS_WITH(train_run(kSmallCnn, {"train.global_batch=30", "train.accum_steps=4"}), Catch::Contains("not divisible"));
  CHECK_THROWS_WITH(train_run(kSmallCnn, {"train.global_batch=64", "train.micro_batch=8"}), Catch::Contains("contradicts"));
}

TEST_CASE("metrics records carry the fields the course reads", "[train]") {
  TrainRun r = train_run(kTinyGpt);
  const auto& step = r.records.front();
  for (auto key : {"step", "loss", "lr", "grad_norm", "samples", "wall_s", "memory"}) CHECK(step.contains(key));
  CHECK(step["memory"]["peak"].contains("activations"));
  CHECK(step["memory"]["current"].contains("optim_state"));
  int evals = 0;
  for (auto& j : r.records) evals += j["kind"] == "eval";
  CHECK(evals == 1);
  const auto& s = r.records.back();
  CHECK(s["kind"] == "summary");
  for (auto key : {"steps", "final_loss", "test_accuracy", "samples_per_s", "params", "peak_memory", "flops_per_step"})
    CHECK(s.contains(key));
  CHECK(r.losses.back() < r.losses.front());
}

TEST_CASE("the simulated device runs out of memory like CUDA, with the breakdown", "[train][oom]") {
  try {
    train_run(kSmallCnn, {"train.device_mem=1MiB"});
    FAIL("no out-of-memory error");
  } catch (const OutOfMemoryError& e) {
    CHECK_THAT(e.what(), Catch::Contains("out of memory: tried to allocate") && Catch::Contains("1.00 MiB total capacity") &&
                             Catch::Contains("params") && Catch::Contains("rank 0"));
    CHECK_THAT(e.hint(), Catch::Contains("micro_batch"));
  }
}

TEST_CASE("a ~1B GPT on the meta device: parameter count and 16 bytes per parameter", "[train][meta]") {
  auto t0 = std::chrono::steady_clock::now();
  RunConfig cfg = load_config(std::string(DISTLAB_SOURCE_DIR) + "/configs/gpt-1b.toml", {"train.steps=1", "train.device=meta"});
  Runtime rt(DeviceKind::meta);
  std::ostringstream log;
  MetricsWriter mw("");
  Trainer t(cfg, rt, log);
  nlohmann::json s = t.run(mw);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 5.0);
  const double n = s["params"].get<double>();
  CHECK(n > 0.9e9);
  CHECK(n < 1.2e9);
  CHECK(std::abs(n - double(gpt_params_closed_form(cfg.model))) / n < 0.01);
  CHECK(s["peak_memory"]["params"].get<double>() == 4 * n);
  CHECK(s["peak_memory"]["grads"].get<double>() == 4 * n);
  CHECK(s["peak_memory"]["optim_state"].get<double>() == 8 * n);
  CHECK(s["peak_memory"]["activations"].get<double>() > 0);
  CHECK_THAT(log.str(), Catch::Contains("closed form"));
}
