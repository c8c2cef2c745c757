// Lab 06's host: the student's column- and row-parallel Linear and 1F1B schedule beside a trainer
// (bridge.cpp, beside this file). Each layer call carries this rank's slice of the weights and the
// activations; every all-reduce the student asks for is a request the trainer runs on its tensor-parallel
// group (and counts); the outputs go back, checked there.
// Read next: grader/host/host.h (what every lab's host shares).
#include <dlfcn.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "grader/host/host.h"
#include "labs/06-tp-pp/api.h"

namespace labhost {

using namespace distlab;

namespace {

void all_reduce(void*, float* data, int64_t n) {
  if (n < 0 || uint64_t(n) * 4 > labproto::kMaxPayload || (n > 0 && !data))
    throw std::invalid_argument("all_reduce of " + std::to_string(n) + " floats: give a buffer of 0.." +
                                std::to_string(labproto::kMaxPayload / 4) + " floats");
  put(labproto::kAllReduce, data, uint64_t(n) * 4, {0});  // ReduceOp sum
  const std::vector<char> back = expect_data(n * 4);
  if (n) std::memcpy(data, back.data(), back.size());
}

const lab06::Group::Ops kOps = {all_reduce};

// An output the student must write: NaN until then, so one never written can't pass for zeros.
std::vector<float> unwritten(int64_t n) { return std::vector<float>(size_t(n), std::numeric_limits<float>::quiet_NaN()); }

void append(std::vector<char>& out, const std::vector<float>& v) {
  out.insert(out.end(), reinterpret_cast<const char*>(v.data()), reinterpret_cast<const char*>(v.data() + v.size()));
}

// kTpColumnForward..kTpRowBackward: args rank, size, rows, in, out, has_bias; payload x, w, then b (forward)
// or dy (backward); returns y, or dx, dw, db.
bool layer_call(const Lab06Plugin& t, const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
  const int64_t fn = f.arg[0], rank = f.arg[1], size = f.arg[2], rows = f.arg[3], nin = f.arg[4], nout = f.arg[5];
  const bool has_bias = f.arg[6] != 0, forward = fn == labproto::kTpColumnForward || fn == labproto::kTpRowForward;
  const bool column = fn == labproto::kTpColumnForward || fn == labproto::kTpColumnBackward;
  const int64_t limit = int64_t(labproto::kMaxPayload / 4);
  if (size < 1 || rank < 0 || rank >= size || rows < 0 || nin < 1 || nout < 1 || rows > limit || nin > limit || nout > limit ||
      rows * nin > limit || nout * nin > limit || rows * nout > limit)
    return false;
  const int64_t third = forward ? (has_bias ? nout : 0) : rows * nout;
  if (in.size() != size_t(rows * nin + nout * nin + third) * 4) return false;
  const float* x = reinterpret_cast<const float*>(in.data());
  const float* w = x + rows * nin;
  const float* third_p = w + nout * nin;
  lab06::Group g(int(rank), int(size), &kOps, nullptr);
  if (forward) {
    auto fn_p = column ? t.column_forward : t.row_forward;
    need(fn_p, column ? "column_forward" : "row_forward");
    std::vector<float> y = unwritten(rows * nout);
    fn_p(g, x, w, has_bias ? third_p : nullptr, y.data(), rows, nin, nout);
    append(out, y);
    return true;
  }
  auto fn_p = column ? t.column_backward : t.row_backward;
  need(fn_p, column ? "column_backward" : "row_backward");
  std::vector<float> dx = unwritten(rows * nin), dw = unwritten(nout * nin), db = unwritten(has_bias ? nout : 0);
  fn_p(g, x, w, third_p, dx.data(), dw.data(), has_bias ? db.data() : nullptr, rows, nin, nout);
  append(out, dx);
  append(out, dw);
  append(out, db);
  return true;
}

// The stage the student's executor drives: every call a request the trainer (or the grader's simulation)
// runs and answers.
class RemoteStage : public lab06::Stage {
 public:
  RemoteStage(int stages, int stage, int m) : stages_(stages), stage_(stage), m_(m) {}
  int stage() const override { return stage_; }
  int stages() const override { return stages_; }
  int micro_batches() const override { return m_; }
  void forward(int micro) override { ask(labproto::kPipeForward, micro, 0); }
  void backward(int micro, bool dp_sync) override { ask(labproto::kPipeBackward, micro, dp_sync ? 1 : 0); }
  void recv_forward(int micro) override { ask(labproto::kPipeRecvForward, micro, 0); }
  void send_forward(int micro) override { ask(labproto::kPipeSendForward, micro, 0); }
  void recv_backward(int micro) override { ask(labproto::kPipeRecvBackward, micro, 0); }
  void send_backward(int micro) override { ask(labproto::kPipeSendBackward, micro, 0); }
  void send_forward_recv_backward(int micro, int micro_back) override { ask(labproto::kPipeSendForwardRecvBackward, micro, micro_back); }
  void send_backward_recv_forward(int micro, int micro_fwd) override { ask(labproto::kPipeSendBackwardRecvForward, micro, micro_fwd); }

 private:
  void ask(labproto::Op op, int a, int b) {
    put(op, nullptr, 0, {a, b});
    expect_data(0);
  }
  int stages_, stage_, m_;
};

}  // namespace

int serve_lab06(void* plugin) {
  auto* t = load_table<const Lab06Plugin>(plugin, "distlab_lab06", kLab06Abi, "tp_pp.cpp", "labs/06-tp-pp/api.h");
  if (!t) return 2;
  return serve_calls([t](const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
    switch (f.arg[0]) {
      case labproto::kTpColumnForward:
      case labproto::kTpColumnBackward:
      case labproto::kTpRowForward:
      case labproto::kTpRowBackward:
        return layer_call(*t, f, in, out);
      case labproto::kPipeRun: {  // args stages, stage, m: the student's executor drives the stage
        const int64_t stages = f.arg[1], stage = f.arg[2], m = f.arg[3];
        if (stages < 1 || stages > 1 << 16 || stage < 0 || stage >= stages || m < 1 || m > 1 << 16) return false;
        need(t->train_step_1f1b, "train_step_1f1b");
        RemoteStage s{int(stages), int(stage), int(m)};
        t->train_step_1f1b(s);
        return true;
      }
      default:
        return false;
    }
  });
}

}  // namespace labhost
