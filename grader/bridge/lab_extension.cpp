#include "grader/bridge/lab_extension.h"

#include <fmt/format.h>

#include <algorithm>

#include <filesystem>
#include <ostream>

#include "core/parallel/gpt_parallel.h"
#include "core/util/error.h"

namespace distlab {

LabExtension::LabExtension(std::unique_ptr<LabPlugin> plugin) : plugin_(std::move(plugin)) {}

void LabExtension::check_run(const RunConfig& cfg, const MeshShape& mesh, const Runtime& rt) {
  const std::string& lab = name();
  if (mesh.tp > 1 || mesh.pp > 1) {
    const std::string split = fmt::format("parallel.tp {} x parallel.pp {}", mesh.tp, mesh.pp);
    if (!plugin_->is("06"))
      throw ConfigError(fmt::format("{} in lab {}: the lab's hooks see whole layers on one stage", split, lab),
                        "run the lab without parallel.tp and parallel.pp");
    if (mesh.pp > 1 && cfg.parallel.schedule != PipeSchedule::one_f_one_b)
      throw ConfigError(fmt::format("parallel.schedule {} in lab {}: the lab's schedule is 1F1B", cfg.parallel.schedule, lab),
                        "set parallel.schedule = \"1f1b\" (the engine's GPipe runs without the lab: lab.plugin = \"none\")");
    if (cfg.parallel.strategy != StrategyKind::none && cfg.parallel.strategy != StrategyKind::ddp)
      throw ConfigError(fmt::format("parallel.strategy {} in lab {}: the lab's dp_sync drives DDP", cfg.parallel.strategy, lab),
                        "set parallel.strategy = \"ddp\"");
  }
  if (plugin_->is("06") && mesh.tp == 1 && mesh.pp == 1)
    throw ConfigError(fmt::format("lab {} with parallel.tp 1 and parallel.pp 1: none of the lab's code would run", lab),
                      "set parallel.tp (and parallel.pp) > 1, e.g. --set parallel.tp=2 on two ranks");
  if (plugin_->is("06") && rt.is_meta())
    throw ConfigError(fmt::format("lab {} on the meta device: the lab's layers compute real numbers", lab), "train on the cpu device");
  if (plugin_->is("02") && cfg.parallel.strategy == StrategyKind::ddp && cfg.precision.mode != "fp32")
    throw ConfigError(fmt::format("precision.mode {} with lab {}'s DDP: the lab's API exchanges f32 gradients", cfg.precision.mode, lab),
                      "run the lab in fp32 (its default); mixed precision is lab 03's subject");
  if (plugin_->is("04") && cfg.parallel.offload == OffloadTo::cpu && cfg.parallel.strategy == StrategyKind::zero2)
    throw ConfigError("parallel.offload = \"cpu\" with lab 04's ZeRO-2: the lab's strategy keeps its parts on the device",
                      "run the lab without offload; offload is lab 05's subject");
  if (plugin_->is("05") && cfg.parallel.strategy == StrategyKind::fsdp && cfg.parallel.sharding != Sharding::no_shard && cfg.parallel.wrap_min_params > 0)
    throw ConfigError("parallel.wrap_min_params with lab 05's FSDP", "the lab's hooks see one unit per model unit: leave it at 0");
}

std::shared_ptr<Sampler> LabExtension::make_sampler(const RunConfig& cfg, int64_t n, int world, int rank) {
  if (plugin_->is("02") && cfg.parallel.strategy == StrategyKind::ddp) return plugin_->make_sampler(n, world, rank, cfg.train.seed, cfg.train.shuffle);
  return nullptr;
}

void LabExtension::on_model(Model& model, Runtime& rt, Mesh* mesh, int64_t micro_batches) {
  // what the plugin may send at once: a few copies of every parameter (a bucket, a flat's parts, a State)
  uint64_t params = 0;
  for (Parameter* p : model.parameters()) params += uint64_t(p->data.numel());
  plugin_->limit_messages(64 * params + (uint64_t(16) << 20));
  if (!plugin_->is("06") || !mesh) return;
  const MeshShape& shape = mesh->shape();
  if (shape.pp > 1) executor_ = plugin_->pipeline_executor();  // the student's 1F1B executor for this stage
  if (shape.tp > 1) {  // the student's column- and row-parallel layers in every block
    auto* gpt = dynamic_cast<GPT*>(&model);
    if (!gpt) throw ConfigError(fmt::format("parallel.tp {} in lab {} with a model that is not GPT", shape.tp, name()), "the lab's tensor parallelism splits GPT");
    tp_ = plugin_->make_tp_kernels(rt);
    set_tp_kernels(*gpt, tp_.get());
  }
}

static uint64_t unit_seed(const RunConfig& cfg);      // lab.unit_seed (below)
static int64_t gather_budget(const RunConfig& cfg);  // lab.gather_budget (below)

std::unique_ptr<Strategy> LabExtension::make_strategy(const RunConfig& cfg, ProcessGroup& dp, Model& model, Runtime& rt) {
  const StrategyKind st = cfg.parallel.strategy;
  if (plugin_->is("02") && st == StrategyKind::ddp) return plugin_->make_ddp(std::string(name_of(cfg.parallel.ddp_mode)), dp, model, rt, cfg.parallel.bucket_mb);
  if (plugin_->is("04") && st == StrategyKind::zero1) return plugin_->make_zero(1, dp, model, rt, cfg.optim.clip_grad_norm);
  if (plugin_->is("04") && st == StrategyKind::zero2) return plugin_->make_zero(2, dp, model, rt, cfg.optim.clip_grad_norm);
  if (plugin_->is("05") && st == StrategyKind::fsdp && cfg.parallel.sharding != Sharding::no_shard)
    return plugin_->make_fsdp(dp, model, rt, std::string(name_of(cfg.parallel.sharding)), cfg.parallel.prefetch, cfg.parallel.offload == OffloadTo::cpu,
                              unit_seed(cfg), gather_budget(cfg));
  return nullptr;  // the engine's
}

void LabExtension::describe(std::ostream& log) const {
  if (executor_) log << "  this stage runs the lab's train_step_1f1b (the order it ran: lab_pipeline_order in the run's summary)\n";
}

void LabExtension::report(nlohmann::json& rank) const {
  rank["lab_largest_all_reduce_bytes"] = plugin_->largest_all_reduce_bytes();  // lab 02's bucket check
  rank["plugin_memory"] = plugin_->memory_report();                              // what the plugin's own process held
  if (executor_) rank["lab_pipeline_order"] = plugin_->pipeline_ran();          // lab 06: this stage's last step
}

ConfigExtras lab_config_sections() {
  ConfigExtras x;
  x.tables["lab"] = {{"title", "the lab's title"},
                     {"files", "the files a student writes"},
                     {"kind", "how the grader runs it"},
                     {"ranks", "the ranks its checks use"},
                     {"plugin", "labs: the student's compiled code (default: the build of student/; none: the engine's)"},
                     {"sandbox", "labs: the plugin's process runs in bubblewrap: auto | require | off"},
                     {"unit_seed", "lab 05: the unit numbers the plugin sees are drawn from it, not the model's order (default: from train.seed; "
                                   "the grader draws one per grading)"},
                     {"gather_budget", "lab 05: the elements the plugin's gathered weights may hold at once (0: no budget; the grader "
                                       "draws one for the prefetch_budget check)"},
                     {"memory_cgroup", "labs: a memory cgroup folder in which each rank's plugin gets a cgroup of its own, so that "
                                       "all it holds is measured (the grader sets it)"}};
  x.ignored_arrays = {"check"};  // the grader's checks
  return x;
}

// lab.unit_seed: what lab 05's unit numbers are drawn from (the grader draws it per grading); unset, from
// train.seed, so a student's own runs number the units out of order too
static uint64_t unit_seed(const RunConfig& cfg) {
  const auto it = cfg.extra.find("lab.unit_seed");
  if (it == cfg.extra.end()) return cfg.train.seed * 0x9E3779B97F4A7C15ULL + 5;
  const std::string& v = it->second;
  if (v.empty() || v.size() > 20 || v.find_first_not_of("0123456789") != std::string::npos)
    throw ConfigError(fmt::format("{}: lab.unit_seed is '{}'", cfg.origin.count("lab.unit_seed") ? cfg.origin.at("lab.unit_seed") : cfg.source, v),
                      "a whole number (0 to 18446744073709551615)");
  try {
    return std::stoull(v);
  } catch (const std::exception&) {
    throw ConfigError(fmt::format("lab.unit_seed {} is past 18446744073709551615", v), "a smaller whole number");
  }
}

// lab.gather_budget: lab 05's Options::gather_budget, in elements (0 or unset: none)
static int64_t gather_budget(const RunConfig& cfg) {
  const auto it = cfg.extra.find("lab.gather_budget");
  if (it == cfg.extra.end()) return 0;
  const std::string& v = it->second;
  if (v.empty() || v.size() > 15 || v.find_first_not_of("0123456789") != std::string::npos)
    throw ConfigError(fmt::format("{}: lab.gather_budget is '{}'", cfg.origin.count("lab.gather_budget") ? cfg.origin.at("lab.gather_budget") : cfg.source, v),
                      "a whole number of elements (0: no budget), below 10^15");
  return std::stoll(v);
}

std::string lab_name(const RunConfig& cfg) {
  const auto& s = cfg.extra_sections;
  if (std::find(s.begin(), s.end(), "lab") == s.end()) return "";
  return std::filesystem::path(cfg.source).parent_path().filename().string();
}

static std::string extra_value(const RunConfig& cfg, const std::string& key, const std::string& fallback) {
  auto it = cfg.extra.find(key);
  return it == cfg.extra.end() ? fallback : it->second;
}

std::unique_ptr<LabExtension> start_lab_extension(const RunConfig& cfg, const std::string& build_dir) {
  const std::string name = lab_name(cfg), plugin = extra_value(cfg, "lab.plugin", ""), sandbox = extra_value(cfg, "lab.sandbox", "auto");
  if (sandbox != "auto" && sandbox != "require" && sandbox != "off")
    throw ConfigError(fmt::format("{}: lab.sandbox is '{}'", cfg.origin.count("lab.sandbox") ? cfg.origin.at("lab.sandbox") : cfg.source, sandbox),
                      "use auto, require or off");
  if ((name.empty() && plugin.empty()) || plugin == "none") return nullptr;  // none: the engine's
  namespace fs = std::filesystem;
  const std::string path = !plugin.empty() ? plugin : (fs::path(build_dir) / "labs" / name / "student.so").string();
  if (!fs::is_regular_file(path))
    throw ConfigError(fmt::format("lab {}: the student's code is not built ({} is missing)", name, path),
                      fmt::format("run `distlab lab build {}` first", name.substr(0, 2)));
  LabPluginOptions o;
  o.host_exe = (fs::canonical("/proc/self/exe").parent_path() / "distlab-labhost").string();
  o.plugin = fs::absolute(path).string();
  o.lab_name = name.empty() ? fs::path(path).parent_path().filename().string() : name;
  o.sandbox = sandbox;
  o.timeout_s = cfg.dist.timeout_s;
  o.memory_cgroup = extra_value(cfg, "lab.memory_cgroup", "");
  if (!o.memory_cgroup.empty() && !fs::is_regular_file(fs::path(o.memory_cgroup) / "cgroup.procs"))
    throw ConfigError(fmt::format("{}: lab.memory_cgroup = {} is not a cgroup folder (it has no cgroup.procs)",
                                  cfg.origin.count("lab.memory_cgroup") ? cfg.origin.at("lab.memory_cgroup") : cfg.source, o.memory_cgroup),
                      "leave it unset: the grader sets it for its own jobs");
  return std::make_unique<LabExtension>(std::make_unique<LabPlugin>(o));
}

}  // namespace distlab
