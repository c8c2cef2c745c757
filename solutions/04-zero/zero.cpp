// Lab 04 — ZeRO-1 and ZeRO-2: every rank keeps 1/N of the optimizer state, then 1/N of the gradients too,
// and the job communicates exactly what DDP does.
#include <algorithm>
#include <cmath>
#include <vector>

#include "labs/04-zero/api.h"

namespace lab04 {

Shard shard_of(int64_t numel, int rank, int world) {
  /// BEGIN SOLUTION
  Shard s;
  s.padded = (numel + world - 1) / world * world;  // zeros: they add nothing to a sum and are never weights
  const int64_t part = s.padded / world;
  s.begin = int64_t(rank) * part;
  s.end = s.begin + part;
  return s;
  /// END SOLUTION
}

void adamw_step(const AdamW& h, bool decay, float grad_scale, float* w, float* m, float* v, const float* g, int64_t n) {
  /// BEGIN SOLUTION
  // PyTorch's order: decay the weights (decoupled: not through the gradient), then the moments, then the
  // bias-corrected step
  const double bc1 = 1.0 - std::pow(double(h.beta1), double(h.t)), bc2 = 1.0 - std::pow(double(h.beta2), double(h.t));
  const float step_size = float(h.lr / bc1), bc2_sqrt = float(std::sqrt(bc2));
  const float shrink = decay ? 1.0f - h.lr * h.weight_decay : 1.0f;
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i] * grad_scale;
    w[i] *= shrink;
    m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * gi;
    v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * gi * gi;
    w[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + h.eps);
  }
  /// END SOLUTION
}

/// BEGIN SOLUTION ONLY
// One flat's reduction: this rank's part of the average over ranks of the gradient — a reduce-scatter, half
// an all-reduce's bytes — started now, and kept once it is done. The whole gradient is released as soon as
// it is copied out, as the engine's ZeRO-2 frees it once packed into its bucket: a reduction in flight holds
// only the plugin's copy.
struct Reduction {
  int flat = -1, handle = -1;
  int64_t begin = 0;
  std::vector<float> part;
};

static Reduction start_reduce(Step& step, int flat) {
  Comm& comm = step.comm();
  const Shard s = shard_of(step.numel(flat), comm.rank(), comm.size());
  std::vector<float> g = step.grad(flat);
  step.release_grad(flat);           // copied: the trainer's whole gradient can go now, before the part is kept
  g.resize(size_t(s.padded), 0.0f);  // reduce_scatter splits size()·n: the padded length
  Reduction p;
  p.flat = flat;
  p.begin = s.begin;
  p.part.assign(size_t(s.end - s.begin), 0.0f);
  p.handle = comm.reduce_scatter_async(g.data(), p.part.data(), s.end - s.begin, ReduceOp::avg);
  return p;
}

static void finish_reduce(Step& step, Reduction& p) {
  if (p.flat < 0) return;
  if (p.handle >= 0) step.comm().wait(p.handle);
  step.keep_grad(p.flat, p.begin, p.part.data(), int64_t(p.part.size()));
  p.flat = -1;
}

// ZeRO-2's reductions in flight: one unit's, waited for when the next unit's flats arrive, so that they run
// while that unit's backward computes, as DDP's buckets do.
static std::vector<Reduction> in_flight;

static void finish_all(Step& step) {
  for (Reduction& p : in_flight) finish_reduce(step, p);
  in_flight.clear();
}
/// END SOLUTION ONLY

void zero1_reduce(Step& step) {
  /// BEGIN SOLUTION
  for (int f = 0; f < step.num_flats(); f++) {
    Reduction p = start_reduce(step, f);
    finish_reduce(step, p);
  }
  /// END SOLUTION
}

void zero_step(Step& step) {
  /// BEGIN SOLUTION
  Comm& comm = step.comm();
  const AdamW& h = step.hyper();
  // the global norm: each rank holds 1/N of every averaged gradient, so the squares add up over ranks
  std::vector<std::vector<float>> grads;
  float sq = 0;
  for (int f = 0; f < step.num_flats(); f++) {
    grads.push_back(step.kept_grad(f));
    double s = 0;
    for (float x : grads.back()) s += double(x) * x;
    sq += float(s);
  }
  float scale = 1.0f;
  if (h.max_norm > 0) {
    comm.all_reduce(&sq, 1, ReduceOp::sum);
    scale = std::min(1.0f, h.max_norm / (std::sqrt(sq) + 1e-6f));  // torch.nn.utils.clip_grad_norm_
  }
  for (int f = 0; f < step.num_flats(); f++) {
    const Shard s = shard_of(step.numel(f), comm.rank(), comm.size());
    const int64_t n = s.end - s.begin;
    float* master = step.state(f, "master", n);  // 12 bytes per element this rank owns, nothing for the rest
    float* m = step.state(f, "exp_avg", n);
    float* v = step.state(f, "exp_avg_sq", n);
    if (h.t == 1) {  // the master starts from the weights as they are (the padding stays 0)
      const std::vector<float> w = step.weights(f);
      for (int64_t i = 0; i < n; i++) master[i] = s.begin + i < int64_t(w.size()) ? w[size_t(s.begin + i)] : 0.0f;
    }
    adamw_step(h, step.decay(f), scale, master, m, v, grads[size_t(f)].data(), n);
    std::vector<float> whole(size_t(s.padded));
    comm.all_gather(master, whole.data(), n);  // the other half of DDP's all-reduce: every rank's new part
    step.set_weights(f, 0, whole.data(), s.padded);
  }
  /// END SOLUTION
}

void zero2_reduce(Step& step, int flat) {
  /// BEGIN SOLUTION
  if (!in_flight.empty() && step.unit(in_flight.front().flat) != step.unit(flat))
    finish_all(step);  // the previous unit's, which ran during this unit's backward
  in_flight.push_back(start_reduce(step, flat));  // (moving a Reduction keeps its part's buffer, where the wait writes)
  /// END SOLUTION
}

void zero2_finish(Step& step) {
  /// BEGIN SOLUTION
  finish_all(step);  // the last unit's: before the step reads the parts
  /// END SOLUTION
}

}  // namespace lab04

extern "C" Lab04Plugin distlab_lab04 = {kLab04Abi,          lab04::shard_of,     lab04::adamw_step, lab04::zero1_reduce,
                                        lab04::zero_step,   lab04::zero2_reduce, lab04::zero2_finish};
