// The trainer's side of lab 06 (labs/06-tp-pp/api.h). The student's column- and row-parallel Linear runs
// in the plugin: each call sends this rank's slice of the weights and the activations over, runs the
// all-reduces the student asks for on the layer's tensor-parallel group (counted and traced like the
// engine's own), and takes the outputs back, checked: the sizes, and no NaN where a finite number belongs.
// The student's 1F1B order is checked by check_schedule (core/parallel/pipeline.h) before the pipeline runs
// it. Compare ColumnParallelLinear and RowParallelLinear (core/parallel/tensor_parallel.cpp), the engine's.
#include <fmt/format.h>

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

 private:
  static void put(std::vector<char>& v, const float* p, int64_t n) {
    v.insert(v.end(), reinterpret_cast<const char*>(p), reinterpret_cast<const char*>(p + n));
  }
  // the outputs, in order, from the plugin's answer: exactly their sizes, every value finite
  static void take(const std::vector<char>& got, const char* fn, std::initializer_list<std::tuple<float*, int64_t, const char*>> outs,
                   int64_t rows, int64_t in, int64_t out) {
    size_t want = 0;
    for (const auto& o : outs) want += size_t(std::get<1>(o)) * 4;
    if (got.size() != want)
      throw Error(fmt::format("the lab's {} (rows {}, in {}, out {}) returned {} bytes instead of {}", fn, rows, in, out, got.size(), want));
    size_t at = 0;
    for (const auto& [dst, n, name] : outs) {
      if (n == 0) continue;
      std::memcpy(dst, got.data() + at, size_t(n) * 4);
      at += size_t(n) * 4;
      for (int64_t i = 0; i < n; i++)
        if (!std::isfinite(dst[i]))
          throw Error(fmt::format("the lab's {} (rows {}, in {}, out {}) left {}[{}] = {}", fn, rows, in, out, name, i, dst[i]),
                      std::isnan(dst[i]) ? "an output your function never wrote stays NaN: write every element of it"
                                         : "the inputs are finite: an infinite output is an arithmetic mistake");
    }
  }
  void forward(labproto::Fn fn, const char* name, ProcessGroup& tp, const float* x, const float* w, const float* b, float* y, int64_t rows,
               int64_t in, int64_t out) {
    std::vector<char> payload;
    put(payload, x, rows * in);
    put(payload, w, out * in);
    if (b) put(payload, b, out);
    const auto got = plugin_.call(fn, {tp.rank(), tp.size(), rows, in, out, b ? 1 : 0}, payload.data(), payload.size(), &tp, &rt_, name);
    take(got, name, {{y, rows * out, "y"}}, rows, in, out);
  }
  void backward(labproto::Fn fn, const char* name, ProcessGroup& tp, const float* x, const float* w, const float* dy, float* dx, float* dw,
                float* db, int64_t rows, int64_t in, int64_t out) {
    std::vector<char> payload;
    put(payload, x, rows * in);
    put(payload, w, out * in);
    put(payload, dy, rows * out);
    const auto got = plugin_.call(fn, {tp.rank(), tp.size(), rows, in, out, db ? 1 : 0}, payload.data(), payload.size(), &tp, &rt_, name);
    take(got, name, {{dx, rows * in, "dx"}, {dw, out * in, "dw"}, {db, db ? out : 0, "db"}}, rows, in, out);
  }

  LabPlugin& plugin_;
  Runtime& rt_;
};

}  // namespace

std::unique_ptr<TpKernels> LabPlugin::make_tp_kernels(Runtime& rt) { return std::make_unique<LabTpKernels>(*this, rt); }

PipelineOrder LabPlugin::pipeline_order(int stages, int stage, int m) {
  const std::vector<char> raw = call(labproto::kPipeSchedule, {stages, stage, m}, nullptr, 0, nullptr, nullptr, "schedule_1f1b");
  if (raw.size() % 8) throw Error("the lab's schedule_1f1b returned a broken list");
  PipelineOrder o;
  for (size_t at = 0; at < raw.size(); at += 8) {
    int32_t a[2];
    std::memcpy(a, raw.data() + at, 8);
    o.actions.push_back({a[0] ? PipeAction::forward : PipeAction::backward, a[1]});
  }
  if (const std::string bad = check_schedule(o.actions, m); !bad.empty())
    throw Error(fmt::format("the lab's schedule_1f1b({}, {}, {}) returned {}: {}", stages, stage, m, describe_schedule(o.actions), bad),
                "every micro-batch 0..m-1 runs forward once and then backward once on every stage");
  const std::vector<char> flags = call(labproto::kPipeDpSync, {int64_t(raw.size() / 8)}, raw.data(), raw.size(), nullptr, nullptr, "dp_sync");
  if (flags.size() != o.actions.size() * 4) throw Error("the lab's dp_sync answers came back broken");
  o.dp_sync.assign(size_t(m), false);
  for (size_t k = 0; k < o.actions.size(); k++) {
    int32_t s;
    std::memcpy(&s, flags.data() + k * 4, 4);
    if (o.actions[k].op == PipeAction::backward) o.dp_sync[size_t(o.actions[k].micro)] = s != 0;
  }
  return o;
}

}  // namespace distlab
