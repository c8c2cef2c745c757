// A ring that turns the other way: each rank sends to its left neighbour and receives from its right one;
// chunks split "ceil-first" (the first count % N chunks one element longer); separate scratch per step.
#include <algorithm>
#include <vector>

#include "labs/01-collectives/api.h"

namespace lab01 {

namespace {
struct Chunks {
  int64_t count;
  int n;
  int64_t begin(int c) const {
    const int64_t base = count / n, extra = count % n;
    return int64_t(c) * base + std::min<int64_t>(c, extra);
  }
  int64_t size(int c) const { return begin(c + 1) - begin(c); }
};
int wrap(int a, int n) { return ((a % n) + n) % n; }

// after it, rank r holds the full sum of chunk r
void scatter_reduce(Comm& comm, float* data, int64_t count) {
  const int n = comm.size(), r = comm.rank();
  if (n == 1) return;
  const Chunks ch{count, n};
  const int left = wrap(r - 1, n), right = wrap(r + 1, n);
  for (int step = 0; step < n - 1; step++) {
    const int out = wrap(r + step + 1, n), in = wrap(r + step + 2, n);
    std::vector<float> got(static_cast<size_t>(ch.size(in)));
    comm.send(data + ch.begin(out), ch.size(out), left);
    comm.recv(got.data(), ch.size(in), right);
    for (int64_t i = 0; i < ch.size(in); i++) data[ch.begin(in) + i] = got[size_t(i)] + data[ch.begin(in) + i];
  }
}

void gather_around(Comm& comm, float* data, int64_t count) {
  const int n = comm.size(), r = comm.rank();
  const Chunks ch{count, n};
  const int left = wrap(r - 1, n), right = wrap(r + 1, n);
  for (int step = 0; step < n - 1; step++) {
    const int out = wrap(r + step, n), in = wrap(r + step + 1, n);
    comm.send(data + ch.begin(out), ch.size(out), left);
    comm.recv(data + ch.begin(in), ch.size(in), right);
  }
}
}  // namespace

void ring_reduce_scatter(Comm& comm, float* out, const float* in, int64_t n) {
  const int N = comm.size(), r = comm.rank();
  std::vector<float> work(in, in + n * N);
  scatter_reduce(comm, work.data(), n * N);
  std::copy_n(work.begin() + r * n, n, out);
}

void ring_all_gather(Comm& comm, float* out, const float* in, int64_t n) {
  std::copy_n(in, n, out + comm.rank() * n);
  gather_around(comm, out, n * comm.size());
}

void ring_all_reduce(Comm& comm, float* data, int64_t count) {
  scatter_reduce(comm, data, count);
  gather_around(comm, data, count);
}

}  // namespace lab01

extern "C" const Lab01Plugin distlab_lab01 = {kLab01Abi, lab01::ring_reduce_scatter, lab01::ring_all_gather, lab01::ring_all_reduce};
