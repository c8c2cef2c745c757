// Which parallel strategy a run gets (core/parallel/strategy.h), and the OOM ladder from it: the one place that reads
// parallel.strategy. The trainer asks this factory and then only calls the interface.
#pragma once
#include <memory>

#include "core/data/sampler.h"
#include "core/parallel/mesh.h"
#include "core/parallel/strategy.h"
#include "core/config/config.h"
#include "core/train/extension.h"

namespace distlab {

// parallel.strategy, parallel.ddp_mode, parallel.bucket_mb and parallel.sync_batchnorm, on `pg` (nullptr:
// one rank). An extension's strategy (`ext`, core/train/extension.h) comes first where it has one. On a cuda rank
// the strategies' collectives go through pg's device backend when it has one (dist.backend = "nccl").
std::unique_ptr<Strategy> make_strategy(const RunConfig& cfg, ProcessGroup* pg, Model& model, Runtime& rt, TrainerExtension* ext = nullptr);

// Refuses a strategy that cannot run on `world` ranks (none on several: each would train alone).
void check_strategy_fits(const RunConfig& cfg, int world);
// Refuses a strategy that does not compose with the mesh's split (ZeRO-2/3 and FSDP with pipeline stages).
void check_strategy_composes(const RunConfig& cfg, const MeshShape& shape);

// The order a rank visits the training set in: under a data-parallel strategy each rank its slice of
// one shared order (DistributedSampler, or an extension's sampler); on one rank a shuffled or plain order.
std::shared_ptr<Sampler> make_train_sampler(const RunConfig& cfg, int64_t dataset_size, int world, int rank, TrainerExtension* ext = nullptr);

// The OOM ladder (course chapter 3) from where a run stands: the next rungs — accumulation, ZeRO-2,
// ZeRO-3/FSDP, CPU offload — each with the bytes per rank it would save. `psi` parameters held in `dtype`,
// `activation_bytes` the micro-batch's activations, `world` ranks.
std::string oom_ladder(const RunConfig& cfg, int world, double psi, DType dtype, double activation_bytes, int64_t micro_batch);

}  // namespace distlab
