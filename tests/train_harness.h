// The two ways the tests train, each returning what the metrics file said:
//   train_in_process  a Trainer in this process, on a TOML text (one rank; cpu or meta, where
//                     dist.fake_world_size makes it rank 0 of a planned job);
//   train_ranks       `distlab run -n N train CONFIG ...` (real processes), with a timeout.
#pragma once
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/ckpt/safetensors.h"
#include "core/train/trainer.h"
#include "shell.h"

namespace distlab::testing {

struct TrainRun {
  int code = 0;       // train_ranks: the launcher's exit code
  std::string out;    // its output, or the in-process run's log
  std::vector<nlohmann::json> records, steps;  // every record; the step records
  std::vector<double> losses, lrs, grad_norms;
  nlohmann::json summary;
  std::vector<std::vector<float>> weights;  // train_in_process: every parameter as f32, in model order
};

inline void read_metrics(const std::string& path, TrainRun& r) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    r.records.push_back(j);
    if (j["kind"] == "step") {
      r.steps.push_back(j);
      if (!j["loss"].is_null()) r.losses.push_back(j["loss"].get<double>());
      r.lrs.push_back(j["lr"].get<double>());
      r.grad_norms.push_back(j["grad_norm"].is_null() ? std::nan("") : j["grad_norm"].get<double>());
    }
    if (j["kind"] == "summary") r.summary = j;
  }
  std::filesystem::remove(path);
}

// A file of the source tree, as text (a config to parse in process)
inline std::string file_text(const std::string& rel) {
  std::ifstream in(std::string(DISTLAB_SOURCE_DIR) + "/" + rel);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline std::string metrics_path(const char* tag) {
  return (std::filesystem::temp_directory_path() / (std::string("distlab-") + tag + "-" + std::to_string(::getpid()) + ".jsonl")).string();
}

inline TrainRun train_in_process(const std::string& toml, std::vector<std::string> sets = {}, DeviceKind dev = DeviceKind::cpu,
                                 const std::string& save = "") {
  const std::string metrics = metrics_path("train");
  sets.insert(sets.begin(), "train.eval_batches=2");  // the final evaluation's 2 test batches, as train_ranks' (the caller's sets win)
  sets.push_back("log.metrics=" + metrics);
  RunConfig cfg = parse_config(toml, "test.toml", sets);
  Runtime rt(dev);
  std::ostringstream log;
  MetricsWriter mw(cfg.log.metrics);
  std::unique_ptr<ProcessGroup> fake;  // dist.fake_world_size: rank 0 of a planned job, as `distlab train` makes it
  if (cfg.dist.fake_world_size > 0) fake = std::make_unique<ProcessGroup>(ProcessGroup::Fake{}, 0, int(cfg.dist.fake_world_size), &rt.trace);
  Trainer t(cfg, rt, log, fake.get());
  TrainOutputs outputs;
  outputs.save_path = save;
  TrainRun r;
  t.run(mw, outputs);
  mw.finish();
  r.out = log.str();
  read_metrics(metrics, r);
  for (auto* p : t.model().parameters()) {
    if (!p->data.data()) continue;
    std::vector<float> w(static_cast<size_t>(p->data.numel()));
    convert(p->data.data(), p->data.dtype(), w.data(), DType::f32, p->data.numel());
    r.weights.push_back(std::move(w));
  }
  return r;
}

// `sets` is appended to the command line as is ("--set a=b --set c=d"); `run_opts` go to `distlab run`.
// The final evaluation reads 2 test batches unless `sets` says otherwise (a later --set wins): the whole
// test set of cifar-cnn was 0.6 of a 12-step 2-rank run's 1.5 s, and no test here reads more of it.
// Every rank computes on one thread unless run_opts says otherwise: the tests compare runs of different
// rank counts at 1e-6, and a 1-rank reference on 2 threads sums in another order than its stages on 1 each
// (measured on an AVX2 machine: 1.3e-4 on the CNN with BatchNorm; 5e-8 with the threads pinned).
inline TrainRun train_ranks(int ranks, const std::string& config, const std::string& sets,
                            const std::string& run_opts = "--threads-per-rank 1") {
  const std::string metrics = metrics_path("ranks");
  const std::string cmd = std::string("timeout 240 ") + DISTLAB_BINARY + " run -n " + std::to_string(ranks) + " " + run_opts + " --master-port 0 train " +
                          config + " --set train.log_every=1000 --set train.eval_batches=2 --metrics " + metrics + " " + sets;
  TrainRun r;
  std::tie(r.code, r.out) = shell_in_source(cmd);
  read_metrics(metrics, r);
  return r;
}

// The largest |a - b| over the f32 tensors of two safetensors files with the same names and shapes
// (infinity when they do not have them).
inline double max_weight_diff(const std::string& a, const std::string& b) {
  StFile fa = read_safetensors(a), fb = read_safetensors(b);
  if (fa.tensors.size() != fb.tensors.size()) return INFINITY;
  double m = 0;
  for (const auto& [name, ta] : fa.tensors) {
    auto it = fb.tensors.find(name);
    if (it == fb.tensors.end() || it->second.shape != ta.shape || it->second.bytes.size() != ta.bytes.size()) return INFINITY;
    const float* x = reinterpret_cast<const float*>(ta.bytes.data());
    const float* y = reinterpret_cast<const float*>(it->second.bytes.data());
    for (size_t i = 0; i < ta.bytes.size() / 4; i++) m = std::max(m, double(std::abs(x[i] - y[i])));
  }
  return m;
}

// A path in the temporary folder, unique to this test process.
inline std::string scratch_path(const std::string& tag, const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("distlab-" + tag + "-" + std::to_string(::getpid()) + "-" + name)).string();
}

inline double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); i++) m = std::max(m, std::abs(a[i] - b[i]) / std::abs(a[i]));
  return m;
}

}  // namespace distlab::testing
