// Lab 04's trainer side: the student's ZeRO-1 or ZeRO-2 and sharded AdamW (labs/04-zero/api.h) behind the
// engine's Strategy. The layout is the engine's — flats, as core/parallel/flat_param.h makes them: one unit's
// parameters of one weight-decay group — but the partition, the collectives, their order and the optimizer
// are the student's. What the student hands over or asks for is held here, in the trainer's process, where
// the plugin can't reach it:
//
//   keep_grad(flat, begin, part)  → the part, in the run's dtype (grads), the flat's whole gradient freed
//   release_grad(flat)            → the flat's whole gradient freed before its part is kept (packed for a
//                                   reduction still running, as the engine's ZeRO-2 frees it into its bucket)
//   state(flat, name, n)          → n floats of optim_state counted here for the buffer the host made
//   set_weights(flat, begin, w)   → into the model's parameters
//
// so the memory a rank holds and the bytes it sends are measured by the engine, as for its own ZeRO. After
// every step the host hands back the buffers named exp_avg and exp_avg_sq, and they must be AdamW's moments
// of the parts this rank kept (a shadow computed here from those parts): optimizer state kept anywhere but
// in the counted buffers fails the run instead of passing the memory checks.
// Read next: host.cpp beside it (the plugin's side of each request).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <string_view>

#include "core/optim/optimizer.h"

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

constexpr size_t kMaxStateName = 64;
constexpr size_t kMaxStatesPerFlat = 8;

class LabZeRO : public Strategy {
 public:
  LabZeRO(LabPlugin& plugin, int stage, ProcessGroup& pg, Model& model, Runtime& rt, double max_norm)
      : plugin_(plugin), stage_(stage), pg_(pg), rt_(rt), max_norm_(max_norm) {
    if (rt.dtype == DType::f16)
      throw ConfigError("precision.mode fp16 with lab 04's ZeRO: the lab's AdamW runs without a loss scaler",
                        "run the lab in bf16 (its config) or fp32; the loss scaler is lab 03's subject");
    broadcast_model(pg, model);  // every replica starts equal, as the engine's strategies
    flats_ = flat_layout(model.units(), pg.size());  // the engine's layout (flat_param.h: a group per unit), nothing allocated
    for (FlatParam& s : flats_) {
      std::string names;
      for (Parameter* p : s.params) names += (names.empty() ? "" : " ") + p->name;
      s.local.name = fmt::format("unit {} ({}): {}", s.group, s.local.decay ? "decayed" : "undecayed", names);
    }
    begin_.assign(flats_.size(), -1);
    kept_.assign(flats_.size(), false);
    released_.assign(flats_.size(), false);
    offered_.assign(flats_.size(), false);
    kept_n_.assign(flats_.size(), 0);
    shadow_.resize(flats_.size());
    for (const auto& s : flats_) {
      const int64_t numel = s.numel, decay = s.local.decay, unit = s.group;
      for (const int64_t* v : {&numel, &decay, &unit}) table_.insert(table_.end(), reinterpret_cast<const char*>(v), reinterpret_cast<const char*>(v) + 8);
      table_.insert(table_.end(), s.local.name.begin(), s.local.name.end());
      table_.push_back('\0');
    }
  }

  std::string describe() const override { return fmt::format("zero{} (the student's)", stage_); }
  nlohmann::json report() const override {
    int64_t padded = 0, kept = 0, largest = 0, state = 0;
    std::map<int, int64_t> unit_numel;
    for (const auto& s : flats_) {
      padded += s.padded;
      unit_numel[s.group] += s.numel;
    }
    for (int64_t n : kept_n_) kept += n;
    for (const auto& [key, t] : state_) state += t.numel();
    // the largest message ZeRO's design sends one flat at a time: its padded gradient (or gathered
    // weights), or its state read back after the step (what the plugin's working copies are sized by)
    int64_t message = 0;
    for (size_t f = 0; f < flats_.size(); f++) {
      int64_t states = 0;
      for (const auto& [key, t] : state_) states += key.first == int64_t(f) ? t.numel() : 0;
      message = std::max({message, flats_[f].padded * 4, states * 4});
    }
    for (const auto& [u, n] : unit_numel)
      if (u > 0) largest = std::max(largest, n);
    return {{"name", describe()},
            {"flat_vectors", flats_.size()},
            {"padded_elements", padded},
            {"elements_kept", kept},        // the gradient parts this rank holds
            {"state_elements", state},      // the optimizer state the student asked for
            {"state_checked_steps", checked_steps_},
            {"unit0_elements", unit_numel.empty() ? 0 : unit_numel.begin()->second},
            {"largest_unit_elements", largest},
            {"largest_flat_message_bytes", message}};
  }

  void begin_backward(bool sync) override { sync_ = sync; }
  void after_layer_backward(int unit, const std::vector<Parameter*>&) override {
    if (stage_ != 2 || !sync_) return;  // accumulation: whole gradients add up until the last micro-step
    for (size_t f = 0; f < flats_.size(); f++)
      if (flats_[f].group == unit) {
        reducing_ = int(f);
        offered_[f] = true;
        call(labproto::kZero2Reduce, int64_t(f), "zero2_reduce");  // its reduction may still be running: kept by zero2_finish
        reducing_ = -1;
      }
  }
  void finish_backward(Runtime&) override {
    if (!sync_) return;
    reducing_ = stage_ == 1 ? kAll : kFinish;
    call(stage_ == 1 ? labproto::kZero1Reduce : labproto::kZero2Finish, 0, stage_ == 1 ? "zero1_reduce" : "zero2_finish");
    reducing_ = -1;
    for (size_t f = 0; f < flats_.size(); f++)
      if (!kept_[f])
        throw lab_error(fmt::format("after zero{}_reduce, flat {} ({}) has no kept gradient part", stage_, f, flats_[f].local.name),
                        "keep_grad every flat once per step");
  }
  // The engine's optimizer holds nothing: the student's AdamW steps the parts, with the state it asked for.
  std::vector<Parameter*> optimizer_parameters(Model&) override { return {}; }
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
  void step(Runtime&, Optimizer& opt, float lr, float) override {  // the clip: the student's
    auto* adamw = dynamic_cast<AdamW*>(&opt);
    if (!adamw) throw ConfigError("lab 04's ZeRO steps AdamW (the student's): optim.name is not adamw", "set optim.name = \"adamw\"");
    const AdamWOptions& o = adamw->options();
    t_++;
    hyper_ = {lr, o.beta1, o.beta2, o.eps, o.weight_decay, float(max_norm_), t_};
    if (t_ == 1 && rt_.dtype != DType::f32)  // the master starts from the weights as the model holds them (step.weights)
      for (size_t f = 0; f < flats_.size(); f++) {
        const std::vector<float> all = packed(flats_[f], false);
        const int64_t b = begin_[f], n = kept_n_[f];
        shadow_[f].w.assign(size_t(std::max<int64_t>(n, 0)), 0.0f);
        for (int64_t i = 0; i < n; i++) shadow_[f].w[size_t(i)] = b + i < int64_t(all.size()) ? all[size_t(b + i)] : 0.0f;
      }
    in_step_ = true;
    call(labproto::kZeroStep, 0, "zero_step");
    in_step_ = false;
    check_state(lr);
  }
  void zero_grad(Model& model) override {
    model.zero_grad();
    for (auto& s : flats_) s.local.grad = Tensor();
    kept_.assign(flats_.size(), false);
    released_.assign(flats_.size(), false);
    offered_.assign(flats_.size(), false);
  }

 private:
  static constexpr int kAll = -2;     // zero1_reduce: every flat's gradient is complete
  static constexpr int kFinish = -3;  // zero2_finish: parts are kept, no gradient is read

  struct Hyper {  // the wire's AdamW: 6 f32 and an int64 (labs/04-zero/api.h's struct AdamW)
    float lr, beta1, beta2, eps, weight_decay, max_norm;
    int64_t t;
  };
  static_assert(sizeof(Hyper) == 32);
  struct Shadow {  // AdamW's moments of the part this rank kept, computed here; in a bf16 run its f32 master too
    std::vector<float> m, v, w;
  };

  std::vector<Parameter*> parts() {
    std::vector<Parameter*> v;
    for (auto& s : flats_) v.push_back(&s.local);
    return v;
  }

  void call(labproto::Fn fn, int64_t flat, const char* during) {
    const int64_t nflats = int64_t(flats_.size());
    const LabPlugin::Serve serve = [this](const wire::Frame& f, std::vector<char>& payload) { serve_step(f, payload); };
    std::vector<char> in;
    if (fn == labproto::kZeroStep) in.assign(reinterpret_cast<const char*>(&hyper_), reinterpret_cast<const char*>(&hyper_) + sizeof hyper_);
    in.insert(in.end(), table_.begin(), table_.end());
    if (fn == labproto::kZero2Reduce)
      plugin_.call(fn, {pg_.rank(), pg_.size(), nflats, flat}, in.data(), in.size(), &pg_, &rt_, during, serve);
    else
      plugin_.call(fn, {pg_.rank(), pg_.size(), nflats}, in.data(), in.size(), &pg_, &rt_, during, serve);
  }

  // After the student's step: its exp_avg and exp_avg_sq of every flat against AdamW's moments of the part
  // it kept.
  void check_state(float lr) {
    // flat by flat: the host's copy of what it sends is one flat's state, never the whole rank's (the
    // plugin's process is measured, and this copy is the host's, not the student's)
    std::vector<std::vector<char>> dumps(flats_.size());
    std::map<std::pair<int64_t, std::string>, std::pair<const char*, int64_t>> got;
    for (size_t fl = 0; fl < flats_.size(); fl++) {
      const std::vector<char>& dump = dumps[fl] = plugin_.call(labproto::kZeroStateDump, {int64_t(fl)}, nullptr, 0, nullptr, &rt_, "the state buffers");
      for (size_t at = 0; at < dump.size();) {
        int64_t flat = 0, n = 0;
        if (dump.size() - at < 16) throw lab_error("the host's state buffers are cut short");
        std::memcpy(&flat, dump.data() + at, 8);
        std::memcpy(&n, dump.data() + at + 8, 8);
        at += 16;
        const size_t end = std::string_view(dump.data() + at, dump.size() - at).find('\0');
        if (end == std::string_view::npos || end > kMaxStateName || flat != int64_t(fl)) throw lab_error("the host's state buffers are garbled");
        const std::string name(dump.data() + at, end);
        at += end + 1;
        if (n < 0 || uint64_t(n) > (dump.size() - at) / 4) throw lab_error("the host's state buffers are cut short");
        got[{flat, name}] = {dump.data() + at, n};
        at += size_t(n) * 4;
      }
    }
    // every flat's exp_avg and exp_avg_sq, of the kept part's length
    std::vector<std::array<const char*, 2>> mine(flats_.size());
    std::vector<std::vector<float>> grads(flats_.size());
    for (size_t f = 0; f < flats_.size(); f++) {
      FlatParam& s = flats_[f];
      const int64_t n = s.local.grad.defined() ? s.local.grad.numel() : 0;
      if (n) {
        const OnHost g(s.local.grad);
        grads[f].assign(g.p, g.p + n);
      }
      int k = 0;
      for (const char* name : {"exp_avg", "exp_avg_sq"}) {
        auto it = got.find({int64_t(f), name});
        if (it == got.end())
          throw lab_error(fmt::format("after step {}, flat {} ({}) has no state buffer named {}", t_, f, s.local.name, name),
                          "keep the moments in step.state(flat, \"exp_avg\", n) and step.state(flat, \"exp_avg_sq\", n): the "
                          "trainer counts them as this rank's optimizer state and checks them");
        if (it->second.second != n)
          throw lab_error(fmt::format("after step {}, flat {}'s {} holds {} floats; the part this rank kept has {}", t_, f, name,
                                      it->second.second, n),
                          "a rank keeps AdamW's state for exactly the part of each flat it owns");
        mine[f][size_t(k++)] = it->second.first;
      }
    }
    auto at = [](const char* data, size_t i) {
      float x;
      std::memcpy(&x, data + 4 * i, 4);
      return x;
    };
    // The coefficient the student's step read its gradient parts with: 1 unclipped; clipped, whatever
    // makes its exp_avg AdamW's (least squares over every flat), which must be a clip's: in (0, 1]. Whether
    // it was the right one, the run's losses say.
    const float b1 = hyper_.beta1, b2 = hyper_.beta2;
    double c = 1.0;
    if (max_norm_ > 0) {
      double num = 0, den = 0;
      for (size_t f = 0; f < flats_.size(); f++)
        for (size_t i = 0; i < grads[f].size(); i++) {
          const double g = grads[f][i];
          num += (double(at(mine[f][0], i)) - double(b1) * (shadow_[f].m.empty() ? 0.0 : shadow_[f].m[i])) * g;
          den += (1.0 - b1) * g * g;
        }
      if (den > 0) c = num / den;
      if (den > 0 && !(c > 1e-6 && c <= 1.0 + 1e-5))
        throw lab_error(fmt::format("after step {}, the moments in your exp_avg buffers are AdamW's of the kept parts times {:.4g}, which is "
                                    "no clipping coefficient (those are in (0, 1])",
                                    t_, c),
                        "m = beta1*m + (1-beta1)*g*grad_scale, with grad_scale = min(1, max_norm / (the global norm + 1e-6))");
    }
    for (size_t f = 0; f < flats_.size(); f++) {
      const size_t n = grads[f].size();
      Shadow& sh = shadow_[f];
      sh.m.resize(n, 0.0f);
      sh.v.resize(n, 0.0f);
      for (size_t i = 0; i < n; i++) {
        const float gi = float(grads[f][i] * c);
        sh.m[i] = b1 * sh.m[i] + (1.0f - b1) * gi;
        sh.v[i] = b2 * sh.v[i] + (1.0f - b2) * gi * gi;
      }
      int k = 0;
      for (const auto& [name, want] : {std::pair{"exp_avg", &sh.m}, std::pair{"exp_avg_sq", &sh.v}}) {
        const char* data = mine[f][size_t(k++)];
        double top = 0, worst = 0;
        size_t where = 0;
        for (size_t i = 0; i < n; i++) {
          top = std::max(top, double(std::abs((*want)[i])));
          const double d = std::abs(double(at(data, i)) - (*want)[i]);
          if (!(d <= worst)) worst = d, where = i;
        }
        if (!(worst <= 1e-4 * top + 1e-30))
          throw lab_error(fmt::format("after step {} (lr {:g}), flat {}'s {}[{}] is {:g}; AdamW's moment of the part this rank kept is {:g}",
                                      t_, lr, f, name, where, at(data, where), (*want)[where]),
                          "m = beta1*m + (1-beta1)*g and v = beta2*v + (1-beta2)*g*g, with g the kept part times the clip coefficient, "
                          "in the buffers step.state gave you");
      }
    }
    if (rt_.dtype != DType::f32) check_master(got, lr);
    checked_steps_++;
  }

  // A bf16 run: the f32 master weights of the part this rank kept, in the state buffer "master", are AdamW's
  // (decoupled decay, then the bias-corrected step from the moments above). Stepping the bf16 weights
  // themselves rounds a small update away; a master buffer that is counted and never read holds nothing.
  void check_master(const std::map<std::pair<int64_t, std::string>, std::pair<const char*, int64_t>>& got, float lr) {
    const double bc1 = 1.0 - std::pow(double(hyper_.beta1), double(t_)), bc2 = 1.0 - std::pow(double(hyper_.beta2), double(t_));
    const float step_size = float(lr / bc1), bc2_sqrt = float(std::sqrt(bc2));
    for (size_t f = 0; f < flats_.size(); f++) {
      Shadow& sh = shadow_[f];
      const size_t n = sh.m.size();
      if (sh.w.size() != n) continue;  // a part that changed size: the moments' check has said so
      const float shrink = flats_[f].local.decay ? 1.0f - lr * hyper_.weight_decay : 1.0f;
      for (size_t i = 0; i < n; i++) sh.w[i] = sh.w[i] * shrink - step_size * sh.m[i] / (std::sqrt(sh.v[i]) / bc2_sqrt + hyper_.eps);
      if (n == 0) continue;
      auto it = got.find({int64_t(f), "master"});
      if (it == got.end() || it->second.second != int64_t(n))
        throw lab_error(fmt::format("after step {} of a bf16 run, flat {} has {}", t_, f,
                                    it == got.end() ? std::string("no state buffer named master") : fmt::format("a master of {} floats; its part has {}", it->second.second, n)),
                        "keep the f32 master weights of your part in step.state(flat, \"master\", n): the bf16 weights cannot hold a small update");
      double top = 0, worst = 0;
      size_t where = 0;
      for (size_t i = 0; i < n; i++) {
        float x;
        std::memcpy(&x, it->second.first + 4 * i, 4);
        top = std::max(top, double(std::abs(sh.w[i])));
        const double d = std::abs(double(x) - sh.w[i]);
        if (!(d <= worst)) worst = d, where = i;
      }
      if (!(worst <= 1e-5 * top + 1e-12)) {
        float x;
        std::memcpy(&x, it->second.first + 4 * where, 4);
        throw lab_error(fmt::format("after step {} (lr {:g}) of a bf16 run, flat {}'s master[{}] is {:.9g}; AdamW's f32 master of the part this "
                                    "rank kept is {:.9g}",
                                    t_, lr, f, where, x, sh.w[where]),
                        "the master starts from step.weights at the first step and takes every AdamW step in f32; set_weights rounds it "
                        "into the bf16 model, and the next step starts from the master again, not from the rounded weights");
      }
    }
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
          throw lab_error(reducing_ == -1       ? fmt::format("grad({}) in zero_step: gradients are read in zero{}_reduce", f.arg[0], stage_)
                          : reducing_ == kFinish ? fmt::format("grad({}) in zero2_finish: each flat's gradient is read in its zero2_reduce", f.arg[0])
                                                 : fmt::format("grad({}) in zero2_reduce(step, {}): flat {}'s gradient is not complete yet", f.arg[0],
                                                               reducing_, f.arg[0]),
                          "zero2_reduce(step, flat) is called for each flat as soon as ITS gradient is complete");
        if (kept_[size_t(f.arg[0])])
          throw lab_error(fmt::format("grad({}) after keep_grad({}, ...): the whole gradient was released then", f.arg[0], f.arg[0]));
        if (released_[size_t(f.arg[0])])
          throw lab_error(fmt::format("grad({}) after release_grad({}): the whole gradient is gone", f.arg[0], f.arg[0]),
                          "read a flat's gradient (once) before you release it");
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
        if (mine >= 0 && (mine != begin || kept_n_[size_t(f.arg[0])] != n))
          throw lab_error(fmt::format("keep_grad({}, begin {}, n {}): last step this rank kept [{}, {}) of it", f.arg[0], begin, n, mine,
                                      mine + kept_n_[size_t(f.arg[0])]),
                          "the same part every step: its optimizer state (master weights, moments) lives on this rank");
        mine = begin;
        kept_n_[size_t(f.arg[0])] = n;
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
      case labproto::kZeroRelease: {
        FlatParam& s = flat_of(f.arg[0], "release_grad");
        const size_t i = size_t(f.arg[0]);
        if (reducing_ == -1) throw lab_error(fmt::format("release_grad({}) in zero_step: whole gradients exist only while they are reduced", f.arg[0]));
        if (reducing_ != kAll && !offered_[i])
          throw lab_error(fmt::format("release_grad({}) before zero2_reduce(step, {}): its gradient is still being computed", f.arg[0], f.arg[0]),
                          "a flat's gradient is complete once zero2_reduce is called for it");
        for (Parameter* p : s.params) p->grad = Tensor();  // nothing reads it any more: freed now, not at keep_grad
        released_[i] = true;
        return answer(nullptr, 0, "release_grad");
      }
      case labproto::kZeroKeptGrad: {
        FlatParam& s = flat_of(f.arg[0], "kept_grad");
        if (!in_step_) throw lab_error(fmt::format("kept_grad({}) outside zero_step", f.arg[0]));
        const int64_t n = s.local.grad.defined() ? s.local.grad.numel() : 0;
        const OnHost g(s.local.grad);  // as the trainer holds it: in the run's dtype
        return answer(n ? g.p : nullptr, size_t(n) * 4, "kept_grad");
      }
      case labproto::kZeroWeights: {
        FlatParam& s = flat_of(f.arg[0], "weights");
        if (!in_step_) throw lab_error(fmt::format("weights({}) outside zero_step", f.arg[0]));
        const auto w = packed(s, false);
        return answer(w.data(), size_t(s.numel) * 4, "weights");
      }
      case labproto::kZeroState: {
        FlatParam& s = flat_of(f.arg[0], "state");
        const int64_t n = f.arg[1];
        const std::string name(payload.begin(), payload.end());
        if (name.empty() || name.size() > kMaxStateName || name.find('\0') != std::string::npos)
          throw lab_error(fmt::format("state({}, name of {} bytes, {}): a name is 1..{} characters", f.arg[0], name.size(), n, kMaxStateName));
        if (n < 0 || n > s.padded)
          throw lab_error(fmt::format("state({}, \"{}\", {}): at most flat {}'s padded length, {}", f.arg[0], name, n, f.arg[0], s.padded));
        int per_flat = 0;
        for (const auto& [key, t] : state_) per_flat += key.first == f.arg[0];
        if (per_flat >= int(kMaxStatesPerFlat))
          throw lab_error(fmt::format("state({}, \"{}\", ...): flat {} has {} buffers already", f.arg[0], name, f.arg[0], per_flat),
                          "AdamW needs three per flat: master, exp_avg, exp_avg_sq");
        Tensor& t = state_[{f.arg[0], name}];
        if (!t.defined() && n > 0) {
          t = rt_.empty({n}, Category::optim_state, name + " of " + s.local.name, DType::f32);
          plugin_.count_host_bytes(n * 4);  // the host holds the student's copy: counted here, not the plugin's own
        }
        return answer(nullptr, 0, "state");
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
  double max_norm_;
  std::vector<FlatParam> flats_;  // local.grad: the part this rank kept this step
  std::vector<int64_t> begin_;    // where each part starts (-1: none kept yet)
  std::vector<int64_t> kept_n_;   // and its length
  std::vector<bool> kept_;        // this step
  std::vector<bool> released_;    // this step: the whole gradient freed by release_grad
  std::vector<bool> offered_;     // this step: zero2_reduce was called for it (its gradient is complete)
  std::vector<Shadow> shadow_;
  std::map<std::pair<int64_t, std::string>, Tensor> state_;  // what the student's buffers count (optim_state)
  std::vector<char> table_;       // numel, decay and name per flat, for the host
  Hyper hyper_{};
  int64_t t_ = 0, checked_steps_ = 0;
  bool sync_ = true, in_step_ = false;
  int reducing_ = -1;             // the flat zero2_reduce is called for; kAll in zero1_reduce
};

}  // namespace

std::unique_ptr<Strategy> LabPlugin::make_zero(int stage, ProcessGroup& pg, Model& model, Runtime& rt, double max_norm) {
  return std::make_unique<LabZeRO>(*this, stage, pg, model, rt, max_norm);
}

}  // namespace distlab
