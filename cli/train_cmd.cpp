#include "cli/train_cmd.h"

#include <fmt/format.h>

#include <iostream>

#include "core/perf/hardware.h"
#include "core/train/trainer.h"
#include "core/util/error.h"

namespace distlab {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string metrics, init, save, save_dtype = "f32", device, device_mem;
  bool help_config = false;
};

int run_train(const TrainArgs& a) {
  if (a.help_config) {
    std::cout << "config keys (section.key  type  default  meaning):\n" << config_reference();
    return 0;
  }
  std::vector<std::string> sets = a.sets;
  if (!a.device.empty()) sets.push_back("train.device=" + a.device);
  if (!a.device_mem.empty()) sets.push_back("train.device_mem=" + a.device_mem);
  if (!a.metrics.empty()) sets.push_back("log.metrics=" + a.metrics);
  RunConfig cfg = load_config(a.config, sets);
  parse_dtype(a.save_dtype);
  Runtime rt(parse_device(cfg.train.device), 0);
  MetricsWriter metrics(cfg.log.metrics);
  try {
    Trainer trainer(cfg, rt, std::cout);
    trainer.run(metrics, TrainOutputs{a.init, a.save, a.save_dtype});
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
  sub->add_option("--save-dtype", args->save_dtype, "dtype of --save: f32 (default), bf16 or f16");
  sub->add_option("--device", args->device, "cpu (default) or meta (shapes, FLOPs and memory only)");
  sub->add_option("--device-mem", args->device_mem, "simulated device memory: a size (16GiB) or a profile (t4, a100-80g, h100, ...)");
  sub->add_flag("--help-config", args->help_config, "list every config key with its default");
  sub->callback([args, &exit_code, sub]() {
    if (args->config.empty() && !args->help_config) throw CLI::RequiredError("config");
    exit_code = run_train(*args);
  });
}

}  // namespace distlab
