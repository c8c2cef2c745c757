#include "core/parallel/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "core/dist/errors.h"
#include "core/tensor/on_host.h"
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

Pipeline::Pipeline(ProcessGroup& pp, Model& stage, std::string schedule, int micro_batches, bool allow_idle)
    : pp_(pp), model_(stage), schedule_(std::move(schedule)), m_(micro_batches) {
  pipeline_schedule(schedule_, pp.size(), pp.rank(), m_);  // checks the name
  if (m_ < 1) throw ConfigError(fmt::format("parallel.micro_batches is {}", m_), "a step has at least one micro-batch");
  if (m_ < pp.size() && !allow_idle)
    throw ConfigError(fmt::format("parallel.micro_batches {} < parallel.pp {}: fewer micro-batches than stages", m_, pp.size()),
                      fmt::format("the pipeline would idle most of each step (a bubble of (p - 1)/(m + p - 1) = {:.0f} %, and no "
                                  "stage ever holds more than m micro-batches); use parallel.micro_batches >= {} (4 x pp is usual)",
                                  100.0 * (pp.size() - 1) / (m_ + pp.size() - 1), pp.size()));
}

// The p2p payload travels as f32 through host memory (Gloo's send and recv); 16-bit activations are
// widened for the wire and rounded back (exact), and a cuda rank's cross to the host and back (OnHost).
void Pipeline::exchange(Runtime& rt, const Tensor& out, int dst, int out_tag, Tensor* in, const Shape& in_shape, int src, int in_tag,
                        const std::string& what) {
  const int64_t n_out = out.defined() ? out.numel() : 0, n = src >= 0 ? shape_numel(in_shape) : 0;
  std::unique_ptr<OnHost> send, recv;
  if (dst >= 0 && out.data()) send = std::make_unique<OnHost>(out, OnHost::in);
  if (src >= 0) {
    *in = rt.empty(in_shape, Category::activations,
                   in_tag % 2 == 0 || in_tag == 1 ? fmt::format("activations from stage {}", src) : fmt::format("gradient from stage {}", src), rt.dtype);
    if (in->data()) recv = std::make_unique<OnHost>(*in, OnHost::out);
  }
  try {
    pp_.send_recv(send ? send->p : nullptr, dst >= 0 ? n_out : 0, dst, out_tag, recv ? recv->p : nullptr, n, src, in_tag);
  } catch (const PeerLostError& e) {  // the neighbour died first: its own output says why (the launcher blames it)
    throw PeerLostError(fmt::format("pipeline stage {} of {}: {} — {}", stage(), stages(), what, e.what()), e.hint());
  } catch (const CommError& e) {
    CommError err(fmt::format("pipeline stage {} of {} ({} schedule, {} micro-batches): {} — {}", stage(), stages(), schedule_, m_, what, e.what()),
                  "a stage's sends and receives must pair with its neighbours' in the same order: under 1F1B stage s runs "
                  "min(p - s - 1, m) forwards before its first backward; a stage that sends when its neighbour also sends, "
                  "or waits for what was never sent, hangs until this timeout");
    err.waiting_for = e.waiting_for;
    throw err;
  }
  if (recv) recv->store();
}

std::string check_schedule(const std::vector<PipeAction>& order, int m) {
  std::vector<int> f_at(static_cast<size_t>(m), -1), b_at(static_cast<size_t>(m), -1);
  for (int i = 0; i < int(order.size()); i++) {
    const PipeAction& a = order[size_t(i)];
    const char op = a.op == PipeAction::forward ? 'F' : 'B';
    if (a.micro < 0 || a.micro >= m) return fmt::format("action {} is {}{}, but the micro-batches are 0..{}", i, op, a.micro, m - 1);
    int& at = (a.op == PipeAction::forward ? f_at : b_at)[size_t(a.micro)];
    if (at >= 0) return fmt::format("{}{} runs twice (actions {} and {})", op, a.micro, at, i);
    at = i;
    if (a.op == PipeAction::backward && f_at[size_t(a.micro)] < 0) return fmt::format("B{} (action {}) runs before F{}", a.micro, i, a.micro);
  }
  for (int j = 0; j < m; j++)
    if (f_at[size_t(j)] < 0 || b_at[size_t(j)] < 0) return fmt::format("{}{} never runs", f_at[size_t(j)] < 0 ? 'F' : 'B', j);
  return "";
}

// Messages are tagged by micro-batch: a stage that expects micro-batch j's activations takes only those,
// so schedules whose orders do not fit together hang (and the timeout names the stage and what it
// waited for) rather than train on each other's tensors.
static int activation_tag(int micro) { return 16 + 2 * micro; }
static int gradient_tag(int micro) { return 17 + 2 * micro; }

Pipeline::StepResult Pipeline::train_step(Runtime& rt, const std::function<Batch()>& next, const StageLoss& loss, float loss_factor,
                                          Strategy& strategy, const std::vector<PipeAction>* order, const std::vector<bool>* dp_sync) {
  StepResult res;
  const int s = stage();
  const std::vector<PipeAction> own = order ? std::vector<PipeAction>() : pipeline_schedule(schedule_, stages(), s, m_);
  const std::vector<PipeAction>& actions = order ? *order : own;
  if (const std::string bad = check_schedule(actions, m_); !bad.empty())
    throw ConfigError(fmt::format("pipeline stage {} of {}: its schedule ({}) {}", s, stages(), describe_schedule(actions), bad),
                      "every micro-batch runs forward once, then backward once, on every stage");
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
  // the last micro-batch's backward is the last backward of the step: data parallelism syncs in it
  int last_backward = -1;
  for (const PipeAction& a : actions)
    if (a.op == PipeAction::backward) last_backward = a.micro;
  auto backward = [&](int j, const Tensor& dy) {
    rt.trace.mark(fmt::format("B{}", j), true);
    model_.swap_saved(held_.at(j));
    held_.erase(j);
    Tensor d = last() ? dlogits.at(j) : dy;
    dlogits.erase(j);
    strategy.begin_backward(dp_sync ? bool(dp_sync->at(size_t(j))) : j == last_backward);
    Tensor dx = model_.backward_stage(rt, d, &strategy);
    strategy.finish_backward(rt);
    rt.trace.mark(fmt::format("B{}", j), false);
    return dx;
  };
  // Where an action's input comes from: a forward's from the stage before, a backward's from the stage after.
  auto source = [&](const PipeAction& a) { return a.op == PipeAction::forward ? prev : next_stage; };
  auto tag_of = [&](const PipeAction& a) { return a.op == PipeAction::forward ? activation_tag(a.micro) : gradient_tag(a.micro); };
  // a forward receives what this stage takes in, a backward the gradient of what it gave out
  auto input_shape = [&](const PipeAction& a) {
    const Batch& b = batch(a.micro);
    return a.op == PipeAction::forward ? model_.stage_input_shape(b) : model_.stage_output_shape(b);
  };
  auto input_name = [&](const PipeAction& a) {
    return fmt::format("micro-batch {}'s {} from stage {}", a.micro, a.op == PipeAction::forward ? "activations" : "gradient", source(a));
  };

  Tensor pending;  // the next action's input, received together with this action's send
  bool have_pending = false;
  for (size_t k = 0; k < actions.size(); k++) {
    const PipeAction& a = actions[k];
    const PipeAction* after = k + 1 < actions.size() ? &actions[k + 1] : nullptr;
    Tensor in;
    if (have_pending) {
      in = pending;
      pending = Tensor();
      have_pending = false;
    } else if (source(a) >= 0) {
      exchange(rt, Tensor(), -1, 0, &in, input_shape(a), source(a), tag_of(a), "receiving " + input_name(a));
    }
    Tensor out = a.op == PipeAction::forward ? forward(a.micro, in) : backward(a.micro, in);
    // a forward's output goes on to the stage after, a backward's (the input's gradient) back to the one before
    const int dst = a.op == PipeAction::forward ? next_stage : prev;
    if (dst < 0) continue;
    const std::string sent = fmt::format("sending micro-batch {}'s {} to stage {}", a.micro, a.op == PipeAction::forward ? "activations" : "gradient", dst);
    const int out_tag = a.op == PipeAction::forward ? activation_tag(a.micro) : gradient_tag(a.micro);
    if (after && source(*after) == dst) {  // the neighbour's send the other way: both in flight at once
      exchange(rt, out, dst, out_tag, &pending, input_shape(*after), dst, tag_of(*after), sent + " and receiving " + input_name(*after));
      have_pending = true;
    } else {
      exchange(rt, out, dst, out_tag, nullptr, {}, -1, 0, sent);
    }
  }
  DL_ASSERT(held_.empty(), "pipeline: a micro-batch's activations were never consumed");
  return res;
}

Tensor Pipeline::forward_only(Runtime& rt, const Batch& b) {
  Tensor x;
  if (!first()) exchange(rt, Tensor(), -1, 0, &x, model_.stage_input_shape(b), stage() - 1, 1, "receiving an evaluation batch's activations");
  Tensor y = model_.forward_stage(rt, b, x, nullptr);
  if (!last()) {
    exchange(rt, y, stage() + 1, 1, nullptr, {}, -1, 0, "sending an evaluation batch's activations");
    return Tensor();
  }
  return y;
}

void Pipeline::sync_tied(Runtime& rt, Parameter* tied) {
  if (stages() == 1 || !(first() || last()) || !tied) return;  // (a model without tied weights: nothing)
  const int peer = first() ? stages() - 1 : 0;
  Tensor& g = tied->grad_for_accumulate();
  const int64_t n = g.numel();
  if (!g.data()) return pp_.send_recv(nullptr, n, peer, 4, nullptr, n, peer, 4);  // meta: traced, no data
  OnHost mine(g, OnHost::inout);
  std::vector<float> theirs(static_cast<size_t>(n));
  try {
    pp_.send_recv(mine.p, n, peer, 4, theirs.data(), n, peer, 4);
  } catch (const PeerLostError& e) {
    throw PeerLostError(fmt::format("pipeline stage {}: summing the tied embedding's gradient with stage {}: {}", stage(), peer, e.what()), e.hint());
  } catch (const CommError& e) {
    throw CommError(fmt::format("pipeline stage {}: summing the tied embedding's gradient with stage {}: {}", stage(), peer, e.what()), e.hint());
  }
  // the same sum on both stages (addition commutes: a + b == b + a, bit for bit)
  for (int64_t i = 0; i < n; i++) mine.p[i] += theirs[size_t(i)];
  mine.store();
}

}  // namespace distlab
