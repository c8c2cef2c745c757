// A run's configuration: one TOML file (sections model, data, train, optim, parallel, precision, log) plus
// `--set section.key=value` overrides. Every key is declared once in config.cpp with its type, default and
// meaning (its checks against the others in validate.cpp); an unknown key, a wrong type or an impossible value is a ConfigError naming the key and where it
// was written (file:line, or --set). A key that takes one of a few names (parallel.strategy) is read once,
// here, into its enum (core/util/choice.h): past the config, the code compares enums, never strings.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "core/comm/device_group.h"
#include "core/data/registry.h"
#include "core/models/zoo.h"
#include "core/nn/lora.h"
#include "core/nn/qlora.h"
#include "core/optim/optimizer.h"
#include "core/optim/schedule.h"
#include "core/parallel/ddp.h"
#include "core/parallel/fsdp.h"
#include "core/parallel/offload.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/zero1.h"
#include "core/perf/eager.h"

namespace distlab {

struct TrainOptions {
  int64_t micro_batch = 128;   // samples per rank per micro-step
  int64_t global_batch = 0;    // when > 0: micro_batch = global_batch / (world · accum_steps)
  int64_t accum_steps = 1;     // micro-steps per optimizer step
  int64_t epochs = 1;          // used when steps == 0
  int64_t steps = 0;           // optimizer steps; 0 = epochs · batches per epoch / accum_steps
  int64_t eval_every = 0;      // evaluate every N steps (0: at the end only)
  int64_t eval_batches = 0;    // batches of the test set per evaluation (0: all)
  int64_t log_every = 50;      // progress line every N steps
  uint64_t seed = 0;
  int64_t threads = 0;         // BLAS/OpenMP threads per rank (0: cores / local ranks)
  bool shuffle = true;
  bool drop_last = true;
  // How data-parallel ranks read the train set. distributed: a DistributedSampler, each rank its 1/N.
  // plain: every rank reads the whole set in one shared order, as a DataLoader without a
  // DistributedSampler does -- the bug lab 08 and quiz 7.3 show (the same curve as one rank, no speed-up).
  std::string sampler = "distributed";
  bool set_epoch = true;       // false: every epoch reuses epoch 0's order (the forgotten set_epoch)
  std::string device = "cpu";  // cpu | meta
  std::string device_mem;      // simulated device capacity: "16GiB" or a profile name; "" = unlimited
};

struct OptimOptions {
  OptimizerKind name = OptimizerKind::sgd;
  double lr = 0.1;
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip_grad_norm = 0.0;  // 0 = no clipping
  LrSchedule schedule = LrSchedule::constant;
  int64_t warmup_steps = 0, step_size = 1;
  double gamma = 0.1, min_lr = 0.0;
};

struct ParallelOptions {
  StrategyKind strategy = StrategyKind::none;
  DdpMode ddp_mode = DdpMode::bucketed;
  double bucket_mb = 25.0;
  bool sync_batchnorm = false;       // BatchNorm statistics over all ranks (SyncBatchNorm)
  ZeroReduce zero_reduce = ZeroReduce::reduce_scatter;  // zero1: all_reduce = all-reduce, then slice
  bool prefetch = true;
  bool forward_prefetch = true;  // with prefetch: in forward too (PyTorch FSDP's forward_prefetch)
  int64_t prefetch_depth = 1;    // with prefetch: the units gathered ahead (1: the next one)
  Sharding sharding = Sharding::full_shard;  // fsdp (no_shard = DDP)
  OffloadTo offload = OffloadTo::none;       // zero2, zero3, fsdp
  int64_t wrap_min_params = 0;          // zero3, fsdp: consecutive units share a flat vector up to this size (0: per unit)
  // The device mesh (core/parallel/mesh.h): world = dp × cp × tp × pp; 0 = what the others leave (all 0:
  // dp = world / cp). cp: context parallel, the sequence split over cp ranks (core/parallel/context_parallel.h)
  int64_t dp = 0, tp = 1, pp = 1, cp = 1;
  // pipeline (pp > 1, core/parallel/pipeline.h): micro-batches per optimizer step (0: 4 x pp), their order,
  // and the blocks each stage holds (empty: n_layer / pp each)
  int64_t micro_batches = 0;
  PipeSchedule schedule = PipeSchedule::one_f_one_b;
  std::vector<int64_t> pp_layers;
};

struct DistOptions {
  double timeout_s = 300.0;  // a collective some rank never joins fails after this
  // "gloo" (host memory; a cuda rank's flat buffers cross to the host and back) or "nccl" (a cuda rank's
  // DDP buckets and ZeRO/FSDP reduce-scatters and all-gathers run on the GPU: core/comm/device_group.h)
  CommBackend backend = CommBackend::gloo;
  // --device meta only: run rank 0 of a job of this many ranks over a process group that moves no data
  // but traces and counts every collective (planning; 0 = off)
  int64_t fake_world_size = 0;
  int64_t fake_ranks_per_node = 0;  // the fake world's nodes: a collective over more ranks crosses nodes (0 = one node)
};

// Mixed precision: PyTorch's autocast + GradScaler, DeepSpeed's fp16/bf16 sections (core/ops/autocast.h,
// core/optim/grad_scaler.h).
struct PrecisionOptions {
  std::string mode = "fp32";     // fp32 | bf16 | fp16: what parameters, gradients and activations are held in
  std::string reduce_dtype = "fp32";  // fp32 | bf16 | fp16: what gradients travel in when averaged across ranks
  std::string loss_scale;        // dynamic | none | a number (static); "" = dynamic for fp16, none otherwise
  double init_scale = 65536.0;   // torch.cuda.amp.GradScaler's defaults
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 1;        // DeepSpeed's: overflows tolerated before the scale backs off
  double min_scale = 1.0;        // DeepSpeed's min_loss_scale: an overflow at this scale stops the run
  std::string effective_loss_scale() const { return !loss_scale.empty() ? loss_scale : mode == "fp16" ? "dynamic" : "none"; }
};

struct LogOptions {
  std::string metrics;  // JSON Lines file ("" = none)
  std::string profile;  // hardware profile for the modeled time ("" = none): t4-pcie, a100-nvlink, h100-nvlink, h100-96g, h100-pcie, h200, cpu
  std::string trace;    // Chrome trace file of one step ("" = none)
  int64_t trace_step = 2;  // which step (1-based) is traced and modeled
  bool calibrated = true;  // false: kernels at the data sheet's peak (hardware.h's at_peak)
  ModeledKernels kernels = ModeledKernels::fused;  // eager: PyTorch's unfused op chains; compiled: torchtitan's per-block torch.compile (core/perf/eager.h)
  std::vector<std::string> fused_ops;  // op families that run fused all the same (a Triton kernel the model calls): rmsnorm, rope, swiglu, loss, adamw
};

// Checkpoints (core/ckpt/checkpoint.h): DIR/step-000100/ holds every rank's part of the training state.
struct CheckpointOptions {
  std::string dir;              // "" = no checkpoints
  int64_t every = 0;            // save every N optimizer steps (0: only at the end, and on SIGTERM)
  int64_t keep = 2;             // complete checkpoints kept (the oldest deleted once a newer one is complete; 0 = all)
  std::string resume = "auto";  // auto (the latest complete one in dir, if any) | never | a step folder
  double disk_gbps = 2.0;       // the storage's write bandwidth per node, GB/s, for the modeled save time
};

// Sections another program adds to a config file, which a run keeps for it and never reads: a lab's [lab]
// table and [[check]] list (grader/bridge/lab_extension.h declares them). The caller that loads the file
// passes them; a section nobody declared is still an error, so a typo ([trian]) never passes silently.
struct ConfigExtras {
  std::map<std::string, std::map<std::string, std::string>> tables;  // section -> its keys -> what each means
  std::vector<std::string> ignored_arrays;                           // arrays of tables a run skips: "check"
};

struct RunConfig {
  std::string source;  // the file it came from
  // the keys of the caller's sections (ConfigExtras), as the file or a --set wrote them: "lab.plugin" ->
  // "build/labs/02-ddp-cifar/student.so" (strings as they are, other values as TOML text)
  std::map<std::string, std::string> extra;
  std::vector<std::string> extra_sections;  // which of them the file has ("lab" in a lab's lab.toml)
  ModelSpec model;
  DataSpec data;
  TrainOptions train;
  OptimOptions optim;
  ParallelOptions parallel;
  DistOptions dist;
  PrecisionOptions precision;
  LogOptions log;
  LoraSpec lora;  // [lora]: adapters and a frozen base (core/nn/lora.h)
  QuantSpec quantization;  // [quantization]: the frozen base in 4 bits, QLoRA (core/nn/qlora.h)
  CheckpointOptions checkpoint;
  std::map<std::string, std::string> origin;  // key -> "file:line" / "--set" / "default"
};

// A setting that comes from another file (a DeepSpeed JSON, an FSDP YAML: core/config/ecosystem.h): the key,
// its value as TOML would write it, and where it came from ("ds.json: zero_optimization.stage"), which
// errors name instead of "--set".
struct SourcedSetting {
  std::string key, value, origin;
};

// Reads `path` and applies the overrides ("train.steps=50"). Validates everything it can without data.
// `from_files` apply after the TOML and before the overrides (a --set still wins).
// `extras`: the sections another program adds (a lab's [lab]), kept in RunConfig::extra.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                      const std::vector<SourcedSetting>& from_files = {}, const ConfigExtras& extras = {});
// The same from TOML text (for tests); `name` stands for the file in messages.
RunConfig parse_config(const std::string& toml_text, const std::string& name, const std::vector<std::string>& overrides = {},
                       const std::vector<SourcedSetting>& from_files = {}, const ConfigExtras& extras = {});
// Checks every value against the others and against its bounds (validate.cpp); load_config and parse_config
// call it last. Throws ConfigError naming the key, where it was set and a hint.
void validate_config(const RunConfig& c);
// Every key's value, "key=value" one per line: ranks compare it to make sure they run the same config.
std::string config_fingerprint(const RunConfig& c);
// Every key's value by name (what a checkpoint's manifest records of the run that wrote it).
std::map<std::string, std::string> config_values(const RunConfig& c);
// Every declared key as "section.key  type  default  meaning", for `distlab train --help-config`; then
// the keys of `extras`' sections.
std::string config_reference(const ConfigExtras& extras = {});

}  // namespace distlab
