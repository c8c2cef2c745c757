#include "core/train/strategies.h"

#include <fmt/format.h>

#include "core/data/distributed_sampler.h"
#include "core/parallel/ddp.h"
#include "core/parallel/none.h"
#include "core/parallel/zero1.h"
#include "core/parallel/zero2.h"
#include "core/parallel/zero3.h"
#include "core/parallel/fsdp.h"
#include "core/util/error.h"

namespace distlab {

std::unique_ptr<Strategy> make_strategy(const RunConfig& cfg, ProcessGroup* pg, Model& model, Runtime& rt, LabPlugin* lab) {
  if (cfg.parallel.strategy == "ddp" && pg) {
    if (cfg.parallel.sync_batchnorm) model.set_sync_batchnorm(pg);
    // both broadcast rank 0's weights and buffers: every replica starts equal
    if (lab && lab->is("02")) return lab->make_ddp(cfg.parallel.ddp_mode, *pg, model, rt, cfg.parallel.bucket_mb);
    return make_ddp(cfg.parallel.ddp_mode, *pg, model, rt, cfg.parallel.bucket_mb);
  }
  if (cfg.parallel.strategy == "zero1" && pg) {
    if (cfg.parallel.sync_batchnorm) model.set_sync_batchnorm(pg);
    if (lab && lab->is("04")) return lab->make_zero(1, *pg, model, rt);
    return std::make_unique<ZeRO1>(*pg, model, rt, cfg.parallel.zero_reduce, cfg.parallel.bucket_mb);
  }
  if (cfg.parallel.strategy == "zero2" && pg) {
    if (cfg.parallel.sync_batchnorm) model.set_sync_batchnorm(pg);
    if (lab && lab->is("04")) return lab->make_zero(2, *pg, model, rt);
    return std::make_unique<ZeRO2>(*pg, model, rt, cfg.parallel.offload == "cpu");
  }
  const bool offload = cfg.parallel.offload == "cpu";
  if (cfg.parallel.strategy == "zero3" && pg) {
    if (cfg.parallel.sync_batchnorm) model.set_sync_batchnorm(pg);
    return std::make_unique<ZeRO3>(*pg, model, rt, ShardedOptions{true, cfg.parallel.prefetch, offload, cfg.parallel.wrap_min_params});
  }
  if (cfg.parallel.strategy == "fsdp" && pg) {
    if (cfg.parallel.sync_batchnorm) model.set_sync_batchnorm(pg);
    if (cfg.parallel.sharding == "no_shard")  // PyTorch: NO_SHARD "is similar to DistributedDataParallel"
      return make_ddp("bucketed", *pg, model, rt, cfg.parallel.bucket_mb);
    if (lab && lab->is("05")) {
      if (cfg.parallel.wrap_min_params > 0)
        throw ConfigError("parallel.wrap_min_params with lab 05's FSDP", "the lab's hooks see one unit per model unit: leave it at 0");
      return lab->make_fsdp(*pg, model, rt, cfg.parallel.sharding, cfg.parallel.prefetch, offload);
    }
    return std::make_unique<FSDP>(*pg, model, rt, cfg.parallel.sharding, cfg.parallel.prefetch, offload, cfg.parallel.wrap_min_params);
  }
  return std::make_unique<NoParallel>();
}

void check_strategy_fits(const RunConfig& cfg, int world) {
  const bool lab_ddp = cfg.parallel.strategy == "ddp" && cfg.lab.name.rfind("02", 0) == 0 && cfg.lab.plugin != "none";
  if (lab_ddp && cfg.precision.mode != "fp32")
    throw ConfigError(fmt::format("precision.mode {} with lab {}'s DDP: the lab's API exchanges f32 gradients", cfg.precision.mode,
                                  cfg.lab.name),
                      "run the lab in fp32 (its default); mixed precision is lab 03's subject");
  if (cfg.parallel.offload == "cpu" && cfg.parallel.strategy != "zero2" && cfg.parallel.strategy != "zero3" &&
      !(cfg.parallel.strategy == "fsdp" && cfg.parallel.sharding != "no_shard"))
    throw ConfigError(fmt::format("parallel.offload = \"cpu\" with parallel.strategy {}{}", cfg.parallel.strategy,
                                  cfg.parallel.strategy == "fsdp" ? " and parallel.sharding no_shard" : ""),
                      "CPU offload moves shards to the host: use strategy zero2 (ZeRO-Offload), zero3, or fsdp with sharding full_shard or shard_grad_op");
  if (cfg.parallel.offload == "cpu" && cfg.parallel.strategy == "zero2" && cfg.lab.name.rfind("04", 0) == 0 && cfg.lab.plugin != "none")
    throw ConfigError("parallel.offload = \"cpu\" with lab 04's ZeRO-2: the lab's strategy keeps its parts on the device",
                      "run the lab without offload; offload is lab 05's subject");
  if (world > 1 && cfg.parallel.strategy == "none")
    throw ConfigError(fmt::format("parallel.strategy is none, but {} ranks were started", world),
                      "every rank would train its own model on the same data: set --set parallel.strategy=ddp");
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

std::shared_ptr<Sampler> base_sampler(const RunConfig& cfg, int64_t n, int world, int rank, LabPlugin* lab) {
  if (cfg.parallel.strategy == "ddp" && lab && lab->is("02")) return lab->make_sampler(n, world, rank, cfg.train.seed, cfg.train.shuffle);
  if (cfg.parallel.strategy != "none" && cfg.train.sampler == "distributed")  // data parallel: each rank its 1/N of the data
    return std::make_shared<DistributedSampler>(n, world, rank, cfg.train.shuffle, cfg.train.seed, false);
  // one rank, or train.sampler = plain: the whole set in one order, the same on every rank
  if (cfg.train.shuffle) return std::make_shared<RandomSampler>(n, cfg.train.seed);
  return std::make_shared<SequentialSampler>(n);
}

}  // namespace

std::shared_ptr<Sampler> make_train_sampler(const RunConfig& cfg, int64_t n, int world, int rank, LabPlugin* lab) {
  std::shared_ptr<Sampler> s = base_sampler(cfg, n, world, rank, lab);
  if (!cfg.train.set_epoch) return std::make_shared<FirstEpochSampler>(std::move(s));
  return s;
}

}  // namespace distlab
