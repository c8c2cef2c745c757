// Softmax cross-entropy on the GPU, as core/ops/cpu/loss.cpp: one block per row for the max, the sum of
// exponentials and the probabilities; then one thread sums the rows' losses in order. In training the mean
// stays in a device slot (loss_out) that the trainer reads after the step; an evaluation reads the mean,
// the count of right answers and any out-of-range target back at once.

#include "core/ops/cuda/common.cuh"
#include "core/ops/cuda/dtype16.cuh"

namespace distlab::cuda {

namespace {

struct LossTotals {
  double loss;
  long long count, hits;
  int bad_target, bad_row;  // the first target >= V (and its row), or -1
};

// T: the logits' type (f32, or bf16/f16 read as f32 exactly)
template <class T>
__global__ void softmax_xent_rows_k(float* probs, float* row_loss, int* row_hit, const T* logits, const int32_t* targets, int64_t V) {
  __shared__ float best_v[kThreads];
  __shared__ int64_t best_i[kThreads];
  const int64_t n = blockIdx.x;
  const T* x = logits + n * V;
  float* p = probs + n * V;
  // argmax with the cpu's rule (the first of equal maxima): each thread its strided share, then a tree
  float mv = -INFINITY;
  int64_t mi = V;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    if (mi == V || wide(x[v]) > mv) {
      mv = wide(x[v]);
      mi = v;
    }
  best_v[threadIdx.x] = mv;
  best_i[threadIdx.x] = mi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const int64_t oi = best_i[threadIdx.x + s];
      if (oi != V && (best_i[threadIdx.x] == V || ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x]))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  const float mx = best_v[0];
  const int64_t arg = best_i[0];
  float s = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    p[v] = expf(wide(x[v]) - mx);
    s += p[v];
  }
  const float sum = block_sum(s), inv = 1.0f / sum;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) p[v] *= inv;
  if (threadIdx.x == 0) {
    const int32_t t = targets[n];
    row_loss[n] = t >= 0 && t < V ? -(wide(x[t]) - mx - logf(sum)) : 0.0f;
    row_hit[n] = t < 0 ? -1 : t >= V ? -2 : (arg == t ? 1 : 0);  // -1 ignored, -2 out of range
  }
}

__global__ void sum_rows_k(LossTotals* out, double* mean_out, const float* row_loss, const int* row_hit, const int32_t* targets,
                           int64_t N) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;  // one thread, rows in order: the cpu's sum
  LossTotals t{0.0, 0, 0, -1, -1};
  for (int64_t n = 0; n < N; n++) {
    if (row_hit[n] == -1) continue;
    if (row_hit[n] == -2) {
      if (t.bad_row < 0) {
        t.bad_row = int(n);
        t.bad_target = targets[n];
      }
      continue;
    }
    t.loss += double(row_loss[n]);
    t.count++;
    t.hits += row_hit[n];
  }
  *out = t;
  if (mean_out) *mean_out = t.count ? t.loss / double(t.count) : 0.0;  // the host's division, in the same double
}

// Each row's loss and hit (-1 ignored, -2 target out of range) in scratch; totals() sums them in row order
// and brings the sums to the host (a wait); mean_into() leaves the mean in a device slot (no wait).
struct RowResults {
  RowResults(Runtime& rt, int64_t N, const char* what) : rows(rt, 2 * N + 8, what), loss(rows.p), hit(reinterpret_cast<int*>(rows.p + N)), n(N) {}
  LossTotals totals(Runtime& rt, const int32_t* targets, const char* what) {
    auto* sums = reinterpret_cast<LossTotals*>(rows.p + 2 * n);  // 8N bytes in: aligned for its doubles
    sum_rows_k<<<1, 32, 0, stream(rt)>>>(sums, nullptr, loss, hit, targets, n);
    DL_CUDA_LAUNCHED(what);
    LossTotals t{};
    DL_CUDA(cudaMemcpyAsync(&t, sums, sizeof t, cudaMemcpyDeviceToHost, stream(rt)));
    host_wait(rt);
    return t;
  }
  void mean_into(Runtime& rt, double* out, const int32_t* targets, const char* what) {
    auto* sums = reinterpret_cast<LossTotals*>(rows.p + 2 * n);
    sum_rows_k<<<1, 32, 0, stream(rt)>>>(sums, out, loss, hit, targets, n);
    DL_CUDA_LAUNCHED(what);
  }
  Scratch rows;  // row_loss (N f32), row_hit (N int), the totals (32 B)
  float* loss;
  int* hit;
  int64_t n;
};

__global__ void count_valid_k(int64_t* count, const int32_t* targets, int64_t N) {
  float c = 0.0f;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) c += targets[n] >= 0 ? 1.0f : 0.0f;
  const float total = block_sum(c);  // exact: integers far below 2^24
  if (threadIdx.x == 0) *count = int64_t(total);
}

// T: the gradient's type (f32, or bf16/f16: rounded once)
template <class T>
__global__ void softmax_xent_backward_k(T* dlogits, const float* probs, const int32_t* targets, const int64_t* count, int64_t N, int64_t V,
                                        float scale) {
  const float k = *count ? scale / float(*count) : 0.0f;
  DL_GRID_LOOP(i, N * V) {
    const int64_t n = i / V, v = i % V;
    const int32_t t = targets[n];
    dlogits[i] = narrow<T>(t < 0 ? 0.0f : k * (probs[i] - (v == t ? 1.0f : 0.0f)));
  }
}

// ---- the vocabulary-parallel loss: a block per row ----

__global__ void vocab_max_k(float* mx, const float* logits, int64_t V) {
  const float* x = logits + int64_t(blockIdx.x) * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
  m = block_max(m);
  if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void vocab_exp_k(float* probs, float* sum, float* zt, const float* logits, const float* mx, const int32_t* targets,
                            int64_t first, int64_t V) {
  const int64_t n = blockIdx.x;
  const float* x = logits + n * V;
  float* p = probs + n * V;
  const float m = mx[n];
  float s = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    p[v] = expf(x[v] - m);
    s += p[v];
  }
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int32_t t = targets[n];
    sum[n] = s;
    zt[n] = t >= first && t < first + V ? x[t - first] : 0.0f;
  }
}

// probs /= sum, and each row's loss and hit for sum_rows_k (-1: an ignored row)
__global__ void vocab_finish_k(float* probs, float* row_loss, int* row_hit, const float* sum, const float* zt, const float* mx,
                               const int32_t* targets, int64_t V) {
  const int64_t n = blockIdx.x;
  const float inv = 1.0f / sum[n];
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) probs[n * V + v] *= inv;
  if (threadIdx.x == 0) {
    const bool counted = targets[n] >= 0;
    row_loss[n] = counted ? -(zt[n] - mx[n] - logf(sum[n])) : 0.0f;
    row_hit[n] = counted ? (zt[n] == mx[n] ? 1 : 0) : -1;
  }
}

}  // namespace

namespace {

// the rows (probs, each row's loss and hit), then the mean into loss_out, or the totals read back
template <class T>
double crossentropy_forward(Runtime& rt, float* probs, const T* logits, const int32_t* targets, int64_t N, int64_t V, int64_t* correct,
                            double* loss_out) {
  if (N == 0) {
    if (correct) *correct = 0;
    if (loss_out) DL_CUDA(cudaMemsetAsync(loss_out, 0, sizeof(double), stream(rt)));
    return 0.0;
  }
  RowResults rows(rt, N, "cross-entropy row sums");
  softmax_xent_rows_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(probs, rows.loss, rows.hit, logits, targets, V);
  DL_CUDA_LAUNCHED("softmax_crossentropy_forward");
  if (loss_out) {  // the caller checked the targets on the host (CrossEntropyLoss::forward)
    DL_ASSERT(!correct, "softmax_crossentropy_forward: `correct` is read back, a slot is not: one or the other");
    rows.mean_into(rt, loss_out, targets, "softmax_crossentropy_forward mean");
    return 0.0;
  }
  const LossTotals t = rows.totals(rt, targets, "softmax_crossentropy_forward sum");
  if (t.bad_row >= 0)
    throw DataError("target " + std::to_string(t.bad_target) + " is out of range for " + std::to_string(V) + " classes",
                    "the data set's labels don't match model's number of classes");
  if (correct) *correct = t.hits;
  return t.count ? t.loss / double(t.count) : 0.0;
}

template <class T>
void crossentropy_backward(Runtime& rt, T* dlogits, const float* probs, const int32_t* targets, int64_t N, int64_t V, float scale) {
  if (N == 0) return;
  Scratch count(rt, 2, "cross-entropy target count");
  auto* c = reinterpret_cast<int64_t*>(count.p);
  count_valid_k<<<1, kThreads, 0, stream(rt)>>>(c, targets, N);
  DL_CUDA_LAUNCHED("softmax_crossentropy_backward count");
  softmax_xent_backward_k<<<blocks_for(N * V), kThreads, 0, stream(rt)>>>(dlogits, probs, targets, c, N, V, scale);
  DL_CUDA_LAUNCHED("softmax_crossentropy_backward");
}

}  // namespace

double softmax_crossentropy_forward(Runtime& rt, float* probs, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                                    int64_t* correct, double* loss_out) {
  OpScope op(rt, "softmax_crossentropy_forward", 5.0 * N * V, 8.0 * N * V);
  return crossentropy_forward(rt, probs, logits, targets, N, V, correct, loss_out);
}

void softmax_crossentropy_backward(Runtime& rt, float* dlogits, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                                   float scale) {
  OpScope op(rt, "softmax_crossentropy_backward", 2.0 * N * V, 8.0 * N * V);
  crossentropy_backward(rt, dlogits, probs, targets, N, V, scale);
}

double softmax_crossentropy_forward_16(Runtime& rt, float* probs, const void* logits, DType t, const int32_t* targets, int64_t N, int64_t V,
                                       int64_t* correct, double* loss_out) {
  require_16bit(t, "softmax_crossentropy_forward_16");
  OpScope op(rt, "softmax_crossentropy_forward", 5.0 * N * V, 8.0 * N * V);  // the f32 kernel's event
  double mean = 0.0;
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    mean = crossentropy_forward(rt, probs, static_cast<const T*>(logits), targets, N, V, correct, loss_out);
  });
  return mean;
}

void softmax_crossentropy_backward_16(Runtime& rt, void* dlogits, DType t, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                                      float scale) {
  require_16bit(t, "softmax_crossentropy_backward_16");
  OpScope op(rt, "softmax_crossentropy_backward", 2.0 * N * V, 8.0 * N * V);
  with_16bit_type(t, [&](auto z) {
    using T = decltype(z);
    crossentropy_backward(rt, static_cast<T*>(dlogits), probs, targets, N, V, scale);
  });
}

void vocab_ce_max(Runtime& rt, float* mx, const float* logits, int64_t N, int64_t V) {
  OpScope op(rt, "vocab_ce_max", double(N * V), 4.0 * double(N * V));
  if (N == 0) return;
  vocab_max_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(mx, logits, V);
  DL_CUDA_LAUNCHED("vocab_ce_max");
}

void vocab_ce_exp(Runtime& rt, float* probs, float* sum, float* zt, const float* logits, const float* mx, const int32_t* targets,
                  int64_t first, int64_t N, int64_t V) {
  OpScope op(rt, "vocab_ce_exp", 3.0 * double(N * V), 8.0 * double(N * V));
  if (N == 0) return;
  vocab_exp_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(probs, sum, zt, logits, mx, targets, first, V);
  DL_CUDA_LAUNCHED("vocab_ce_exp");
}

double vocab_ce_finish(Runtime& rt, float* probs, const float* sum, const float* zt, const float* mx, const int32_t* targets,
                       int64_t N, int64_t V, int64_t* correct, double* loss_out) {
  OpScope op(rt, "vocab_ce_finish", double(N * V), 8.0 * double(N * V));
  if (correct) *correct = 0;
  if (N == 0) {
    if (loss_out) DL_CUDA(cudaMemsetAsync(loss_out, 0, sizeof(double), stream(rt)));
    return 0.0;
  }
  RowResults rows(rt, N, "vocab-parallel loss row sums");
  vocab_finish_k<<<unsigned(N), kThreads, 0, stream(rt)>>>(probs, rows.loss, rows.hit, sum, zt, mx, targets, V);
  DL_CUDA_LAUNCHED("vocab_ce_finish");
  if (loss_out) {
    DL_ASSERT(!correct, "vocab_ce_finish: `correct` is read back, a slot is not: one or the other");
    rows.mean_into(rt, loss_out, targets, "vocab_ce_finish mean");
    return 0.0;
  }
  const LossTotals t = rows.totals(rt, targets, "vocab_ce_finish sum");
  if (correct) *correct = t.hits;
  return t.count ? t.loss / double(t.count) : 0.0;
}

}  // namespace distlab::cuda
