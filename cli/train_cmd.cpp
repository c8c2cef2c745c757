#include "cli/train_cmd.h"
#include "cli/paths.h"

#include <fmt/format.h>

#include <dlfcn.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/comm/env.h"
#include "core/comm/error_file.h"
#include "core/comm/errors.h"
#include "core/util/atomic_file.h"
#include "core/comm/store.h"
#include "core/comm/tcp_store.h"
#include "core/comm/watchdog.h"
#include "core/ops/attach.h"
#include "core/perf/hardware.h"
#include "core/config/ecosystem.h"
#include "core/train/stop_signal.h"
#include "core/train/trainer.h"
#include "grader/bridge/lab_extension.h"
#include "core/util/error.h"

namespace distlab {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string metrics, init, save, save_dtype = "f32", device, device_mem, deepspeed, fsdp_config, init_adapter, save_adapter;
  bool help_config = false;
};

// Every rank must run the same config (the same file and overrides): rank 0 publishes it, the others compare.
void check_same_config(ProcessGroup& pg, const RunConfig& cfg) {
  const std::string mine = config_fingerprint(cfg);
  if (pg.rank() == 0) pg.store().set_string("config", mine);
  const std::string theirs = pg.store().get_string("config");
  if (theirs == mine) return;
  std::string diff;
  std::istringstream a(mine), b(theirs);
  for (std::string x, y; std::getline(a, x) && std::getline(b, y);)
    if (x != y) diff += fmt::format("\n  rank {}: {}   rank 0: {}", pg.rank(), x, y);
  throw ConfigError(fmt::format("rank {} runs a different config from rank 0:{}", pg.rank(), diff),
                    "every rank must get the same config file and --set overrides");
}

int run_train(const TrainArgs& a) {
  if (a.help_config) {
    std::cout << "config keys (section.key  type  default  meaning):\n" << config_reference(lab_config_sections());
    return 0;
  }
  std::vector<std::string> sets = a.sets;
  if (!a.device.empty()) sets.push_back("train.device=" + a.device);
  if (!a.device_mem.empty()) sets.push_back("train.device_mem=" + a.device_mem);
  if (!a.metrics.empty()) sets.push_back("log.metrics=" + a.metrics);
  // the ecosystem's config files: every field mapped to a key (or a note), after the TOML, before --set
  std::vector<EcosystemConfig> eco;
  if (!a.deepspeed.empty()) eco.push_back(read_deepspeed_config(a.deepspeed));
  if (!a.fsdp_config.empty()) eco.push_back(read_fsdp_config(a.fsdp_config));
  std::vector<SourcedSetting> from_files;
  for (const EcosystemConfig& e : eco) from_files.insert(from_files.end(), e.settings.begin(), e.settings.end());
  RunConfig cfg = load_config(a.config, sets, from_files, lab_config_sections());  // a lab's lab.toml too
  parse_float_dtype(a.save_dtype);
  // where the run will write, checked now rather than after the training
  check_output_path(cfg.log.metrics, "log.metrics (--metrics)");
  check_output_path(cfg.log.trace, "log.trace");
  check_output_path(a.save, "--save");
  if (!a.save_adapter.empty()) {  // a folder, made now: a run must not fail at its end on this
    std::error_code ec;
    std::filesystem::create_directories(a.save_adapter, ec);
    if (ec) throw IoError(fmt::format("--save-adapter: cannot create '{}': {}", a.save_adapter, ec.message()), "is its parent folder writable?");
    check_output_path((std::filesystem::path(a.save_adapter) / "adapter_config.json").string(), "--save-adapter");
  }
  // under `distlab run`: join the other ranks (rank 0 of 1 otherwise)
  const LaunchEnv env = read_launch_env();
  for (const EcosystemConfig& e : eco) {
    const int64_t world = cfg.dist.fake_world_size > 0 ? cfg.dist.fake_world_size : env.world_size;
    if (e.world_size > 0 && e.world_size != world)
      throw ConfigError(fmt::format("{}: num_processes says {} ranks, the run has {}", e.file, e.world_size, world),
                        fmt::format("start it with distlab run -n {} (or fix num_processes)", e.world_size));
    if (env.rank == 0) std::cout << describe_mapping(e);
  }
  // SIGTERM (the launcher's stop, a preemption) finishes the step and saves a checkpoint before exiting
  if (!cfg.checkpoint.dir.empty()) install_stop_handler();
  Runtime rt(parse_device(cfg.train.device), env.rank);
  // a GPU rank (cuda, or cuda-sim on the CPU): its context, memory and kernels, outliving every tensor
  std::unique_ptr<AttachedDevice> gpu = attach_device(rt, cfg.train.device, env.local_rank);
  // ends this rank if its launcher dies or stays stopped past the collective timeout
  LauncherWatchdog watchdog(env.launcher_pid, Millis(int64_t(cfg.dist.timeout_s * 1000)), fmt::format("rank {}", env.rank));
  std::unique_ptr<TcpStoreServer> own_store = serve_store_if_first(env);  // `srun -n N distlab train`: rank 0 serves
  std::unique_ptr<TcpStore> store;
  std::unique_ptr<MemoryStore> own_memory_store;  // a single process's group of one
  std::unique_ptr<ProcessGroup> pg;
  // a single launched rank on meta plans alone (the fake world, or no group): a real group moves no meta data
  const bool meta_alone = env.world_size == 1 && rt.is_meta();
  if (env.world_size > 1 || (env.launched && cfg.parallel.strategy != StrategyKind::none && !meta_alone)) {
    const Millis timeout(int64_t(cfg.dist.timeout_s * 1000));
    store = connect_store(env, timeout);
    ProcessGroupOptions po = options_from_env(timeout);
    po.host = local_address_for(env.master_addr);
    pg = std::make_unique<ProcessGroup>(*store, env.rank, env.world_size, po, &rt.trace);
    check_same_config(*pg, cfg);
  } else if (cfg.dist.fake_world_size > 0) {  // one rank of a planned job: the Trainer checks it is on meta
    pg = std::make_unique<ProcessGroup>(ProcessGroup::Fake{}, 0, int(cfg.dist.fake_world_size), &rt.trace);
  } else if (cfg.parallel.strategy != StrategyKind::none) {
    // One process with a strategy (DeepSpeed's ZeRO-Offload on one GPU is its headline use): the strategy
    // runs on a group of one, its shards whole and its offload real, as `distlab run -n 1` runs it. On meta
    // (planning) a fake world of one records what it would do.
    if (rt.is_meta()) {
      pg = std::make_unique<ProcessGroup>(ProcessGroup::Fake{}, 0, 1, &rt.trace);
    } else {
      const Millis timeout(int64_t(cfg.dist.timeout_s * 1000));
      own_memory_store = std::make_unique<MemoryStore>(timeout);
      ProcessGroupOptions po = options_from_env(timeout);
      po.host = "127.0.0.1";
      pg = std::make_unique<ProcessGroup>(*own_memory_store, 0, 1, po, &rt.trace);
    }
  }
  const bool rank0 = env.rank == 0;
  MetricsWriter metrics(rank0 ? cfg.log.metrics : "");
  std::ostringstream quiet;  // ranks other than 0 don't print progress
  try {
    // a lab's config: the student's code behind the trainer's extension points (grader/bridge/lab_extension.h)
    std::unique_ptr<LabExtension> lab = start_lab_extension(cfg, tree_build_dir());
    if (lab && rank0) std::cout << "lab " << lab_name(cfg) << ": running the student's code\n";
    Trainer trainer(cfg, rt, rank0 ? static_cast<std::ostream&>(std::cout) : quiet, pg.get(), lab.get());
    // a progress bar where a person watches (rank 0's stdout is a terminal), plain lines elsewhere, as tqdm
    // does; DISTLAB_PROGRESS=bar|lines decides instead
    const char* progress = std::getenv("DISTLAB_PROGRESS");
    trainer.show_progress_bar(rank0 && (progress ? std::string(progress) == "bar" : isatty(1) != 0));
    // the live MFU's peak: the GPU's own profile (by its name, as torchtitan reads it), else log.profile when
    // it names the hardware the rank runs on (cpu on the CPU); a GPU profile on the CPU stays a model
    std::optional<HardwareProfile> hw;
    if (gpu && cfg.train.device == "cuda") hw = profile_for_gpu(gpu->describe());
    const bool profile_is_here = cfg.log.profile == "cpu" ? cfg.train.device == "cpu" : cfg.train.device == "cuda";  // not cuda-sim's CPU
    if (!hw && !cfg.log.profile.empty() && profile_is_here) hw = find_profile(cfg.log.profile);
    if (hw && !rt.is_meta()) {
      const bool low = rt.dtype != DType::f32;
      trainer.set_live_peak(low ? hw->low_precision_flops_per_s : hw->fp32_flops_per_s, hw->name + (low ? " 16-bit" : " fp32"));
    }
    const nlohmann::json summary = trainer.run(metrics, TrainOutputs{a.init, a.save, a.save_dtype, a.init_adapter, a.save_adapter});
    if (summary.value("interrupted", false)) {  // the metrics stay .partial: the run is not over
      // for the launcher: the rank that was sent SIGTERM is the one to name, the others stopped with it
      const int sent_to = summary.value("stop_rank", -1);
      record_worker_stop(sent_to >= 0 ? fmt::format("rank {} was sent SIGTERM: every rank saved and stopped (exit 143)", sent_to)
                                      : "SIGTERM: every rank saved and stopped (exit 143)",
                         sent_to >= 0 && sent_to != env.rank);
      return 128 + SIGTERM;
    }
    metrics.finish();
  } catch (const Error& e) {
    metrics.fail(e.what());
    throw;
  } catch (const std::exception& e) {
    metrics.fail(e.what());
    throw;
  }
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand("train", "train a model from a TOML config on this rank");
  sub->add_option("config", args->config, "the run's TOML file (configs/ has examples)");
  sub->add_option("--set", args->sets, "override a config key: --set train.steps=50 (repeatable)");
  sub->add_option("--metrics", args->metrics, "write JSON Lines metrics to FILE (same as --set log.metrics=FILE)");
  sub->add_option("--init", args->init, "load model weights from FILE.safetensors before training");
  sub->add_option("--save", args->save, "write model weights to FILE.safetensors after training");
  sub->add_option("--save-dtype", args->save_dtype, "dtype of --save and --save-adapter: f32 (default), bf16 or f16");
  sub->add_option("--init-adapter", args->init_adapter, "load LoRA adapters from PEFT's folder DIR (adapter_config.json, adapter_model.safetensors)");
  sub->add_option("--save-adapter", args->save_adapter, "write the LoRA adapters as PEFT's folder DIR after training (PeftModel.from_pretrained reads it)");
  sub->add_option("--device", args->device, "cpu (default), meta (shapes, FLOPs and memory only), cuda (a GPU per rank) or cuda-sim (the GPU path on the CPU)");
  sub->add_option("--device-mem", args->device_mem, "simulated device memory: a size (16GiB) or a profile (t4, a100-80g, h100, ...)");
  sub->add_option("--deepspeed", args->deepspeed, "read a DeepSpeed JSON config: zero_optimization, fp16/bf16, batch sizes, ... mapped to distlab's keys");
  sub->add_option("--fsdp-config", args->fsdp_config, "read an FSDP config (accelerate's YAML, or Trainer-style fsdp: full_shard auto_wrap) mapped to distlab's keys");
  sub->add_flag("--help-config", args->help_config, "list every config key with its default");
  sub->callback([args, &exit_code, sub]() {
    if (args->config.empty() && !args->help_config) throw CLI::RequiredError("config");
    exit_code = run_train(*args);
  });
}

}  // namespace distlab
