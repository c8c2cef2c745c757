#include "core/train/strategies.h"

#include <fmt/format.h>

#include "core/data/distributed_sampler.h"
#include "core/models/llama.h"
#include "core/parallel/ddp.h"
#include "core/parallel/none.h"
#include "core/parallel/zero1.h"
#include "core/parallel/zero2.h"
#include "core/parallel/zero3.h"
#include "core/parallel/fsdp.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

std::unique_ptr<Strategy> make_strategy(const RunConfig& cfg, ProcessGroup* pg, Model& model, Runtime& rt, TrainerExtension* ext) {
  const ParallelOptions& p = cfg.parallel;
  if (p.strategy == StrategyKind::none || !pg) return std::make_unique<NoParallel>();
  if (p.sync_batchnorm) model.set_sync_batchnorm(pg);
  // an extension's strategy replaces the engine's (it too broadcasts rank 0's weights first)
  if (ext)
    if (auto s = ext->make_strategy(cfg, *pg, model, rt)) return s;
  // each broadcasts rank 0's weights and buffers: every replica starts equal
  const bool offload = p.offload == OffloadTo::cpu;
  switch (p.strategy) {
    case StrategyKind::none: break;
    case StrategyKind::ddp: return make_ddp(p.ddp_mode, *pg, model, rt, p.bucket_mb);
    case StrategyKind::zero1: return std::make_unique<ZeRO1>(*pg, model, rt, p.zero_reduce, p.bucket_mb);
    case StrategyKind::zero2: return std::make_unique<ZeRO2>(*pg, model, rt, offload);
    case StrategyKind::zero3: return std::make_unique<ZeRO3>(*pg, model, rt, ShardedOptions{true, p.prefetch, offload, p.wrap_min_params, p.forward_prefetch, int(p.prefetch_depth)});
    case StrategyKind::fsdp:
      if (p.sharding == Sharding::no_shard)  // PyTorch: NO_SHARD "is similar to DistributedDataParallel"
        return make_ddp(DdpMode::bucketed, *pg, model, rt, p.bucket_mb);
      return std::make_unique<FSDP>(*pg, model, rt, p.sharding, p.prefetch, offload, p.wrap_min_params, p.forward_prefetch, int(p.prefetch_depth));
  }
  return std::make_unique<NoParallel>();
}

void check_strategy_fits(const RunConfig& cfg, int world) {
  if (cfg.parallel.offload == OffloadTo::cpu && cfg.parallel.strategy != StrategyKind::zero2 && cfg.parallel.strategy != StrategyKind::zero3 &&
      !(cfg.parallel.strategy == StrategyKind::fsdp && cfg.parallel.sharding != Sharding::no_shard))
    throw ConfigError(fmt::format("parallel.offload = \"cpu\" with parallel.strategy {}{}", cfg.parallel.strategy,
                                  cfg.parallel.strategy == StrategyKind::fsdp ? " and parallel.sharding no_shard" : ""),
                      "CPU offload moves shards to the host: use strategy zero2 (ZeRO-Offload), zero3, or fsdp with sharding full_shard or shard_grad_op");
  if (world > 1 && cfg.parallel.strategy == StrategyKind::none)
    throw ConfigError(cfg.parallel.cp > 1 ? fmt::format("parallel.strategy is none, but {} ranks hold the same weights (parallel.cp {})", world, cfg.parallel.cp)
                                          : fmt::format("parallel.strategy is none, but {} ranks were started", world),
                      cfg.parallel.cp > 1 ? "each context-parallel rank's gradient is its tokens' part and must be summed with the others': set "
                                            "--set parallel.strategy=ddp (or zero1/zero2/zero3/fsdp)"
                                          : "every rank would train its own model on the same data: set --set parallel.strategy=ddp");
}

void check_strategy_composes(const RunConfig& cfg, const MeshShape& shape) {
  const StrategyKind st = cfg.parallel.strategy;
  const bool whole_grads = st == StrategyKind::none || st == StrategyKind::ddp || st == StrategyKind::zero1;  // reduced after the backward, or whole
  if (!whole_grads && shape.pp > 1)
    throw ConfigError(fmt::format("parallel.strategy {} with parallel.tp {} x parallel.pp {}: ZeRO-2's gradient buckets and ZeRO-3/FSDP's "
                                  "units are reduced during a pipeline's backward, before the tied embedding's two copies (first and last "
                                  "stage) are summed",
                                  st, shape.tp, shape.pp),
                      "with pipeline stages use parallel.strategy = \"zero1\" (the optimizer state split over the data-parallel "
                      "ranks, Megatron's distributed optimizer) or \"ddp\"; zero2, zero3 and fsdp compose with parallel.tp alone "
                      "(PyTorch's 2D: FSDP across the data-parallel ranks, TP inside a node)");
}

namespace {

// The forgotten set_epoch: whatever epoch the loader asks for, the order of epoch 0.
class FirstEpochSampler : public Sampler {
 public:
  explicit FirstEpochSampler(std::shared_ptr<Sampler> s) : s_(std::move(s)) {}
  std::vector<int64_t> indices(int64_t) const override { return s_->indices(0); }
  int64_t size() const override { return s_->size(); }

 private:
  std::shared_ptr<Sampler> s_;
};

std::shared_ptr<Sampler> base_sampler(const RunConfig& cfg, int64_t n, int world, int rank, TrainerExtension* ext) {
  if (ext)
    if (auto s = ext->make_sampler(cfg, n, world, rank)) return s;
  if (cfg.parallel.strategy != StrategyKind::none && cfg.train.sampler == "distributed")  // data parallel: each rank its 1/N of the data
    return std::make_shared<DistributedSampler>(n, world, rank, cfg.train.shuffle, cfg.train.seed, false);
  // one rank, or train.sampler = plain: the whole set in one order, the same on every rank
  if (cfg.train.shuffle) return std::make_shared<RandomSampler>(n, cfg.train.seed);
  return std::make_shared<SequentialSampler>(n);
}

}  // namespace

std::shared_ptr<Sampler> make_train_sampler(const RunConfig& cfg, int64_t n, int world, int rank, TrainerExtension* ext) {
  std::shared_ptr<Sampler> s = base_sampler(cfg, n, world, rank, ext);
  if (!cfg.train.set_epoch) return std::make_shared<FirstEpochSampler>(std::move(s));
  return s;
}

std::string oom_ladder(const RunConfig& cfg, int world, double psi, DType dtype, double activation_bytes, int64_t micro_batch) {
  const double b = double(dtype_size(dtype));  // parameter and gradient bytes
  // optimizer state per parameter: AdamW's two moments or SGD's momentum, + the f32 master in 16 bits
  const double k = (cfg.optim.name == OptimizerKind::adamw ? 8.0 : cfg.optim.momentum > 0 ? 4.0 : 0.0) + (dtype == DType::f32 ? 0.0 : 4.0);
  const double n = world, shard = 1.0 - 1.0 / n;
  const StrategyKind s = cfg.parallel.strategy;
  const bool offloaded = cfg.parallel.offload == OffloadTo::cpu;
  std::vector<std::string> rungs;
  auto bytes = [](double x) { return format_bytes(x); };
  if (micro_batch > 1)
    rungs.push_back(fmt::format("accumulation: train.micro_batch {} with train.accum_steps x 2 keeps the batch and halves the "
                                "activations{}", micro_batch / 2,
                                activation_bytes > 0 ? " (about " + bytes(activation_bytes / 2) + " saved)" : ""));
  // activation checkpointing: what each block keeps (core/models/gpt.h, core/models/llama.h), in d·B·T
  // bytes per unit of width. GPT none: 16 tensors of width C, the probabilities (B, NH, T, T) and
  // LayerNorm's f32 statistics; selective: all but the probabilities. Llama none: x, its norm, q/k/v (kv
  // repeated), y, the residual, its norm, gate, up and SwiGLU's output — 8C + 3I at tp 1; selective_op
  // (torchtitan's): x, q, v, y, gate and down_proj's output — 4C + C_kv + I. Full: the block's input alone.
  // Flash attention keeps no probabilities. B is the micro-batch; TP splits the heads and the MLP's rows.
  if (is_language_model(cfg.model) && cfg.model.checkpointing != Checkpointing::full) {
    const Checkpointing ac = cfg.model.checkpointing;
    const bool llama = cfg.model.name == "llama";
    const double d = b, B = double(micro_batch), T = double(cfg.data.seq_len), C = double(cfg.model.n_embd), BT = B * T;
    const double L = double(cfg.model.n_layer) / double(std::max<int64_t>(1, cfg.parallel.pp));
    const double tp = double(std::max<int64_t>(1, cfg.parallel.tp)), heads = double(cfg.model.n_head) / tp;
    const double probabilities = cfg.model.attention == AttentionKernel::flash ? 0 : heads * T * T * B * d;
    double kept = 16 * BT * C * d + 16 * BT + (ac == Checkpointing::none ? probabilities : 0);  // GPT
    if (llama) {
      const double I = double(llama_intermediate(cfg.model)), Ckv = double(llama_kv_heads(cfg.model)) * C / double(cfg.model.n_head);
      const double none = d * BT * (4 * C + (4 * C + 3 * I) / tp), op = d * BT * (2 * C + (2 * C + Ckv + I) / tp);
      kept = (ac == Checkpointing::selective_op ? op : none) + (ac == Checkpointing::selective ? 0 : probabilities);
      if (ac != Checkpointing::selective_op)
        rungs.push_back(fmt::format("op-level activation checkpointing (train.activation_checkpointing = \"selective_op\", torchtitan's): "
                                    "each block keeps its input, every second matmul's output and the attention's: about {} saved for "
                                    "recomputing k_proj, o_proj, up_proj and the elementwise ops (~10 % more compute)",
                                    bytes(L * (none - op))));
    }
    if (ac == Checkpointing::none && probabilities > 0)
      rungs.push_back(fmt::format("selective activation checkpointing (train.activation_checkpointing = \"selective\"): each block's "
                                  "attention probabilities are recomputed in backward, not kept: {} saved for one more attention "
                                  "forward per block", bytes(L * probabilities)));
    rungs.push_back(fmt::format("full activation checkpointing (train.activation_checkpointing = \"full\"): each block keeps only its "
                                "input and reruns its forward in backward: about {} saved for a third more compute",
                                bytes(L * (kept - BT * C * d))));
  }
  if (world < 2) {
    rungs.push_back("sharding needs ranks: `distlab run -n N train ...` with parallel.strategy zero2, zero3 or fsdp");
  } else if (s == StrategyKind::ddp || s == StrategyKind::none) {
    rungs.push_back(fmt::format("ZeRO-2 (parallel.strategy = \"zero2\"): gradients and optimizer state split {} ways save {}", world,
                                bytes((b + k) * psi * shard)));
  } else if (s == StrategyKind::zero1) {
    rungs.push_back(fmt::format("ZeRO-2: the gradients split {} ways too save {}", world, bytes(b * psi * shard)));
  } else if (s == StrategyKind::zero2 || (s == StrategyKind::fsdp && cfg.parallel.sharding == Sharding::shard_grad_op)) {
    rungs.push_back(fmt::format("ZeRO-3 or FSDP full_shard: the parameters split {} ways too save up to {}", world, bytes(b * psi * shard)));
  }
  if (world >= 2 && !offloaded && (s == StrategyKind::zero3 || s == StrategyKind::fsdp))
    rungs.push_back(fmt::format("CPU offload (parallel.offload = \"cpu\"): the shards and the optimizer state move to host memory, {} "
                                "off the device, for host<->device copies every step", bytes((2 * b + k) * psi / n)));
  if (world >= 2 && (s == StrategyKind::zero3 || s == StrategyKind::fsdp))
    rungs.push_back(fmt::format("more ranks: {} ranks would halve every shard", 2 * world));
  std::string out = fmt::format("strategy {} on {} rank(s) with {:.3g} parameters ({} bytes each + {} of optimizer state); the OOM ladder "
                                "from here:", s, world, psi, b, k);
  for (size_t i = 0; i < rungs.size(); i++) out += fmt::format("\n    {}. {}", i + 1, rungs[i]);
  return out + "\n  or give the device more memory with --device-mem";
}

}  // namespace distlab
