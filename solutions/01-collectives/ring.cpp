// Lab 01 — ring collectives from nothing but send and recv.
//
// The ring (Baidu's ring all-reduce; NCCL's and Gloo's default): the N ranks form a circle, and each sends
// only to its right neighbour (r + 1) and receives only from its left one (r − 1). A buffer of `count`
// floats is split into N chunks; chunk c is [c·count/N, (c+1)·count/N), so sizes differ by at most one.
/// BEGIN SOLUTION ONLY
//
//   reduce-scatter phase: N−1 steps. In step s (0, 1, ..., N−2) rank r sends its partial sum of chunk
//                         (r − s − 1) and adds the chunk (r − s − 2) that arrives from the left.
//                         After the last step rank r holds the full sum of chunk r.
//   all-gather phase:     N−1 more steps. In step s rank r sends chunk (r − s), which it has complete,
//                         and receives chunk (r − s − 1) from the left.
/// END SOLUTION ONLY
// (All chunk numbers mod N.) Each phase sends N−1 chunks of S/N bytes per rank, so an all-reduce sends
// 2(N−1)/N·S per rank whatever N is: bandwidth-optimal, which is why its time barely grows with N.
#include <algorithm>
#include <vector>

#include "labs/01-collectives/api.h"

namespace lab01 {

static int mod(int a, int n) { return ((a % n) + n) % n; }
// chunk c of `count` floats split N ways starts here; it ends where chunk c + 1 starts
static int64_t chunk_begin(int c, int64_t count, int N) { return int64_t(c) * count / N; }
static int64_t chunk_size(int c, int64_t count, int N) { return chunk_begin(c + 1, count, N) - chunk_begin(c, count, N); }

// data (count): on return rank r's chunk r holds the sum over ranks of chunk r (other chunks: partial sums).
static void reduce_scatter_phase(Comm& comm, float* data, int64_t count) {
  /// BEGIN SOLUTION
  const int N = comm.size(), r = comm.rank();
  std::vector<float> incoming(static_cast<size_t>(count / N + 1));
  for (int s = 0; s < N - 1; s++) {
    const int sc = mod(r - s - 1, N), rc = mod(r - s - 2, N);
    comm.send(data + chunk_begin(sc, count, N), chunk_size(sc, count, N), mod(r + 1, N));
    comm.recv(incoming.data(), chunk_size(rc, count, N), mod(r - 1, N));
    float* dst = data + chunk_begin(rc, count, N);
    for (int64_t i = 0; i < chunk_size(rc, count, N); i++) dst[i] += incoming[size_t(i)];
  }
  /// END SOLUTION
}

// data (count): on entry rank r's chunk r is final; on return every chunk is.
static void all_gather_phase(Comm& comm, float* data, int64_t count) {
  /// BEGIN SOLUTION
  const int N = comm.size(), r = comm.rank();
  for (int s = 0; s < N - 1; s++) {
    const int sc = mod(r - s, N), rc = mod(r - s - 1, N);
    comm.send(data + chunk_begin(sc, count, N), chunk_size(sc, count, N), mod(r + 1, N));
    comm.recv(data + chunk_begin(rc, count, N), chunk_size(rc, count, N), mod(r - 1, N));
  }
  /// END SOLUTION
}

void ring_reduce_scatter(Comm& comm, float* out, const float* in, int64_t n) {
  /// BEGIN SOLUTION
  // N slots of n are exactly the ring's N chunks
  const int N = comm.size(), r = comm.rank();
  std::vector<float> acc(in, in + n * N);
  reduce_scatter_phase(comm, acc.data(), n * N);
  std::copy(acc.begin() + r * n, acc.begin() + (r + 1) * n, out);
  /// END SOLUTION
}

void ring_all_gather(Comm& comm, float* out, const float* in, int64_t n) {
  /// BEGIN SOLUTION
  std::copy(in, in + n, out + comm.rank() * n);
  all_gather_phase(comm, out, n * comm.size());
  /// END SOLUTION
}

void ring_all_reduce(Comm& comm, float* data, int64_t count) {
  /// BEGIN SOLUTION
  reduce_scatter_phase(comm, data, count);
  all_gather_phase(comm, data, count);
  /// END SOLUTION
}

}  // namespace lab01

extern "C" const Lab01Plugin distlab_lab01 = {kLab01Abi, lab01::ring_reduce_scatter, lab01::ring_all_gather, lab01::ring_all_reduce};
