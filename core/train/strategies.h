// Which parallel strategy a run gets (core/parallel/strategy.h): the one place that reads
// parallel.strategy. The trainer asks this factory and then only calls the interface.
#pragma once
#include <memory>

#include "core/data/sampler.h"
#include "core/parallel/strategy.h"
#include "core/train/config.h"
#include "core/train/lab_plugin.h"

namespace distlab {

// parallel.strategy, parallel.ddp_mode, parallel.bucket_mb and parallel.sync_batchnorm, on `pg` (nullptr:
// one rank). A lab's plugin (`lab`) supplies the student's DDP in place of the engine's. On a cuda rank
// the strategies' collectives go through pg's device backend when it has one (dist.backend = "nccl").
std::unique_ptr<Strategy> make_strategy(const RunConfig& cfg, ProcessGroup* pg, Model& model, Runtime& rt, LabPlugin* lab);

// Refuses a strategy that cannot run on `world` ranks (none on several: each would train alone).
void check_strategy_fits(const RunConfig& cfg, int world);

// The order a rank visits the training set in: under a data-parallel strategy each rank its slice of
// one shared order (DistributedSampler, or the lab student's); on one rank a shuffled or plain order.
std::shared_ptr<Sampler> make_train_sampler(const RunConfig& cfg, int64_t dataset_size, int world, int rank, LabPlugin* lab);

}  // namespace distlab
