#include "core/ops/cpu/loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"
#include "core/util/error.h"

namespace distlab {

double softmax_crossentropy_forward(Runtime& rt, float* probs, const float* logits, const int32_t* targets,
                                    int64_t N, int64_t V, int64_t* correct, double* loss_out) {
  if (rt.kernels) return rt.kernels->softmax_crossentropy_forward(rt, probs, logits, targets, N, V, correct, loss_out);
  OpScope op(rt, "softmax_crossentropy_forward", 5.0 * N * V, 8.0 * N * V);
  if (rt.is_meta()) return 0.0;
  double total = 0;
  int64_t count = 0, hits = 0;
  for (int64_t n = 0; n < N; n++) {
    const float* x = logits + n * V;
    float* p = probs + n * V;
    float mx = x[0];
    int64_t arg = 0;
    for (int64_t v = 1; v < V; v++)
      if (x[v] > mx) {
        mx = x[v];
        arg = v;
      }
    double sum = 0;
    for (int64_t v = 0; v < V; v++) {
      p[v] = std::exp(x[v] - mx);
      sum += p[v];
    }
    float inv = float(1.0 / sum);
    for (int64_t v = 0; v < V; v++) p[v] *= inv;
    int32_t t = targets[n];
    if (t < 0) continue;
    if (t >= V)
      throw DataError("target " + std::to_string(t) + " is out of range for " + std::to_string(V) + " classes",
                      "the data set's labels don't match model's number of classes");
    total += -(double(x[t]) - mx - std::log(sum));
    count++;
    if (arg == t) hits++;
  }
  if (correct) *correct = hits;
  const double mean = count ? total / double(count) : 0.0;
  if (loss_out) *loss_out = mean;
  return mean;
}

double softmax_crossentropy_forward_16(Runtime& rt, float* probs, const void* logits, DType t, const int32_t* targets, int64_t N, int64_t V,
                                       int64_t* correct, double* loss_out) {
  if (rt.kernels) return rt.kernels->softmax_crossentropy_forward_16(rt, probs, logits, t, targets, N, V, correct, loss_out);
  if (rt.is_meta()) return softmax_crossentropy_forward(rt, nullptr, nullptr, nullptr, N, V, correct, loss_out);
  const std::vector<float> z = widened(logits, t, N * V);
  return softmax_crossentropy_forward(rt, probs, z.data(), targets, N, V, correct, loss_out);
}

void softmax_crossentropy_backward_16(Runtime& rt, void* dlogits, DType t, const float* probs, const int32_t* targets, int64_t N, int64_t V,
                                      float scale) {
  if (rt.kernels) return rt.kernels->softmax_crossentropy_backward_16(rt, dlogits, t, probs, targets, N, V, scale);
  if (rt.is_meta()) return softmax_crossentropy_backward(rt, nullptr, nullptr, nullptr, N, V, scale);
  std::vector<float> d(static_cast<size_t>(N * V));
  softmax_crossentropy_backward(rt, d.data(), probs, targets, N, V, scale);
  convert(d.data(), DType::f32, dlogits, t, N * V);
}

void softmax_crossentropy_backward(Runtime& rt, float* dlogits, const float* probs, const int32_t* targets,
                                   int64_t N, int64_t V, float scale) {
  if (rt.kernels) return rt.kernels->softmax_crossentropy_backward(rt, dlogits, probs, targets, N, V, scale);
  OpScope op(rt, "softmax_crossentropy_backward", 2.0 * N * V, 8.0 * N * V);
  if (rt.is_meta()) return;
  int64_t count = 0;
  for (int64_t n = 0; n < N; n++) count += targets[n] >= 0;
  const float k = count ? scale / float(count) : 0.0f;
  for (int64_t n = 0; n < N; n++) {
    float* d = dlogits + n * V;
    const float* p = probs + n * V;
    int32_t t = targets[n];
    if (t < 0) {
      for (int64_t v = 0; v < V; v++) d[v] = 0.0f;
      continue;
    }
    for (int64_t v = 0; v < V; v++) d[v] = k * (p[v] - (v == t ? 1.0f : 0.0f));
  }
}

// ---- the vocabulary-parallel loss's three steps ----

void vocab_ce_max(Runtime& rt, float* mx, const float* logits, int64_t N, int64_t V) {
  if (rt.kernels) return rt.kernels->vocab_ce_max(rt, mx, logits, N, V);
  OpScope op(rt, "vocab_ce_max", double(N * V), 4.0 * double(N * V));
  if (rt.is_meta()) return;
  for (int64_t n = 0; n < N; n++) {
    float m = logits[n * V];
    for (int64_t v = 1; v < V; v++) m = std::max(m, logits[n * V + v]);
    mx[n] = m;
  }
}

void vocab_ce_exp(Runtime& rt, float* probs, float* sum, float* zt, const float* logits, const float* mx,
                  const int32_t* targets, int64_t first, int64_t N, int64_t V) {
  if (rt.kernels) return rt.kernels->vocab_ce_exp(rt, probs, sum, zt, logits, mx, targets, first, N, V);
  OpScope op(rt, "vocab_ce_exp", 3.0 * double(N * V), 8.0 * double(N * V));
  if (rt.is_meta()) return;
  for (int64_t n = 0; n < N; n++) {
    double s = 0;
    for (int64_t v = 0; v < V; v++) {
      probs[n * V + v] = std::exp(logits[n * V + v] - mx[n]);
      s += probs[n * V + v];
    }
    sum[n] = float(s);
    const int32_t t = targets[n];
    zt[n] = t >= first && t < first + V ? logits[n * V + (t - first)] : 0.0f;
  }
}

double vocab_ce_finish(Runtime& rt, float* probs, const float* sum, const float* zt, const float* mx, const int32_t* targets,
                       int64_t N, int64_t V, int64_t* correct, double* loss_out) {
  if (rt.kernels) return rt.kernels->vocab_ce_finish(rt, probs, sum, zt, mx, targets, N, V, correct, loss_out);
  OpScope op(rt, "vocab_ce_finish", double(N * V), 8.0 * double(N * V));
  if (correct) *correct = 0;
  if (rt.is_meta()) return 0.0;
  double total = 0;
  int64_t counted = 0;
  for (int64_t n = 0; n < N; n++) {
    const float inv = 1.0f / sum[n];
    for (int64_t v = 0; v < V; v++) probs[n * V + v] *= inv;
    if (targets[n] < 0) continue;
    total += -(double(zt[n]) - mx[n] - std::log(double(sum[n])));
    counted++;
    if (correct && zt[n] == mx[n]) ++*correct;
  }
  const double mean = counted ? total / double(counted) : 0.0;
  if (loss_out) *loss_out = mean;
  return mean;
}

}  // namespace distlab
