// Pipeline parallelism: the model's blocks split into p stages on p ranks (gpt_parallel.h builds a stage),
// each optimizer step's batch split into m micro-batches that flow through them. Stage s receives a
// micro-batch's activations (B, T, C) from stage s − 1, runs its blocks, sends them on to s + 1; the
// gradients flow back the same way. Two orders of the same work (Narayanan et al., 2021, figure 3):
//
//   gpipe  all m forwards, then all m backwards (Huang et al., 2019). A stage holds the activations of all
//          m micro-batches at its peak.
//   1f1b   warm-up: min(p − s − 1, m) forwards; steady state: one forward, one backward; cool-down: the
//          backwards left (PipeDream-Flush, Megatron-LM's default). A stage holds at most p − s micro-batches.
//
//   p = 4, m = 8, 1F1B                time →
//   stage 0   F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7
//   stage 3            F0 B0 F1 B1 F2 B2 F3 B3 ...
//
// Both leave every stage idle for the same (p − 1) forward-and-backward slots per step — the bubble,
// (p − 1)/(m + p − 1) of the step when the stages are balanced — so m ≥ p is required: with fewer
// micro-batches than stages most of the pipeline idles. 1F1B's gain is memory, not time.
// Neighbours exchange activations and gradients at once where both must (1F1B's steady state), as
// Megatron's send_forward_recv_backward does: two blocking sends towards each other would deadlock.
// Messages carry their micro-batch in the tag (pipe_tag below): a stage never takes another micro-batch's
// tensor. The engine's 1F1B is written out as its three phases (run_1f1b); a given order — GPipe's, a lab's —
// runs through one generic executor (run_order) that pairs each send with the next receive from the same
// neighbour. Both issue the same exchanges for 1F1B.
// Data parallelism over the stages' replicas synchronises gradients once, during the last micro-batch's
// backward (the strategy's no_sync before). The tied embedding's two copies (first and last stage) sum
// their gradients after the last backward.
// Read next: core/train/trainer_ckpt.cpp (checkpoints: what a bitwise resume needs).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/models/model.h"
#include "core/parallel/strategy.h"
#include "core/util/error.h"

namespace distlab {

// parallel.schedule: the order of a stage's forwards and backwards
enum class PipeSchedule { one_f_one_b, gpipe };
template <>
struct ChoiceTable<PipeSchedule> {
  static constexpr std::array names = {choice(PipeSchedule::one_f_one_b, "1f1b"), choice(PipeSchedule::gpipe, "gpipe")};
};

struct PipeAction {
  enum Op { forward, backward } op;
  int micro;  // 0..m-1
  bool operator==(const PipeAction& o) const { return op == o.op && micro == o.micro; }
};
// The forwards stage `stage` of `stages` runs before its first backward under 1F1B.
int warmup_forwards(int stages, int stage, int micro_batches);
// The order in which a stage runs the forwards and backwards of m micro-batches.
std::vector<PipeAction> pipeline_schedule(PipeSchedule schedule, int stages, int stage, int micro_batches);
std::string describe_schedule(const std::vector<PipeAction>& s);  // "F0 F1 B0 F2 B1 B2"
// "" when `order` runs every micro-batch 0..m-1 forward once and then backward once; else what is wrong.
std::string check_schedule(const std::vector<PipeAction>& order, int micro_batches);
// The pipeline's message tags. A training step's messages carry their micro-batch, so that a stage takes
// only the tensor it expects: orders that do not fit together hang until the timeout names the stage,
// rather than train on each other's tensors.
namespace pipe_tag {
constexpr int evaluation = 1;     // forward_only's activations (one micro-batch, in order)
constexpr int tied_gradient = 4;  // the tied embedding's gradient between the first and the last stage
constexpr int first_micro = 16;   // micro-batch j: its activations 16 + 2j, their gradient 17 + 2j
constexpr int activations(int micro) { return first_micro + 2 * micro; }
constexpr int gradient(int micro) { return first_micro + 2 * micro + 1; }
constexpr bool is_gradient(int tag) { return tag >= first_micro && tag % 2 == 1; }
}  // namespace pipe_tag

// What the loss does on the last stage: logits -> (loss, dlogits scaled by `factor`)
using StageLoss = std::function<double(Runtime& rt, const Tensor& logits, const Batch& batch, float factor, Tensor& dlogits)>;

class Pipeline {
  struct Step;  // one train_step's micro-batches, losses and results

 public:
  class Driver;
  // An executor written outside the engine (lab 06's): it runs one step on this stage through a Driver.
  using Executor = std::function<void(Driver&)>;
  // `pp`: the stages' group (this rank is stage pp.rank()); the model says what crosses its boundaries
  // (Model::stage_input_shape). m < p is refused unless `allow_idle` (the simulator of pipeline_sim.h shows it).
  Pipeline(ProcessGroup& pp, Model& stage, PipeSchedule schedule, int micro_batches, bool allow_idle = false);
  struct StepResult {
    double loss_sum = 0;          // the last stage's micro-batch losses, summed (0 on the others)
    int64_t samples = 0;          // this stage's micro-batches' samples
    int peak_in_flight = 0;       // micro-batches whose activations this stage held at once
    int64_t peak_held_bytes = 0;  // their saved tensors' bytes, at that peak
  };
  // One optimizer step: m micro-batches (next() gives them: every stage reads the same ones) through the
  // schedule (`order`: this stage's own, e.g. a lab's; nullptr: the configured one); gradients accumulate;
  // the strategy synchronises them during the last backward (`dp_sync`, by micro-batch: during those
  // micro-batches' backwards instead). The executor takes any valid order: after
  // each action it sends the action's output on, and when the next action's input comes from that same
  // neighbour it receives it in the same exchange (Megatron's send_forward_recv_backward and
  // send_backward_recv_forward) — so 1F1B's steady state, where neighbours send to each other, cannot
  // deadlock, while orders that do not fit the neighbours' hang until the timeout names the stage.
  // `executor`: an executor of its own runs the step instead (the order is then its, and each of its
  // backwards says whether it synchronises; `dp_sync`, when given, overrides that).
  StepResult train_step(Runtime& rt, const std::function<Batch()>& next, const StageLoss& loss, float loss_factor, StepHooks& strategy,
                        const std::vector<PipeAction>* order = nullptr, const std::vector<bool>* dp_sync = nullptr,
                        const Executor* executor = nullptr);
  // Evaluation: one micro-batch's forward through every stage; the logits on the last stage (undefined on
  // the others).
  Tensor forward_only(Runtime& rt, const Batch& b);
  // Sums the gradients of the tied embedding's copies (first and last stage; nothing elsewhere).
  void sync_tied(Runtime& rt, Parameter* tied);
  // One step's operations by micro-batch, for an executor outside the engine: what run_1f1b and run_order
  // do, one call at a time, each checked. A received tensor waits for its micro-batch's forward (backward);
  // a computed one waits to be sent. A call out of order — a forward whose input has not arrived, a send of
  // what was not computed, a micro-batch run twice — throws an Error naming the stage and the micro-batch;
  // sends and receives that do not pair with the neighbours' hang until the process group's timeout names
  // them. At an end stage the half towards the missing neighbour does nothing, as Megatron's.
  class Driver {
   public:
    int stage() const { return p_.stage(); }
    int stages() const { return p_.stages(); }
    int micro_batches() const { return p_.m_; }
    void forward(int micro);
    void backward(int micro, bool dp_sync);
    void recv_forward(int micro);
    void recv_backward(int micro);
    void send_forward(int micro);
    void send_backward(int micro);
    void send_forward_recv_backward(int micro, int micro_back);
    void send_backward_recv_forward(int micro, int micro_fwd);
    const std::vector<PipeAction>& order() const { return ran_; }  // the forwards and backwards, as they ran
    void finish();  // after the executor: every micro-batch run both ways, every output sent, every input used

   private:
    friend class Pipeline;
    Driver(Pipeline& p, Step& st) : p_(p), st_(st) {}
    void valid(int micro, const char* what) const;
    Error wrong(int micro, const std::string& what, const std::string& hint) const;
    Pipeline& p_;
    Step& st_;
    std::map<int, Tensor> x_, dy_, y_, dx_;  // by micro-batch: received inputs, computed outputs not yet sent
    std::vector<PipeAction> ran_;
  };

  int stage() const { return pp_.rank(); }
  int stages() const { return pp_.size(); }
  bool first() const { return stage() == 0; }
  bool last() const { return stage() == stages() - 1; }
  PipeSchedule schedule() const { return schedule_; }
  int micro_batches() const { return m_; }

 private:
  // One micro-batch's forward (its input from the stage before) and backward (the gradient of its output),
  // its saved activations held in between.
  Tensor forward(Step& st, int micro, const Tensor& x);
  Tensor backward(Step& st, int micro, const Tensor& dy);
  // The neighbour exchanges, named as Megatron names them. An end stage has no neighbour on one side: that
  // half does nothing (and a receive returns an undefined tensor).
  Tensor recv_forward(Step& st, int micro);
  Tensor recv_backward(Step& st, int micro);
  void send_forward(Step& st, int micro, const Tensor& y);
  void send_backward(Step& st, int micro, const Tensor& dx);
  Tensor send_forward_recv_backward(Step& st, int micro, const Tensor& y, int micro_back);
  Tensor send_backward_recv_forward(Step& st, int micro, const Tensor& dx, int micro_fwd);
  // The two executors.
  void run_1f1b(Step& st);
  void run_order(Step& st, const std::vector<PipeAction>& actions);
  // the exchange itself; either half may be absent (dst or src < 0)
  void exchange(Runtime& rt, const Tensor& out, int dst, int out_tag, Tensor* in, const Shape& in_shape, int src, int in_tag,
                const std::string& what);
  int prev() const { return first() ? -1 : stage() - 1; }
  int next() const { return last() ? -1 : stage() + 1; }
  ProcessGroup& pp_;
  Model& model_;
  PipeSchedule schedule_;
  int m_;
  std::map<int, SavedState> held_;  // micro-batch -> what its forward saved, until its backward
};

}  // namespace distlab
