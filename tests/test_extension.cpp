// The trainer's extension points (core/train/extension.h), with extensions written here: a step driven
// through TrainerCalls equals the engine's own bit for bit; an extension's sampler and strategy replace the
// engine's; an extension's checkpoints are saved into the folders the trainer makes, and its resume point
// is where the run continues. (The course's labs use the same hooks: their tests are test_grader.cpp's.)
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/ckpt/checkpoint.h"
#include "core/parallel/none.h"
#include "core/train/extension.h"
#include "core/train/trainer.h"
#include "grader/bridge/lab_extension.h"
#include "grader/check.h"
#include "train_harness.h"

using namespace distlab;
using namespace distlab::testing;
namespace fs = std::filesystem;

namespace {

// a tiny GPT with dropout, accumulation, clipping and a warmed-up cosine schedule: every part of a step
const char* kExtGpt = R"(
model = {name = "gpt", vocab_size = 32, block_size = 16, n_layer = 2, n_head = 2, n_embd = 16, dropout = 0.1}
data = {name = "tokens", seq_len = 16, vocab = 32, synthetic_tokens = 4000}
train = {micro_batch = 4, accum_steps = 2, steps = 6, eval_batches = 2, seed = 3, threads = 1}
optim = {name = "adamw", lr = 1e-2, schedule = "cosine", warmup_steps = 2, clip_grad_norm = 0.5}
)";

struct ExtRun {
  TrainRun r;
  std::string log;
};

ExtRun train_with(const std::string& toml, TrainerExtension* ext, std::vector<std::string> sets = {}) {
  const std::string metrics = metrics_path("ext");
  sets.push_back("log.metrics=" + metrics);
  RunConfig cfg = parse_config(toml, "test.toml", sets);
  Runtime rt(DeviceKind::cpu);
  std::ostringstream log;
  MetricsWriter mw(cfg.log.metrics);
  ExtRun out;
  {
    Trainer t(cfg, rt, log, nullptr, ext);
    t.run(mw);
    mw.finish();
    for (auto* p : t.model().parameters()) {
      std::vector<float> w(size_t(p->data.numel()));
      convert(p->data.data(), p->data.dtype(), w.data(), DType::f32, p->data.numel());
      out.r.weights.push_back(std::move(w));
    }
  }
  out.log = log.str();
  read_metrics(metrics, out.r);
  return out;
}

// The engine's step (Trainer::engine_step) written against the extension interface: accumulate k
// micro-batches, clip, step, advance the scheduler.
class DrivenStep : public TrainerExtension {
 public:
  bool drives_steps() const override { return true; }
  StepOutcome drive_step(RunParts& run, TrainerCalls& calls, int64_t) override {
    StepOutcome o;
    const int64_t k = run.cfg.train.accum_steps;
    double sum = 0;
    for (int64_t micro = 0; micro < k; micro++) sum += calls.forward_backward(1.0f / float(k), micro == k - 1, o.samples);
    o.loss = sum / double(k);
    o.grad_norm = run.strategy.grad_norm(run.rt, run.model);
    o.lr = calls.scheduler_lr();
    calls.optimizer_step(float(o.lr), clip_coefficient(o.grad_norm, run.cfg.optim.clip_grad_norm));
    calls.zero_grad();
    calls.scheduler_step();
    steps++;
    return o;
  }
  void describe(std::ostream& log) const override { log << "driven by the test's extension\n"; }
  int steps = 0;
};

// The training set in its plain order, whatever train.shuffle says; and a strategy of its own.
class PlainOrder : public TrainerExtension {
 public:
  std::shared_ptr<Sampler> make_sampler(const RunConfig&, int64_t n, int, int) override { return std::make_shared<SequentialSampler>(n); }
};

class OwnCheckpoints : public TrainerExtension {
 public:
  bool owns_checkpoints() const override { return true; }
  void save(RunParts& run, TrainerCalls& calls, const std::string& dir, int64_t steps, MetricsWriter&) override {
    saved.push_back(dir);
    calls.write_engine_checkpoint((fs::path(dir) / ".engine").string(), steps, "the test's reference");
    std::ofstream(fs::path(dir) / "mine.txt") << steps;
  }
  std::optional<ResumePoint> resume(RunParts& run, TrainerCalls&, MetricsWriter&) override {
    resumed = true;
    if (resume_at.empty()) return std::nullopt;
    int64_t step = 0;
    std::ifstream(fs::path(resume_at) / "mine.txt") >> step;
    return ResumePoint{step, resume_at};
  }
  std::vector<std::string> saved;
  std::string resume_at;
  bool resumed = false;
};

}  // namespace

TEST_CASE("a step driven through TrainerCalls equals the engine's own, bit for bit (accumulation, clipping, a cosine schedule)",
          "[extension]") {
  const ExtRun engine = train_with(kExtGpt, nullptr);
  DrivenStep driven;
  const ExtRun ext = train_with(kExtGpt, &driven);
  CHECK(driven.steps == 6);
  REQUIRE(engine.r.losses.size() == 6);
  CHECK(ext.r.losses == engine.r.losses);
  CHECK(ext.r.lrs == engine.r.lrs);
  CHECK(ext.r.grad_norms == engine.r.grad_norms);
  CHECK(ext.r.weights == engine.r.weights);
  CHECK_THAT(ext.log, Catch::Contains("driven by the test's extension"));
  CHECK_THAT(engine.log, !Catch::Contains("driven by the test's extension"));
}

TEST_CASE("an extension's sampler replaces the engine's: train.shuffle = true then runs the plain order", "[extension]") {
  const ExtRun plain = train_with(kExtGpt, nullptr, {"train.shuffle=false", "train.steps=3"});
  const ExtRun shuffled = train_with(kExtGpt, nullptr, {"train.shuffle=true", "train.steps=3"});
  PlainOrder ext;
  const ExtRun mine = train_with(kExtGpt, &ext, {"train.shuffle=true", "train.steps=3"});
  CHECK(shuffled.r.losses != plain.r.losses);  // the engine's shuffle draws another order
  CHECK(mine.r.losses == plain.r.losses);
}

TEST_CASE("an extension's checkpoints: saved into the trainer's step folders, resumed from its own point, and the engine's "
          "checkpoint holds the scheduler's position",
          "[extension][ckpt]") {
  const std::string dir = scratch_path("ext", "ckpt");
  fs::remove_all(dir);
  OwnCheckpoints first;
  const ExtRun a = train_with(kExtGpt, &first, {"checkpoint.dir=" + dir, "checkpoint.every=2", "checkpoint.keep=0", "train.steps=4"});
  CHECK(first.resumed);
  REQUIRE(first.saved.size() == 2);  // steps 2 and 4 (the end of the run is step 4: saved once)
  CHECK(fs::path(first.saved[0]).filename() == "step-000002");
  CHECK(fs::path(first.saved[1]).filename() == "step-000004");
  Checkpoint reference((fs::path(first.saved[0]) / ".engine").string());
  CHECK(reference.step() == 2);
  CHECK(reference.rank_state(0)["scheduler"]["steps"].get<int64_t>() == 2);

  OwnCheckpoints second;
  second.resume_at = first.saved[0];
  const ExtRun b = train_with(kExtGpt, &second, {"checkpoint.dir=" + dir, "checkpoint.every=2", "checkpoint.keep=0", "train.steps=4"});
  REQUIRE(b.r.steps.size() == 2);  // steps 3 and 4: the run continued from the extension's point
  CHECK(b.r.steps[0]["step"].get<int64_t>() == 3);
  fs::remove_all(dir);
}

TEST_CASE("a lab's [lab] section reaches the bridge through the config's extras, and nowhere else", "[extension][config]") {
  const std::string toml = "[lab]\ntitle = \"DDP\"\nplugin = \"a.so\"\nranks = 2\n[[check]]\nname = \"x\"\n[train]\nsteps = 3\n";
  // the engine alone knows no [lab]: a section nobody declared is an error, as a typo is
  CHECK_THROWS_WITH(parse_config(toml, "labs/02-ddp-cifar/lab.toml"), Catch::Contains("[[check]]"));
  CHECK_THROWS_WITH(parse_config("[lab]\ntitle = \"DDP\"\n", "labs/02-ddp-cifar/lab.toml"), Catch::Contains("lab.title"));
  RunConfig c = parse_config(toml, "labs/02-ddp-cifar/lab.toml", {"lab.sandbox=off"}, {}, lab_config_sections());
  CHECK(c.train.steps == 3);
  CHECK(c.extra.at("lab.plugin") == "a.so");
  CHECK(c.extra.at("lab.ranks") == "2");
  CHECK(c.extra.at("lab.sandbox") == "off");
  CHECK(c.origin.at("lab.sandbox") == "--set lab.sandbox");
  CHECK(lab_name(c) == "02-ddp-cifar");
  // ranks compare the fingerprint, lab 08 and the checkpoint's manifest the values: both carry them
  CHECK_THAT(config_fingerprint(c), Catch::Contains("lab.plugin=\"a.so\""));
  CHECK(config_values(c).at("lab.plugin") == "\"a.so\"");  // as the engine's string keys show
  CHECK_THAT(config_reference(lab_config_sections()), Catch::Contains("lab.sandbox"));
  // a key the section does not hold, in the file or by --set, names the section's keys
  try {
    parse_config("[lab]\npluggin = \"a.so\"\n", "lab.toml", {}, {}, lab_config_sections());
    FAIL("lab.pluggin accepted");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("lab.toml:2: unknown key 'lab.pluggin'"));
    CHECK_THAT(e.hint(), Catch::Contains("plugin, ranks, sandbox"));
  }
  CHECK_THROWS_WITH(parse_config("[train]\nsteps = 1\n", "run.toml", {"lab.plugn=x"}, {}, lab_config_sections()),
                    Catch::Contains("unknown key 'lab.plugn'"));
  // a run config without [lab] is no lab's, even with --set lab.plugin (the grader's jobs set it so)
  RunConfig plain = parse_config("[train]\nsteps = 1\n", "configs/x.toml", {"lab.plugin=none"}, {}, lab_config_sections());
  CHECK(lab_name(plain).empty());
  CHECK(start_lab_extension(plain, DISTLAB_SOURCE_DIR).get() == nullptr);  // plugin = none: the engine's own
  // the sandbox's value is the bridge's to check
  RunConfig bad = parse_config(toml, "labs/02-ddp-cifar/lab.toml", {"lab.sandbox=maybe"}, {}, lab_config_sections());
  try {
    start_lab_extension(bad, DISTLAB_SOURCE_DIR);
    FAIL("lab.sandbox = maybe accepted");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--set lab.sandbox: lab.sandbox is 'maybe'"));
    CHECK_THAT(e.hint(), Catch::Contains("auto, require or off"));
  }
}

// `distlab grade --submissions DIR --jobs N` grades N students at once: the references they share are
// computed by the first grading that asks, the others wait for that result (never a second run, never a
// half-made one), and a reference that failed is computed again by the next asker.
TEST_CASE("the grader's shared results under --jobs: one computation for many askers, a failed one retried", "[grader][jobs]") {
  grader::ResultStore store;
  std::atomic<int> runs{0}, entered{0};
  std::vector<int> seen(8, 0);
  std::vector<std::thread> askers;
  for (int t = 0; t < 8; t++)
    askers.emplace_back([&, t] {
      entered++;
      seen[size_t(t)] = store.get<int>("engine:ref", [&] {
        runs++;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // long enough for every asker to arrive
        return 42;
      });
    });
  for (auto& a : askers) a.join();
  CHECK(entered == 8);
  CHECK(runs == 1);
  for (int v : seen) CHECK(v == 42);
  // a computation that throws leaves nothing behind: the waiting askers and the next one compute it themselves
  std::atomic<int> tries{0};
  std::vector<int> got(4, 0);
  std::vector<std::thread> more;
  for (int t = 0; t < 4; t++)
    more.emplace_back([&, t] {
      for (;;) {
        try {
          got[size_t(t)] = store.get<int>("engine:flaky", [&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            if (tries++ == 0) throw std::runtime_error("the first run timed out");
            return 7;
          });
          return;
        } catch (const std::runtime_error&) {
        }
      }
    });
  for (auto& a : more) a.join();
  CHECK(tries == 2);
  for (int v : got) CHECK(v == 7);
  CHECK(store.get<int>("engine:ref", [] { return -1; }) == 42);  // kept
}
