// Lab 09's checks: the student's answers (TOML, no code) against distlab's own arithmetic.
//   fields_<config>      every field of a real-world style DeepSpeed/FSDP config -> the distlab key it sets
//                        ("-" for a field distlab has no key for), against core/config/ecosystem.cpp's mapping
//   memory_predictions   the predicted peak memory per GPU of each config, running one step of the 1B GPT on
//                        the fake world of 8, within 10 % of the run's (--device meta)
//   decision_tree        the strategy for each (model, GPUs, memory) case, against the course's decision tree
//                        as `distlab plan` applies it (its "decision_tree"); a miss shows the tree's reason
// The cases are labs/09-configs-plan/configs/cases.toml (the instructor's); the answers come from the
// bundle the harness made of student/annotations.toml and student/decisions.toml.
// Read next: labs/09-configs-plan/configs/cases.toml (the cases). No plugin: no host.cpp or bridge.cpp here.
#include <fmt/format.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <toml++/toml.h>

#include "grader/bridge/sandbox.h"
#include "core/config/ecosystem.h"
#include "core/util/error.h"
#include "core/util/error.h"
#include "core/util/nesting.h"
#include "grader/check.h"
#include "grader/harness.h"
#include "grader/scratch.h"

namespace fs = std::filesystem;

namespace distlab::grader {

namespace checks09 {  // named: a unity build (CMakeLists.txt) puts several labs' checks in one unit

// One of the student's files, parsed; a file that is not TOML fails the check that reads it, saying where.
toml::table answers(const CheckContext& ctx, const std::string& name) {
  std::ifstream in(ctx.plugin);
  const nlohmann::json bundle = nlohmann::json::parse(in, nullptr, false);
  if (!bundle.is_object() || !bundle.contains(name) || !bundle[name].is_string())
    throw CheckAbort("error", fmt::format("the submission has no {}", name));
  parse_in_own_process(ctx, bundle[name].get<std::string>(), "student/" + name, "toml");  // first where a crash costs nothing
  try {
    check_nesting(bundle[name].get<std::string>(), "student/" + name);  // a parser that recurses, in the grader's own process
    return toml::parse(bundle[name].get<std::string>(), "student/" + name);
  } catch (const ConfigError& e) {
    throw CheckAbort("error", e.what());
  } catch (const toml::parse_error& e) {
    throw CheckAbort("error", fmt::format("student/{}:{}: {}", name, e.source().begin.line, e.description()));
  }
}

toml::table cases(const CheckContext& ctx) {
  return toml::parse_file((fs::path(ctx.lab.dir) / "configs" / "cases.toml").string());
}

EcosystemConfig mapping_of(const CheckContext& ctx, const std::string& file) {
  const std::string path = (fs::path(ctx.lab.dir) / "configs" / file).string();
  return file.size() > 5 && file.substr(file.size() - 5) == ".json" ? read_deepspeed_config(path) : read_fsdp_config(path);
}

std::string stem(const std::string& file) { return fs::path(file).stem().string(); }

CheckResult fields_of(CheckContext& ctx, const std::string& file) {
  const EcosystemConfig e = mapping_of(ctx, file);
  std::map<std::string, std::set<std::string>> keys;  // field -> the keys it sets ("-": none)
  std::map<std::string, std::string> why;             // field -> what it became, for the feedback
  for (const MappedField& f : e.fields) {
    keys[f.field].insert(f.key.empty() ? "-" : f.key);
    why[f.field] = f.key.empty() ? f.setting : f.key + " = " + f.setting;
  }
  for (const SourcedSetting& s : e.settings)  // a field that sets two keys (betas: beta1 and beta2): either names it
    if (s.origin.rfind(e.file + ": ", 0) == 0 && keys.count(s.origin.substr(e.file.size() + 2))) keys[s.origin.substr(e.file.size() + 2)].insert(s.key);
  const toml::table a = answers(ctx, "annotations.toml");
  const toml::table* given = a[stem(file)]["fields"].as_table();
  CheckResult r;
  r.expected = fmt::format("each of the {} fields of configs/{} mapped to the distlab key it sets, or \"-\"", keys.size(), file);
  if (!given) {
    r.seen = fmt::format("annotations.toml has no [{}.fields] table", stem(file));
    return r;
  }
  int right = 0;
  std::vector<std::string> wrong;
  for (const auto& [field, options] : keys) {
    const auto* v = given->get_as<std::string>(field);  // "zero_optimization.stage" = "...": a quoted key, dots and all
    const std::string answer = v ? v->get() : std::string("(missing)");
    if (options.count(answer)) {
      right++;
      continue;
    }
    wrong.push_back(fmt::format("{}: you wrote '{}'; it sets {} ({})", field, answer, fmt::join(options, " or "), why[field]));
  }
  for (auto&& [k, v] : *given)
    if (!keys.count(std::string(k.str()))) wrong.push_back(fmt::format("{}: not a field of configs/{}", k.str(), file));
  r.passed = wrong.empty();
  r.seen = fmt::format("{} of {} fields right", right, keys.size());
  for (size_t i = 0; i < wrong.size() && i < 6; i++) r.detail += (i ? "\n" : "") + wrong[i];
  if (wrong.size() > 6) r.detail += fmt::format("\n... and {} more", wrong.size() - 6);
  if (!r.passed) r.hint = fmt::format("`distlab train configs/gpt-1b.toml --device meta --set train.steps=1 {} labs/09-configs-plan/configs/{}` "
                                      "prints each field with what it became", file.find(".json") != std::string::npos ? "--deepspeed" : "--fsdp-config", file);
  return r;
}

// One step of the model with the config on the fake world: the peak memory per GPU, in GiB.
double measured_peak_gib(CheckContext& ctx, const std::string& file, const std::string& model, int64_t ranks) {
  return ctx.shared.get<double>("engine:lab09 peak:" + file, [&] {  // the lab's own config: the batch's
    const std::string tmpl = make_scratch_dir(ctx.paths, "lab09");
    const std::string metrics = (fs::path(tmpl) / "m.jsonl").string();
    const std::string cfg = (fs::path(ctx.lab.dir) / "configs" / file).string();
    std::vector<std::string> argv = {ctx.paths.self_exe, "train", (fs::path(ctx.paths.source_dir) / model).string(), "--device", "meta",
                                     "--set", fmt::format("dist.fake_world_size={}", ranks), "--set", "train.steps=1",
                                     file.find(".json") != std::string::npos ? "--deepspeed" : "--fsdp-config", cfg, "--metrics", metrics};
    SpawnOptions o;
    const RunResult r = run_to_end(argv, o, std::max(10.0, ctx.seconds_left()), 3000);
    double peak = -1;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("kind", "") == "summary") peak = j.value("peak_memory_total", -1.0);
    }
    std::error_code ec;
    fs::remove_all(tmpl, ec);
    if (r.timed_out || !WIFEXITED(r.status) || WEXITSTATUS(r.status) != 0 || peak < 0)
      throw CheckAbort("error", fmt::format("the reference run of configs/{} failed:\n{}", file, r.output));
    return peak / double(1ll << 30);
  });
}

CheckResult memory_predictions(CheckContext& ctx) {
  const toml::table c = cases(ctx), a = answers(ctx, "annotations.toml");
  CheckResult r;
  r.expected = "each config's peak memory per GPU predicted within 10 %";
  int right = 0, n = 0;
  std::vector<std::string> lines;
  for (auto&& node : *c["config"].as_array()) {
    const toml::table& t = *node.as_table();
    const std::string file = t["file"].value_or(std::string()), model = t["model"].value_or(std::string());
    const int64_t ranks = t["ranks"].value_or(int64_t(8));
    const double truth = measured_peak_gib(ctx, file, model, ranks);
    const auto guess = a[stem(file)]["peak_gib"].value<double>();
    n++;
    const bool ok = guess && *guess > 0 && std::abs(*guess - truth) <= 0.10 * truth;
    right += ok;
    lines.push_back(fmt::format("{}: predicted {}, measured {:.2f} GiB{}", file, guess ? fmt::format("{:.2f} GiB", *guess) : "nothing",
                                truth, ok ? "" : " (off by more than 10 %)"));
  }
  r.passed = right == n;
  r.seen = fmt::format("{} of {} within 10 %", right, n);
  for (const std::string& l : lines) r.detail += (r.detail.empty() ? "" : "\n") + l;
  if (!r.passed)
    r.hint = "per GPU: the model state (params, grads, optimizer: 16 bytes/param in bf16 + AdamW) divided as the stage shards it, "
             "minus what offload moves to the host, plus the activations of one micro-batch; chapter 6 and 7 have the numbers";
  return r;
}

// the decision tree's rung in the words the answers use
std::string pick_word(const std::string& recommendation) {
  if (recommendation == "DDP") return "ddp";
  if (recommendation == "ZeRO-1") return "zero1";
  if (recommendation == "ZeRO-2") return "zero2";
  if (recommendation == "FSDP" || recommendation == "ZeRO-3") return "fsdp";
  if (recommendation == "FSDP + sel. AC") return "fsdp+selective";
  if (recommendation == "FSDP + full AC") return "fsdp+full";
  if (recommendation == "FSDP + offload") return "fsdp+offload";
  if (recommendation == "FSDP+offload+AC") return "fsdp+offload+full";
  return "none";
}

CheckResult decision_tree(CheckContext& ctx) {
  const toml::table c = cases(ctx), a = answers(ctx, "decisions.toml");
  CheckResult r;
  r.expected = "for each case, the strategy of the decision tree (ddp, zero2, fsdp, fsdp+selective, fsdp+full, fsdp+offload, "
               "fsdp+offload+full, or none: more GPUs / 3D)";
  int right = 0, n = 0;
  for (auto&& node : *c["case"].as_array()) {
    const toml::table& t = *node.as_table();
    const std::string id = t["id"].value_or(std::string()), model = t["model"].value_or(std::string()),
                      mem = t["gpu_mem"].value_or(std::string());
    const int64_t gpus = t["gpus"].value_or(int64_t(1));
    const nlohmann::json& plan = ctx.shared.get<nlohmann::json>("engine:lab09 plan:" + id, [&] {  // plan's pick: the batch's
      SpawnOptions o;
      const RunResult run = run_to_end({ctx.paths.self_exe, "plan", "--model", model, "--gpus", std::to_string(gpus), "--gpu-mem", mem, "--json"},
                                       o, std::max(10.0, ctx.seconds_left()), 200000);
      auto parsed = nlohmann::json::parse(run.output.substr(std::min(run.output.size(), run.output.find('{'))), nullptr, false);
      if (!parsed.is_object() || !parsed.contains("decision_tree"))
        throw CheckAbort("error", fmt::format("distlab plan failed for case {}:\n{}", id, run.output.substr(0, 2000)));
      return parsed;
    });
    const toml::table* chosen = a["cases"].as_table();
    const auto* v = chosen ? chosen->get_as<std::string>(id) : nullptr;
    std::string answer = v ? v->get() : std::string("(missing)");
    for (char& ch : answer) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (answer == "zero3") answer = "fsdp";
    // the course's decision tree (plan's "decision_tree"), not plan's recommendation (the fastest row that
    // fits, a modeled time a student cannot derive by hand)
    const std::string want = pick_word(plan["decision_tree"].get<std::string>());
    n++;
    if (answer == want) {
      right++;
      continue;
    }
    r.detail += fmt::format("{}{} ({} on {} x {}): you chose '{}'; the tree gives {}: {}", r.detail.empty() ? "" : "\n", id, model, gpus, mem,
                            answer, want, plan.value("decision_tree_reason", std::string()));
  }
  r.passed = right == n;
  r.seen = fmt::format("{} of {} cases", right, n);
  if (!r.passed)
    r.hint = "walk the tree from the top: does a whole replica fit? then ZeRO-2, then FSDP, then FSDP with activation checkpointing "
             "(selective, then full), then offload (then offload with full checkpointing); `distlab plan` shows every row";
  return r;
}

}  // namespace checks09

std::map<std::string, CheckDef> lab09_checks() {
  using namespace checks09;
  return {
      {"fields_ds_zero2_offload", {[](CheckContext& c) { return fields_of(c, "ds_zero2_offload.json"); }, true}},
      {"fields_ds_zero3", {[](CheckContext& c) { return fields_of(c, "ds_zero3.json"); }, true}},
      {"fields_accelerate_fsdp", {[](CheckContext& c) { return fields_of(c, "accelerate_fsdp.yaml"); }, true}},
      {"memory_predictions", {memory_predictions, true}},
      {"decision_tree", {decision_tree, true}},
  };
}

}  // namespace distlab::grader
