// `distlab bench comm --backend nccl`: nccl-tests' table (time, algbw, busbw, #wrong) for the NCCL group's
// collectives on device buffers, one GPU per rank (rank r on GPU local_rank). Times are CUDA events on
// the communication stream, the slowest rank's mean over the iterations. Read cli/bench_cmd.cpp first:
// the Gloo table and its conventions are the same.
#pragma once
#include <cstdint>
#include <string>

#include "core/comm/store.h"

namespace distlab {

struct NcclBenchOptions {
  int rank = 0, world = 1, local_rank = 0;
  int64_t min_bytes = 1024, max_bytes = int64_t(128) << 20;
  int iters = 0;         // 0: by size
  std::string json;      // rank 0 writes the rows here
};

// Runs on every rank of the job; returns the process's exit code (1 when a result was wrong).
int nccl_bench_worker(Store& store, const NcclBenchOptions& o);

}  // namespace distlab
