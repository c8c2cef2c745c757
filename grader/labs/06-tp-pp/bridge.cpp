// The trainer's side of lab 06 (labs/06-tp-pp/api.h). The student's column- and row-parallel Linear runs
// in the plugin, plain or sequence parallel: each call sends this rank's slice of the weights and the
// activations over, runs the all-reduces, all-gathers and reduce-scatters the student asks for on the
// layer's tensor-parallel group (counted and traced like the engine's own), and takes the outputs back,
// checked: the sizes, and no NaN where a finite number belongs.
// The student's 1F1B order is checked by check_schedule (core/parallel/pipeline.h) before the pipeline runs
// it. Compare ColumnParallelLinear and RowParallelLinear (core/parallel/tensor_parallel.cpp), the engine's.
// Read next: host.cpp beside it (the plugin's side of each request).
#include <fmt/format.h>

#include <algorithm>

#include <cmath>
#include <cstring>

#include "grader/bridge/lab_plugin.h"
#include "core/util/error.h"

namespace distlab {

namespace {

class LabTpKernels : public TpKernels {
 public:
  LabTpKernels(LabPlugin& plugin, Runtime& rt) : plugin_(plugin), rt_(rt) {}

  void column_forward(ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in,
                      int64_t out) override {
    forward(labproto::kTpColumnForward, "column_forward", tp, x, w, b, y, rows, in, out);
  }
  void row_forward(ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in,
                   int64_t out) override {
    forward(labproto::kTpRowForward, "row_forward", tp, x, w, b, y, rows, in, out);
  }
  void column_backward(ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                       int64_t in, int64_t out) override {
    backward(labproto::kTpColumnBackward, "column_backward", tp, x, w, dy, dx, dw, db, rows, in, out);
  }
  void row_backward(ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                    int64_t in, int64_t out) override {
    backward(labproto::kTpRowBackward, "row_backward", tp, x, w, dy, dx, dw, db, rows, in, out);
  }
  void sp_column_forward(ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in,
                         int64_t out) override {
    forward(labproto::kTpSpColumnForward, "sp_column_forward", tp, x, w, b, y, rows, in, out);
  }
  void sp_row_forward(ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in,
                      int64_t out) override {
    forward(labproto::kTpSpRowForward, "sp_row_forward", tp, x, w, b, y, rows, in, out);
  }
  void sp_column_backward(ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                          int64_t in, int64_t out) override {
    backward(labproto::kTpSpColumnBackward, "sp_column_backward", tp, x, w, dy, dx, dw, db, rows, in, out);
  }
  void sp_row_backward(ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t rows,
                       int64_t in, int64_t out) override {
    backward(labproto::kTpSpRowBackward, "sp_row_backward", tp, x, w, dy, dx, dw, db, rows, in, out);
  }
  void sp_norm_grads(ProcessGroup& tp, float* g, int64_t n) override {
    std::vector<char> payload;
    put(payload, g, n);
    const auto got = plugin_.call(labproto::kTpSpNormGrads, {tp.rank(), tp.size(), n}, payload.data(), payload.size(), &tp, &rt_, "sp_norm_grads");
    take(got, fmt::format("sp_norm_grads ({} floats)", n), {{g, n, "grads"}});
  }

 private:
  static void put(std::vector<char>& v, const float* p, int64_t n) {
    v.insert(v.end(), reinterpret_cast<const char*>(p), reinterpret_cast<const char*>(p + n));
  }
  // the outputs, in order, from the plugin's answer: exactly their sizes, every value finite
  // `call`: the function and its sizes, for the messages ("row_forward (rows 8, in 16, out 12)")
  static void take(const std::vector<char>& got, const std::string& call, std::initializer_list<std::tuple<float*, int64_t, const char*>> outs) {
    size_t want = 0;
    for (const auto& o : outs) want += size_t(std::get<1>(o)) * 4;
    if (got.size() != want)
      throw Error(fmt::format("the lab's {} returned {} bytes instead of {}", call, got.size(), want));
    size_t at = 0;
    for (const auto& [dst, n, name] : outs) {
      if (n == 0) continue;
      std::memcpy(dst, got.data() + at, size_t(n) * 4);
      at += size_t(n) * 4;
      for (int64_t i = 0; i < n; i++)
        if (!std::isfinite(dst[i]))
          throw Error(fmt::format("the lab's {} left {}[{}] = {}", call, name, i, dst[i]),
                      std::isnan(dst[i]) ? "an output your function never wrote stays NaN: write every element of it"
                                         : "the inputs are finite: an infinite output is an arithmetic mistake");
    }
  }
  // The rows of x (and dx) and of y (and dy) in a call: every row, or — sequence parallel — this rank's
  // rows/t on the stream's side (a column layer's input, a row layer's output).
  static std::pair<int64_t, int64_t> row_counts(labproto::Fn fn, int64_t rows, int t) {
    const bool sp = fn >= labproto::kTpSpColumnForward && fn <= labproto::kTpSpRowBackward;
    const bool column = fn == labproto::kTpSpColumnForward || fn == labproto::kTpSpColumnBackward;
    return {sp && column ? rows / t : rows, sp && !column ? rows / t : rows};
  }
  void forward(labproto::Fn fn, const char* name, ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows,
               int64_t in, int64_t out) {
    const auto [xr, yr] = row_counts(fn, rows, tp.size());
    std::vector<char> payload;
    put(payload, x, xr * in);
    put(payload, w, out * in);
    if (b) put(payload, b, out);
    const auto got = plugin_.call(fn, {tp.rank(), tp.size(), rows, in, out, b ? 1 : 0}, payload.data(), payload.size(), &tp, &rt_, name);
    take(got, fmt::format("{} (rows {}, in {}, out {})", name, rows, in, out), {{y, yr * out, "y"}});
  }
  void backward(labproto::Fn fn, const char* name, ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db, int64_t rows, int64_t in, int64_t out) {
    const auto [xr, yr] = row_counts(fn, rows, tp.size());
    std::vector<char> payload;
    put(payload, x, xr * in);
    put(payload, w, out * in);
    put(payload, dy, yr * out);
    const auto got = plugin_.call(fn, {tp.rank(), tp.size(), rows, in, out, db ? 1 : 0}, payload.data(), payload.size(), &tp, &rt_, name);
    take(got, fmt::format("{} (rows {}, in {}, out {})", name, rows, in, out), {{dx, xr * in, "dx"}, {dw, out * in, "dw"}, {db, db ? out : 0, "db"}});
  }

  LabPlugin& plugin_;
  Runtime& rt_;
};

}  // namespace

std::unique_ptr<TpKernels> LabPlugin::make_tp_kernels(Runtime& rt) { return std::make_unique<LabTpKernels>(*this, rt); }

// The student's executor drives this stage's step: each request is one of the Driver's calls, which
// checks it (a forward without its input, a send of what was not computed, ...) and runs it on the
// engine's pipeline — the sends and receives on the stages' real process group.
Pipeline::Executor LabPlugin::pipeline_executor() {
  return [this](Pipeline::Driver& d) {
    std::string syncs;
    const Serve serve = [this, &d, &syncs](const wire::Frame& f, std::vector<char>&) {
      const int a = int(std::clamp<int64_t>(f.arg[0], -1, 1 << 20)), b = int(std::clamp<int64_t>(f.arg[1], -1, 1 << 20));
      switch (f.op) {
        case labproto::kPipeForward: d.forward(a); break;
        case labproto::kPipeBackward:
          d.backward(a, f.arg[1] != 0);
          if (f.arg[1] != 0) syncs += fmt::format("{}B{}", syncs.empty() ? "" : ", ", a);
          break;
        case labproto::kPipeRecvForward: d.recv_forward(a); break;
        case labproto::kPipeSendForward: d.send_forward(a); break;
        case labproto::kPipeRecvBackward: d.recv_backward(a); break;
        case labproto::kPipeSendBackward: d.send_backward(a); break;
        case labproto::kPipeSendForwardRecvBackward: d.send_forward_recv_backward(a, b); break;
        case labproto::kPipeSendBackwardRecvForward: d.send_backward_recv_forward(a, b); break;
        default: throw Error(fmt::format("the lab's train_step_1f1b sent request {}, which lab 06 has no use for", f.op));
      }
      reply(labproto::kData, nullptr, 0, 0, "train_step_1f1b");
    };
    call(labproto::kPipeRun, {d.stages(), d.stage(), d.micro_batches()}, nullptr, 0, nullptr, nullptr, "train_step_1f1b", serve);
    pipeline_ran_ = fmt::format("{}; data-parallel gradients averaged in: {}", describe_schedule(d.order()), syncs.empty() ? "none" : syncs);
  };
}

}  // namespace distlab
