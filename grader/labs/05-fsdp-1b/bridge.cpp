// Lab 05's trainer side: the student's FlatParameter and FSDP hooks (labs/05-fsdp-1b/api.h). The student
// allocates, copies, all-gathers, views, frees and reduce-scatters; every buffer it names is a tensor here,
// behind a handle, allocated on this rank's accountant in the category the lab says (so the memory checks
// measure the student's buffers), and every collective runs on this rank's process group (counted and
// traced like the engine's own). What stays the engine's: this rank's part of every flat vector (the
// layout of core/parallel/flat_param.h, which the student's layout must agree with), the optimizer and its
// step, and gathering the whole model for a save or the check that replicas agree (ZeRO3's machinery).
// The rules that keep the numbers right are checked as they happen: a unit's parameters have weights,
// gathered and waited for, when its forward or backward starts; no buffer a running unit views is freed;
// every gradient reaches the optimizer once per step.
// Compare the engine's own FSDP (core/parallel/zero3.cpp): the same decisions, made by the engine.
// Read next: host.cpp beside it (the plugin's side of each request).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "core/parallel/comm_buffers.h"
#include "core/parallel/zero3.h"
#include "core/util/error.h"
#include "grader/bridge/lab_plugin.h"

namespace distlab {

namespace {

Error fsdp_error(const std::string& what, const std::string& hint = "see labs/05-fsdp-1b/api.h and README.md") {
  return Error("the lab's FSDP: " + what, hint);
}

enum class Kind { weights = 0, grads = 1, host = 2 };
const char* kind_name(Kind k) { return k == Kind::weights ? "weights" : k == Kind::grads ? "grads" : "host"; }

// A parameter's name as the plugin sees it: a block's number ("transformer.h.7.attn.c_attn.weight") is its
// unit's drawn number, or the names would give the order the numbers hide (h.0, h.1, ... run in turn).
// The embeddings' and the final norm's names stay as they are: they name the root and the last block, as
// the module tree names them to PyTorch FSDP, and say nothing of the blocks' order.
std::string renumbered(const std::string& name, int unit) {
  for (size_t at = 0; at < name.size();) {
    const size_t end = std::min(name.find('.', at), name.size());
    if (end > at && name.find_first_not_of("0123456789", at) >= end) return name.substr(0, at) + std::to_string(unit) + name.substr(end);
    at = end + 1;
  }
  return name;
}

class LabFSDP : public ZeRO3 {
 public:
  LabFSDP(LabPlugin& plugin, ProcessGroup& pg, Model& model, Runtime& rt, ShardedOptions o, const std::string& sharding, uint64_t unit_seed,
          int64_t gather_budget)
      : ZeRO3(pg, model, rt, o, "fsdp (the student's, " + sharding + ")"), plugin_(plugin), gather_budget_(gather_budget) {
    const size_t units = size_t(flats_.num_groups());  // lab 05 refuses wrapping: a group is a unit
    // The numbers the plugin knows the units by: drawn from lab.unit_seed (the grader draws one per
    // grading), as modules are numbered by registration and not by when they run. What the order is, the
    // plugin learns from the calls (PyTorch FSDP's execution order, recorded on the first iteration).
    ids_.resize(units);
    for (size_t u = 0; u < units; u++) ids_[u] = int(u);
    std::mt19937_64 draw(unit_seed);
    for (size_t u = units; u > 1; u--) std::swap(ids_[u - 1], ids_[size_t(draw() % u)]);
    // and the flats' numbers too (else the order could be read off them: the engine numbers flats in order)
    const size_t nflats = flats_.all().size();
    flat_of_.resize(nflats);
    for (size_t i = 0; i < nflats; i++) flat_of_[i] = int(i);
    for (size_t i = nflats; i > 1; i--) std::swap(flat_of_[i - 1], flat_of_[size_t(draw() % i)]);
    fid_.resize(nflats);
    for (size_t p = 0; p < nflats; p++) fid_[size_t(flat_of_[p])] = int(p);
    running_.assign(units, 0);
    done_.assign(units, false);
    kept_.assign(flats_.all().size(), false);
    part_handle_.assign(flats_.all().size(), 0);
    for (const auto& f : flats_.all()) largest_alloc_ += f.padded;
    for (int e : flat_of_) {  // what every hook call carries: the flats in the plugin's numbering, their parameters
      const FlatParam& f = flats_.all()[size_t(e)];
      const int32_t unit = ids_[size_t(f.group)], n = int32_t(f.params.size());
      put(&unit, 4);
      put(&n, 4);
      for (const Parameter* p : f.params) {
        const int64_t numel = p->data.numel();
        put(&numel, 8);
        const std::string shown = renumbered(p->name, unit);
        table_.insert(table_.end(), shown.c_str(), shown.c_str() + shown.size() + 1);
      }
    }
  }
  nlohmann::json report() const override {
    auto r = ZeRO3::report();
    r["gathers_requested_ahead"] = ahead_;        // all-gathers waited for in a later hook than the one that started them
    r["root_freed_after_forward"] = root_freed_;  // the root rule broken: gathered again as backward starts
    r["buffers_allocated"] = allocs_;
    r["gather_budget"] = gather_budget_;                  // lab.gather_budget (0: none)
    r["peak_gathered_elements"] = peak_weights_;          // the most the student's weights buffers held at once
    r["peak_gathered_during"] = peak_weights_during_;     // in which hook
    return r;
  }

  // ---- the model's hooks: each calls the student's, then checks what it left ----

  void before_forward(int unit) override {
    if (root_ < 0) root_ = unit;  // the first unit a forward reaches encloses the others (PyTorch's root)
    hook(0, unit);
    require_weights(unit, "forward");
    running_[size_t(unit)]++;
  }
  void after_forward(int unit) override {
    running_[size_t(unit)]--;
    hook(1, unit);
  }
  void begin_backward(bool sync) override {
    sync_ = sync;
    in_backward_ = true;
    done_.assign(done_.size(), false);
    kept_.assign(kept_.size(), false);
  }
  void before_layer_backward(int unit) override {
    hook(2, unit);
    require_weights(unit, "backward");
    running_[size_t(unit)]++;
  }
  void after_layer_backward(int unit, const std::vector<Parameter*>&) override {
    running_[size_t(unit)]--;
    done_[size_t(unit)] = true;
    hook(3, unit);
  }
  void finish_backward(Runtime&) override {
    hook(4, -1);
    in_backward_ = false;
    if (!works_.empty()) {
      const auto& [id, w] = *works_.begin();
      throw fsdp_error(fmt::format("finish_backward returned and work {} ({} of buffer {} into buffer {}, started in {}) was never waited for",
                                  id, w.gather ? "an all_gather" : "a reduce_scatter", w.in, w.out, w.started),
                      "every Work is waited for once: a prefetch nobody used is waited for too, and its buffer freed");
    }
    if (!sync_) return;
    for (size_t i = 0; i < flats_.all().size(); i++) {
      const FlatParam& f = flats_.all()[i];
      for (const Parameter* p : f.params)
        if (p->grad.defined())
          throw fsdp_error(fmt::format("backward is over and {}'s gradient (flat {}, unit {}) was never taken: the optimizer would step "
                                      "without it",
                                      p->name, fid(int(i)), id(f.group)),
                          "after a unit's backward, take every parameter's gradient into the flat gradient you reduce-scatter");
      if (!kept_[i])
        throw fsdp_error(fmt::format("finish_backward returned and flat {} (unit {}) has no gradient part kept: the optimizer would step "
                                    "its part without a gradient",
                                    fid(int(i)), id(f.group)),
                        "keep_grad(flat, reduced part) once per flat per step, before finish_backward returns");
    }
  }
  void step(Runtime& rt, Optimizer& opt, float lr, float grad_factor) override {
    if (!viewing_.empty())
      throw fsdp_error(fmt::format("the optimizer steps while {} still views buffer {} (allocated in {}): after the step those weights are stale",
                                  viewing_.begin()->first->name, viewing_.begin()->second, bufs_.at(viewing_.begin()->second).made),
                      "free every unit's gathered weights after its backward: the next forward gathers the new ones");
    ZeRO3::step(rt, opt, lr, grad_factor);
  }
  // A save or the replicas check gathers the whole model with the engine's machinery: views it drops.
  void gather_full_params(Runtime& rt, const Optimizer* masters) override {
    forget_views("the trainer gathered the whole model (a save)");
    ZeRO3::gather_full_params(rt, masters);
  }
  void visit_full_params(Runtime& rt, Model& model, const std::function<void(const std::vector<Parameter*>&)>& fn) override {
    forget_views("the trainer gathered the whole model (the check that replicas agree)");
    ZeRO3::visit_full_params(rt, model, fn);
  }

 private:
  struct Buf {
    Tensor t;
    Kind kind = Kind::weights;
    int64_t n = 0;
    int part_of = -1;  // the trainer's part of this flat (never released)
    int busy = 0;      // collectives in flight that read or write it
    int writing = 0;   // the work writing it, not yet waited for
    std::string made;  // "unit 3's before_forward"
    bool host() const { return kind == Kind::host; }
  };
  struct Pending {
    std::shared_ptr<Work> work;
    bool gather = true;
    int in = 0, out = 0;
    int64_t n = 0;
    Tensor temp_in, temp_out;  // f32 staging where a buffer is 16 bits
    std::string started;
    int64_t hook_call = 0;
  };

  void put(const void* p, size_t n) { table_.insert(table_.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n); }

  void hook(int which, int unit) {
    static const char* names[5] = {"before_forward", "after_forward", "before_backward", "after_backward", "finish_backward"};
    during_ = which == 4 ? std::string("finish_backward") : fmt::format("{}({})", names[which], id(unit));
    hook_calls_++;
    const int64_t flags = (o_.reshard_after_forward ? 1 : 0) | (o_.prefetch ? 2 : 0) | (sync_ ? 4 : 0) | (o_.offload ? 8 : 0);
    const LabPlugin::Serve serve = [this](const wire::Frame& f, std::vector<char>& payload) { serve_request(f, payload); };
    plugin_.call(labproto::kFsdpHook, {pg_.rank(), pg_.size(), which, which == 4 ? -1 : id(unit), flags, int64_t(flats_.all().size()), gather_budget_},
                 table_.data(), table_.size(), &pg_, &rt_, names[which], serve);
  }

  // When unit's forward or backward starts: every parameter has weights, all-gathered and waited for.
  void require_weights(int unit, const char* what) {
    for (const FlatParam& f : flats_.all()) {
      if (f.group != unit) continue;
      for (const Parameter* p : f.params) {
        if (!p->data.defined()) {
          const auto lost = lost_.find(p);
          throw fsdp_error(fmt::format("unit {}'s {} starts and {} has no weights: {}", id(unit), what, p->name,
                                      lost != lost_.end() ? lost->second : "no view of a gathered buffer was ever set"),
                          what == std::string("backward") ? "under FULL_SHARD a unit's weights are freed after its forward: its backward needs them again"
                                                          : "before_forward makes the unit whole: gathered, waited for, its parameters viewing the buffer");
        }
        const auto v = viewing_.find(const_cast<Parameter*>(p));
        if (v == viewing_.end()) continue;  // weights the engine gathered (a save)
        const int b = v->second;
        if (const int w = bufs_.at(b).writing)
          throw fsdp_error(fmt::format("unit {}'s {} starts and {} views buffer {}, which work {} (an all_gather) is still writing", id(unit), what,
                                      p->name, b, w),
                          "wait(work) before the unit computes: an all_gather's output is there only once it is waited for");
      }
    }
  }

  Buf& buffer(int64_t b, const char* op) {
    auto it = bufs_.find(int(b));
    if (b <= 0 || b > INT32_MAX || it == bufs_.end())
      throw fsdp_error(fmt::format("{} in {}: buffer {} does not exist ({})", op, during_, b,
                                  b > 0 && b < next_buf_ ? "it was released" : "no alloc() or part() returned it"));
    if (it->second.part_of >= 0) it->second.t = flats_.all()[size_t(it->second.part_of)].local.data;  // the optimizer's part as it is now
    return it->second;
  }
  // the engine's index of the plugin's flat i
  int64_t engine_flat(int64_t i, const char* op) const {
    if (i < 0 || i >= int64_t(flats_.all().size()))
      throw fsdp_error(fmt::format("{} in {}: flat {} does not exist (flats 0..{})", op, during_, i, flats_.all().size() - 1));
    return flat_of_[size_t(i)];
  }
  FlatParam& flat(int64_t i, const char* op) { return flats_.all()[size_t(engine_flat(i, op))]; }
  Parameter* param(int64_t i, int64_t k, const char* op) {
    FlatParam& f = flat(i, op);
    if (k < 0 || k >= int64_t(f.params.size()))
      throw fsdp_error(fmt::format("{} in {}: flat {} has parameters 0..{}, not {}", op, during_, i, f.params.size() - 1, k));
    return f.params[size_t(k)];
  }
  void in_range(const Buf& b, int64_t id, int64_t at, int64_t n, const char* op) {
    if (at < 0 || n < 0 || at > b.n || n > b.n - at)
      throw fsdp_error(fmt::format("{} in {}: elements [{}, {}) of buffer {}, which holds {}", op, during_, at, at + n, id, b.n));
  }
  DType dtype_of(const Buf& b) const { return b.t.dtype(); }
  DeviceKind device_of(const Buf& b) const { return b.t.device(); }

  int new_handle(Buf b) {
    b.made = during_;
    const int id = next_buf_++;
    bufs_.emplace(id, std::move(b));
    return id;
  }
  void reply_int(int32_t v, const char* name) { plugin_.reply(labproto::kData, &v, 4, 0, name); }

  void serve_request(const wire::Frame& f, const std::vector<char>& payload) {
    const int64_t* a = f.arg;
    switch (f.op) {
      case labproto::kFsdpAlloc: {
        const int64_t n = a[0];
        if (a[1] < 0 || a[1] > 2) throw fsdp_error(fmt::format("alloc({}, kind {}) in {}: the kinds are weights, grads and host", n, a[1], during_));
        if (n < 0 || n > largest_alloc_)
          throw fsdp_error(fmt::format("alloc({}) in {}: more elements than every flat vector of the model together ({})", n, during_, largest_alloc_),
                          "a buffer holds one flat vector (padded), or a part of one");
        if (live_ + n > 3 * largest_alloc_)  // a rank's whole model, gathered, plus its flat gradients, fit twice over
          throw fsdp_error(fmt::format("alloc({}) in {}: the lab's buffers would hold {} elements, more than 3x every flat vector of the model "
                                      "together ({})", n, during_, live_ + n, largest_alloc_),
                          "release what is no longer needed: a gathered unit after its use, a flat gradient once reduced");
        live_ += n;
        if (a[1] == int64_t(Kind::weights) && (live_weights_ += n) > peak_weights_) peak_weights_ = live_weights_, peak_weights_during_ = during_;
        Buf b;
        b.kind = Kind(a[1]);
        b.n = n;
        const std::string what = fmt::format("the lab's {} buffer ({})", kind_name(b.kind), during_);
        if (b.kind == Kind::weights) b.t = rt_.empty({n}, Category::params, what, rt_.dtype);
        else if (b.kind == Kind::grads) b.t = rt_.empty({n}, Category::comm_buffers, what);
        else b.t = rt_.host_empty({n}, Category::host, what, rt_.dtype);
        if (!b.t.is_meta()) b.t.fill_(NAN);  // uninitialized: a value nobody wrote shows
        allocs_++;
        return reply_int(new_handle(std::move(b)), "alloc");
      }
      case labproto::kFsdpPart: {
        const int64_t e = engine_flat(a[0], "part");
        FlatParam& fl = flats_.all()[size_t(e)];
        int& h = part_handle_[size_t(e)];
        if (!h) {
          Buf b;
          b.kind = fl.local.data.category() == Category::host ? Kind::host : Kind::weights;
          b.part_of = int(e);
          b.n = fl.shard;
          h = new_handle(std::move(b));
        }
        bufs_.at(h).t = fl.local.data;  // the optimizer's part as it is now
        return reply_int(h, "part");
      }
      case labproto::kFsdpRelease: {
        Buf& b = buffer(a[0], "release");
        if (b.part_of >= 0)
          throw fsdp_error(fmt::format("release({}) in {}: buffer {} is this rank's part of flat {}, the trainer's", a[0], during_, a[0], fid(b.part_of)),
                          "part(flat) is the optimizer's: keep it");
        if (b.busy) throw fsdp_error(fmt::format("release({}) in {}: a collective in flight still uses buffer {}", a[0], during_, a[0]),
                                    "wait(work) first: the collective reads or writes the buffer until then");
        for (auto it = viewing_.begin(); it != viewing_.end();) {
          if (it->second != int(a[0])) {
            ++it;
            continue;
          }
          Parameter* p = it->first;
          const int unit = unit_of(p);
          if (running_[size_t(unit)] > 0)
            throw fsdp_error(fmt::format("release({}) in {} while unit {}'s {} is running: {} views that buffer", a[0], during_, id(unit),
                                        done_[size_t(unit)] || in_backward_ ? "backward" : "forward", p->name),
                            "a unit's weights are freed in its after_ hooks, or later: never between before_ and after_");
          if (unit == root_ && !in_backward_) root_freed_++;
          p->data.release();  // the view goes: the shape stays
          lost_[p] = fmt::format("its weights viewed buffer {}, released in {}", a[0], during_);
          it = viewing_.erase(it);
        }
        live_ -= b.n;
        if (b.kind == Kind::weights) live_weights_ -= b.n;
        bufs_.erase(int(a[0]));
        break;
      }
      case labproto::kFsdpCopy: {
        Buf& dst = buffer(a[0], "copy");
        Buf& src = buffer(a[2], "copy");
        in_range(dst, a[0], a[1], a[4], "copy (dst)");
        in_range(src, a[2], a[3], a[4], "copy (src)");
        if (dst.busy || src.writing)  // a collective in flight reads or writes dst, or writes src
          throw fsdp_error(fmt::format("copy in {}: buffer {} is in use by a collective not yet waited for", during_, dst.busy ? a[0] : a[2]),
                          "wait(work) first");
        if (dst.part_of >= 0) throw fsdp_error(fmt::format("copy in {} into buffer {}, this rank's part of flat {}: the optimizer's", during_, a[0], fid(dst.part_of)));
        const int64_t n = a[4];
        char* d = static_cast<char*>(dst.t.data());
        const char* s = static_cast<const char*>(src.t.data());
        copy_across(rt_, s ? s + a[3] * dtype_size(dtype_of(src)) : nullptr, dtype_of(src), device_of(src),
                    d ? d + a[1] * dtype_size(dtype_of(dst)) : nullptr, dtype_of(dst), device_of(dst), n);
        if (dst.host() != src.host())  // across the bus: what CPU offload pays for
          rt_.trace.record_copy(dst.host() ? "lab offload: to the host" : "lab offload: to the device",
                                double(n) * double(std::min(dtype_size(dtype_of(src)), dtype_size(dtype_of(dst)))));
        break;
      }
      case labproto::kFsdpFill: {
        Buf& b = buffer(a[0], "fill");
        in_range(b, a[0], a[1], a[2], "fill");
        if (b.part_of >= 0) throw fsdp_error(fmt::format("fill in {} of buffer {}, this rank's part of flat {}: the optimizer's", during_, a[0], fid(b.part_of)));
        if (b.busy) throw fsdp_error(fmt::format("fill in {}: buffer {} is in use by a collective not yet waited for", during_, a[0]), "wait(work) first");
        float v = 0;
        if (payload.size() != 4) throw fsdp_error(fmt::format("fill in {} sent {} bytes for its value", during_, payload.size()));
        std::memcpy(&v, payload.data(), 4);
        if (!b.t.is_meta() && a[2] > 0) b.t.slice(a[1], {a[2]}).fill_(v);
        break;
      }
      case labproto::kFsdpAllGather:
      case labproto::kFsdpReduceScatter:
        return collective(f.op == labproto::kFsdpAllGather, a[0], a[1], a[2]);
      case labproto::kFsdpWait: {
        auto it = works_.find(a[0]);
        if (it == works_.end())
          throw fsdp_error(fmt::format("wait({}) in {}: no collective in flight has that handle{}", a[0], during_,
                                      a[0] > 0 && a[0] < next_work_ ? " (it was waited for already)" : ""));
        Pending w = std::move(it->second);
        works_.erase(it);
        w.work->wait();
        Buf& out = bufs_.at(w.out);
        if (w.temp_out.defined()) copy_values(rt_, w.temp_out.data(), DType::f32, out.t.data(), out.t.dtype(), w.n * (w.gather ? pg_.size() : 1));
        out.writing = 0;
        out.busy--;
        bufs_.at(w.in).busy--;
        if (w.gather && w.hook_call != hook_calls_) ahead_++;
        break;
      }
      case labproto::kFsdpView: {
        Parameter* p = param(a[0], a[1], "view");
        Buf& b = buffer(a[2], "view");
        if (b.kind != Kind::weights || b.part_of >= 0)
          throw fsdp_error(fmt::format("view({}, {}, buffer {}) in {}: buffer {} is {}; a parameter views a weights buffer (the gathered flat "
                                      "vector)",
                                      a[0], a[1], a[2], during_, a[2], b.part_of >= 0 ? "this rank's part" : fmt::format("a {} buffer", kind_name(b.kind))));
        in_range(b, a[2], a[3], p->data.numel(), "view");
        const int unit = unit_of(p);
        if (running_[size_t(unit)] > 0)
          throw fsdp_error(fmt::format("view of {} in {} while unit {} is running", p->name, during_, id(unit)));
        p->data = b.t.slice(a[3], p->data.shape());
        viewing_[p] = int(a[2]);
        lost_.erase(p);
        break;
      }
      case labproto::kFsdpTakeGrad: {
        Parameter* p = param(a[0], a[1], "take_grad");
        Buf& b = buffer(a[2], "take_grad");
        const int unit = unit_of(p);
        if (!sync_)
          throw fsdp_error(fmt::format("take_grad of {} in {} on an accumulation micro-step", p->name, during_),
                          "o.sync is false: the layers' gradients add up until the last micro-step (no_sync); take them then");
        if (!done_[size_t(unit)] || running_[size_t(unit)] > 0)
          throw fsdp_error(fmt::format("take_grad of {} in {}: unit {}'s backward is not done", p->name, during_, id(unit)),
                          "a unit's gradients are complete in its after_backward");
        if (b.kind != Kind::grads) throw fsdp_error(fmt::format("take_grad of {} in {} into buffer {}, a {} buffer: gradients go into a grads buffer", p->name, during_, a[2], kind_name(b.kind)));
        if (b.busy) throw fsdp_error(fmt::format("take_grad in {}: buffer {} is in use by a collective not yet waited for", during_, a[2]), "wait(work) first");
        in_range(b, a[2], a[3], p->data.numel(), "take_grad");
        float* dst = b.t.f32_at(a[3]);
        if (p->grad.defined()) copy_values(rt_, p->grad.data(), p->grad.dtype(), dst, DType::f32, p->data.numel());
        else if (dst) zero_values(rt_, dst, p->data.numel() * 4);  // a parameter the loss doesn't reach
        p->grad = Tensor();  // the layer's gradient goes: the flat buffer has it
        break;
      }
      case labproto::kFsdpKeepGrad: {
        const int64_t e = engine_flat(a[0], "keep_grad");
        FlatParam& fl = flats_.all()[size_t(e)];
        Buf& b = buffer(a[1], "keep_grad");
        if (!sync_) throw fsdp_error(fmt::format("keep_grad({}) in {} on an accumulation micro-step", a[0], during_),
                                    "o.sync is false: nothing is reduced until the last micro-step (no_sync)");
        if (kept_[size_t(e)]) throw fsdp_error(fmt::format("keep_grad({}) in {}: flat {}'s part was kept already this step", a[0], during_, a[0]));
        if (b.writing)
          throw fsdp_error(fmt::format("keep_grad({}, buffer {}) in {}: a reduce_scatter is still writing that buffer", a[0], a[1], during_),
                          "wait(work) first: its output is there only once it is waited for");
        const bool host = fl.local.data.category() == Category::host;
        if (b.part_of >= 0 || (host && b.kind != Kind::host) || (!host && b.kind != Kind::grads))
          throw fsdp_error(fmt::format("keep_grad({}, buffer {}) in {}: buffer {} is {}; the optimizer steps this part {}", a[0], a[1], during_, a[1],
                                      b.part_of >= 0 ? "a part of the weights" : fmt::format("a {} buffer", kind_name(b.kind)),
                                      host ? "on the host (offload): its gradient must be host memory" : "on the device, from a grads buffer"));
        if (b.n < fl.shard)
          throw fsdp_error(fmt::format("keep_grad({}, buffer {}) in {}: this rank's part of flat {} is {} elements, and buffer {} holds {}", a[0], a[1],
                                      during_, a[0], fl.shard, a[1], b.n),
                          "the part of a flat is what the reduce-scatter leaves each rank: the layout decides its size");
        check_padding(fl, b, a[0], a[1]);
        const DeviceKind where = host ? rt_.host_device() : rt_.device;
        fl.local.grad = Tensor::empty({fl.shard}, rt_.memory, where, offload_.grads(), rt_.dtype, fl.local.name + " gradient");
        copy_across(rt_, b.t.data(), b.t.dtype(), b.t.device(), fl.local.grad.data(), rt_.dtype, where, fl.shard);
        kept_[size_t(e)] = true;
        break;
      }
      default:
        throw fsdp_error(fmt::format("sent request {} in {}, which lab 05 has no use for", f.op, during_));
    }
    plugin_.reply(labproto::kData, nullptr, 0, 0, "fsdp request");
  }

  // all_gather (in[0, n) from every rank -> out[r·n, (r+1)·n)) or reduce_scatter (the average of in[rank·n,
  // (rank+1)·n) -> out[0, n)), asynchronous; 16-bit buffers travel through f32 staging, as the engine's do.
  void collective(bool gather, int64_t in_id, int64_t out_id, int64_t n) {
    const char* op = gather ? "all_gather" : "reduce_scatter";
    Buf& in = buffer(in_id, op);
    Buf& out = buffer(out_id, op);
    const int64_t world = pg_.size();
    if (n < 0 || n > (int64_t(1) << 40)) throw fsdp_error(fmt::format("{} of {} elements in {}", op, n, during_));
    in_range(in, in_id, 0, gather ? n : n * world, fmt::format("{} (in)", op).c_str());
    in_range(out, out_id, 0, gather ? n * world : n, fmt::format("{} (out)", op).c_str());
    if (in.host() || out.host())
      throw fsdp_error(fmt::format("{}(buffer {}, buffer {}) in {}: buffer {} is host memory", op, in_id, out_id, during_, in.host() ? in_id : out_id),
                      "a collective runs between devices: copy a host part into a device buffer first");
    if (!gather && (in.kind != Kind::grads || out.kind != Kind::grads))
      throw fsdp_error(fmt::format("reduce_scatter(buffer {}, buffer {}) in {}: gradients are reduced in grads buffers (f32)", in_id, out_id, during_));
    if (gather && out.kind != Kind::weights)  // what the budget (gather_budget) and the parameters' memory count
      throw fsdp_error(fmt::format("all_gather(buffer {}, buffer {}) in {}: weights are gathered into a weights buffer, and buffer {} is {}", in_id,
                                  out_id, during_, out_id, kind_name(out.kind)),
                      "alloc(padded, Kind::weights) for a unit's gathered flat vector");
    if (out.part_of >= 0) throw fsdp_error(fmt::format("{} in {} into buffer {}, this rank's part of flat {}: the optimizer's", op, during_, out_id, fid(out.part_of)));
    if (in_id == out_id) throw fsdp_error(fmt::format("{} in {} with buffer {} as its input and its output", op, during_, in_id));
    if (in.writing || out.writing || out.busy)
      throw fsdp_error(fmt::format("{} in {}: buffer {} is in use by a collective not yet waited for", op, during_, in.writing ? in_id : out_id));
    Pending w;
    w.gather = gather;
    w.in = int(in_id);
    w.out = int(out_id);
    w.n = n;
    w.started = during_;
    w.hook_call = hook_calls_;
    const float* src = nullptr;
    if (in.t.dtype() == DType::f32) src = in.t.f32();
    else {
      w.temp_in = rt_.empty({gather ? n : n * world}, Category::comm_buffers, fmt::format("the lab's {} input (f32)", op));
      copy_values(rt_, in.t.data(), in.t.dtype(), w.temp_in.data(), DType::f32, w.temp_in.numel());
      src = w.temp_in.f32();
    }
    float* dst = nullptr;
    if (out.t.dtype() == DType::f32) dst = out.t.f32();
    else {
      w.temp_out = rt_.empty({gather ? n * world : n}, Category::comm_buffers, fmt::format("the lab's {} output (f32)", op));
      dst = w.temp_out.f32();
    }
    if (gather) {
      const DType wire = in.t.dtype() != DType::f32 || out.t.dtype() != DType::f32 ? rt_.dtype : DType::f32;
      w.work = staged_all_gather_async(rt_, pg_, dst, src, n, wire);
      gathers_++;
    } else {
      w.work = staged_reduce_scatter_async(rt_, pg_, dst, src, n, ReduceOp::avg, rt_.reduce_dtype);
    }
    in.busy++;
    out.busy++;
    const int id = next_work_++;
    out.writing = id;
    works_.emplace(id, std::move(w));
    reply_int(id, op);
  }

  // The part's elements past the parameters' end (the padding that falls in this rank's part) must be
  // zero: they count in the gradient's norm. Read where the values are on the host (a cpu rank).
  void check_padding(const FlatParam& fl, const Buf& b, int64_t flat, int64_t id) {
    const int64_t first = std::max<int64_t>(fl.numel - int64_t(pg_.rank()) * fl.shard, 0);  // in the part
    if (first >= fl.shard || rt_.device != DeviceKind::cpu || !b.t.data()) return;
    std::vector<float> pad(size_t(fl.shard - first));
    copy_values(rt_, static_cast<const char*>(b.t.data()) + first * dtype_size(b.t.dtype()), b.t.dtype(), pad.data(), DType::f32,
                int64_t(pad.size()));
    for (size_t i = 0; i < pad.size(); i++)
      if (pad[i] != 0.0f)
        throw fsdp_error(fmt::format("keep_grad({}, buffer {}) in {}: element {} of this rank's part lies past the parameters' end (the padding) "
                                    "and is {}, not 0: it would count in the gradient's norm (and the clipping)",
                                    flat, id, during_, first + int64_t(i), pad[i]),
                        "a buffer comes uninitialized: what nobody writes stays NaN");
  }

  int unit_of(const Parameter* p) const { return unit_by_param_.count(p) ? unit_by_param_.at(p) : index_units(p); }
  int index_units(const Parameter* p) const {
    for (const FlatParam& f : flats_.all())
      for (const Parameter* q : f.params) unit_by_param_[q] = f.group;
    return unit_by_param_.at(p);
  }
  void forget_views(const std::string& why) {
    for (const auto& [p, b] : viewing_) lost_[p] = why;
    viewing_.clear();
  }

  LabPlugin& plugin_;
  std::vector<char> table_;           // the flat table every hook call carries
  std::vector<int> running_;          // per unit: its forward or backward is running (between the hooks)
  std::vector<bool> done_, kept_;     // this micro-step: a unit's backward finished; per flat: its part kept
  std::vector<int> part_handle_;      // per flat: the handle part() returned (0: none yet)
  std::map<int, Buf> bufs_;
  std::map<int64_t, Pending> works_;
  std::map<Parameter*, int> viewing_;              // which buffer a parameter's weights view
  std::map<const Parameter*, std::string> lost_;   // why a parameter has no weights
  mutable std::map<const Parameter*, int> unit_by_param_;
  std::string during_;
  int next_buf_ = 1;
  int64_t next_work_ = 1, hook_calls_ = 0;
  int root_ = -1;
  std::vector<int> ids_;  // the plugin's number of each unit (drawn), by the engine's
  int id(int unit) const { return unit >= 0 && size_t(unit) < ids_.size() ? ids_[size_t(unit)] : unit; }
  std::vector<int> flat_of_, fid_;  // the engine's flat of the plugin's flat p, and the plugin's number of engine flat e (drawn)
  int fid(int e) const { return e >= 0 && size_t(e) < fid_.size() ? fid_[size_t(e)] : e; }
  int64_t ahead_ = 0, root_freed_ = 0, allocs_ = 0, largest_alloc_ = 0;
  int64_t live_ = 0;  // elements in the student's buffers now (its parts' handles not counted)
  const int64_t gather_budget_;                   // lab.gather_budget: what Kind::weights buffers may hold at once (0: none)
  int64_t live_weights_ = 0, peak_weights_ = 0;   // elements in the student's Kind::weights buffers: now, at the most
  std::string peak_weights_during_;
  bool in_backward_ = false;
};

}  // namespace

std::unique_ptr<Strategy> LabPlugin::make_fsdp(ProcessGroup& pg, Model& model, Runtime& rt, const std::string& sharding, bool prefetch,
                                               bool offload, uint64_t unit_seed, int64_t gather_budget) {
  return std::make_unique<LabFSDP>(*this, pg, model, rt, ShardedOptions{sharding != "shard_grad_op", prefetch, offload, 0}, sharding,
                                   unit_seed, gather_budget);
}

}  // namespace distlab
