// Lab 02's checks. Sampler checks ask the student's plugin (in its sandboxed host) for indices and compare
// them with the engine's DistributedSampler here. Training checks run real jobs through `distlab run`:
// the trainers are the engine's, the student's sampler and DDP run in sandboxed processes beside them,
// and losses, parameters, collectives and modeled times are measured by the trainers, where the plugin
// can't reach. A job's result is shared by the checks that need it (one student job hanging costs one
// timeout, not five); the student's job may take a few times the reference's own time.
// Read next: host.cpp beside it (the plugin's side), then grader/bridge/lab_plugin.cpp (the trainer's).
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/data/distributed_sampler.h"
#include "core/models/zoo.h"
#include "core/util/error.h"
#include "grader/check.h"
#include "grader/jobs.h"

namespace fs = std::filesystem;

namespace distlab::grader {

namespace checks02 {  // named: a unity build (CMakeLists.txt) puts several labs' checks in one unit

// ---- the sampler, asked directly ----

std::vector<int64_t> ask_sampler(CheckContext& ctx, PluginProcess& p, int64_t n, int world, int rank, uint64_t seed, int64_t epoch, bool shuffle,
                                 bool drop) {
  wire::Frame f;
  f.op = labproto::kCall;
  const int64_t args[] = {labproto::kSamplerIndices, n, world, rank, int64_t(seed), epoch, (shuffle ? 1 : 0) | (drop ? 2 : 0)};
  for (int k = 0; k < 7; k++) f.arg[k] = args[k];
  const std::string during = fmt::format("sampler_indices(n={}, replicas={}, rank={}, seed={}, epoch={}, shuffle={}, drop_last={})", n, world, rank,
                                         seed, epoch, shuffle, drop);
  p.send(f, nullptr, 0, ctx.deadline, during.c_str());
  std::vector<char> raw;
  p.receive(f, raw, ctx.deadline, during.c_str(), uint64_t(1) << 20);
  if (f.op == labproto::kRaised)
    throw CheckAbort("error", fmt::format("{} threw: {}", during, sanitize_output(std::string(raw.begin(), raw.end()), 1500)));
  if (f.op != labproto::kReturn || raw.size() % 8) throw CheckAbort("error", during + " sent a broken answer");
  std::vector<int64_t> v(raw.size() / 8);
  if (!v.empty()) std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

std::string show(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 12; i++) s += (i ? ", " : "") + std::to_string(v[i]);
  return "[" + s + (v.size() > 12 ? ", ..." : "") + "]";
}

// The seed drawn per grading; the padding rules with shuffle off too (the order is then 0..n-1's), and
// set_epoch over three epochs (a seed + min(epoch, 1) or an order that alternates passes two).
CheckResult sampler_check(CheckContext& ctx, const std::string& which) {
  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  auto gen = ctx.rng({2, 17});
  const uint64_t seed = gen() % 100000;
  for (bool shuffle : {true, false}) {
    if (!shuffle && which != "padding") continue;
    for (int64_t n : {0, 1, 2, 7, 10, 13, 100, 1000}) {
      for (int world = 1; world <= 4; world++) {
        for (bool drop : {false, true}) {
          if (which == "covering" && drop) continue;
          std::vector<int64_t> all;
          std::vector<std::vector<int64_t>> epoch0(static_cast<size_t>(world));
          for (int r = 0; r < world; r++) {
            for (int64_t epoch : {int64_t(0), int64_t(1), int64_t(2)}) {
              if (which != "set_epoch" && epoch > 0) continue;
              auto mine = ask_sampler(ctx, p, n, world, r, seed, epoch, shuffle, drop);
              auto want = DistributedSampler(n, world, r, shuffle, seed, drop).indices(epoch);
              if (which == "covering") {
                if (int64_t(mine.size()) != (n + world - 1) / world)
                  return {false, fmt::format("rank {} of {} gets ceil({}/{}) = {} indices", r, world, n, world, (n + world - 1) / world),
                          fmt::format("{} indices", mine.size()), ""};
                all.insert(all.end(), mine.begin(), mine.end());
                continue;
              }
              if (epoch == 0) epoch0[size_t(r)] = mine;
              if (mine == want) continue;
              CheckResult bad{false, fmt::format("n={} N={} rank {} seed {} epoch {} shuffle={} drop_last={}: {}", n, world, r, seed, epoch,
                                                 shuffle, drop, show(want)),
                              show(mine), ""};
              if (epoch > 0 && mine == epoch0[size_t(r)] && n > 2)
                bad.hint = fmt::format("epoch {} repeats epoch 0's order: shuffle with seeded_permutation(n, seed + epoch)", epoch);
              else if (!shuffle) bad.hint = "shuffle = false: the order is 0, 1, ..., n - 1, padded and sliced as when shuffled";
              return bad;
            }
          }
          if (which == "covering") {
            std::set<int64_t> distinct(all.begin(), all.end());
            for (auto i : distinct)
              if (i < 0 || i >= n) return {false, fmt::format("indices in 0..{}", n - 1), fmt::format("index {}", i), ""};
            if (int64_t(distinct.size()) != n) {
              CheckResult bad{false, fmt::format("the {} ranks together see all {} samples", world, n),
                              fmt::format("{} distinct samples", distinct.size()), ""};
              if (int64_t(all.size()) > n + world) bad.hint = "each rank must take only its share: positions r, r+N, r+2N, ...";
              else bad.hint = "every rank must slice ONE shared permutation (the same seed on every rank), not shuffle on its own";
              return bad;
            }
            if (int64_t(all.size()) - n != (n ? (world - n % world) % world : 0))
              return {false, fmt::format("only the {} padding samples repeat", (world - n % world) % world),
                      fmt::format("{} repeated", int64_t(all.size()) - n), ""};
          }
        }
      }
    }
  }
  return {true, "", "", fmt::format("n in 0..1000 on 1..4 ranks{}{}: every rank's indices as PyTorch's DistributedSampler's (seed {}{})",
                                    which == "covering" ? "" : ", drop_last both ways", which == "set_epoch" ? ", epochs 0, 1 and 2" : "", seed,
                                    which == "padding" ? ", shuffled and not" : ", shuffled")};
}

// ---- training jobs ----

// 10 steps: the course's wrong DDPs are off the 1-rank curve by 6.7e-3 (a sum for the average) to 1.1e-2
// (a bucket not copied back, decoy buckets) relative within them, 670 times the 1e-5 the check allows; a
// right one stays within 8.8e-8. 30 steps only cost time (16 s of a grading under a batch's load).
const std::vector<std::string> kCurve = {"optim.lr=0.002", "train.steps=10", "log.profile="};
const std::vector<std::string> kShort = {"train.steps=3"};

std::vector<std::string> plus(std::vector<std::string> a, std::initializer_list<std::string> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The student's DDP in `mode` on 2 ranks, and whether its curve follows the 1-rank run's within 1e-5.
const Job& curve_job(CheckContext& ctx, const std::string& mode) {
  return job(ctx, "curve-2-" + mode, 2, true, with(kCurve, "parallel.ddp_mode=" + mode), true);
}
// The largest relative difference between two runs' losses, step by step; infinite when they ran a
// different number of steps or a loss is not a number.
double worst_rel(const Job& ref, const Job& mine) {
  double worst = mine.losses.size() == ref.losses.size() ? 0 : INFINITY;
  for (size_t i = 0; i < std::min(ref.losses.size(), mine.losses.size()); i++) {
    const double d = std::abs(ref.losses[i] - mine.losses[i]) / std::abs(ref.losses[i]);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return worst;
}

bool follows_one_rank(CheckContext& ctx, const std::string& mode) {
  const Job& mine = curve_job(ctx, mode);
  return !mine.diverged && worst_rel(job(ctx, "curve-1", 1, false, kCurve), mine) < 1e-5;
}

// The 3-step job whose modeled times the speed-up and the overlap read (and whose epoch the modeled speed-up
// counts) trains as the engine's bucketed DDP of the same job: an overlap shown by a run that does not
// average its gradients counts for nothing.
std::optional<CheckResult> short_must_train(CheckContext& ctx) {
  const Job& ref = job(ctx, "short-2-engine", 2, false, kShort);
  const double worst = worst_rel(ref, job(ctx, "short-2", 2, true, kShort));
  if (worst < 1e-5) return std::nullopt;
  return CheckResult{false, fmt::format("the {}-step job the speed-up and the overlap read trains as the engine's bucketed DDP: its losses within 1e-5", ref.losses.size()),
                     fmt::format("{:.1e} relative at worst", worst), "", "the buckets must carry every gradient, averaged, in this run too"};
}

// Both DDPs of the student (naive and bucketed) on 2 ranks, and the naive one on 4 (where an average
// written as a half is wrong), against one rank with the same global batch.
CheckResult curve(CheckContext& ctx) {
  const Job& ref = job(ctx, "curve-1", 1, false, kCurve);
  struct Run {
    std::string mode;
    int ranks;
    std::function<const Job&()> job;  // run when its turn comes: a curve that fails stops the check before the next job
  };
  const std::vector<Run> runs = {{"naive", 2, [&]() -> const Job& { return curve_job(ctx, "naive"); }},
                                 {"bucketed", 2, [&]() -> const Job& { return curve_job(ctx, "bucketed"); }},
                                 {"naive", 4, [&]() -> const Job& { return job(ctx, "curve-4-naive", 4, true, with(kCurve, "parallel.ddp_mode=naive"), true); }}};
  std::string detail;
  for (const Run& run : runs) {
    const Job& mine = run.job();
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < std::min(ref.losses.size(), mine.losses.size()); i++) {
      const double d = std::abs(ref.losses[i] - mine.losses[i]) / std::abs(ref.losses[i]);
      if (!(d <= worst)) {
        worst = d;
        at = i;
      }
    }
    if (mine.losses.size() == ref.losses.size() && worst < 1e-5 && !mine.diverged) {
      detail += fmt::format("{}{} DDP on {} ranks: {} steps, {:.1e} from the 1-rank curve at worst", detail.empty() ? "" : "; ", run.mode, run.ranks,
                            mine.losses.size(), worst);
      continue;
    }
    CheckResult bad{false, fmt::format("{} DDP on {} ranks: the 1-rank loss curve within 1e-5 relative (step {}: {:.6f})", run.mode, run.ranks,
                                       at + 1, ref.losses.empty() ? 0.0 : ref.losses[at]),
                    mine.losses.size() != ref.losses.size() ? fmt::format("{} steps instead of {}", mine.losses.size(), ref.losses.size())
                                                            : fmt::format("{:.6f} at step {} ({:.1e} relative)", mine.losses[at], at + 1, worst),
                    ""};
    if (mine.diverged)
      bad.hint = run.mode == "naive" ? "the replicas diverged: every rank must end backward with the same averaged gradient"
                                     : "the replicas diverged: wait for every bucket and copy its result back into grads[i].data";
    else if (worst > 0.2 && mine.losses.size() > 1 && mine.losses.back() > ref.losses.back())
      bad.hint = "the curve runs away: all_reduce gives the SUM over ranks; the gradient of the global batch's mean loss is the average";
    else if (run.ranks == 4)
      bad.hint = "right on 2 ranks, not on 4: the average divides the sum by the number of ranks, comm.size()";
    return bad;
  }
  return {true, "", "", detail};
}

CheckResult params_equal(CheckContext& ctx) {
  for (const std::string mode : {"naive", "bucketed"}) {
    const Job& mine = job(ctx, "curve-2-" + mode, 2, true, with(kCurve, "parallel.ddp_mode=" + mode), true);
    if (mine.diverged) {
      const auto at = mine.failure.find("differs from rank 0");
      const auto from = at == std::string::npos ? 0 : mine.failure.rfind('\n', at) + 1;
      return {false, fmt::format("{} DDP: bitwise-equal parameters on both ranks after {} steps", mode, mine.losses.size()),
              at == std::string::npos ? std::string("the replicas differ") : mine.failure.substr(from, mine.failure.find('\n', at) - from), ""};
    }
  }
  return {true, "", "", "naive and bucketed DDP: every parameter bitwise equal on both ranks at the end (the trainers compared them)"};
}

// An epoch's time: steps per epoch x time per step. One rank takes dataset/global_batch steps of the whole
// global batch; N ranks take as many steps as the sampler gives each of them. Modeled: both from the 2-rank
// job's cost model (modeled_single_rank_s, modeled_step_s) on the profile's two T4s. Measured: each job's
// own steady steps (measured_step_s, the first step's warm-up left out; a GPU's end in a device synchronize).
double epoch_speedup(const std::string& step_key, double one_rank_step_s, const nlohmann::json& two) {
  const double one_s = double(two.value("dataset_size", int64_t(0))) / 128.0 * one_rank_step_s;
  const double two_s = double(two.value("steps_per_epoch", int64_t(0))) * two.value(step_key, 0.0);
  return two_s > 0 ? one_s / two_s : 0;
}

// Measured runs: 30 steps, long enough for a steady mean on a GPU or a core. The baseline is the reference
// solution (solutions/02-ddp-cifar) through the same plugin path as the student's, its hooks crossing the
// same socket, or the engine's own DDP where the course has no solutions/. Its runs are made again in every
// grading, around the student's (a time kept from another grading is another moment's).
const std::vector<std::string> kMeasured = {"train.steps=30", "train.log_every=10"};
constexpr double kMeasuredPass = 1.6;   // the course's ~1.8x on two T4s over PCIe, less a PCIe-class link's margin
constexpr double kOfBaseline = 0.9;     // ... or this share of the reference's speed-up measured on the same devices

// the reference solution this batch built and loaded (grader/harness.cpp, reference_times), or "none"
std::string baseline_plugin(CheckContext& ctx) {
  return ctx.shared.get<std::string>("reference:plugin", [] { return std::string("none"); });
}
std::string baseline_name(CheckContext& ctx) { return baseline_plugin(ctx) == "none" ? "the engine's DDP" : "the reference's DDP"; }

const Job& measured_baseline(CheckContext& ctx, int ranks) {
  return ctx.shared.get<Job>(fmt::format("measured-baseline-{}:{}", ranks, ctx.plugin), [&] {
    Job j = run_job(ctx, ranks, baseline_plugin(ctx), kMeasured, ctx.seconds_left());
    if (!j.ok)
      throw CheckAbort(j.status.empty() ? "error" : j.status, fmt::format("{}'s measured run on {} rank(s): {}", baseline_name(ctx), ranks, j.failure));
    return j;
  });
}

// Why this grading models its speed-up instead of measuring it ("" when it measures).
std::string why_modeled(const SharedResults& s) {
  if (s.jobs > 1) return "several gradings at once share the devices (--jobs)";
  if (!s.shared_machine.empty()) return s.shared_machine;
  if (s.measure_speedup) return "";
  if (s.device == "cuda" && s.gpus >= 2) return "";
  if (s.device == "cuda") return "one GPU: both ranks would share it";
  return s.device == "cuda-sim" ? "cuda-sim has no GPU to time" : "cpu ranks share this machine's cores (--measure-speedup times them)";
}

// The measured speed-up: the reference's 1-rank run, the student's 2 ranks, the reference's 2 ranks, in
// that order. The student's timed run must train as the reference's (its losses and its bytes), or a DDP
// that stops communicating once it is timed would look fast.
CheckResult measured_speedup(CheckContext& ctx, double modeled) {
  const Job& one = measured_baseline(ctx, 1);
  const Job& yours = job(ctx, "measured-2", 2, true, kMeasured);
  const Job& two = measured_baseline(ctx, 2);
  const double worst = worst_rel(two, yours);
  const double want_bytes = two.first_step.value("comm_bytes_sent", 0.0), got_bytes = yours.first_step.value("comm_bytes_sent", 0.0);
  if (!(worst < 1e-5) || !(std::abs(got_bytes - want_bytes) <= 0.01 * want_bytes))
    return {false, fmt::format("the timed run trains as {}: every loss within 1e-5 and the same bytes a step", baseline_name(ctx)),
            fmt::format("{:.1e} relative at worst over {} steps; {:.0f} bytes a step against {:.0f}", worst, yours.losses.size(), got_bytes, want_bytes),
            "", "a run is timed only for what it does: every step's gradients averaged, with every bucket's all-reduce"};
  const double step1 = one.summary.value("measured_step_s", 0.0);
  const double base = epoch_speedup("measured_step_s", step1, two.summary), got = epoch_speedup("measured_step_s", step1, yours.summary);
  if (!(step1 > 0) || !(base > 0))
    throw CheckAbort("error", fmt::format("{}'s measured runs have no steady steps to time (one rank {:.3g} s a step, a speed-up of {:.3g})",
                                          baseline_name(ctx), step1, base));
  const std::string where = ctx.shared.device == "cuda" ? (ctx.shared.gpus >= 2 ? std::string("2 GPUs") : std::string("one GPU that both ranks share"))
                                                        : ctx.shared.device + " ranks";
  const std::string numbers =
      fmt::format("an epoch measured on {}: {:.2f}x over one ({}: {:.2f}x; one rank {:.2f} ms a step, yours on two {:.2f} ms); "
                  "an epoch modeled on two T4s: {:.2f}x",
                  where, got, baseline_name(ctx), base, 1e3 * step1, 1e3 * yours.summary.value("measured_step_s", 0.0), modeled);
  if (got >= kMeasuredPass || got >= kOfBaseline * base) return {true, "", "", numbers};
  return {false, fmt::format("an epoch measured >= {}x faster on 2 than on 1, or within {:.0f} % of {} on the same devices", kMeasuredPass,
                             100 * (1 - kOfBaseline), baseline_name(ctx)),
          numbers, "", "your step is slower than the reference's: send fewer, larger messages (buckets) and start them during backward"};
}

CheckResult speedup(CheckContext& ctx) {
  if (auto bad = short_must_train(ctx)) return *bad;
  const Job& mine = job(ctx, "short-2", 2, true, kShort);
  const auto& s = mine.summary;
  const double modeled = epoch_speedup("modeled_step_s", s.value("modeled_single_rank_s", 0.0), s);
  const std::string why = why_modeled(ctx.shared);
  if (why.empty()) return measured_speedup(ctx, modeled);
  const double epoch2 = double(s.value("steps_per_epoch", int64_t(0))) * s.value("modeled_step_s", 0.0);
  const double epoch1 = double(s.value("dataset_size", int64_t(0))) / 128.0 * s.value("modeled_single_rank_s", 0.0);
  if (modeled >= 1.8)
    return {true, "", "", fmt::format("an epoch modeled on two T4s: {:.2f}x ({:.3f} s an epoch against one T4's {:.3f} s); not measured: {}", modeled,
                                      epoch2, epoch1, why)};
  return {false, "an epoch >= 1.8x faster on 2 T4s than on one",
          fmt::format("{:.2f}x: the modeled step takes {:.2f} ms with {:.2f} ms of exposed communication", modeled, 1e3 * s.value("modeled_step_s", 0.0),
                      1e3 * s.value("modeled_exposed_comm_s", 0.0)),
          "", "too much communication is exposed: send fewer, larger messages (buckets) and start them during backward"};
}

struct Buckets {
  int64_t count = 0;
  int64_t largest = 0;  // bytes: bucket_mb, or one parameter larger than it
};
Buckets expected_buckets(double bucket_mb) {
  Runtime rt(DeviceKind::meta);
  ModelSpec spec;
  spec.name = "cifar_cnn";
  spec.in_channels = 3;
  spec.height = spec.width = 32;
  auto m = build_model(rt, spec);
  auto params = m->parameters();
  const int64_t cap = int64_t(bucket_mb * 1024 * 1024);
  Buckets b;
  int64_t bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    if (b.count == 0 || (bytes > 0 && bytes + params[k]->data.nbytes() > cap)) {
      b.count++;
      bytes = 0;
    }
    bytes += params[k]->data.nbytes();
    b.largest = std::max(b.largest, bytes);
  }
  return b;
}

// Bucketing counts only for a bucketed DDP that trains: all_reduces of junk in the right number, or of the
// right sizes at the right times, with the gradients never averaged, earn nothing.
std::optional<CheckResult> bucketed_must_train(CheckContext& ctx) {
  if (follows_one_rank(ctx, "bucketed")) return std::nullopt;
  return CheckResult{false, "a bucketed DDP whose 2-rank curve follows the 1-rank run (see curve_matches_one_rank)",
                     "it does not: its buckets are not counted", "",
                     "the buckets must carry every gradient, averaged, and be written back before the step"};
}

// The trainer counts the collectives it runs for the plugin: one all_reduce per bucket.
// ... of the sizes buckets have: on every rank, no all_reduce larger than the largest bucket (a count made
// of small decoys and one all_reduce of everything is not bucketing).
CheckResult bucket_count(CheckContext& ctx) {
  if (auto bad = bucketed_must_train(ctx)) return *bad;
  const Job& mine = job(ctx, "short-2", 2, true, kShort);
  const Buckets want = expected_buckets(0.05);
  const int64_t calls = mine.first_step.value("comm_calls", int64_t(-1));
  if (calls != want.count)
    return {false, fmt::format("{} all_reduces per step: one per bucket of <= 0.05 MiB", want.count), fmt::format("{}", calls), "",
            calls > want.count ? "copy a whole bucket into one flat buffer and all_reduce it once" : "every parameter must be in some bucket"};
  const nlohmann::json ranks = mine.summary.value("ranks", nlohmann::json::array());
  if (!ranks.is_array() || ranks.size() != 2) return {false, "every rank's report in the run's summary", "none", ""};
  for (const auto& r : ranks) {
    const int64_t largest = r.value("lab_largest_all_reduce_bytes", int64_t(-1));
    if (largest < 0 || largest > want.largest)
      return {false, fmt::format("{} all_reduces per step, none larger than the largest bucket ({} bytes)", want.count, want.largest),
              fmt::format("rank {} all_reduced {} bytes at once", r.value("rank", -1), largest), "",
              "a bucket holds parameters in reverse order until the next would take it past bucket_mb: one all_reduce each"};
  }
  // Wider buckets span layers (at 0.2 MiB the first holds fc's and conv2's bias): a bucket must leave only
  // once every gradient in it is ready — before, the trainer's host holds NaN where a gradient will be.
  const Buckets wide = expected_buckets(0.2);
  const Job& ref = job(ctx, "curve-1", 1, false, kCurve);
  const std::string wide_what = fmt::format("bucket_mb 0.2 ({} buckets, the first across fc and conv2): the 1-rank curve within 1e-5, {} "
                                            "all_reduces per step", wide.count, wide.count);
  const std::string early = "a bucket may hold gradients of several layers: it leaves when the last of them is ready, not the first";
  const Job* got = nullptr;
  try {
    got = &job(ctx, "curve-2-wide", 2, true, plus(kCurve, {"parallel.ddp_mode=bucketed", "parallel.bucket_mb=0.2"}), true);
  } catch (const CheckAbort& e) {
    const std::string why = e.what();
    const size_t at = why.find("loss became nan");
    if (at == std::string::npos) throw;
    return {false, wide_what, "the loss is NaN: " + sanitize_output(why.substr(at, why.find('\n', at) - at), 200),
            "a gradient the trainer has not reported ready holds NaN", early};
  }
  const Job& spanning = *got;
  const double worst = worst_rel(ref, spanning);
  const int64_t wide_calls = spanning.first_step.value("comm_calls", int64_t(-1));
  if (!(worst < 1e-5) || wide_calls != wide.count)
    return {false, wide_what,
            fmt::format("{:.1e} from the curve at worst{}, {} all_reduces", worst,
                        !spanning.losses.empty() && std::isnan(spanning.losses.back()) ? " (the loss is NaN)" : "", wide_calls),
            "", early};
  return {true, "", "", fmt::format("{} all_reduces per step, the largest {} bytes (bucket_mb 0.05); bucket_mb 0.2: {} buckets across layers, "
                                    "{:.1e} from the 1-rank curve", calls, want.largest, wide.count, worst)};
}

CheckResult overlap(CheckContext& ctx) {
  if (auto bad = bucketed_must_train(ctx)) return *bad;
  if (auto bad = short_must_train(ctx)) return *bad;
  const Job& naive = job(ctx, "short-2-engine-naive", 2, false, with(kShort, "parallel.ddp_mode=naive"));
  const Job& mine = job(ctx, "short-2", 2, true, kShort);
  const double n = naive.summary.value("modeled_exposed_comm_s", 0.0), b = mine.summary.value("modeled_exposed_comm_s", 1e9);
  if (b <= 0.5 * n)
    return {true, "", "", fmt::format("modeled on t4-pcie: {:.1f} us of communication exposed, naive DDP's {:.1f} us ({:.0f} %)", b * 1e6, n * 1e6,
                                      100 * b / n)};
  return {false, fmt::format("at most half of naive DDP's exposed communication ({:.1f} us)", n * 1e6),
          fmt::format("{:.1f} us: the buckets' all_reduces don't run during backward", b * 1e6), ""};
}

// Gradient accumulation (k = 4 micro-steps per step, the same global batch): the engine's bucketed DDP with
// the same micro-batches gives the losses and the bytes of one synchronisation per optimizer step.
CheckResult no_sync(CheckContext& ctx) {
  if (auto bad = bucketed_must_train(ctx)) return *bad;
  const std::vector<std::string> accum = with(kShort, "train.accum_steps=4");
  const Job& ref = job(ctx, "accum4-2-engine", 2, false, accum);
  const Job& mine = job(ctx, "accum4-2", 2, true, accum, true);
  const double worst = worst_rel(ref, mine);
  if (!(worst < 1e-5) || mine.diverged)
    return {false, "accumulating 4 micro-steps on 2 ranks: the engine's DDP losses within 1e-5 relative, replicas equal",
            mine.diverged ? "the replicas diverged" : fmt::format("{:.1e} relative at worst", worst), "",
            "on a no_sync micro-step the gradients stay on this rank and add up; the last micro-step averages the sums"};
  const double want = ref.first_step.value("comm_bytes_sent", 0.0), got = mine.first_step.value("comm_bytes_sent", 0.0);
  const int64_t calls = mine.first_step.value("comm_calls", int64_t(-1)), want_calls = ref.first_step.value("comm_calls", int64_t(-1));
  const std::string numbers = fmt::format("{:.0f} bytes in {} all_reduces per optimizer step (the engine's no_sync DDP: {:.0f} in {})", got, calls,
                                          want, want_calls);
  if (std::abs(got / want - 1) <= 0.01) return {true, "", "", numbers};
  return {false, "accumulating 4 micro-steps: one synchronisation per optimizer step, the engine's bytes within 1 %", numbers, "",
          fmt::format("{:.1f}x the bytes: the gradients are averaged on every micro-step; PyTorch's no_sync() sends nothing until the "
                      "last one (the sums stay right either way, which is why only the bytes show it)",
                      got / want)};
}

}  // namespace checks02

std::map<std::string, CheckDef> lab02_checks() {
  using namespace checks02;
  return {
      {"sampler_disjoint_covering", {[](CheckContext& c) { return sampler_check(c, "covering"); }}},
      {"sampler_padding_rules", {[](CheckContext& c) { return sampler_check(c, "padding"); }}},
      {"sampler_set_epoch", {[](CheckContext& c) { return sampler_check(c, "set_epoch"); }}},
      // the training jobs: each student job's limit comes from the engine's own run of the same job
      {"curve_matches_one_rank", {curve, true}},
      {"params_equal_across_ranks", {params_equal, true}},
      {"modeled_speedup_t4", {speedup, true}},
      {"bucketed_allreduces", {bucket_count, true}},
      {"bucketed_overlap", {overlap, true}},
      {"no_sync_accumulation", {no_sync, true}},
  };
}

}  // namespace distlab::grader
