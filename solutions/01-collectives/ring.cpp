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
  /// BEGIN SOLUTION
  const int N = pg.size(), r = pg.rank();
  std::vector<float> acc(in, in + n * N), tmp(static_cast<size_t>(n));
  // step s: send chunk (r − s − 1), receive chunk (r − s − 2): after N−1 steps chunk r is complete here
  for (int s = 0; s < N - 1; s++) {
    const int send_c = ((r - s - 1) % N + N) % N, recv_c = ((r - s - 2) % N + N) % N;
    exchange(pg, acc.data() + send_c * n, n, tmp.data(), n);
    for (int64_t i = 0; i < n; i++) acc[size_t(recv_c * n + i)] += tmp[size_t(i)];
  }
  std::copy(acc.begin() + r * n, acc.begin() + (r + 1) * n, out);
  /// END SOLUTION
}

void ring_all_gather(ProcessGroup& pg, float* out, const float* in, int64_t n) {
  /// BEGIN SOLUTION
  const int N = pg.size(), r = pg.rank();
  std::copy(in, in + n, out + r * n);
  // step s: pass on the chunk received in the previous step (first our own)
  for (int s = 0; s < N - 1; s++) {
    const int send_c = ((r - s) % N + N) % N, recv_c = ((r - s - 1) % N + N) % N;
    exchange(pg, out + send_c * n, n, out + recv_c * n, n);
  }
  /// END SOLUTION
}

void ring_all_reduce(ProcessGroup& pg, float* data, int64_t count) {
  /// BEGIN SOLUTION
  const int N = pg.size(), r = pg.rank();
  if (N == 1 || count == 0) return;
  std::vector<float> tmp(static_cast<size_t>(count / N + 1));
  // reduce-scatter over uneven chunks: after it, rank r owns the sum of chunk (r + 1)
  for (int s = 0; s < N - 1; s++) {
    const int sc = ((r - s) % N + N) % N, rc = ((r - s - 1) % N + N) % N;
    const int64_t sb = begin(sc, count, N), rb = begin(rc, count, N);
    const int64_t sn = begin(sc + 1, count, N) - sb, rn = begin(rc + 1, count, N) - rb;
    exchange(pg, data + sb, sn, tmp.data(), rn);
    for (int64_t i = 0; i < rn; i++) data[rb + i] += tmp[size_t(i)];
  }
  // all-gather: circulate the finished chunks, starting with our own (r + 1)
  for (int s = 0; s < N - 1; s++) {
    const int sc = ((r + 1 - s) % N + N) % N, rc = ((r - s) % N + N) % N;
    const int64_t sb = begin(sc, count, N), rb = begin(rc, count, N);
    exchange(pg, data + sb, begin(sc + 1, count, N) - sb, data + rb, begin(rc + 1, count, N) - rb);
  }
  /// END SOLUTION
}

}  // namespace lab01

extern "C" Lab01Api distlab_lab01 = {lab01::ring_reduce_scatter, lab01::ring_all_gather, lab01::ring_all_reduce};
