// The run's assembly, in the order each part needs the last (torchtitan's build, then parallelize):
//   the mesh (dp × tp × pp) and the checks of what composes → the data and the batch sizes → the model
//   (this rank's stage and slices) → the pipeline → an extension's layers → the device backends → the
//   strategy (make_strategy, core/train/strategies.h) → the optimizer on what the strategy says it steps →
//   the device's capacity → the lr schedule.
// The keys were checked at load (core/config/config.cpp); what can only be checked against the data, the
// world or the device is checked here, before anything runs. The loop that runs it is trainer.cpp.
#include <fmt/format.h>

#include <thread>

#include "core/data/registry.h"
#include "core/comm/device_group.h"
#include "core/parallel/gpt_parallel.h"
#include "core/models/peft.h"
#include "core/models/zoo.h"
#include "core/perf/hardware.h"
#include "core/train/strategies.h"
#include "core/train/trainer.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

// [lora] as it applies to this run: what composes with it so far, and PEFT's default targets
static LoraSpec lora_spec(const RunConfig& cfg, const MeshShape& shape) {
  LoraSpec s = cfg.lora;
  const std::string at = cfg.origin.count("lora.r") ? cfg.origin.at("lora.r") : "lora.r";
  const StrategyKind k = cfg.parallel.strategy;
  if ((k == StrategyKind::zero3 || k == StrategyKind::fsdp) && cfg.quantization.on())
    throw ConfigError(fmt::format("{}: QLoRA (quantization.bits = 4) under parallel.strategy = {}: sharding 4-bit weights is not in this engine",
                                  at, name_of(k)),
                      "QLoRA runs over none, ddp, zero1 or zero2 (every rank holds the 4-bit base whole); LoRA on a 16-bit base shards under zero3 and fsdp");
  if (shape.tp > 1 && cfg.quantization.on())
    throw ConfigError(fmt::format("{}: QLoRA (quantization.bits = 4) with parallel.tp = {}: splitting 4-bit weights is not in this engine", at, shape.tp),
                      "QLoRA runs over data parallelism (every rank holds the 4-bit base whole); LoRA on a 16-bit base splits with parallel.tp");
  if (shape.pp > 1)
    throw ConfigError(fmt::format("{}: LoRA with parallel.pp = {}: adapters on pipeline stages are not in this engine", at, shape.pp),
                      "LoRA runs over data parallelism (none, ddp, zero1/2/3, fsdp) and tensor parallelism (parallel.tp)");
  if (s.dropout > 0 && cfg.model.checkpointing == Checkpointing::selective_op)
    throw ConfigError(fmt::format("lora.dropout {} with train.activation_checkpointing = selective_op: the op-level recompute keeps no dropout "
                                  "masks",
                                  s.dropout),
                      "set lora.dropout = 0, or use full checkpointing (its replay draws the same masks)");
  if (s.target_modules.empty()) {  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    if (cfg.model.name == "llama") s.target_modules = {"q_proj", "v_proj"};
    else if (cfg.model.name == "gpt") s.target_modules = {"c_attn"};
    else
      throw ConfigError(fmt::format("lora.target_modules is empty for model.name = \"{}\": PEFT has no default for it", cfg.model.name),
                        "name the Linear layers, e.g. lora.target_modules = [\"fc1\", \"fc2\"], or \"all-linear\"");
  }
  return s;
}

static int default_threads() {
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v && std::atoi(v) > 0) return std::atoi(v);  // set by distlab run
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

Trainer::Trainer(const RunConfig& cfg, Runtime& rt, std::ostream& log, ProcessGroup* pg, TrainerExtension* ext)
    : cfg_(cfg), rt_(rt), log_(log), pg_(pg), ext_(ext), scaler_(loss_scale_options(cfg.precision)) {
  // the device mesh: the data is split over the dp axis, the sequence over cp, the model over tp (and pp); the
  // strategy reduces gradients over dp x cp
  const MeshShape shape = resolve_mesh(world(), cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.cp);
  dp_ = grad_ = pg;
  accum_ = cfg.train.accum_steps;
  if (ext_) ext_->check_run(cfg, shape, rt);  // what the extension cannot serve, before anything is built
  if (shape.tp > 1 || shape.pp > 1 || shape.cp > 1) {
    check_strategy_composes(cfg, shape);  // ZeRO-2/3 and FSDP reduce during the backward: not with stages
    if (shape.pp > 1) accum_ = cfg.parallel.micro_batches > 0 ? cfg.parallel.micro_batches : 4 * int64_t(shape.pp);
    mesh_ = std::make_unique<Mesh>(*pg, shape);
    dp_ = &mesh_->group(MeshAxis::dp);
    grad_ = &mesh_->group(MeshAxis::dp_cp);  // a CP group's ranks hold the same weights: their gradients join dp's
  }
  if (shape.cp > 1) {
    if (rt.device != DeviceKind::cpu && !rt.is_meta())
      throw ConfigError(fmt::format("parallel.cp {} on device {}: ring attention's block kernels are written for the CPU only", shape.cp,
                                    device_name(rt.device)),
                        "run context parallelism with --device cpu (or plan it with --device meta)");
    ring_ = std::make_unique<RingAttention>(mesh_->group(MeshAxis::cp));
  }
  // the fake world first: on a real device its N ranks were never started (not "N ranks were started")
  if (pg && pg->is_fake() && !rt.is_meta())
    throw ConfigError(fmt::format("dist.fake_world_size {} on device {}: the fake world moves no data", pg->size(), device_name(rt.device)),
                      "plan with --device meta, or start real ranks with distlab run");
  check_strategy_fits(cfg, grad_ ? grad_->size() : 1);
  if (world() > 1 && rt.is_meta() && !(pg && pg->is_fake()))
    throw ConfigError("the meta device runs on one rank",
                      "plan one rank of an N-rank job with `distlab train ... --device meta --set dist.fake_world_size=N`, without distlab run");
  const int threads = cfg.train.threads > 0 ? int(cfg.train.threads) : default_threads();
  set_compute_threads(threads);
  if (!rt.is_meta()) data_ = open_datasets(cfg.data);
  spec_ = spec_for(cfg, data_, rt.is_meta());
  if (ring_) {
    spec_.context = ring_.get();
    // each CP rank's dropout draws for its own tokens (a stream of its own, as sequence parallel's rows)
    spec_.dropout_seed ^= 0xC2B2AE3D27D4EB4FULL * uint64_t(mesh_->coord().cp);
  }

  // batch sizes: micro × ranks × accum = global (one rank here)
  micro_batch_ = cfg.train.micro_batch;
  if (cfg.train.global_batch > 0) {
    const int64_t world = dp_world(), per = world * accum_;
    const char* accum_key = shape.pp > 1 ? "parallel.micro_batches" : "train.accum_steps";
    if (cfg.train.global_batch % per != 0)
      throw ConfigError(fmt::format("train.global_batch {} is not divisible by data-parallel ranks ({}) x {} ({})",
                                    cfg.train.global_batch, world, accum_key, accum_),
                        fmt::format("choose a global batch that is a multiple of ranks x {}", accum_key));
    micro_batch_ = cfg.train.global_batch / per;
    if (cfg.origin.count("train.micro_batch") && cfg.train.micro_batch != micro_batch_)
      throw ConfigError(fmt::format("{}: train.micro_batch {} contradicts train.global_batch {} ({}) = {} ranks x {} accum x {}",
                                    cfg.origin.at("train.micro_batch"), cfg.train.micro_batch, cfg.train.global_batch,
                                    cfg.origin.count("train.global_batch") ? cfg.origin.at("train.global_batch") : "default", world,
                                    accum_, micro_batch_),
                        fmt::format("state only one of them, or make them agree (--set train.micro_batch={})", micro_batch_));
  }

  // Megatron's rule: the sequence splits over the group — so every batch's B·T rows do, the evaluation's
  // shorter last one too
  // (context parallel: this rank's share of the sequence)
  if (cfg.model.sequence_parallel && shape.tp > 1 && (cfg.data.seq_len / shape.cp) % shape.tp != 0)
    throw ConfigError(fmt::format("parallel.sequence_parallel: data.seq_len {}{} does not split over parallel.tp {}: a batch's rows (micro_batch x "
                                  "data.seq_len{}) must split into {} equal blocks, the evaluation's last batch's too",
                                  cfg.data.seq_len, shape.cp > 1 ? fmt::format(" / parallel.cp {}", shape.cp) : "", shape.tp,
                                  shape.cp > 1 ? " / cp" : "", shape.tp),
                      shape.cp > 1 ? "choose data.seq_len divisible by parallel.tp x parallel.cp" : "choose data.seq_len divisible by parallel.tp");
  if (!rt.is_meta()) {
    auto sampler = make_train_sampler(cfg, data_.train->size(), dp_world(), dp_rank(), ext_);
    loader_ = std::make_unique<DataLoader>(*data_.train, sampler, micro_batch_, cfg.train.drop_last, cfg.data.check_finite);
    if (loader_->batches_per_epoch() < 1)
      throw ConfigError(fmt::format("the train set has {} samples, fewer than one micro-batch of {}", data_.train->size(), micro_batch_),
                        "lower train.micro_batch");
  }
  if (cfg.train.steps > 0) total_steps_ = cfg.train.steps;
  else {
    const int64_t per_epoch = loader_ ? loader_->batches_per_epoch() / accum_ : 1;
    if (per_epoch < 1)
      throw ConfigError(fmt::format("an epoch has {} micro-batches, fewer than the {} of one step", loader_->batches_per_epoch(), accum_),
                        "lower train.accum_steps (parallel.micro_batches) or set train.steps");
    total_steps_ = cfg.train.epochs * per_epoch;
  }

  rt.dtype = parse_float_dtype(cfg.precision.mode);  // params, grads and activations (core/ops/autocast.h)
  rt.reduce_dtype = parse_float_dtype(cfg.precision.reduce_dtype);  // gradients on the wire
  rt.eager_ops = eager_ops_for(cfg.log.kernels, cfg.log.fused_ops);  // eager PyTorch's saved tensors in the count
  model_ = build_split_model(rt, spec_, mesh_ ? &mesh_->group(MeshAxis::tp) : nullptr, mesh_ ? mesh_->coord().pp : 0, shape.pp,
                             cfg.parallel.pp_layers);
  model_->init(cfg.train.seed);
  if (cfg.lora.on()) {  // PEFT's get_peft_model; split with their base under tensor parallelism (core/nn/lora.h)
    lora_ = lora_spec(cfg, shape);
    lora_modules_ = apply_lora(rt, *model_, lora_, cfg.train.seed);
  }
  // QLoRA: the frozen base in 4 bits (load_in_4bit), each Linear's 16-bit weight freed as it is quantized
  if (cfg.quantization.on()) {
    quantized_ = quantize_base(rt, *model_, cfg.quantization);
    // transformers quantizes each weight as it loads it: the whole 16-bit base never sits on the card. It was
    // built whole here, so the caching allocator hands its segments back (else they stay reserved)
    rt.memory.empty_cache();
  }
  if (shape.pp > 1) {
    pipeline_ = std::make_unique<Pipeline>(mesh_->group(MeshAxis::pp), *model_, cfg.parallel.schedule, int(accum_));
    if (auto* gpt = dynamic_cast<GPT*>(model_.get())) tied_ = gpt->tied_embedding();
  }
  if (ext_) ext_->on_model(*model_, rt, mesh_.get(), accum_);  // layer substitution, a stage's own order
  if (cfg.dist.backend == CommBackend::nccl && grad_ && !grad_->is_fake()) {  // the strategy's flat buffers on the GPU: NCCL
    device_group_ = std::make_unique<DeviceBackend>(*grad_, make_device_group(rt, cfg.train.device, *grad_,
                                                                           Millis(int64_t(cfg.dist.timeout_s * 1000))));
  }
  if (cfg.dist.backend == CommBackend::nccl && mesh_ && shape.tp > 1) {  // the split layers' all-reduces of activations too
    ProcessGroup& tp = mesh_->group(MeshAxis::tp);
    tp_device_group_ = std::make_unique<DeviceBackend>(tp, make_device_group(rt, cfg.train.device, tp, Millis(int64_t(cfg.dist.timeout_s * 1000))));
  }
  strategy_ = make_strategy(cfg, grad_, *model_, rt, ext_);
  if (cfg.optim.name == OptimizerKind::sgd) {
    opt_ = std::make_unique<SGD>(strategy_->optimizer_parameters(*model_),
                                 SGDOptions{float(cfg.optim.momentum), float(cfg.optim.dampening), float(cfg.optim.weight_decay), cfg.optim.nesterov});
  } else {
    opt_ = std::make_unique<AdamW>(strategy_->optimizer_parameters(*model_), AdamWOptions{float(cfg.optim.beta1), float(cfg.optim.beta2),
                                                                      float(cfg.optim.eps), float(cfg.optim.weight_decay)});
  }
  opt_->set_state_category(strategy_->optimizer_state_category());  // host under CPU offload
  // The device's capacity applies from here: ZeRO-3/FSDP build the whole model and then keep their part
  // (PyTorch FSDP materializes a meta-initialized model shard by shard; the end state is the same), so a
  // model too big for one device can still be sharded onto it. What does not fit fails at the first step,
  // with the OOM ladder.
  if (!cfg.train.device_mem.empty()) {  // a GPU's own size stays the limit: device_mem can only lower it
    const int64_t cap = parse_device_memory(cfg.train.device_mem, "train.device_mem");
    rt.memory.set_capacity(rt.device == DeviceKind::cuda && rt.memory.capacity() >= 0 ? std::min(cap, rt.memory.capacity()) : cap);
  }
  schedule_ = Schedule{cfg.optim.schedule, cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.step_size,
                       cfg.optim.gamma, cfg.optim.min_lr, total_steps_};
}

}  // namespace distlab
