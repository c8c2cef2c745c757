#include "core/parallel/pipeline.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/dist/errors.h"
#include "core/util/error.h"

namespace distlab {

int warmup_forwards(int stages, int stage, int m) { return std::min(stages - stage - 1, m); }

static int warmup_of(const std::string& schedule, int stages, int stage, int m) {
  return schedule == "gpipe" ? m : warmup_forwards(stages, stage, m);
}

std::vector<PipeAction> pipeline_schedule(const std::string& schedule, int stages, int stage, int m) {
  if (schedule != "gpipe" && schedule != "1f1b")
    throw ConfigError(fmt::format("parallel.schedule is '{}'", schedule), "use gpipe or 1f1b");
  const int w = warmup_of(schedule, stages, stage, m);
  std::vector<PipeAction> v;
  for (int i = 0; i < w; i++) v.push_back({PipeAction::forward, i});
  for (int i = 0; i < m - w; i++) {
    v.push_back({PipeAction::forward, w + i});
    v.push_back({PipeAction::backward, i});
  }
  for (int i = m - w; i < m; i++) v.push_back({PipeAction::backward, i});
  return v;
}

std::string describe_schedule(const std::vector<PipeAction>& s) {
  std::string out;
  for (const PipeAction& a : s) out += fmt::format("{}{}{}", out.empty() ? "" : " ", a.op == PipeAction::forward ? 'F' : 'B', a.micro);
  return out;
}

Pipeline::Pipeline(ProcessGroup& pp, Model& stage, std::string schedule, int micro_batches, int64_t hidden, bool allow_idle)
    : pp_(pp), model_(stage), schedule_(std::move(schedule)), m_(micro_batches), hidden_(hidden) {
  pipeline_schedule(schedule_, pp.size(), pp.rank(), m_);  // checks the name
  if (m_ < 1) throw ConfigError(fmt::format("parallel.micro_batches is {}", m_), "a step has at least one micro-batch");
  if (m_ < pp.size() && !allow_idle)
    throw ConfigError(fmt::format("parallel.micro_batches {} < parallel.pp {}: fewer micro-batches than stages", m_, pp.size()),
                      fmt::format("the pipeline would idle most of each step (a bubble of (p - 1)/(m + p - 1) = {:.0f} %, and no "
                                  "stage ever holds more than m micro-batches); use parallel.micro_batches >= {} (4 x pp is usual)",
                                  100.0 * (pp.size() - 1) / (m_ + pp.size() - 1), pp.size()));
}

// The p2p payload travels as f32; 16-bit activations are widened for the wire and rounded back (exact).
void Pipeline::exchange(Runtime& rt, const Tensor& out, int dst, int out_tag, Tensor* in, int src, int in_tag, const Batch& b,
                        const std::string& what) {
  const int64_t n = b.B * b.T * hidden_;
  std::vector<float> send_buf, recv_buf;
  if (dst >= 0 && out.data()) {
    send_buf.resize(static_cast<size_t>(out.numel()));
    convert(out.data(), out.dtype(), send_buf.data(), DType::f32, out.numel());
  }
  if (src >= 0) {
    *in = rt.empty({b.B, b.T, hidden_}, Category::activations,
                   in_tag == 1 ? fmt::format("activations from stage {}", src) : fmt::format("gradient from stage {}", src), rt.dtype);
    if (in->data()) recv_buf.resize(static_cast<size_t>(n));
  }
  try {
    pp_.send_recv(send_buf.empty() ? nullptr : send_buf.data(), dst >= 0 ? n : 0, dst, out_tag, recv_buf.empty() ? nullptr : recv_buf.data(),
                  src >= 0 ? n : 0, src, in_tag);
  } catch (const CommError& e) {
    CommError err(fmt::format("pipeline stage {} of {} ({} schedule, {} micro-batches): {} — {}", stage(), stages(), schedule_, m_, what, e.what()),
                  "a stage's sends and receives must pair with its neighbours' in the same order: under 1F1B stage s runs "
                  "min(p - s - 1, m) forwards before its first backward; a stage that sends when its neighbour also sends, "
                  "or waits for what was never sent, hangs until this timeout");
    err.waiting_for = e.waiting_for;
    throw err;
  }
  if (src >= 0 && in->data()) convert(recv_buf.data(), DType::f32, in->data(), in->dtype(), n);
}

Pipeline::StepResult Pipeline::train_step(Runtime& rt, const std::function<Batch()>& next, const StageLoss& loss, float loss_factor,
                                          Strategy& strategy) {
  StepResult res;
  const int s = stage(), w = warmup_of(schedule_, stages(), s, m_), rest = m_ - w;
  const int prev = first() ? -1 : s - 1, next_stage = last() ? -1 : s + 1;
  std::vector<Batch> batches;
  std::map<int, Tensor> dlogits;  // the last stage's: a micro-batch's loss gradient, from its forward to its backward
  auto batch = [&](int j) -> const Batch& {  // read in order, once; every stage reads the same micro-batches
    while (int(batches.size()) <= j) {
      batches.push_back(next());
      res.samples += batches.back().samples();
    }
    return batches[size_t(j)];
  };
  auto forward = [&](int j, const Tensor& x) {
    rt.trace.mark(fmt::format("F{}", j), true);
    const Batch& b = batch(j);
    Tensor y = model_.forward_stage(rt, b, x, &strategy);
    if (last()) {
      res.loss_sum += loss(rt, y, b, loss_factor, dlogits[j]);
      y = Tensor();
    }
    SavedState& held = held_[j];
    model_.swap_saved(held);  // this micro-batch's saved activations leave the layers until its backward
    res.peak_in_flight = std::max(res.peak_in_flight, int(held_.size()));
    int64_t bytes = 0;
    for (const auto& [k, h] : held_) bytes += h.bytes();
    for (const auto& [k, d] : dlogits) bytes += d.defined() ? d.nbytes() : 0;
    res.peak_held_bytes = std::max(res.peak_held_bytes, bytes);
    rt.trace.mark(fmt::format("F{}", j), false);
    return y;
  };
  auto backward = [&](int j, const Tensor& dy) {
    rt.trace.mark(fmt::format("B{}", j), true);
    model_.swap_saved(held_.at(j));
    held_.erase(j);
    Tensor d = last() ? dlogits.at(j) : dy;
    dlogits.erase(j);
    strategy.begin_backward(j == m_ - 1);  // data parallel: once, in the last micro-batch's backward
    Tensor dx = model_.backward_stage(rt, d, &strategy);
    strategy.finish_backward(rt);
    rt.trace.mark(fmt::format("B{}", j), false);
    return dx;
  };
  const int kAct = 1, kGrad = 2;  // tags: activations flow forward, gradients backward
  auto recv_forward = [&](int j) {
    Tensor x;
    if (!first()) exchange(rt, Tensor(), -1, 0, &x, prev, kAct, batch(j), fmt::format("receiving micro-batch {}'s activations from stage {}", j, prev));
    return x;
  };
  auto send_forward = [&](int j, const Tensor& y) {
    if (!last()) exchange(rt, y, next_stage, kAct, nullptr, -1, 0, batch(j), fmt::format("sending micro-batch {}'s activations to stage {}", j, next_stage));
  };
  auto recv_backward = [&](int j) {
    Tensor d;
    if (!last()) exchange(rt, Tensor(), -1, 0, &d, next_stage, kGrad, batch(j), fmt::format("receiving micro-batch {}'s gradient from stage {}", j, next_stage));
    return d;
  };
  auto send_backward = [&](int j, const Tensor& dx) {
    if (!first()) exchange(rt, dx, prev, kGrad, nullptr, -1, 0, batch(j), fmt::format("sending micro-batch {}'s gradient to stage {}", j, prev));
  };

  // warm-up: forwards only (all m under GPipe)
  for (int i = 0; i < w; i++) send_forward(i, forward(i, recv_forward(i)));
  // steady state: one forward, one backward; each exchange pairs a send with the neighbour's send the other way
  Tensor x = rest > 0 ? recv_forward(w) : Tensor();
  for (int i = 0; i < rest; i++) {
    const int j = w + i;
    Tensor y = forward(j, x);
    Tensor dy;
    if (!last()) exchange(rt, y, next_stage, kAct, &dy, next_stage, kGrad, batch(j),
                          fmt::format("sending micro-batch {}'s activations to stage {} and receiving micro-batch {}'s gradient", j, next_stage, i));
    Tensor dx = backward(i, dy);
    x = Tensor();
    if (i == rest - 1) {
      send_backward(i, dx);
    } else if (!first()) {
      exchange(rt, dx, prev, kGrad, &x, prev, kAct, batch(j + 1),
               fmt::format("sending micro-batch {}'s gradient to stage {} and receiving micro-batch {}'s activations", i, prev, j + 1));
    }
  }
  // cool-down: the backwards left
  for (int i = rest; i < m_; i++) send_backward(i, backward(i, recv_backward(i)));
  DL_ASSERT(held_.empty(), "pipeline: a micro-batch's activations were never consumed");
  return res;
}

Tensor Pipeline::forward_only(Runtime& rt, const Batch& b) {
  Tensor x;
  if (!first()) exchange(rt, Tensor(), -1, 0, &x, stage() - 1, 3, b, "receiving an evaluation batch's activations");
  Tensor y = model_.forward_stage(rt, b, x, nullptr);
  if (!last()) {
    exchange(rt, y, stage() + 1, 3, nullptr, -1, 0, b, "sending an evaluation batch's activations");
    return Tensor();
  }
  return y;
}

void Pipeline::sync_tied(Runtime& rt, Parameter* tied) {
  if (stages() == 1 || !(first() || last())) return;
  DL_ASSERT(tied, "sync_tied: the first and last stage hold the tied embedding");
  const int peer = first() ? stages() - 1 : 0;
  Tensor& g = tied->grad_for_accumulate();
  const int64_t n = g.numel();
  if (!g.data()) return pp_.send_recv(nullptr, n, peer, 4, nullptr, n, peer, 4);  // meta: traced, no data
  std::vector<float> mine(static_cast<size_t>(n)), theirs(static_cast<size_t>(n));
  convert(g.data(), g.dtype(), mine.data(), DType::f32, n);
  try {
    pp_.send_recv(mine.data(), n, peer, 4, theirs.data(), n, peer, 4);
  } catch (const CommError& e) {
    throw CommError(fmt::format("pipeline stage {}: summing the tied embedding's gradient with stage {}: {}", stage(), peer, e.what()), e.hint());
  }
  // the same sum on both stages (addition commutes: a + b == b + a, bit for bit)
  for (int64_t i = 0; i < n; i++) mine[size_t(i)] += theirs[size_t(i)];
  convert(mine.data(), DType::f32, g.data(), g.dtype(), n);
}

}  // namespace distlab
