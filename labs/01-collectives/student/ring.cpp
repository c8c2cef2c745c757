// Lab 01 — ring collectives from nothing but send and recv.
//
// The ring (Baidu's ring all-reduce; NCCL's and Gloo's default): the N ranks form a circle, and each sends
// only to its right neighbour (r + 1) and receives only from its left one (r − 1). A buffer of `count`
// floats is split into N chunks; chunk c is [c·count/N, (c+1)·count/N), so sizes differ by at most one.
// (All chunk numbers mod N.) Each phase sends N−1 chunks of S/N bytes per rank, so an all-reduce sends
// 2(N−1)/N·S per rank whatever N is: bandwidth-optimal, which is why its time barely grows with N.
#include <algorithm>
#include <vector>

#include <stdexcept>

#include "labs/01-collectives/api.h"

namespace lab01 {

static int mod(int a, int n) { return ((a % n) + n) % n; }
// chunk c of `count` floats split N ways starts here; it ends where chunk c + 1 starts
static int64_t chunk_begin(int c, int64_t count, int N) { return int64_t(c) * count / N; }
static int64_t chunk_size(int c, int64_t count, int N) { return chunk_begin(c + 1, count, N) - chunk_begin(c, count, N); }

// data (count): on return rank r's chunk r holds the sum over ranks of chunk r (other chunks: partial sums).
static void reduce_scatter_phase(Comm& comm, float* data, int64_t count) {
  // TODO(01-collectives): implement reduce_scatter_phase. Read labs/01-collectives/README.md.
  throw std::logic_error("01-collectives: reduce_scatter_phase is not implemented yet: "
                         "fill in the TODO in labs/01-collectives/student/ring.cpp");
}

// data (count): on entry rank r's chunk r is final; on return every chunk is.
static void all_gather_phase(Comm& comm, float* data, int64_t count) {
  // TODO(01-collectives): implement all_gather_phase. Read labs/01-collectives/README.md.
  throw std::logic_error("01-collectives: all_gather_phase is not implemented yet: "
                         "fill in the TODO in labs/01-collectives/student/ring.cpp");
}

void ring_reduce_scatter(Comm& comm, float* out, const float* in, int64_t n) {
  // TODO(01-collectives): implement ring_reduce_scatter. Read labs/01-collectives/README.md.
  throw std::logic_error("01-collectives: ring_reduce_scatter is not implemented yet: "
                         "fill in the TODO in labs/01-collectives/student/ring.cpp");
}

void ring_all_gather(Comm& comm, float* out, const float* in, int64_t n) {
  // TODO(01-collectives): implement ring_all_gather. Read labs/01-collectives/README.md.
  throw std::logic_error("01-collectives: ring_all_gather is not implemented yet: "
                         "fill in the TODO in labs/01-collectives/student/ring.cpp");
}

void ring_all_reduce(Comm& comm, float* data, int64_t count) {
  // TODO(01-collectives): implement ring_all_reduce. Read labs/01-collectives/README.md.
  throw std::logic_error("01-collectives: ring_all_reduce is not implemented yet: "
                         "fill in the TODO in labs/01-collectives/student/ring.cpp");
}

}  // namespace lab01

extern "C" const Lab01Plugin distlab_lab01 = {kLab01Abi, lab01::ring_reduce_scatter, lab01::ring_all_gather, lab01::ring_all_reduce};
