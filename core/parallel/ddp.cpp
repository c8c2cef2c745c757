#include "core/parallel/ddp.h"

#include <fmt/format.h>

#include <cstring>

#include "core/parallel/comm_buffers.h"
#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

// Our collectives move f32. A 16-bit tensor (mixed precision) travels as f32: converted in, rounded back
// out. Broadcasts are exact that way; a gradient's average is the f32 average rounded once (NCCL's 16-bit
// ring rounds at every hop), and the wire carries 4 bytes per value where a 16-bit all-reduce sends 2.
// (A cuda rank's tensors come down to the host and go back up: Gloo moves host memory.)
static void broadcast_tensor(ProcessGroup& pg, Tensor& t) {
  OnHost h(t, OnHost::inout);  // meta: nullptr, no data
  pg.broadcast(h.p, t.numel(), 0);
  h.store();
}

void broadcast_model(ProcessGroup& pg, Model& model) {
  for (auto* p : model.parameters()) broadcast_tensor(pg, p->data);
  for (auto* b : model.buffers()) broadcast_tensor(pg, b->data);
}

// A parameter that got no gradient this step (unused) contributes zeros, as DDP's find_unused_parameters.
static Tensor& grad_or_zeros(Parameter& p) { return p.grad_for_accumulate(); }

// the trainable parameters only: a frozen one (LoRA's base) has no gradient to average
NaiveDDP::NaiveDDP(ProcessGroup& pg, Model& model) : pg_(pg), params_(trainable(model.parameters())) {
  broadcast_model(pg, model);
  plain_optimizer_step_ = true;  // the default norm and step (StepHooks)
}

void NaiveDDP::finish_backward(Runtime& rt) {
  if (!sync_) return;
  for (auto* p : params_) {
    OnHost g(grad_or_zeros(*p), OnHost::inout);
    pg_.all_reduce(g.p, p->data.numel(), ReduceOp::avg, rt.reduce_dtype);
    g.store();
  }
}

BucketedDDP::BucketedDDP(ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb)
    : pg_(pg), rt_(rt), params_(trainable(model.parameters())) {
  broadcast_model(pg, model);
  plain_optimizer_step_ = true;
  const int64_t cap = int64_t(bucket_mb * 1024 * 1024);
  where_.resize(params_.size());
  marked_.assign(params_.size(), false);
  Bucket cur;
  int64_t bytes = 0;
  std::vector<int64_t> sizes;
  auto close = [&] {
    if (cur.params.empty()) return;
    buckets_.push_back(std::move(cur));
    sizes.push_back(bytes / 4);
    cur = Bucket();
    bytes = 0;
  };
  for (size_t k = params_.size(); k-- > 0;) {  // reverse: the order backward finishes them
    const int64_t b = params_[k]->data.numel() * 4;
    if (bytes > 0 && bytes + b > cap) close();
    where_[k] = {int64_t(buckets_.size()), bytes / 4};
    cur.params.push_back(params_[k]);
    bytes += b;
  }
  close();
  for (size_t i = 0; i < buckets_.size(); i++)
    buckets_[i].flat = rt.zeros({sizes[i]}, Category::comm_buffers, fmt::format("DDP bucket {}", i));
}

std::vector<std::string> BucketedDDP::bucket_names(int64_t b) const {
  std::vector<std::string> n;
  for (auto* p : buckets_[size_t(b)].params) n.push_back(p->name);
  return n;
}

nlohmann::json BucketedDDP::report() const {
  nlohmann::json r = DataParallel::report();
  nlohmann::json sizes = nlohmann::json::array();
  for (const auto& b : buckets_) sizes.push_back(b.flat.nbytes());
  r["bucket_bytes"] = sizes;  // comm_buffers: one flat f32 buffer per bucket, the last layers' first
  return r;
}

void BucketedDDP::after_layer_backward(int unit, const std::vector<Parameter*>& params) {
  if (!sync_) return;
  for (auto* p : params) {
    for (size_t k = 0; k < params_.size(); k++) {
      if (params_[k] != p || marked_[k]) continue;
      marked_[k] = true;
      buckets_[size_t(where_[k].first)].ready++;
    }
  }
  launch_ready_buckets();
}

// Buckets start strictly in order 0, 1, 2...: every rank must issue the same all_reduces in the same order.
void BucketedDDP::launch_ready_buckets() {
  while (next_to_launch_ < int64_t(buckets_.size())) {
    Bucket& b = buckets_[size_t(next_to_launch_)];
    if (b.ready < int64_t(b.params.size())) return;
    float* flat = b.flat.f32();
    int64_t off = 0;
    for (auto* p : b.params) {
      const int64_t n = p->data.numel();
      const Tensor& g = grad_or_zeros(*p);
      if (flat) copy_values(rt_, g.data(), g.dtype(), flat + off, DType::f32, n);
      off += n;
    }
    // on a cuda rank: NCCL on the GPU after the copies queued above (dist.backend = "nccl"), or Gloo over a
    // host copy (core/parallel/comm_buffers.h)
    b.work = staged_all_reduce_async(rt_, pg_, flat, b.flat.numel(), ReduceOp::avg, rt_.reduce_dtype);
    next_to_launch_++;
  }
}

void BucketedDDP::finish_backward(Runtime& rt) {
  if (!sync_) return;
  // parameters the model never reported (none in our models) are treated as ready now
  for (size_t k = 0; k < params_.size(); k++)
    if (!marked_[k]) {
      marked_[k] = true;
      buckets_[size_t(where_[k].first)].ready++;
    }
  launch_ready_buckets();
  for (auto& b : buckets_) {
    b.work->wait();
    const float* flat = b.flat.f32();
    int64_t off = 0;
    for (auto* p : b.params) {
      const int64_t n = p->data.numel();
      if (flat) copy_values(rt, flat + off, DType::f32, p->grad.data(), p->grad.dtype(), n);
      off += n;
    }
    b.work.reset();
    b.ready = 0;
  }
  marked_.assign(params_.size(), false);
  next_to_launch_ = 0;
}

std::unique_ptr<DataParallel> make_ddp(DdpMode mode, ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb) {
  if (mode == DdpMode::naive) return std::make_unique<NaiveDDP>(pg, model);
  return std::make_unique<BucketedDDP>(pg, model, rt, bucket_mb);
}

}  // namespace distlab
