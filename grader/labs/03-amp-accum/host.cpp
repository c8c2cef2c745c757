// Lab 03's host: the student's scaler, clipping and train_step. Direct calls (the grader's quick checks)
// get their inputs in the payload; train_step's Step is served by the trainer (bridge.cpp, beside this
// file, through grader/bridge/lab_plugin.cpp): every forward_backward, gradient fetch and optimizer step is
// a request the trainer runs and answers.
// Read next: grader/host/host.h (what every lab's host shares).
#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "grader/host/host.h"
#include "labs/03-amp-accum/api.h"

namespace labhost {

using namespace distlab;

namespace {

void all_reduce(void* ctx, float* data, int64_t n, lab03::ReduceOp op) {
  if (n < 0 || uint64_t(n) * 4 > labproto::kMaxPayload || (n > 0 && !data))
    throw std::invalid_argument("all_reduce of " + std::to_string(n) + " floats: give a buffer of 0.." +
                                std::to_string(labproto::kMaxPayload / 4) + " floats");
  if (int(op) < 0 || int(op) > 2) throw std::invalid_argument("all_reduce: unknown ReduceOp " + std::to_string(int(op)));
  put(labproto::kAllReduce, data, uint64_t(n) * 4, {int64_t(op)});
  auto back = expect_data(uint64_t(n) * 4);
  if (n) std::memcpy(data, back.data(), back.size());
}

const lab03::Comm::Ops kOps = {all_reduce};

// The payload of a call, with the records of this lab.
struct LabReader : Reader {  // the lab's records on top of take<T>() (host.h)
  lab03::ScalerConfig config() {
    lab03::ScalerConfig c;
    c.init_scale = take<float>();
    c.growth_factor = take<float>();
    c.backoff_factor = take<float>();
    c.growth_interval = take<int32_t>();
    return c;
  }
  lab03::ScalerState state() {
    lab03::ScalerState s;
    s.scale = take<float>();
    s.growth_tracker = take<int32_t>();
    return s;
  }
  // `count` numels, then their floats, into storage; the Grads point into it
  void grads(int64_t count, std::vector<std::vector<float>>& storage, std::vector<lab03::Grad>& grads) {
    if (count < 0 || count > 1 << 20) _exit(3);
    storage.assign(size_t(count), {});
    grads.clear();
    for (int64_t k = 0; k < count; k++) {
      const int64_t n = take<int64_t>();
      if (n < 0 || uint64_t(n) * 4 > in.size()) _exit(3);
      storage[size_t(k)].resize(size_t(n));
    }
    for (int64_t k = 0; k < count; k++) {
      auto& s = storage[size_t(k)];
      if (at + s.size() * 4 > in.size()) _exit(3);
      if (!s.empty()) std::memcpy(s.data(), in.data() + at, s.size() * 4);
      at += s.size() * 4;
      grads.push_back({"grad " + std::to_string(k), s.data(), int64_t(s.size())});
    }
  }
};

void append(std::vector<char>& out, const void* p, size_t n) {
  out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
}
void append_state(std::vector<char>& out, const lab03::ScalerState& s) {
  append(out, &s.scale, 4);
  append(out, &s.growth_tracker, 4);
}

// The trainer's side of train_step, one request per call.
class RemoteStep : public lab03::Step {
 public:
  RemoteStep(int rank, int size, int accum, double max_norm, const std::vector<std::pair<std::string, int64_t>>& params)
      : accum_(accum), max_norm_(max_norm), comm_(rank, size, &kOps, nullptr) {
    storage_.resize(params.size());
    for (size_t i = 0; i < params.size(); i++) {
      storage_[i].resize(size_t(params[i].second));
      grads_.push_back({params[i].first, storage_[i].data(), params[i].second});
      total_ += params[i].second;
    }
  }
  int accum_steps() const override { return accum_; }
  double max_norm() const override { return max_norm_; }
  double forward_backward(int micro, float loss_factor) override {
    put(labproto::kStepForwardBackward, &loss_factor, 4, {micro});
    auto back = expect_data(8);
    fetched_ = false;  // the gradients changed
    double loss;
    std::memcpy(&loss, back.data(), 8);
    return loss;
  }
  std::vector<lab03::Grad>& grads() override {
    if (!fetched_) {
      put(labproto::kStepGrads, nullptr, 0);
      auto back = expect_data(uint64_t(total_) * 4);
      size_t at = 0;
      for (auto& s : storage_) {
        if (!s.empty()) std::memcpy(s.data(), back.data() + at, s.size() * 4);
        at += s.size() * 4;
      }
      fetched_ = true;
    }
    for (size_t i = 0; i < grads_.size(); i++) {  // whatever the student did to the vector, the trainer's view
      grads_[i].data = storage_[i].data();
      grads_[i].numel = int64_t(storage_[i].size());
    }
    return grads_;
  }
  void optimizer_step() override {
    grads();
    std::vector<char> out;
    for (const auto& s : storage_) append(out, s.data(), s.size() * 4);
    put(labproto::kStepOptimizer, out.data(), out.size());
    expect_data(0);
    fetched_ = false;
  }
  void skip_step() override {
    put(labproto::kStepSkip, nullptr, 0);
    expect_data(0);
    fetched_ = false;
  }
  void scheduler_step() override {
    put(labproto::kStepScheduler, nullptr, 0);
    expect_data(0);
  }
  lab03::Comm& comm() override { return comm_; }

 private:
  int accum_;
  double max_norm_;
  lab03::Comm comm_;
  std::vector<std::vector<float>> storage_;
  std::vector<lab03::Grad> grads_;
  int64_t total_ = 0;
  bool fetched_ = false;
};

}  // namespace

int serve_lab03(void* plugin) {
  auto* t = load_table<const Lab03Plugin>(plugin, "distlab_lab03", kLab03Abi, "amp.cpp", "labs/03-amp-accum/api.h");
  if (!t) return 2;
  std::unique_ptr<lab03::ScalerState> run_state;  // train_step's scaler, from scaler_init on the first step
  return serve_calls([t, &run_state](const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
    LabReader r{{in}};
    switch (f.arg[0]) {
      case labproto::kScalerInit: {
        need(t->scaler_init, "scaler_init");
        append_state(out, t->scaler_init(r.config()));
        return true;
      }
      case labproto::kScalerUpdate: {
        need(t->scaler_update, "scaler_update");
        const lab03::ScalerConfig c = r.config();
        lab03::ScalerState s = r.state();
        t->scaler_update(c, s, f.arg[1] != 0);
        append_state(out, s);
        return true;
      }
      case labproto::kUnscale: {
        need(t->unscale, "unscale_");
        lab03::Comm comm(int(f.arg[1]), int(f.arg[2]), &kOps, nullptr);
        const lab03::ScalerState s = r.state();
        std::vector<std::vector<float>> storage;
        std::vector<lab03::Grad> grads;
        r.grads(f.arg[3], storage, grads);
        const int32_t found = t->unscale(comm, s, grads) ? 1 : 0;
        append(out, &found, 4);
        for (const auto& v : storage) append(out, v.data(), v.size() * 4);
        return true;
      }
      case labproto::kClipGradNorm: {
        need(t->clip_grad_norm, "clip_grad_norm");
        const double max_norm = r.take<double>();
        std::vector<std::vector<float>> storage;
        std::vector<lab03::Grad> grads;
        r.grads(f.arg[1], storage, grads);
        const double norm = t->clip_grad_norm(grads, max_norm);
        append(out, &norm, 8);
        for (const auto& v : storage) append(out, v.data(), v.size() * 4);
        return true;
      }
      case labproto::kTrainStep: {
        need(t->train_step, "train_step");
        const double max_norm = r.take<double>();
        const lab03::ScalerConfig c = r.config();
        std::vector<std::pair<std::string, int64_t>> params;
        for (int64_t k = 0; k < f.arg[4]; k++) {
          const int64_t numel = r.take<int64_t>();
          std::string name;
          for (char ch; (ch = r.take<char>()) != '\0';) name += ch;
          params.push_back({name, numel});
        }
        if (!run_state) {
          need(t->scaler_init, "scaler_init");
          run_state = std::make_unique<lab03::ScalerState>(t->scaler_init(c));
        }
        RemoteStep step(int(f.arg[1]), int(f.arg[2]), int(f.arg[3]), max_norm, params);
        const float used = run_state->scale;
        t->train_step(step, c, *run_state);
        append(out, &used, 4);
        append_state(out, *run_state);
        return true;
      }
      default:
        return false;
    }
  });
}

}  // namespace labhost
