// A bidirectional ring, as NCCL runs one ring each way over full-duplex links: every chunk is cut in two
// halves; the first halves go around to the right (send to r + 1, receive from r - 1), the second halves to
// the left, both at each step. Each rank sends the ring's (N-1)/N·S bytes, half to each neighbour, in the
// same number of steps.
#include <algorithm>
#include <vector>

#include "labs/01-collectives/api.h"

namespace lab01 {

namespace {
int wrap(int a, int n) { return ((a % n) + n) % n; }

// `count` floats in n chunks (the first count % n one longer), each chunk in two halves: half 0 and half 1
struct Halves {
  int64_t count;
  int n;
  int64_t chunk_begin(int c) const { return int64_t(c) * (count / n) + std::min<int64_t>(c, count % n); }
  int64_t chunk_size(int c) const { return chunk_begin(c + 1) - chunk_begin(c); }
  int64_t begin(int c, int half) const { return chunk_begin(c) + (half ? chunk_size(c) / 2 : 0); }
  int64_t size(int c, int half) const { return half ? chunk_size(c) - chunk_size(c) / 2 : chunk_size(c) / 2; }
};

// after it, rank r holds the full sum of chunk r (both halves)
void scatter_reduce(Comm& comm, float* data, const Halves& h) {
  const int n = comm.size(), r = comm.rank();
  const int right = wrap(r + 1, n), left = wrap(r - 1, n);
  for (int step = 0; step < n - 1; step++) {
    const int out0 = wrap(r - step - 1, n), in0 = wrap(r - step - 2, n);  // the right-turning ring's chunks
    const int out1 = wrap(r + step + 1, n), in1 = wrap(r + step + 2, n);  // the left-turning ring's
    std::vector<float> got0(static_cast<size_t>(h.size(in0, 0))), got1(static_cast<size_t>(h.size(in1, 1)));
    comm.send(data + h.begin(out0, 0), h.size(out0, 0), right);
    comm.send(data + h.begin(out1, 1), h.size(out1, 1), left);
    comm.recv(got0.data(), h.size(in0, 0), left);
    comm.recv(got1.data(), h.size(in1, 1), right);
    for (int64_t i = 0; i < h.size(in0, 0); i++) data[h.begin(in0, 0) + i] += got0[size_t(i)];
    for (int64_t i = 0; i < h.size(in1, 1); i++) data[h.begin(in1, 1) + i] += got1[size_t(i)];
  }
}

// every rank starts with chunk r final and ends with all of them
void gather_around(Comm& comm, float* data, const Halves& h) {
  const int n = comm.size(), r = comm.rank();
  const int right = wrap(r + 1, n), left = wrap(r - 1, n);
  for (int step = 0; step < n - 1; step++) {
    const int out0 = wrap(r - step, n), in0 = wrap(r - step - 1, n);
    const int out1 = wrap(r + step, n), in1 = wrap(r + step + 1, n);
    comm.send(data + h.begin(out0, 0), h.size(out0, 0), right);
    comm.send(data + h.begin(out1, 1), h.size(out1, 1), left);
    comm.recv(data + h.begin(in0, 0), h.size(in0, 0), left);
    comm.recv(data + h.begin(in1, 1), h.size(in1, 1), right);
  }
}
}  // namespace

void ring_reduce_scatter(Comm& comm, float* out, const float* in, int64_t n) {
  const int N = comm.size(), r = comm.rank();
  std::vector<float> work(in, in + n * N);
  scatter_reduce(comm, work.data(), Halves{n * N, N});
  std::copy_n(work.begin() + r * n, n, out);
}

void ring_all_gather(Comm& comm, float* out, const float* in, int64_t n) {
  std::copy_n(in, n, out + comm.rank() * n);
  gather_around(comm, out, Halves{n * comm.size(), comm.size()});
}

void ring_all_reduce(Comm& comm, float* data, int64_t count) {
  scatter_reduce(comm, data, Halves{count, comm.size()});
  gather_around(comm, data, Halves{count, comm.size()});
}

}  // namespace lab01

extern "C" const Lab01Plugin distlab_lab01 = {kLab01Abi, lab01::ring_reduce_scatter, lab01::ring_all_gather, lab01::ring_all_reduce};
