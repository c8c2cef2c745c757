#include "core/ops/cpu/loss.h"

#include <cmath>

#include "core/ops/kernels.h"
#include "core/ops/op_scope.h"
#include "core/util/error.h"

namespace distlab {

double softmax_crossentropy_forward(Runtime& rt, float* probs, const float* logits, const int32_t* targets,
                                    int64_t N, int64_t V, int64_t* correct) {
  if (rt.kernels) return rt.kernels->softmax_crossentropy_forward(rt, probs, logits, targets, N, V, correct);
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
  return count ? total / double(count) : 0.0;
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

}  // namespace distlab
