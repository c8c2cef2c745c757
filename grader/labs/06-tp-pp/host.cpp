// Lab 06's host: the student's column- and row-parallel Linear (plain and sequence parallel) and 1F1B
// schedule beside a trainer (bridge.cpp, beside this file). Each layer call carries this rank's slice of the
// weights and the activations; every collective the student asks for is a request the trainer runs on its
// tensor-parallel group (and counts); the outputs go back, checked there.
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

void check_count(const char* what, int64_t n, uint64_t per, const void* a, const void* b) {
  if (n < 0 || uint64_t(n) > labproto::kMaxPayload / 4 / per || (n > 0 && (!a || !b)))  // by division: n·per may wrap
    throw std::invalid_argument(std::string(what) + " of " + std::to_string(n) + " floats: give buffers of 0.." +
                                std::to_string(labproto::kMaxPayload / 4 / per) + " floats");
}

// ctx: the group's size (an int), for the all-gather's and reduce-scatter's t·n
void all_reduce(void*, float* data, int64_t n) {
  check_count("all_reduce", n, 1, data, data);
  put(labproto::kAllReduce, data, uint64_t(n) * 4, {0});  // ReduceOp sum
  const std::vector<char> back = expect_data(n * 4);
  if (n) std::memcpy(data, back.data(), back.size());
}

void all_gather(void* ctx, const float* mine, float* all, int64_t n) {
  const int size = *static_cast<const int*>(ctx);
  check_count("all_gather", n, uint64_t(size), mine, all);
  put(labproto::kAllGather, mine, uint64_t(n) * 4, {n});
  const std::vector<char> back = expect_data(n * size * 4);
  if (n) std::memcpy(all, back.data(), back.size());
}

void reduce_scatter(void* ctx, const float* all, float* mine, int64_t n) {
  const int size = *static_cast<const int*>(ctx);
  check_count("reduce_scatter", n, uint64_t(size), all, mine);
  put(labproto::kReduceScatter, all, uint64_t(n) * uint64_t(size) * 4, {0, n});  // ReduceOp sum
  const std::vector<char> back = expect_data(n * 4);
  if (n) std::memcpy(mine, back.data(), back.size());
}

const lab06::Group::Ops kOps = {all_reduce, all_gather, reduce_scatter};

// An output the student must write: NaN until then, so one never written can't pass for zeros.
std::vector<float> unwritten(int64_t n) { return std::vector<float>(size_t(n), std::numeric_limits<float>::quiet_NaN()); }

void append(std::vector<char>& out, const std::vector<float>& v) {
  out.insert(out.end(), reinterpret_cast<const char*>(v.data()), reinterpret_cast<const char*>(v.data() + v.size()));
}

// kTpColumnForward..kTpRowBackward and their sequence-parallel kTpSp*: args rank, size, rows, in, out,
// has_bias; payload x, w, then b (forward) or dy (backward); returns y, or dx, dw, db. Under sequence
// parallel the stream's side (a column layer's x and dx, a row layer's y and dy) has rows/size rows.
bool layer_call(const Lab06Plugin& t, const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
  const int64_t fn = f.arg[0], rank = f.arg[1], size = f.arg[2], rows = f.arg[3], nin = f.arg[4], nout = f.arg[5];
  const bool sp = fn >= labproto::kTpSpColumnForward && fn <= labproto::kTpSpRowBackward;
  const bool has_bias = f.arg[6] != 0;
  const bool forward = fn == labproto::kTpColumnForward || fn == labproto::kTpRowForward || fn == labproto::kTpSpColumnForward ||
                       fn == labproto::kTpSpRowForward;
  const bool column = fn == labproto::kTpColumnForward || fn == labproto::kTpColumnBackward || fn == labproto::kTpSpColumnForward ||
                      fn == labproto::kTpSpColumnBackward;
  const int64_t limit = int64_t(labproto::kMaxPayload / 4);
  if (size < 1 || size > 1 << 16 || rank < 0 || rank >= size || rows < 0 || nin < 1 || nout < 1 || rows > limit || nin > limit ||
      nout > limit || rows * nin > limit || nout * nin > limit || rows * nout > limit || (sp && rows % size != 0))
    return false;
  const int64_t xr = sp && column ? rows / size : rows, yr = sp && !column ? rows / size : rows;
  const int64_t third = forward ? (has_bias ? nout : 0) : yr * nout;
  if (in.size() != size_t(xr * nin + nout * nin + third) * 4) return false;
  const float* x = reinterpret_cast<const float*>(in.data());
  const float* w = x + xr * nin;
  const float* third_p = w + nout * nin;
  int group_size = int(size);
  lab06::Group g(int(rank), int(size), &kOps, &group_size);
  if (forward) {
    auto fn_p = sp ? (column ? t.sp_column_forward : t.sp_row_forward) : (column ? t.column_forward : t.row_forward);
    need(fn_p, sp ? (column ? "sp_column_forward" : "sp_row_forward") : (column ? "column_forward" : "row_forward"));
    std::vector<float> y = unwritten(yr * nout);
    fn_p(g, x, w, has_bias ? third_p : nullptr, y.data(), rows, nin, nout);
    append(out, y);
    return true;
  }
  auto fn_p = sp ? (column ? t.sp_column_backward : t.sp_row_backward) : (column ? t.column_backward : t.row_backward);
  need(fn_p, sp ? (column ? "sp_column_backward" : "sp_row_backward") : (column ? "column_backward" : "row_backward"));
  std::vector<float> dx = unwritten(xr * nin), dw = unwritten(nout * nin), db = unwritten(has_bias ? nout : 0);
  fn_p(g, x, w, third_p, dx.data(), dw.data(), has_bias ? db.data() : nullptr, rows, nin, nout);
  append(out, dx);
  append(out, dw);
  append(out, db);
  return true;
}

// kTpSpNormGrads: args rank, size, n; payload the gradient; returns it as the student left it
bool norm_grads_call(const Lab06Plugin& t, const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
  const int64_t rank = f.arg[1], size = f.arg[2], n = f.arg[3];
  if (size < 1 || size > 1 << 16 || rank < 0 || rank >= size || n < 0 || n > int64_t(labproto::kMaxPayload / 4) || in.size() != size_t(n) * 4)
    return false;
  need(t.sp_norm_grads, "sp_norm_grads");
  std::vector<float> g(static_cast<size_t>(n));
  if (n) std::memcpy(g.data(), in.data(), in.size());
  int group_size = int(size);
  lab06::Group grp(int(rank), int(size), &kOps, &group_size);
  t.sp_norm_grads(grp, g.data(), n);
  append(out, g);
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
      case labproto::kTpSpColumnForward:
      case labproto::kTpSpColumnBackward:
      case labproto::kTpSpRowForward:
      case labproto::kTpSpRowBackward:
        return layer_call(*t, f, in, out);
      case labproto::kTpSpNormGrads:
        return norm_grads_call(*t, f, in, out);
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
