// DDP end to end through `distlab run`: N ranks with the same global batch follow the 1-rank curve, the
// replicas stay bitwise equal, and bucketed DDP exposes less communication than naive.
//
// The comparison runs at lr 0.002: at the config's lr 0.02 the first 20 steps agree to ~1e-8, but the
// fast-learning phase amplifies reordered float sums (even one rank with accum 2x64 against 1x128 drifts
// past 1e-5 by step ~25) — chaos of training itself, not of DDP.
#include <sys/wait.h>

#include "train_harness.h"
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

using distlab::testing::max_rel_diff;
using RunOut = distlab::testing::TrainRun;

// The course's CNN on a synthetic set of 8192 images, DDP on `ranks` ranks
RunOut train(int ranks, const std::string& sets) {
  return distlab::testing::train_ranks(ranks, "configs/cifar-cnn.toml", "--set data.synthetic_train=8192 --set parallel.strategy=ddp " + sets);
}

constexpr int kSteps = 30;  // the CIFAR CNN on 2 cores: 30 steps of 128 images per comparison
const std::string kCompare = "--set optim.lr=0.002 --set train.steps=30 ";

}  // namespace

TEST_CASE("2, 3 and 4 ranks follow the 1-rank curve with the same global batch", "[ddp][e2e]") {
  struct Case {
    int ranks;
    std::string mode, batch;
  };
  std::map<std::string, RunOut> one_rank;  // by global batch: one rank's curve doesn't depend on the DDP mode
  for (const Case& c : {Case{2, "bucketed", "128"}, Case{2, "naive", "128"}, Case{3, "bucketed", "96"}, Case{4, "naive", "128"}}) {
    INFO(c.ranks << " ranks, " << c.mode << ", global batch " << c.batch);
    const std::string sets = kCompare + "--set train.global_batch=" + c.batch + " --set parallel.ddp_mode=" + c.mode;
    if (!one_rank.count(c.batch)) one_rank[c.batch] = train(1, sets);
    const RunOut& one = one_rank[c.batch];
    RunOut many = train(c.ranks, sets);
    INFO(many.out);
    REQUIRE(one.code == 0);
    REQUIRE(many.code == 0);
    REQUIRE(one.losses.size() == kSteps);
    REQUIRE(many.losses.size() == kSteps);
    CHECK(max_rel_diff(one.losses, many.losses) < 1e-5);
    CHECK(many.summary["params_equal_across_ranks"] == true);
    CHECK(many.summary["world_size"] == c.ranks);
  }
}

TEST_CASE("accumulation with no_sync matches one rank with the same effective batch", "[ddp][e2e]") {
  RunOut one = train(1, kCompare + "--set train.global_batch=128");
  RunOut acc = train(2, kCompare + "--set train.global_batch=128 --set train.accum_steps=2");
  REQUIRE(acc.code == 0);
  CHECK(max_rel_diff(one.losses, acc.losses) < 1e-5);
  // one all_reduce per step (the bucket, on the last micro-step) + the logged loss
  CHECK(acc.summary["comm"]["all_reduce"]["calls"] == kSteps * 2);
}

// The big step: clipping on the accumulated gradient and the schedule both happen once per optimizer
// step, so k micro-steps of m on one rank, one step of k·m, and N ranks of k·m/N are the same run.
TEST_CASE("k x m on one rank = 1 x km = 2 ranks x km/2, clipped and scheduled once per optimizer step", "[ddp][e2e]") {
  const std::string big = kCompare + "--set train.global_batch=128 --set optim.clip_grad_norm=0.5 --set optim.schedule=step "
                                     "--set optim.step_size=10 --set optim.gamma=0.5 ";
  RunOut one = train(1, big), acc = train(1, big + "--set train.accum_steps=4"), two = train(2, big + "--set train.accum_steps=2");
  REQUIRE(one.code == 0);
  REQUIRE(acc.code == 0);
  REQUIRE(two.code == 0);
  REQUIRE(one.losses.size() == kSteps);
  CHECK(max_rel_diff(one.losses, acc.losses) < 1e-5);
  CHECK(max_rel_diff(one.losses, two.losses) < 1e-5);
  // clipping is active (the norm before clipping is over 0.5), and the same norm is seen either way
  CHECK(one.grad_norms[0] > 0.5);
  CHECK(max_rel_diff(one.grad_norms, acc.grad_norms) < 1e-4);
  CHECK(max_rel_diff(one.grad_norms, two.grad_norms) < 1e-4);
  // lr halves every 10 optimizer steps, not every 10 micro-steps
  for (size_t i = 0; i < size_t(kSteps); i++) {
    const double want = 0.002 * std::pow(0.5, double(i / 10));
    CHECK(std::abs(acc.lrs[i] - want) < 1e-12);
    CHECK(std::abs(two.lrs[i] - want) < 1e-12);
  }
}

// BatchNorm learns faster on this data, so its chaotic phase starts earlier: compared at lr 0.0005
TEST_CASE("SyncBatchNorm on 2 ranks matches BatchNorm on one", "[ddp][e2e]") {
  const std::string bn = "--set optim.lr=0.0005 --set train.steps=20 --set model.batchnorm=true --set train.global_batch=128 ";
  const std::string sets = bn + "--set parallel.sync_batchnorm=true";
  RunOut one = train(1, sets), two = train(2, sets);
  REQUIRE(two.code == 0);
  CHECK(max_rel_diff(one.losses, two.losses) < 1e-5);
  CHECK(two.summary["params_equal_across_ranks"] == true);
  // without SyncBatchNorm each rank normalizes its own 64 samples: a different curve
  RunOut local = train(2, bn);
  CHECK(max_rel_diff(one.losses, local.losses) > 1e-4);
}

TEST_CASE("modeled on two T4s: >= 1.8x speed-up, and buckets hide more communication than naive", "[ddp][e2e][costmodel]") {
  const std::string sets = "--set train.steps=3 --set train.global_batch=128 --set log.profile=t4-pcie ";
  RunOut bucketed = train(2, sets + "--set parallel.ddp_mode=bucketed");
  RunOut naive = train(2, sets + "--set parallel.ddp_mode=naive");
  REQUIRE(bucketed.code == 0);
  REQUIRE(naive.code == 0);
  INFO(bucketed.summary.dump() << "\n" << naive.summary.dump());
  CHECK(bucketed.summary["modeled_speedup"].get<double>() >= 1.8);
  CHECK(bucketed.summary["modeled_exposed_comm_s"].get<double>() < naive.summary["modeled_exposed_comm_s"].get<double>());
  CHECK(bucketed.summary["comm"]["all_reduce"]["calls"] < naive.summary["comm"]["all_reduce"]["calls"]);
}

TEST_CASE("strategy none on several ranks is refused with a hint", "[ddp][e2e]") {
  auto [code, out] = shell_in_source("timeout 60 "s + DISTLAB_BINARY + " run -n 2 --master-port 0 --grace 2 train configs/fashion-mnist-mlp.toml");
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("parallel.strategy=ddp"));
}

TEST_CASE("log.trace writes a Chrome trace with a compute and a comm track per rank", "[ddp][e2e][costmodel]") {
  const std::string trace = (fs::temp_directory_path() / ("distlab-trace-" + std::to_string(getpid()) + ".json")).string();
  for (const std::string profile : {"h100-nvlink", "cpu", ""}) {
    INFO("profile " << profile);
    RunOut r = train(2, "--set train.steps=2 --set log.trace=" + trace + (profile.empty() ? "" : " --set log.profile=" + profile));
    REQUIRE(r.code == 0);
    std::ifstream in(trace);
    auto j = nlohmann::json::parse(in);
    std::set<std::pair<int, int>> tracks;
    for (const auto& e : j["traceEvents"])
      if (e["ph"] == "X") tracks.insert({e["pid"].get<int>(), e["tid"].get<int>()});
    CHECK(tracks.count({0, 0}) == 1);
    CHECK(tracks.count({1, 0}) == 1);
    if (!profile.empty()) {
      CHECK(tracks.count({0, 1}) == 1);  // modeled collectives on the comm stream
      CHECK(r.summary["profile"] == profile);
      CHECK(r.summary["modeled_step_s"].get<double>() > 0);
    }
    fs::remove(trace);
  }
}

namespace {

void write_idx(const fs::path& path, uint32_t magic, std::vector<uint32_t> dims, size_t payload, uint8_t fill) {
  std::ofstream f(path, std::ios::binary);
  for (uint32_t v : [&] { dims.insert(dims.begin(), magic); return dims; }())
    for (int s = 24; s >= 0; s -= 8) f.put(char(v >> s));
  for (size_t i = 0; i < payload; i++) f.put(char(fill + i % 7));
}

}  // namespace

TEST_CASE("ranks that start from different weights or data, or end with different ones, fail the run", "[ddp][e2e]") {
  const fs::path dir = fs::temp_directory_path() / ("distlab-replicas-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string bin = DISTLAB_BINARY, w = (dir / "w.safetensors").string();
  const std::string cnn = " train configs/cifar-cnn.toml --set data.synthetic_train=512 --set train.steps=2 --set parallel.strategy=ddp";
  auto [c0, o0] = shell_in_source("timeout 120 " + bin + " train configs/cifar-cnn.toml --set data.synthetic_train=512 --set train.steps=1 --save " + w);
  REQUIRE(c0 == 0);
  // --init on rank 0 only: rank 1 keeps its own weights after DDP's broadcast... no longer silently
  auto [c1, o1] = shell_in_source("timeout 120 " + bin + " run -n 2 --master-port 0 --grace 1 -- bash -c 'if [ $RANK = 0 ]; then exec " + bin + cnn +
                     " --init " + w + "; else exec " + bin + cnn + "; fi'");
  INFO(o1);
  CHECK(c1 == 1);
  CHECK_THAT(o1, Catch::Contains("rank 1's conv1.weight differs from rank 0's at the start"));
  // a Fashion-MNIST of its own on rank 1 (DISTLAB_DATA on one node only)
  const fs::path fm = dir / "fm";
  fs::create_directories(fm);
  write_idx(fm / "train-images-idx3-ubyte", 2051, {256, 28, 28}, 256 * 784, 3);
  write_idx(fm / "train-labels-idx1-ubyte", 2049, {256}, 256, 0);
  write_idx(fm / "t10k-images-idx3-ubyte", 2051, {64, 28, 28}, 64 * 784, 5);
  write_idx(fm / "t10k-labels-idx1-ubyte", 2049, {64}, 64, 0);
  const std::string mlp = " train configs/fashion-mnist-mlp.toml --set train.steps=2 --set parallel.strategy=ddp";
  auto [c2, o2] = shell_in_source("timeout 120 " + bin + " run -n 2 --master-port 0 --grace 1 -- bash -c 'if [ $RANK = 1 ]; then export DISTLAB_DATA=" +
                     fm.string() + "; fi; exec " + bin + mlp + "'");
  INFO(o2);
  CHECK(c2 == 1);
  CHECK_THAT(o2, Catch::Contains("rank 1 trains on other data than rank 0"));
  fs::remove_all(dir);
}
