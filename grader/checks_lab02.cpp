// Lab 02's checks. Sampler checks call the student's function and compare with the engine's
// DistributedSampler. Training checks run real jobs through `distlab run` (inside the check's sandbox):
// the student's code via --set lab.plugin, and the references with the engine's own (lab.plugin=none).
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <dlfcn.h>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/data/distributed_sampler.h"
#include "core/models/zoo.h"
#include "core/train/lab_hooks.h"
#include "core/util/error.h"
#include "grader/check.h"

namespace fs = std::filesystem;

namespace distlab::grader {

namespace {

const LabHooks& hooks(void* h) { return *static_cast<LabHooks*>(plugin_symbol(h, "distlab_lab_hooks")); }

std::string self_exe() {
  char buf[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : "distlab";
}

std::string plugin_path(void* h) {
  Dl_info info{};
  dladdr(plugin_symbol(h, "distlab_lab_hooks"), &info);
  return info.dli_fname ? info.dli_fname : "";
}

struct Job {
  std::string output;
  std::vector<double> losses;
  nlohmann::json summary, first_step;
};

// One training job of the lab's config; plugin "none" runs the engine's own implementation.
Job train(int ranks, const std::string& plugin, const std::string& sets) {
  const std::string metrics = (fs::temp_directory_path() / fmt::format("lab02-{}-{}.jsonl", getpid(), ranks)).string();
  const std::string cmd = fmt::format("{} run -n {} --master-port 0 --grace 2 train {}/labs/02-ddp-cifar/lab.toml --set lab.plugin={} "
                                      "--set train.log_every=1000 --metrics {} {} 2>&1",
                                      self_exe(), ranks, DISTLAB_GRADER_SOURCE_DIR, plugin, metrics, sets);
  Job j;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) j.output.append(buf, n);
  const int st = pclose(p);
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto r = nlohmann::json::parse(line);
    if (r["kind"] == "step") {
      if (j.first_step.is_null()) j.first_step = r;
      j.losses.push_back(r["loss"].get<double>());
    }
    if (r["kind"] == "summary") j.summary = r;
  }
  fs::remove(metrics);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || j.summary.is_null()) {
    std::string tail = j.output.size() > 1500 ? j.output.substr(j.output.size() - 1500) : j.output;
    throw Error(fmt::format("the {}-rank training job failed:\n{}", ranks, tail));
  }
  return j;
}

const std::string kCurve = "--set optim.lr=0.002 --set train.steps=50 --set parallel.ddp_mode=naive --set log.profile=";

CheckResult sampler_check(void* h, const std::string& which) {
  const LabHooks& k = hooks(h);
  for (int64_t n : {0, 1, 2, 7, 10, 13, 100, 1000}) {
    for (int world = 1; world <= 4; world++) {
      for (bool drop : {false, true}) {
        if (which == "covering" && drop) continue;
        std::vector<int64_t> all;
        for (int r = 0; r < world; r++) {
          for (int64_t epoch : {int64_t(0), int64_t(1)}) {
            if (which != "set_epoch" && epoch == 1) continue;
            auto mine = k.sampler_indices(n, world, r, 17, epoch, true, drop);
            DistributedSampler ref(n, world, r, true, 17, drop);
            auto want = ref.indices(epoch);
            if (which == "covering") {
              if (int64_t(mine.size()) != (n + world - 1) / world)
                return {false, fmt::format("rank {} of {} gets ceil({}/{}) = {} indices", r, world, n, world, (n + world - 1) / world),
                        fmt::format("{} indices", mine.size()), ""};
              all.insert(all.end(), mine.begin(), mine.end());
            } else if (mine != want) {
              auto show = [](const std::vector<int64_t>& v) {
                std::string s;
                for (size_t i = 0; i < v.size() && i < 12; i++) s += (i ? ", " : "") + std::to_string(v[i]);
                return "[" + s + (v.size() > 12 ? ", ..." : "") + "]";
              };
              return {false, fmt::format("n={} N={} rank {} epoch {} drop_last={}: {}", n, world, r, epoch, drop, show(want)),
                      show(mine), ""};
            }
          }
        }
        if (which == "covering") {
          std::set<int64_t> distinct(all.begin(), all.end());
          for (auto i : distinct)
            if (i < 0 || i >= n) return {false, fmt::format("indices in 0..{}", n - 1), fmt::format("index {}", i), ""};
          if (int64_t(distinct.size()) != n)
            return {false, fmt::format("the {} ranks together see all {} samples", world, n),
                    fmt::format("{} distinct samples", distinct.size()), ""};
          if (int64_t(all.size()) - n != (n ? (world - n % world) % world : 0))
            return {false, fmt::format("only the {} padding samples repeat", (world - n % world) % world),
                    fmt::format("{} repeated", int64_t(all.size()) - n), ""};
        }
      }
    }
  }
  return {true, "", "", ""};
}

CheckResult curve(void* h, bool params_only) {
  Job ref = train(1, "none", kCurve);
  Job mine = train(2, plugin_path(h), kCurve);
  if (params_only) {
    if (mine.summary.value("params_equal_across_ranks", false)) return {true, "", "", ""};
    return {false, "bitwise-equal parameters on both ranks after 50 steps", "the replicas differ", ""};
  }
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < std::min(ref.losses.size(), mine.losses.size()); i++) {
    const double d = std::abs(ref.losses[i] - mine.losses[i]) / std::abs(ref.losses[i]);
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  if (mine.losses.size() == ref.losses.size() && worst < 1e-5) return {true, "", "", ""};
  return {false, fmt::format("the 1-rank loss curve within 1e-5 relative (step {}: {:.6f})", at + 1, ref.losses[at]),
          fmt::format("{:.6f} at step {} ({:.1e} relative)", mine.losses[at], at + 1, worst), ""};
}

// An epoch's modeled time: steps per epoch x modeled time per step. One rank takes dataset/global_batch
// steps of the whole global batch (modeled_single_rank_s); N ranks take as many steps as the sampler gives
// each of them.
CheckResult speedup(void* h) {
  Job mine = train(2, plugin_path(h), "--set train.steps=3");
  const auto& s = mine.summary;
  const double one = double(s["dataset_size"].get<int64_t>()) / 128.0 * s["modeled_single_rank_s"].get<double>();
  const double two = double(s["steps_per_epoch"].get<int64_t>()) * s["modeled_step_s"].get<double>();
  const double x = one / two;
  if (x >= 1.8) return {true, "", "", ""};
  const int64_t per_rank = s["samples_per_epoch_per_rank"];
  std::string why = per_rank >= s["dataset_size"].get<int64_t>()
                        ? fmt::format("each rank visits {} samples per epoch, the whole data set: without a DistributedSampler two "
                                      "ranks take as many steps per epoch as one, so there is no speed-up",
                                      per_rank)
                        : fmt::format("the modeled step takes {:.2f} ms with {:.2f} ms of exposed communication",
                                      1e3 * s["modeled_step_s"].get<double>(), 1e3 * s["modeled_exposed_comm_s"].get<double>());
  return {false, "an epoch >= 1.8x faster on 2 T4s than on one", fmt::format("{:.2f}x: {}", x, why), ""};
}

int64_t expected_buckets(double bucket_mb) {
  Runtime rt(DeviceKind::meta);
  ModelSpec spec;
  spec.name = "cifar_cnn";
  spec.in_channels = 3;
  spec.height = spec.width = 32;
  auto m = build_model(rt, spec);
  auto params = m->parameters();
  const int64_t cap = int64_t(bucket_mb * 1024 * 1024);
  int64_t buckets = 0, bytes = 0;
  for (size_t k = params.size(); k-- > 0;) {
    if (buckets == 0 || (bytes > 0 && bytes + params[k]->data.nbytes() > cap)) {
      buckets++;
      bytes = 0;
    }
    bytes += params[k]->data.nbytes();
  }
  return buckets;
}

CheckResult bucket_count(void* h) {
  Job mine = train(2, plugin_path(h), "--set train.steps=3");
  const int64_t want = expected_buckets(0.05);
  const int64_t calls = mine.first_step["comm_calls"].get<int64_t>();  // collectives during backward and the step
  if (calls == want) return {true, "", "", ""};
  return {false, fmt::format("{} all_reduces per step: one per bucket of <= 0.05 MiB", want), fmt::format("{}", calls), ""};
}

CheckResult overlap(void* h) {
  Job naive = train(2, "none", "--set train.steps=3 --set parallel.ddp_mode=naive");
  Job mine = train(2, plugin_path(h), "--set train.steps=3");
  const double n = naive.summary["modeled_exposed_comm_s"], b = mine.summary["modeled_exposed_comm_s"];
  if (b <= 0.5 * n) return {true, "", "", ""};
  return {false, fmt::format("at most half of naive DDP's exposed communication ({:.1f} us)", n * 1e6),
          fmt::format("{:.1f} us: the buckets' all_reduces don't run during backward", b * 1e6), ""};
}

}  // namespace

std::map<std::string, CheckFn> lab02_checks() {
  return {
      {"sampler_disjoint_covering", [](void* h) { return sampler_check(h, "covering"); }},
      {"sampler_padding_rules", [](void* h) { return sampler_check(h, "padding"); }},
      {"sampler_set_epoch", [](void* h) { return sampler_check(h, "set_epoch"); }},
      {"curve_matches_one_rank", [](void* h) { return curve(h, false); }},
      {"params_equal_across_ranks", [](void* h) { return curve(h, true); }},
      {"modeled_speedup_t4", speedup},
      {"bucketed_allreduces", bucket_count},
      {"bucketed_overlap", overlap},
  };
}

}  // namespace distlab::grader
