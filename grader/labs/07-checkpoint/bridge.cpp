// Lab 07: the student's save_state and load_state in place of the engine's optimizer / RNG / sampler
// checkpoint (labs/07-checkpoint/api.h): LabExtension's save and resume hooks (grader/bridge/lab_extension.h).
// The trainer still owns everything around them:
//
//   save (every rank)   model.safetensors (rank 0, the f32 weights, atomically)
//                       .reference/ — the engine's own checkpoint of the same step, which the student's code
//                         cannot name (no name starts with '.'): only to explain what a resume got wrong
//                       save_state(State, Files): the student writes its files through the trainer, which
//                         records how (a write under the final name, a rename before fsync)
//   resume              the newest folder with model.safetensors and every saving rank's rank-<r>.state is
//                       complete (the student's atomicity decides what appears there); the weights are loaded,
//                       then load_state on every rank — a refusal on any rank ("corrupt") moves every rank on
//                       to the folder before; what load_state set is applied only when all accepted
//
// After a resume the trainer compares the state with .reference/ and records what differs (the optimizer
// moments not restored, the sampler back at the start, ...) in the metrics, for the grader's explanations.
// The file service the student's code writes through, and the parsing of load_state's answer, are in
// grader/bridge/lab_files.h (fuzzed on their own by tests/test_lab_fuzz.cpp).
// Read next: grader/bridge/lab_files.h, then host.cpp beside this file (the plugin's side of each request).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <ostream>

#include "core/ckpt/checkpoint.h"
#include "core/ckpt/safetensors.h"
#include "grader/bridge/sandbox.h"
#include "core/tensor/on_host.h"
#include "grader/bridge/lab_files.h"
#include "grader/bridge/lab_extension.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

namespace fs = std::filesystem;

namespace {

Error lab07_error(const std::string& what, const std::string& hint = "see labs/07-checkpoint/api.h and README.md") {
  return Error("lab 07: " + what, hint);
}

void put_i64(std::vector<char>& out, int64_t v) { out.insert(out.end(), reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + 8); }
void put_str(std::vector<char>& out, const std::string& s) {
  out.insert(out.end(), s.begin(), s.end());
  out.push_back('\0');
}

}  // namespace

std::vector<char> LabExtension::snapshot(RunParts& run, int64_t step) {
  std::vector<char> out;
  put_i64(out, run.pg ? run.pg->rank() : 0);
  put_i64(out, run.world());
  put_i64(out, run.micro_batch);
  put_i64(out, step);
  const auto names = run.opt.state_names();
  put_i64(out, int64_t(run.opt.size()));
  put_i64(out, int64_t(names.size()));
  for (const auto& n : names) put_str(out, n);
  for (size_t i = 0; i < run.opt.size(); i++) {
    put_i64(out, run.opt.param(i).data.numel());
    put_str(out, run.opt.param(i).name);
  }
  put_i64(out, run.opt.steps());
  for (size_t i = 0; i < run.opt.size(); i++)
    for (const auto& n : names) {
      const Tensor* t = run.opt.state(run.rt, i, n, false);
      put_i64(out, t ? t->numel() : 0);
      if (t) {
        const OnHost h(*t);  // a cuda rank's: down from the device
        out.insert(out.end(), reinterpret_cast<const char*>(h.p), reinterpret_cast<const char*>(h.p + t->numel()));
      }
    }
  const auto streams = run.model.rng_streams();
  put_i64(out, int64_t(streams.size()));
  for (uint64_t* s : streams) out.insert(out.end(), reinterpret_cast<const char*>(s), reinterpret_cast<const char*>(s) + 8);
  put_i64(out, run.loader ? run.loader->epoch() : 0);
  put_i64(out, run.loader ? run.loader->position() : 0);
  return out;
}

void LabExtension::save(RunParts& run, TrainerCalls& calls, const std::string& dir, int64_t steps, MetricsWriter& metrics) {
  const double t0 = run.rt.trace.now_us();
  if (run.strategy.shards_parameters() || !run.strategy.replicates_optimizer())
    throw ConfigError("lab 07 runs under DDP (or one rank): the student's State holds whole parameters", "set parallel.strategy = \"ddp\"");
  const int rank = run.pg ? run.pg->rank() : 0;
  const bool group = run.pg && run.pg->size() > 1;
  if (rank == 0)
    save_model(run.model, (fs::path(dir) / "model.safetensors").string(), DType::f32, &run.opt,
               {{"step", std::to_string(steps)}, {"world_size", std::to_string(run.world())}});
  calls.write_engine_checkpoint((fs::path(dir) / ".reference").string(), steps, "lab 07's reference");

  const std::vector<char> snap = snapshot(run, steps);
  LabFileServer files(*plugin_, dir, rank, calls.fault_due("save", steps), run.log, 4 * uint64_t(snap.size()) + (1 << 20));
  plugin_->call(labproto::kSaveState, {}, snap.data(), snap.size(), run.pg, &run.rt, "save_state",
             [&](const wire::Frame& f, std::vector<char>& payload) { files.serve(f, payload); });
  files.finish();
  if (!fs::exists(fs::path(dir) / lab07_state_file(rank)))
    files.violations.push_back(fmt::format("save_state returned, and {} is not there: the checkpoint can never be complete", lab07_state_file(rank)));

  // every rank's violations reach rank 0, which records the save
  nlohmann::json all = nlohmann::json::array();
  if (group) {
    const std::string key = fmt::format("lab07/{}/", dir);
    run.pg->store().set_string(key + std::to_string(rank), nlohmann::json(files.violations).dump());
    if (rank == 0)
      for (int r = 0; r < run.pg->size(); r++)
        for (const auto& v : nlohmann::json::parse(run.pg->store().get_string(key + std::to_string(r)))) all.push_back(fmt::format("rank {}: {}", r, v.get<std::string>()));
  } else {
    for (const auto& v : files.violations) all.push_back("rank 0: " + v);
  }
  const double secs = (run.rt.trace.now_us() - t0) * 1e-6;
  if (rank == 0) {
    run.log << fmt::format("checkpoint {} (lab 07's save_state): {:.2f} s{}\n", dir, secs, all.empty() ? "" : fmt::format(", {} problem(s)", all.size()));
    for (const auto& v : all) run.log << "  " << v.get<std::string>() << "\n";
    metrics.write({{"kind", "checkpoint"}, {"step", steps}, {"dir", dir}, {"save_s", secs}, {"lab07_violations", all}});
    run.log.flush();
  }
}

nlohmann::json LabExtension::restore_problems(RunParts& run, const std::string& dir) {
  nlohmann::json problems = nlohmann::json::array();
  Checkpoint ref((fs::path(dir) / ".reference").string());
  const int rank = run.pg ? run.pg->rank() : 0;
  const bool same_world = ref.world_size() == run.world();
  const nlohmann::json st = ref.rank_state(same_world ? rank : 0);
  for (const std::string& name : run.opt.state_names()) {
    int64_t missing = 0, differ = 0, total = 0;
    for (size_t i = 0; i < run.opt.size(); i++) {
      const std::string logical = "optim." + name + "." + run.opt.param(i).name;
      if (!ref.has(logical)) continue;
      total++;
      const Tensor* t = run.opt.state(run.rt, i, name, false);
      std::vector<float> want(size_t(run.opt.param(i).data.numel()));
      ref.read(logical, 0, int64_t(want.size()), want.data());
      if (!t) missing++;
      else if (std::memcmp(OnHost(*t).p, want.data(), want.size() * 4) != 0) differ++;
    }
    if (missing) problems.push_back(fmt::format("the optimizer's {} was not restored for {} of {} parameters (they start from zero again)", name, missing, total));
    else if (differ) problems.push_back(fmt::format("the optimizer's {} differs from what was saved for {} of {} parameters", name, differ, total));
  }
  if (const int64_t t = st["optimizer"]["steps"].get<int64_t>(); run.opt.steps() != t)
    problems.push_back(fmt::format("AdamW's step count is {}, it was {} (its bias correction restarts)", run.opt.steps(), t));
  std::vector<uint64_t> now;
  for (uint64_t* c : run.model.rng_streams()) now.push_back(*c);
  if (nlohmann::json(now) != st["rng"]["dropout_calls"])
    problems.push_back(fmt::format("the dropout streams are at {}, they were at {} (the resumed run draws masks already used)", nlohmann::json(now).dump(),
                                   st["rng"]["dropout_calls"].dump()));
  int64_t epoch = st["data"]["epoch"], position = st["data"]["position"];
  if (!same_world || st["micro_batch"].get<int64_t>() != run.micro_batch)
    position = position * st["micro_batch"].get<int64_t>() * ref.world_size() / (run.micro_batch * run.world());
  if (run.loader && (run.loader->epoch() != epoch || run.loader->position() != position))
    problems.push_back(fmt::format("the sampler is at epoch {} batch {}, it should be at epoch {} batch {} (samples {})", run.loader->epoch(),
                                   run.loader->position(), epoch, position, run.loader->position() < position ? "seen twice" : "skipped"));
  return problems;
}

std::optional<ResumePoint> LabExtension::resume(RunParts& run, TrainerCalls& calls, MetricsWriter& metrics) {
  const auto& cc = run.cfg.checkpoint;
  const int rank = run.pg ? run.pg->rank() : 0;
  const bool group = run.pg && run.pg->size() > 1;
  if (cc.resume != "auto") throw ConfigError("lab 07 resumes with checkpoint.resume = \"auto\" only", "leave checkpoint.resume at its default");
  // rank 0 lists the complete folders, newest first: model.safetensors and every saving rank's file there
  nlohmann::json candidates = nlohmann::json::array();
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(cc.dir, ec);
    for (const std::string& d : list_checkpoints(cc.dir)) {
      std::string missing;
      int saved_world = 0;
      try {
        saved_world = std::stoi(read_safetensors((fs::path(d) / "model.safetensors").string()).metadata.at("world_size"));
        for (int r = 0; r < saved_world; r++)
          if (!fs::exists(fs::path(d) / lab07_state_file(r))) missing += (missing.empty() ? "" : ", ") + lab07_state_file(r);
      } catch (const std::exception&) {
        missing = "model.safetensors";
      }
      if (missing.empty()) candidates.push_back(d);
      else run.log << fmt::format("skipping {}: incomplete ({} missing)\n", d, missing);
    }
  }
  if (group) {
    if (rank == 0) run.pg->store().set_string("lab07/candidates", candidates.dump());
    else candidates = nlohmann::json::parse(run.pg->store().get_string("lab07/candidates"));
  }
  if (run.loader) run.loader->start_epoch(0);  // where a fresh run starts: what load_state does not set stays so
  std::string refusals;
  for (const auto& c : candidates) {
    const std::string dir = c.get<std::string>();
    std::string refusal;
    int64_t step = 0;
    std::vector<char> back;
    try {
      StFile weights = read_safetensors((fs::path(dir) / "model.safetensors").string());
      step = std::stoll(weights.metadata.at("step"));
      load_model(run.model, (fs::path(dir) / "model.safetensors").string());
      const std::vector<char> snap = snapshot(run, step);
      LabFileServer files(*plugin_, dir, rank, false, run.log, 4 * uint64_t(snap.size()) + (1 << 20));
      back = plugin_->call(labproto::kLoadState, {}, snap.data(), snap.size(), run.pg, &run.rt, "load_state",
                        [&](const wire::Frame& f, std::vector<char>& payload) { files.serve(f, payload); });
      refusal = parse_load_refusal(back);
      if (!refusal.empty()) refusal = "load_state refused it: " + sanitize_output(refusal, 2000);
    } catch (const DataError& e) {
      refusal = e.what();
    } catch (const std::out_of_range&) {
      refusal = "model.safetensors has no step";
    }
    // every rank must agree before anything is applied
    if (group) {
      const std::string key = fmt::format("lab07/load/{}/", dir);
      run.pg->store().set_string(key + std::to_string(rank), refusal);
      for (int r = 0; r < run.pg->size(); r++) {
        const std::string theirs = r == rank ? refusal : run.pg->store().get_string(key + std::to_string(r));
        if (!theirs.empty() && refusal.empty()) refusal = fmt::format("rank {}: {}", r, theirs);
      }
    }
    if (!refusal.empty()) {
      if (rank == 0) run.log << fmt::format("skipping {}: {}\n", dir, refusal);
      refusals += fmt::format("\n  {}: {}", dir, refusal);
      continue;
    }
    // apply what load_state set, checked against this model first
    const auto names = run.opt.state_names();
    std::vector<int64_t> numels;
    for (size_t i = 0; i < run.opt.size(); i++) numels.push_back(run.opt.param(i).data.numel());
    const auto streams = run.model.rng_streams();
    const LabLoadAnswer set = parse_load_answer(back, numels, names.size(), streams.size());
    if (set.steps_set) {
      run.opt.set_steps(set.steps);
      for (size_t i = 0; i < run.opt.size(); i++)
        if (set.steps > 0) run.opt.set_param_steps(i, set.steps);
    }
    for (size_t i = 0; i < run.opt.size(); i++)
      for (size_t k = 0; k < names.size(); k++) {
        if (!set.state_set[i * names.size() + k]) continue;
        Tensor* t = run.opt.state(run.rt, i, names[k], true);
        OnHost h(*t, OnHost::out);  // up to a cuda rank's device
        std::memcpy(h.p, set.states[i * names.size() + k].data(), size_t(t->numel()) * 4);
        h.store();
      }
    if (set.rng_set)
      for (size_t k = 0; k < streams.size(); k++) *streams[k] = set.rng[k];
    if (set.sampler_set && run.loader) {
      run.loader->seek(set.epoch, set.position);
    }
    // what differs from the engine's own save of the same step: the grader's explanations
    nlohmann::json problems = restore_problems(run, dir);
    nlohmann::json all = nlohmann::json::array();
    if (group) {
      const std::string key = fmt::format("lab07/problems/{}/", dir);
      run.pg->store().set_string(key + std::to_string(rank), problems.dump());
      if (rank == 0)
        for (int q = 0; q < run.pg->size(); q++)
          for (const auto& p : nlohmann::json::parse(run.pg->store().get_string(key + std::to_string(q)))) all.push_back(fmt::format("rank {}: {}", q, p.get<std::string>()));
    } else {
      for (const auto& p : problems) all.push_back("rank 0: " + p.get<std::string>());
    }
    if (rank == 0) {
      const int64_t kept = metrics.continue_from(step);
      metrics.write({{"kind", "resume"}, {"step", step}, {"from", dir}, {"world_size", run.world()}, {"records_kept", kept}, {"lab07_problems", all}});
      run.log << fmt::format("resumed from {} (step {}) through load_state\n", dir, step);
      for (const auto& p : all) run.log << "  not as saved: " << p.get<std::string>() << "\n";
      run.log.flush();
    }
    return ResumePoint{step, dir};
  }
  if (!candidates.empty())
    throw lab07_error(fmt::format("every checkpoint in '{}' was refused:{}", cc.dir, refusals), "start afresh in another checkpoint.dir");
  return std::nullopt;  // nothing saved yet: a fresh start
}

}  // namespace distlab
