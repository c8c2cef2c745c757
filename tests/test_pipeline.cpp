// Pipeline parallelism (core/parallel/pipeline.h, stages of core/parallel/gpt_parallel.h):
//   - the schedules: 1F1B's warm-up is min(p - s - 1, m) forwards, every micro-batch runs forward once and
//     backward once, after its forward; GPipe runs every forward first;
//   - GPT trained with pp = 2 and 4 stages (1F1B and GPipe) and 3D dp 2 x tp 2 x pp 2 on 8 ranks, as real
//     processes: every loss within 1e-6 of one rank accumulating the same micro-batches, the gathered
//     --save within fp32 rounding of its weights;
//   - memory: a stage holds at most p - s micro-batches in flight under 1F1B, all m under GPipe;
//   - time: on the modeled timeline each stage idles (p - 1)/(m + p - 1) of the pipeline's span (the
//     bubble), within 2 points, under both schedules;
//   - m < p and stages that do not divide the blocks are refused, saying why.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "core/ckpt/safetensors.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/pipeline_sim.h"
#include "core/perf/hardware.h"
#include "train_harness.h"

using namespace distlab;
using namespace distlab::testing;
namespace fs = std::filesystem;

namespace {

const std::string kPipelineGpt = "configs/gpt-tiny.toml";

std::string pipeline_scratch(const std::string& name) { return scratch_path("pp", name); }

}  // namespace

TEST_CASE("pipeline schedules: 1F1B warms up with min(p - s - 1, m) forwards, GPipe runs every forward first", "[pp][schedule]") {
  CHECK(describe_schedule(pipeline_schedule(PipeSchedule::one_f_one_b, 4, 0, 8)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(describe_schedule(pipeline_schedule(PipeSchedule::one_f_one_b, 4, 3, 8)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  CHECK(describe_schedule(pipeline_schedule(PipeSchedule::gpipe, 2, 1, 3)) == "F0 F1 F2 B0 B1 B2");
  using A = PipeAction;
  CHECK(check_schedule({{A::forward, 0}, {A::backward, 1}, {A::forward, 1}, {A::backward, 0}}, 2) == "B1 (action 1) runs before F1");
  CHECK(check_schedule({{A::forward, 0}, {A::forward, 0}}, 1) == "F0 runs twice (actions 0 and 1)");
  CHECK(check_schedule({{A::forward, 0}, {A::backward, 0}}, 2) == "F1 never runs");
  CHECK(check_schedule({{A::forward, 2}}, 2) == "action 0 is F2, but the micro-batches are 0..1");
  for (const PipeSchedule sched : {PipeSchedule::one_f_one_b, PipeSchedule::gpipe})
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 4, 5, 8, 16})
        for (int s = 0; s < p; s++) {
          const auto v = pipeline_schedule(sched, p, s, m);
          INFO(name_of(sched) << " p " << p << " m " << m << " stage " << s << ": " << describe_schedule(v));
          REQUIRE(v.size() == size_t(2 * m));
          CHECK(check_schedule(v, m).empty());
          std::vector<int> f_at(size_t(m), -1), b_at(size_t(m), -1);
          int first_backward = -1, in_flight = 0, peak = 0;
          for (int i = 0; i < int(v.size()); i++) {
            auto& at = v[size_t(i)].op == PipeAction::forward ? f_at : b_at;
            CHECK(at[size_t(v[size_t(i)].micro)] == -1);  // once each
            at[size_t(v[size_t(i)].micro)] = i;
            if (v[size_t(i)].op == PipeAction::backward && first_backward < 0) first_backward = i;
            in_flight += v[size_t(i)].op == PipeAction::forward ? 1 : -1;
            peak = std::max(peak, in_flight);
          }
          for (int j = 0; j < m; j++) CHECK(f_at[size_t(j)] < b_at[size_t(j)]);
          if (sched == PipeSchedule::one_f_one_b) {
            CHECK(first_backward == warmup_forwards(p, s, m) + (warmup_forwards(p, s, m) < m ? 1 : 0));
            CHECK(peak == std::min(p - s, m));  // 1F1B's memory bound
          } else {
            CHECK(first_backward == m);
            CHECK(peak == m);
          }
        }
}

TEST_CASE("GPT in pipeline stages (pp 2 and 4, 1F1B and GPipe, and dp 2 x tp 2 x pp 2) trains as one rank accumulating the micro-batches",
          "[pp][train]") {
  // 4 blocks; 8 micro-batches of 4 sequences per step = one rank's train.accum_steps 8
  const std::string sets = "--set train.steps=12 --set train.eval_batches=2 --set model.n_layer=4 --set train.micro_batch=4 --set dist.timeout_s=60 ";
  const std::string ref_save = pipeline_scratch("one.safetensors");
  TrainRun one = train_ranks(1, kPipelineGpt, sets + "--set train.accum_steps=8 --save " + ref_save);
  INFO(one.out);
  REQUIRE(one.code == 0);
  REQUIRE(one.losses.size() == 12);
  struct Case {
    int ranks, pp;
    std::string sets;
    std::vector<int> in_flight;  // per rank
  };
  const std::vector<Case> cases = {
      {2, 2, "--set parallel.pp=2 --set parallel.micro_batches=8", {2, 1}},
      {4, 4, "--set parallel.pp=4 --set parallel.micro_batches=8", {4, 3, 2, 1}},
      {4, 4, "--set parallel.pp=4 --set parallel.micro_batches=8 --set parallel.schedule=gpipe", {8, 8, 8, 8}},
      // dp 2 x pp 2: ranks 0, 1 are stage 0's replicas, 2, 3 stage 1's
      {4, 2, "--set parallel.pp=2 --set parallel.strategy=ddp --set parallel.micro_batches=8 --set train.micro_batch=2", {2, 2, 1, 1}},
      // 3D: ranks 0-3 are stage 0 (tp pairs 0-1 and 2-3, the dp replicas), 4-7 stage 1; 2 sequences per
      // micro-batch on each of 2 replicas
      {8, 2, "--set parallel.pp=2 --set parallel.tp=2 --set parallel.strategy=ddp --set parallel.micro_batches=8 --set train.micro_batch=2",
       {2, 2, 2, 2, 1, 1, 1, 1}},
  };
  for (const Case& c : cases) {
    const std::string save = pipeline_scratch(fmt::format("pp{}-{}.safetensors", c.pp, c.ranks));
    TrainRun r = train_ranks(c.ranks, kPipelineGpt, sets + c.sets + " --save " + save);
    INFO(c.sets << "\n" << r.out);
    REQUIRE(r.code == 0);
    REQUIRE(r.losses.size() == 12);
    CHECK(max_rel_diff(r.losses, one.losses) < 1e-6);
    CHECK(r.summary["params"] == one.summary["params"]);
    CHECK(max_weight_diff(save, ref_save) < 1e-4);
    const auto& pipe = r.summary["pipeline"];
    CHECK(pipe["peak_in_flight"].get<std::vector<int>>() == c.in_flight);
    if (c.ranks == 4 && c.pp == 2) {
      // DP x PP: stage 0's gradients all-reduced ONCE per step (a ring of 2 sends each rank the whole
      // gradient's bytes), not once per micro-batch; plus its 8 micro-batches' activations (2 x 64 x 64
      // floats each), wte's gradient to the last stage (the tied copy), and the norm's one float
      const double grads = 4.0 * r.summary["params_this_rank"].get<double>();
      const double want = grads + 8 * 4.0 * 2 * 64 * 64 + 4.0 * 256 * 64 + 4.0;
      CHECK(r.steps.back()["comm_bytes_sent"].get<double>() == Approx(want).epsilon(1e-9));
    }
    fs::remove(save);
  }
  fs::remove(ref_save);
}

TEST_CASE("a replica that diverges in a stage without rank 0 fails every rank, and rank 0's metrics record it", "[pp][ddp][replicas]") {
  // dp 2 x pp 2: ranks 2 and 3 are stage 1's replicas; before step 2 rank 3's first weight moves by 1e-3
  const std::string metrics = metrics_path("skew");
  const std::string cmd = std::string("DISTLAB_TEST_FAULT=skew:3:step:2 timeout 240 ") + DISTLAB_BINARY + " run -n 4 --master-port 0 --grace 1 train " +
                          kPipelineGpt + " --set train.steps=3 --set train.eval_batches=1 --set model.n_layer=2 --set parallel.pp=2 " +
                          "--set parallel.strategy=ddp --set parallel.micro_batches=2 --set train.micro_batch=2 --metrics " + metrics;
  auto [code, out] = shell_in_source(cmd);
  INFO(out);
  CHECK(code != 0);
  // rank 0 (stage 0, whose replicas agree) fails too, naming stage 1's first weight: the launcher shows its output
  CHECK_THAT(out, Catch::Contains("rank 3's transformer.h.1.ln_1.weight differs from rank 2's at the end: the replicas diverged during training"));
  TrainRun r;
  read_metrics(metrics + ".partial", r);  // a failed run's metrics stay .partial (read_metrics removes what it read)
  nlohmann::json diverged;
  for (const auto& rec : r.records)
    if (rec["kind"] == "diverged") diverged = rec;
  INFO(nlohmann::json(r.records).dump());
  REQUIRE(diverged.is_object());
  CHECK(diverged["rank"] == 3);
  CHECK(diverged["versus_rank"] == 2);
}

TEST_CASE("the CIFAR CNN with BatchNorm in 2 pipeline stages (split to balance parameters) trains as one rank accumulating", "[pp][train][cnn]") {
  // global batch 16 = 4 micro-batches of 4; every stage keeps its own BatchNorm statistics, updated in the
  // micro-batches' order as one rank's are
  const std::string sets = "--set train.steps=20 --set train.global_batch=16 --set data.synthetic_train=1024 "
                           "--set data.synthetic_test=128 --set train.eval_batches=2 --set dist.timeout_s=60 ";
  const std::string ref_save = pipeline_scratch("cnn-one.safetensors"), save = pipeline_scratch("cnn-pp2.safetensors");
  // one thread per rank in both: one rank's default 2 threads change the sums by 1.3e-4 on an AVX2 machine
  TrainRun one = train_ranks(1, "configs/cifar-cnn-bn.toml", sets + "--set train.accum_steps=4 --save " + ref_save, "--threads-per-rank 1");
  INFO(one.out);
  REQUIRE(one.code == 0);
  TrainRun r = train_ranks(2, "configs/cifar-cnn-bn.toml", sets + "--set parallel.pp=2 --set parallel.micro_batches=4 --save " + save,
                           "--threads-per-rank 1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  REQUIRE(r.losses.size() == 20);
  CHECK(max_rel_diff(r.losses, one.losses) < 1e-6);
  CHECK(r.summary["pipeline"]["peak_in_flight"].get<std::vector<int>>() == std::vector<int>{2, 1});
  CHECK(max_weight_diff(save, ref_save) < 1e-4);  // the whole model, BatchNorm statistics included
  fs::remove(save);
  fs::remove(ref_save);
}

TEST_CASE("the modeled bubble is (p - 1)/(m + p - 1) of the pipeline's span, and GPipe's activations are m micro-batches to 1F1B's p",
          "[pp][bubble]") {
  // stages balanced to about 1 %: 8 blocks of width 256, a vocabulary of 64 (the lm_head a small extra on
  // the last stage), the cpu profile (compute, not launch overhead, dominates a stage's time)
  const std::string sets =
      "--set train.steps=2 --set model.n_layer=8 --set model.n_embd=256 --set model.vocab_size=64 --set data.vocab=64 "
      "--set train.micro_batch=2 --set train.eval_batches=1 --set log.profile=cpu --set dist.timeout_s=60 ";
  for (auto [p, m] : {std::pair{2, 4}, std::pair{4, 8}}) {
    std::map<std::string, TrainRun> runs;
    for (const std::string sched : {"1f1b", "gpipe"}) {
      TrainRun r = train_ranks(p, kPipelineGpt, sets + fmt::format("--set parallel.pp={} --set parallel.micro_batches={} --set parallel.schedule={}", p, m, sched));
      INFO("p " << p << " m " << m << " " << sched << "\n" << r.out);
      REQUIRE(r.code == 0);
      const double formula = double(p - 1) / double(m + p - 1);
      CHECK(r.summary["pipeline_bubble_formula"].get<double>() == Approx(formula));
      CHECK(std::abs(r.summary["pipeline_bubble"].get<double>() - formula) < 0.02);
      runs[sched] = r;
    }
    // the same bubble, but GPipe holds all m micro-batches' activations where 1F1B holds p - s
    CHECK(std::abs(runs["1f1b"].summary["pipeline_bubble"].get<double>() - runs["gpipe"].summary["pipeline_bubble"].get<double>()) < 0.01);
    const auto act_1f1b = runs["1f1b"].summary["pipeline"]["peak_activations"].get<std::vector<double>>();
    const auto act_gpipe = runs["gpipe"].summary["pipeline"]["peak_activations"].get<std::vector<double>>();
    if (m > p) CHECK(act_gpipe[0] > 1.5 * act_1f1b[0]);
  }
}

TEST_CASE("a pipeline with fewer micro-batches than stages, or stages that do not divide the blocks, is refused saying why", "[pp][config]") {
  TrainRun r = train_ranks(4, kPipelineGpt, "--set train.steps=1 --set model.n_layer=4 --set parallel.pp=4 --set parallel.micro_batches=2");
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Catch::Contains("parallel.micro_batches 2 < parallel.pp 4") && Catch::Contains("bubble"));
  r = train_ranks(2, kPipelineGpt, "--set train.steps=1 --set model.n_layer=3 --set parallel.pp=2");
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Catch::Contains("parallel.pp 2 does not divide model.n_layer 3") && Catch::Contains("parallel.pp_layers"));
  // explicit stages: 1 + 2 blocks
  r = train_ranks(2, kPipelineGpt, "--set train.steps=2 --set model.n_layer=3 --set parallel.pp=2 --set parallel.pp_layers=[1,2] --set train.micro_batch=4");
  INFO(r.out);
  CHECK(r.code == 0);
  r = train_ranks(2, kPipelineGpt, "--set train.steps=1 --set parallel.pp=2 --set train.accum_steps=2");
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Catch::Contains("train.accum_steps") && Catch::Contains("parallel.micro_batches"));
}

TEST_CASE("the pipeline simulator: equal stages idle (p - 1)/(m + p - 1) under both schedules, m < p included", "[pp][bubble][sim]") {
  const HardwareProfile hw = require_profile("h100-nvlink", "test", true);
  for (int p : {2, 4})
    for (int m : {1, 2, 4, 8})
      for (const std::string sched : {"1f1b", "gpipe"}) {
        const PipelineSimResult r = simulate_pipeline(p, m, sched, hw);
        INFO("p " << p << " m " << m << " " << sched);
        CHECK(r.formula == Approx(double(p - 1) / (m + p - 1)));
        CHECK(std::abs(r.bubble - r.formula) < 0.02);
        CHECK(r.span_s / r.ideal_s == Approx(double(m + p - 1) / m).epsilon(0.02));
        REQUIRE(r.peak_in_flight.size() == size_t(p));
        for (int s = 0; s < p; s++) CHECK(r.peak_in_flight[size_t(s)] == (sched == "gpipe" ? m : std::min(p - s, m)));
      }
}
