// Lab 01 — ring collectives on the process group's send and recv.
//
// The ring (Baidu's ring all-reduce, NCCL's and Gloo's default): ranks form a circle, each sends only to
// its right neighbour and receives only from its left one. Split the buffer into N chunks.
//   reduce-scatter: N−1 steps; in step s rank r sends its partial sum of chunk (r − s) and adds the chunk
//                   (r − s − 1) it receives. After N−1 steps rank r holds the full sum of chunk (r + 1).
//   all-gather:     N−1 more steps passing the finished chunks around the circle.
// Every rank sends 2(N−1) chunks of S/N bytes: 2(N−1)/N·S in all, whatever N is — bandwidth-optimal.
#include <algorithm>
#include <vector>

#include "core/util/error.h"
#include "labs/01-collectives/api.h"

namespace lab01 {

using distlab::ProcessGroup;

// Ranks send and receive in a fixed order that cannot deadlock on any ring: even ranks send first, odd
// ranks receive first (a rank never waits on a neighbour that waits on it).
static void exchange(ProcessGroup& pg, const float* send, int64_t ns, float* recv, int64_t nr) {
  const int N = pg.size(), right = (pg.rank() + 1) % N, left = (pg.rank() + N - 1) % N;
  if (pg.rank() % 2 == 0) {
    pg.send(send, ns, right);
    pg.recv(recv, nr, left);
  } else {
    pg.recv(recv, nr, left);
    pg.send(send, ns, right);
  }
}

// Chunk c of a buffer of `count` split N ways: [begin(c), begin(c+1)), sizes differing by at most one.
static int64_t begin(int64_t c, int64_t count, int N) { return c * count / N; }

void ring_reduce_scatter(ProcessGroup& pg, float* out, const float* in, int64_t n) {
  // TODO(01-collectives): implement ring_reduce_scatter. Read labs/01-collectives/README.md.
  throw distlab::Error("01-collectives: ring_reduce_scatter is not implemented yet",
                       "fill in the TODO in labs/01-collectives/student/ring.cpp");
}

void ring_all_gather(ProcessGroup& pg, float* out, const float* in, int64_t n) {
  // TODO(01-collectives): implement ring_all_gather. Read labs/01-collectives/README.md.
  throw distlab::Error("01-collectives: ring_all_gather is not implemented yet",
                       "fill in the TODO in labs/01-collectives/student/ring.cpp");
}

void ring_all_reduce(ProcessGroup& pg, float* data, int64_t count) {
  // TODO(01-collectives): implement ring_all_reduce. Read labs/01-collectives/README.md.
  throw distlab::Error("01-collectives: ring_all_reduce is not implemented yet",
                       "fill in the TODO in labs/01-collectives/student/ring.cpp");
}

}  // namespace lab01

extern "C" Lab01Api distlab_lab01 = {lab01::ring_reduce_scatter, lab01::ring_all_gather, lab01::ring_all_reduce};
