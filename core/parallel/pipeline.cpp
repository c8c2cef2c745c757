#include "core/parallel/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "core/comm/errors.h"
#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

int warmup_forwards(int stages, int stage, int m) { return std::min(stages - stage - 1, m); }

static int warmup_of(PipeSchedule schedule, int stages, int stage, int m) {
  return schedule == PipeSchedule::gpipe ? m : warmup_forwards(stages, stage, m);
}

std::vector<PipeAction> pipeline_schedule(PipeSchedule schedule, int stages, int stage, int m) {
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

Pipeline::Pipeline(ProcessGroup& pp, Model& stage, PipeSchedule schedule, int micro_batches, bool allow_idle)
    : pp_(pp), model_(stage), schedule_(schedule), m_(micro_batches) {
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
                   pipe_tag::is_gradient(in_tag) ? fmt::format("gradient from stage {}", src) : fmt::format("activations from stage {}", src), rt.dtype);
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

// ---- one step ----

struct Pipeline::Step {
  Runtime& rt;
  const std::function<Batch()>& next;
  const StageLoss& loss;
  float loss_factor;
  StepHooks& strategy;
  const std::vector<bool>* dp_sync;  // by micro-batch; nullptr: only the last backward synchronises
  int last_backward = -1;            // the micro-batch whose backward is the step's last
  std::vector<Batch> batches;        // read in order, once; every stage reads the same micro-batches
  std::map<int, Tensor> dlogits;     // the last stage's: a micro-batch's loss gradient, from its forward to its backward
  StepResult res;

  const Batch& batch(int j) {
    while (int(batches.size()) <= j) {
      batches.push_back(next());
      res.samples += batches.back().samples();
    }
    return batches[size_t(j)];
  }
};

Tensor Pipeline::forward(Step& st, int j, const Tensor& x) {
  Runtime& rt = st.rt;
  rt.trace.mark(fmt::format("F{}", j), true);
  const Batch& b = st.batch(j);
  Tensor y = model_.forward_stage(rt, b, x, &st.strategy);
  if (last()) {
    st.res.loss_sum += st.loss(rt, y, b, st.loss_factor, st.dlogits[j]);
    y = Tensor();
  }
  SavedState& held = held_[j];
  model_.swap_saved(held);  // this micro-batch's saved activations leave the layers until its backward
  st.res.peak_in_flight = std::max(st.res.peak_in_flight, int(held_.size()));
  int64_t bytes = 0;
  for (const auto& [k, h] : held_) bytes += h.bytes();
  for (const auto& [k, d] : st.dlogits) bytes += d.defined() ? d.nbytes() : 0;
  st.res.peak_held_bytes = std::max(st.res.peak_held_bytes, bytes);
  rt.trace.mark(fmt::format("F{}", j), false);
  return y;
}

Tensor Pipeline::backward(Step& st, int j, const Tensor& dy) {
  Runtime& rt = st.rt;
  rt.trace.mark(fmt::format("B{}", j), true);
  model_.swap_saved(held_.at(j));
  held_.erase(j);
  Tensor d = last() ? st.dlogits.at(j) : dy;
  st.dlogits.erase(j);
  // data parallelism synchronises during the step's last backward (no_sync before), or where dp_sync says
  st.strategy.begin_backward(st.dp_sync ? bool(st.dp_sync->at(size_t(j))) : j == st.last_backward);
  Tensor dx = model_.backward_stage(rt, d, &st.strategy);
  st.strategy.finish_backward(rt);
  rt.trace.mark(fmt::format("B{}", j), false);
  return dx;
}

// ---- the neighbour exchanges: a forward's input comes from the stage before, a backward's from the one after ----

static std::string what_moves(int micro, bool gradient, const char* dir, int stage) {
  return fmt::format("micro-batch {}'s {} {} stage {}", micro, gradient ? "gradient" : "activations", dir, stage);
}

Tensor Pipeline::recv_forward(Step& st, int j) {
  Tensor x;
  if (prev() >= 0)
    exchange(st.rt, Tensor(), -1, 0, &x, model_.stage_input_shape(st.batch(j)), prev(), pipe_tag::activations(j),
             "receiving " + what_moves(j, false, "from", prev()));
  return x;
}

Tensor Pipeline::recv_backward(Step& st, int j) {
  Tensor dy;
  if (next() >= 0)
    exchange(st.rt, Tensor(), -1, 0, &dy, model_.stage_output_shape(st.batch(j)), next(), pipe_tag::gradient(j),
             "receiving " + what_moves(j, true, "from", next()));
  return dy;
}

void Pipeline::send_forward(Step& st, int j, const Tensor& y) {
  if (next() >= 0) exchange(st.rt, y, next(), pipe_tag::activations(j), nullptr, {}, -1, 0, "sending " + what_moves(j, false, "to", next()));
}

void Pipeline::send_backward(Step& st, int j, const Tensor& dx) {
  if (prev() >= 0) exchange(st.rt, dx, prev(), pipe_tag::gradient(j), nullptr, {}, -1, 0, "sending " + what_moves(j, true, "to", prev()));
}

// Both at once: the stage after is sending micro-batch jb's gradient back while this one sends j's
// activations on. Two blocking sends towards each other would deadlock.
Tensor Pipeline::send_forward_recv_backward(Step& st, int j, const Tensor& y, int jb) {
  Tensor dy;
  if (next() >= 0)
    exchange(st.rt, y, next(), pipe_tag::activations(j), &dy, model_.stage_output_shape(st.batch(jb)), next(), pipe_tag::gradient(jb),
             "sending " + what_moves(j, false, "to", next()) + " and receiving " + what_moves(jb, true, "from", next()));
  return dy;
}

Tensor Pipeline::send_backward_recv_forward(Step& st, int j, const Tensor& dx, int jf) {
  Tensor x;
  if (prev() >= 0)
    exchange(st.rt, dx, prev(), pipe_tag::gradient(j), &x, model_.stage_input_shape(st.batch(jf)), prev(), pipe_tag::activations(jf),
             "sending " + what_moves(j, true, "to", prev()) + " and receiving " + what_moves(jf, false, "from", prev()));
  return x;
}

// ---- the executors ----

// 1F1B (PipeDream-Flush), in its three phases, as Megatron-LM's forward_backward_pipelining_without_interleaving:
//   warm-up     w = min(p − s − 1, m) forwards: receive, compute, send on
//   steady      m − w times: one forward, then one backward (the oldest micro-batch in flight), each send
//               paired with the receive coming the other way
//   cool-down   the w backwards left
void Pipeline::run_1f1b(Step& st) {
  const int w = warmup_forwards(stages(), stage(), m_), steady = m_ - w;
  Tensor dy;  // a backward's input received early (only when there is no steady state: m < p, the simulator's)
  for (int j = 0; j < w; j++) {
    Tensor y = forward(st, j, recv_forward(st, j));
    if (j == w - 1 && steady == 0) dy = send_forward_recv_backward(st, j, y, 0);
    else send_forward(st, j, y);
  }
  Tensor x = steady > 0 ? recv_forward(st, w) : Tensor();
  for (int i = 0; i < steady; i++) {
    const int j = w + i;  // this forward's micro-batch; the backward's is i
    Tensor y = forward(st, j, x);
    Tensor dx = backward(st, i, send_forward_recv_backward(st, j, y, i));
    if (i + 1 < steady) x = send_backward_recv_forward(st, i, dx, j + 1);
    else send_backward(st, i, dx);
  }
  for (int i = steady; i < m_; i++) {
    const Tensor in = i == steady && dy.defined() ? dy : recv_backward(st, i);
    send_backward(st, i, backward(st, i, in));
  }
}

// Any valid order (GPipe's, a lab's): after each action its output goes on — a forward's to the stage
// after, a backward's back to the stage before — and when the next action's input comes from that same
// neighbour it is received in the same exchange.
void Pipeline::run_order(Step& st, const std::vector<PipeAction>& actions) {
  Tensor pending;  // the next action's input, received together with this action's send
  bool have_pending = false;
  for (size_t k = 0; k < actions.size(); k++) {
    const PipeAction& a = actions[k];
    const bool fwd = a.op == PipeAction::forward;
    const PipeAction* after = k + 1 < actions.size() ? &actions[k + 1] : nullptr;
    Tensor in;
    if (have_pending) in = pending, pending = Tensor(), have_pending = false;
    else in = fwd ? recv_forward(st, a.micro) : recv_backward(st, a.micro);
    const Tensor out = fwd ? forward(st, a.micro, in) : backward(st, a.micro, in);
    const int dst = fwd ? next() : prev();
    const bool paired = dst >= 0 && after && (after->op == PipeAction::forward ? prev() : next()) == dst;
    if (!paired) {
      if (fwd) send_forward(st, a.micro, out);
      else send_backward(st, a.micro, out);
      continue;
    }
    pending = fwd ? send_forward_recv_backward(st, a.micro, out, after->micro) : send_backward_recv_forward(st, a.micro, out, after->micro);
    have_pending = true;
  }
}

// ---- an executor of its own (lab 06's), one checked call at a time ----

Error Pipeline::Driver::wrong(int j, const std::string& what, const std::string& hint) const {
  return Error(fmt::format("pipeline stage {} of {} ({} micro-batches), micro-batch {}: {}", stage(), stages(), micro_batches(), j, what), hint);
}

void Pipeline::Driver::valid(int j, const char* what) const {
  if (j < 0 || j >= micro_batches())
    throw Error(fmt::format("pipeline stage {} of {}: {}({}), but the micro-batches are 0..{}", stage(), stages(), what, j, micro_batches() - 1));
}

void Pipeline::Driver::forward(int j) {
  valid(j, "forward");
  for (const PipeAction& a : ran_)
    if (a.op == PipeAction::forward && a.micro == j) throw wrong(j, "its forward runs a second time", "every micro-batch runs forward once per step");
  Tensor x;
  if (!p_.first()) {
    auto it = x_.find(j);
    if (it == x_.end())
      throw wrong(j, fmt::format("its forward runs before its activations arrived from stage {}", p_.prev()),
                  "receive them first (recv_forward, or paired with a send the other way)");
    x = it->second;
    x_.erase(it);
  }
  Tensor y = p_.forward(st_, j, x);
  if (!p_.last()) y_[j] = y;
  ran_.push_back({PipeAction::forward, j});
}

void Pipeline::Driver::backward(int j, bool dp_sync) {
  valid(j, "backward");
  bool fwd = false;
  for (const PipeAction& a : ran_) {
    if (a.micro != j) continue;
    if (a.op == PipeAction::backward) throw wrong(j, "its backward runs a second time", "every micro-batch runs backward once per step");
    fwd = true;
  }
  if (!fwd) throw wrong(j, "its backward runs before its forward", "a micro-batch's backward needs what its forward saved");
  Tensor dy;
  if (!p_.last()) {
    auto it = dy_.find(j);
    if (it == dy_.end())
      throw wrong(j, fmt::format("its backward runs before its gradient arrived from stage {}", p_.next()),
                  "receive it first (recv_backward, or paired with a send the other way)");
    dy = it->second;
    dy_.erase(it);
  }
  std::vector<bool> say(size_t(micro_batches()), false);  // the executor's say, unless the caller decides (a strategy that
  say[size_t(j)] = dp_sync;                                // reduces after the backward passes its own)
  const std::vector<bool>* caller = st_.dp_sync;
  if (!caller) st_.dp_sync = &say;
  Tensor dx = p_.backward(st_, j, dy);
  st_.dp_sync = caller;
  if (!p_.first()) dx_[j] = dx;
  ran_.push_back({PipeAction::backward, j});
}

void Pipeline::Driver::recv_forward(int j) {
  valid(j, "recv_forward");
  if (p_.first()) return;
  if (x_.count(j)) throw wrong(j, "its activations are received a second time", "once per micro-batch per step");
  x_[j] = p_.recv_forward(st_, j);
}

void Pipeline::Driver::recv_backward(int j) {
  valid(j, "recv_backward");
  if (p_.last()) return;
  if (dy_.count(j)) throw wrong(j, "its gradient is received a second time", "once per micro-batch per step");
  dy_[j] = p_.recv_backward(st_, j);
}

void Pipeline::Driver::send_forward(int j) {
  valid(j, "send_forward");
  if (p_.last()) return;
  auto it = y_.find(j);
  if (it == y_.end()) throw wrong(j, "send_forward of activations this stage has not computed (or sent already)", "send a forward's output after it ran, once");
  p_.send_forward(st_, j, it->second);
  y_.erase(it);
}

void Pipeline::Driver::send_backward(int j) {
  valid(j, "send_backward");
  if (p_.first()) return;
  auto it = dx_.find(j);
  if (it == dx_.end()) throw wrong(j, "send_backward of a gradient this stage has not computed (or sent already)", "send a backward's output after it ran, once");
  p_.send_backward(st_, j, it->second);
  dx_.erase(it);
}

void Pipeline::Driver::send_forward_recv_backward(int j, int jb) {
  valid(j, "send_forward_recv_backward");
  valid(jb, "send_forward_recv_backward");
  if (p_.last()) return;
  auto it = y_.find(j);
  if (it == y_.end()) throw wrong(j, "send_forward_recv_backward sends activations this stage has not computed (or sent already)", "send a forward's output after it ran, once");
  if (dy_.count(jb)) throw wrong(jb, "its gradient is received a second time", "once per micro-batch per step");
  dy_[jb] = p_.send_forward_recv_backward(st_, j, it->second, jb);
  y_.erase(it);
}

void Pipeline::Driver::send_backward_recv_forward(int j, int jf) {
  valid(j, "send_backward_recv_forward");
  valid(jf, "send_backward_recv_forward");
  if (p_.first()) return;
  auto it = dx_.find(j);
  if (it == dx_.end()) throw wrong(j, "send_backward_recv_forward sends a gradient this stage has not computed (or sent already)", "send a backward's output after it ran, once");
  if (x_.count(jf)) throw wrong(jf, "its activations are received a second time", "once per micro-batch per step");
  x_[jf] = p_.send_backward_recv_forward(st_, j, it->second, jf);
  dx_.erase(it);
}

void Pipeline::Driver::finish() {
  if (const std::string bad = check_schedule(ran_, micro_batches()); !bad.empty())
    throw Error(fmt::format("pipeline stage {} of {}: the step ended and {} (ran: {})", stage(), stages(), bad, describe_schedule(ran_)),
                "every micro-batch runs forward once, then backward once, on every stage");
  for (const auto* unsent : {&y_, &dx_})
    if (!unsent->empty())
      throw wrong(unsent->begin()->first, fmt::format("the step ended and its {} was never sent to stage {}", unsent == &y_ ? "activations" : "gradient",
                                                      unsent == &y_ ? p_.next() : p_.prev()),
                  "every forward's output goes on to the next stage, every backward's back to the one before");
  for (const auto* unused : {&x_, &dy_})
    if (!unused->empty())
      throw wrong(unused->begin()->first, "the step ended and what was received for it was never used", "receive only what a forward or backward needs");
}

Pipeline::StepResult Pipeline::train_step(Runtime& rt, const std::function<Batch()>& next, const StageLoss& loss, float loss_factor,
                                          StepHooks& strategy, const std::vector<PipeAction>* order, const std::vector<bool>* dp_sync,
                                          const Executor* executor) {
  if (executor) {
    Step st{rt, next, loss, loss_factor, strategy, dp_sync};
    Driver d(*this, st);
    (*executor)(d);
    d.finish();
    DL_ASSERT(held_.empty(), "pipeline: a micro-batch's activations were never consumed");
    return st.res;
  }
  const std::vector<PipeAction> own = order ? std::vector<PipeAction>() : pipeline_schedule(schedule_, stages(), stage(), m_);
  const std::vector<PipeAction>& actions = order ? *order : own;
  if (const std::string bad = check_schedule(actions, m_); !bad.empty())
    throw ConfigError(fmt::format("pipeline stage {} of {}: its schedule ({}) {}", stage(), stages(), describe_schedule(actions), bad),
                      "every micro-batch runs forward once, then backward once, on every stage");
  Step st{rt, next, loss, loss_factor, strategy, dp_sync};
  for (const PipeAction& a : actions)
    if (a.op == PipeAction::backward) st.last_backward = a.micro;
  if (!order && schedule_ == PipeSchedule::one_f_one_b) run_1f1b(st);
  else run_order(st, actions);
  DL_ASSERT(held_.empty(), "pipeline: a micro-batch's activations were never consumed");
  return st.res;
}

Tensor Pipeline::forward_only(Runtime& rt, const Batch& b) {
  Tensor x;
  if (!first()) exchange(rt, Tensor(), -1, 0, &x, model_.stage_input_shape(b), stage() - 1, pipe_tag::evaluation,
                                "receiving an evaluation batch's activations");
  Tensor y = model_.forward_stage(rt, b, x, nullptr);
  if (!last()) {
    exchange(rt, y, stage() + 1, pipe_tag::evaluation, nullptr, {}, -1, 0, "sending an evaluation batch's activations");
    return Tensor();
  }
  return y;
}

void Pipeline::sync_tied(Runtime& rt, Parameter* tied) {
  if (stages() == 1 || !(first() || last()) || !tied) return;  // (a model without tied weights: nothing)
  const int peer = first() ? stages() - 1 : 0;
  Tensor& g = tied->grad_for_accumulate();
  const int64_t n = g.numel();
  if (!g.data()) return pp_.send_recv(nullptr, n, peer, pipe_tag::tied_gradient, nullptr, n, peer, pipe_tag::tied_gradient);  // meta: traced, no data
  OnHost mine(g, OnHost::inout);
  std::vector<float> theirs(static_cast<size_t>(n));
  try {
    pp_.send_recv(mine.p, n, peer, pipe_tag::tied_gradient, theirs.data(), n, peer, pipe_tag::tied_gradient);
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
