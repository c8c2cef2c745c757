// Lab 04's trainer side: the student's ZeRO-1 or ZeRO-2 (labs/04-zero/api.h) behind the engine's Strategy.
// The layout is the engine's — flats, as core/parallel/flat_param.h makes them: one unit's parameters of
// one weight-decay group — but the partition, the collectives and their order are the student's. What the
// student hands over stays here, in the trainer's process, where the plugin can't reach it:
//
//   keep_grad(flat, begin, part)  → the part, in the run's dtype (grads), the flat's whole gradient freed
//   optimizer_step()              → the engine's optimizer on every kept part: f32 master + moments for
//                                   exactly the elements kept (optim_state)
//   set_weights(flat, begin, w)   → into the model's parameters
//
// so the memory a rank holds and the bytes it sends are measured by the engine, as for its own ZeRO
// (compare core/parallel/zero1.cpp and zero2.cpp, the engine's versions of the same stages).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>

#include "core/optim/grad_scaler.h"
#include "core/parallel/ddp.h"
#include "core/parallel/flat_param.h"
#include "core/tensor/on_host.h"
#include "grader/bridge/lab_plugin.h"
#include "core/util/error.h"

namespace distlab {

namespace {

Error lab_error(const std::string& what, const std::string& hint = "see labs/04-zero/api.h and README.md") {
  return Error("the lab's ZeRO: " + what, hint);
}

class LabZeRO : public Strategy {
 public:
  LabZeRO(LabPlugin& plugin, int stage, ProcessGroup& pg, Model& model, Runtime& rt)
      : plugin_(plugin), stage_(stage), pg_(pg), rt_(rt) {
    broadcast_model(pg, model);  // every replica starts equal, as the engine's strategies
    flats_ = flat_layout(model.units(), pg.size());  // the engine's layout (flat_param.h: a group per unit), nothing allocated
    for (FlatParam& s : flats_) {
      std::string names;
      for (Parameter* p : s.params) names += (names.empty() ? "" : " ") + p->name;
      s.local.name = fmt::format("unit {} ({}): {}", s.group, s.local.decay ? "decayed" : "undecayed", names);
    }
    begin_.assign(flats_.size(), -1);
    kept_.assign(flats_.size(), false);
    for (const auto& s : flats_) {
      const int64_t numel = s.numel;
      table_.insert(table_.end(), reinterpret_cast<const char*>(&numel), reinterpret_cast<const char*>(&numel) + 8);
      table_.insert(table_.end(), s.local.name.begin(), s.local.name.end());
      table_.push_back('\0');
    }
  }

  std::string describe() const override { return fmt::format("zero{} (the student's)", stage_); }
  nlohmann::json report() const override {
    int64_t padded = 0, kept = 0, largest = 0;
    std::map<int, int64_t> unit_numel;
    for (const auto& s : flats_) {
      padded += s.padded;
      kept += s.local.data.defined() ? s.local.data.numel() : 0;
      unit_numel[s.group] += s.numel;
    }
    for (const auto& [u, n] : unit_numel)
      if (u > 0) largest = std::max(largest, n);
    return {{"name", describe()},
            {"flat_vectors", flats_.size()},
            {"padded_elements", padded},
            {"elements_kept", kept},  // what this rank's optimizer steps
            {"unit0_elements", unit_numel.empty() ? 0 : unit_numel.begin()->second},
            {"largest_unit_elements", largest}};
  }

  void begin_backward(bool sync) override { sync_ = sync; }
  void after_layer_backward(int unit, const std::vector<Parameter*>&) override {
    if (stage_ != 2 || !sync_) return;  // accumulation: whole gradients add up until the last micro-step
    for (size_t f = 0; f < flats_.size(); f++)
      if (flats_[f].group == unit) {
        reducing_ = int(f);
        call(labproto::kZero2Reduce, int64_t(f), "zero2_reduce");
        reducing_ = -1;
        if (!kept_[f]) throw lab_error(fmt::format("zero2_reduce(step, {}) returned without keep_grad({}, ...)", f, f),
                                       "keep this rank's part of the flat's averaged gradient (n = 0 where it owns nothing)");
      }
  }
  void finish_backward(Runtime&) override {
    if (!sync_) return;
    if (stage_ == 1) {
      reducing_ = kAll;
      call(labproto::kZero1Reduce, 0, "zero1_reduce");
      reducing_ = -1;
    }
    for (size_t f = 0; f < flats_.size(); f++)
      if (!kept_[f])
        throw lab_error(fmt::format("after zero{}_reduce, flat {} ({}) has no kept gradient part", stage_, f, flats_[f].local.name),
                        "keep_grad every flat once per step (n = 0 where this rank owns nothing of it)");
  }
  std::vector<Parameter*> optimizer_parameters(Model&) override { return parts(); }
  std::string checkpoint_refusal() const override { return "lab 04's student ZeRO keeps parts of its own design, which a checkpoint cannot address"; }
  double grad_norm(Runtime&, Model&) override {
    double ss = 0;
    for (auto& s : flats_)
      if (s.local.grad.defined() && s.local.grad.data()) {
        const OnHost g(s.local.grad);  // f32 on the host, from any device and dtype
        for (int64_t i = 0; i < s.local.grad.numel(); i++) ss += double(g.p[i]) * g.p[i];
      }
    return norm_over_ranks(pg_, ss);  // the parts are disjoint when the partition is: the global norm
  }
  bool found_inf(Runtime& rt, Model&, ProcessGroup*) override { return GradScaler::found_inf(rt, parts(), &pg_); }
  void step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) override {
    opt_ = &opt;
    lr_ = lr;
    grad_factor_ = grad_factor;
    stepped_ = false;
    in_step_ = true;
    call(labproto::kZeroStep, 0, "zero_step");
    in_step_ = false;
    opt_ = nullptr;
    if (!stepped_) throw lab_error("zero_step returned without step.optimizer_step()", "step your parts, then all-gather them");
  }
  void zero_grad(Model& model) override {
    model.zero_grad();
    for (auto& s : flats_) s.local.grad = Tensor();
    kept_.assign(flats_.size(), false);
  }

 private:
  static constexpr int kAll = -2;  // zero1_reduce: every flat's gradient is complete

  std::vector<Parameter*> parts() {
    std::vector<Parameter*> v;
    for (auto& s : flats_) v.push_back(&s.local);
    return v;
  }

  void call(labproto::Fn fn, int64_t flat, const char* during) {
    const int64_t nflats = int64_t(flats_.size());
    const LabPlugin::Serve serve = [this](const wire::Frame& f, std::vector<char>& payload) { serve_step(f, payload); };
    if (fn == labproto::kZero2Reduce)
      plugin_.call(fn, {pg_.rank(), pg_.size(), nflats, flat}, table_.data(), table_.size(), &pg_, &rt_, during, serve);
    else
      plugin_.call(fn, {pg_.rank(), pg_.size(), nflats}, table_.data(), table_.size(), &pg_, &rt_, during, serve);
  }

  FlatParam& flat_of(int64_t f, const char* what) {
    if (f < 0 || f >= int64_t(flats_.size())) throw lab_error(fmt::format("{}({}): there are flats 0..{}", what, f, flats_.size() - 1));
    return flats_[size_t(f)];
  }
  void check_range(const FlatParam& s, int64_t f, int64_t begin, int64_t n, const char* what) {
    // in this order, so that nothing wraps: begin and n come from the plugin and may be anything
    if (begin < 0 || n < 0 || begin > s.padded || n > s.padded - begin)
      throw lab_error(fmt::format("{}({}, begin {}, n {}): [{}, {}) is not inside flat {}'s padded length {} ({} elements padded to a "
                                  "multiple of {} ranks)",
                                  what, f, begin, n, begin, uint64_t(begin) + uint64_t(n), f, s.padded, s.numel, pg_.size()),
                      "a part is a range of the flat padded to the smallest multiple of the world size: shard_of");
  }
  std::vector<float> packed(const FlatParam& s, bool grads) {
    std::vector<float> flat(static_cast<size_t>(s.padded));
    pack(rt_, s, 0, s.padded, flat.data(), grads, DeviceKind::cpu);  // a host vector (down from a cuda rank's device)
    return flat;
  }
  void answer(const void* data, size_t bytes, const char* during) { plugin_.reply(labproto::kData, data, bytes, 0, during); }

  void serve_step(const wire::Frame& f, std::vector<char>& payload) {
    switch (f.op) {
      case labproto::kZeroGrad: {
        FlatParam& s = flat_of(f.arg[0], "grad");
        if (reducing_ != kAll && reducing_ != f.arg[0])
          throw lab_error(reducing_ == -1 ? fmt::format("grad({}) in zero_step: gradients are read in zero{}_reduce", f.arg[0], stage_)
                                          : fmt::format("grad({}) in zero2_reduce(step, {}): flat {}'s gradient is not complete yet", f.arg[0],
                                                        reducing_, f.arg[0]),
                          "zero2_reduce(step, flat) is called for each flat as soon as ITS gradient is complete");
        if (kept_[size_t(f.arg[0])])
          throw lab_error(fmt::format("grad({}) after keep_grad({}, ...): the whole gradient was released then", f.arg[0], f.arg[0]));
        const auto g = packed(s, true);
        return answer(g.data(), size_t(s.numel) * 4, "grad");
      }
      case labproto::kZeroKeep: {
        FlatParam& s = flat_of(f.arg[0], "keep_grad");
        const int64_t begin = f.arg[1], n = int64_t(payload.size() / 4);
        if (reducing_ == -1) throw lab_error(fmt::format("keep_grad({}, ...) in zero_step: parts are kept in zero{}_reduce", f.arg[0], stage_));
        if (kept_[size_t(f.arg[0])]) throw lab_error(fmt::format("keep_grad({}, ...) twice in one step", f.arg[0]), "once per flat per step");
        check_range(s, f.arg[0], begin, n, "keep_grad");
        int64_t& mine = begin_[size_t(f.arg[0])];
        const int64_t had = s.local.data.defined() ? s.local.data.numel() : 0;
        if (mine >= 0 && (mine != begin || had != n))
          throw lab_error(fmt::format("keep_grad({}, begin {}, n {}): last step this rank kept [{}, {}) of it", f.arg[0], begin, n, mine,
                                      mine + had),
                          "the same part every step: its optimizer state (master weights, moments) lives on this rank");
        if (mine < 0) {  // the first step: the f32 master of the part, from the weights as they are now
          mine = begin;
          if (n > 0) {
            s.local.data = rt_.empty({n}, Category::optim_state, "f32 master of the part of " + s.local.name, DType::f32);
            const auto w = packed(s, false);
            s.local.data.from_host(w.data() + begin);
          }
        }
        if (n > 0) {
          s.local.grad = rt_.empty({n}, Category::grads, "gradient part of " + s.local.name, rt_.dtype);
          OnHost g(s.local.grad, OnHost::out);  // rounded to the run's dtype, on the rank's device
          if (g.p) std::memcpy(g.p, payload.data(), size_t(n) * 4);
          g.store();
        }
        for (Parameter* p : s.params) p->grad = Tensor();  // the whole gradient: released, only the part stays
        kept_[size_t(f.arg[0])] = true;
        return answer(nullptr, 0, "keep_grad");
      }
      case labproto::kZeroOptimizer: {
        if (!in_step_) throw lab_error("optimizer_step outside zero_step");
        if (stepped_) throw lab_error("optimizer_step twice in one zero_step", "one optimizer step per training step");
        opt_->step(rt_, lr_, grad_factor_);  // every kept part, at this step's lr, unscaled and clipped
        stepped_ = true;
        return answer(nullptr, 0, "optimizer_step");
      }
      case labproto::kZeroPartWeights: {
        FlatParam& s = flat_of(f.arg[0], "part_weights");
        if (!stepped_) throw lab_error(fmt::format("part_weights({}) before optimizer_step", f.arg[0]));
        const int64_t n = s.local.data.defined() ? s.local.data.numel() : 0;
        const OnHost w(s.local.data);  // the f32 master of the part
        return answer(n ? w.p : nullptr, size_t(n) * 4, "part_weights");
      }
      case labproto::kZeroSetWeights: {
        FlatParam& s = flat_of(f.arg[0], "set_weights");
        if (!in_step_) throw lab_error(fmt::format("set_weights({}, ...) outside zero_step", f.arg[0]));
        const int64_t begin = f.arg[1], n = int64_t(payload.size() / 4);
        check_range(s, f.arg[0], begin, n, "set_weights");
        auto w = packed(s, false);
        if (n) std::memcpy(w.data() + begin, payload.data(), size_t(n) * 4);
        unpack(rt_, s, 0, s.padded, w.data(), DeviceKind::cpu);  // rounded into the parameters' dtype; the padding dropped
        return answer(nullptr, 0, "set_weights");
      }
      default:
        throw lab_error(fmt::format("sent request {}, which lab 04 has no use for", f.op));
    }
  }

  LabPlugin& plugin_;
  int stage_;
  ProcessGroup& pg_;
  Runtime& rt_;
  std::vector<FlatParam> flats_;  // local: this rank's part (data: the f32 master, grad: the kept part)
  std::vector<int64_t> begin_;    // where each part starts (-1: none kept yet)
  std::vector<bool> kept_;        // this step
  std::vector<char> table_;       // numel + name per flat, for the host
  bool sync_ = true, in_step_ = false, stepped_ = false;
  int reducing_ = -1;             // the flat zero2_reduce is called for; kAll in zero1_reduce
  Optimizer* opt_ = nullptr;
  float lr_ = 0, grad_factor_ = 1;
};

}  // namespace

std::unique_ptr<Strategy> LabPlugin::make_zero(int stage, ProcessGroup& pg, Model& model, Runtime& rt) {
  return std::make_unique<LabZeRO>(*this, stage, pg, model, rt);
}

}  // namespace distlab
