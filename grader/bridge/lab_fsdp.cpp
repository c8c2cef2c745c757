// Lab 05's trainer side: the student's FSDP (labs/05-fsdp-1b/api.h) decides WHEN; the engine's ZeRO-3
// machinery (core/parallel/zero3.h) does the work. Each of the model's hooks calls the student's hook of
// the same name, and the student's requests — gather (async), wait, free, reduce_scatter — run here on the
// engine's shards, traced and counted as the engine's own FSDP. The rules that keep the numbers right are
// checked as they happen: a unit's parameters are whole when its forward or backward starts, never freed
// while it runs, and its gradients are reduced once, after its backward.
// Compare ZeRO3's own hooks (zero3.cpp): the same decisions, made by the engine.
#include <fmt/format.h>

#include "core/parallel/zero3.h"
#include "grader/bridge/lab_plugin.h"
#include "core/util/error.h"

namespace distlab {

namespace {

Error lab_error(const std::string& what, const std::string& hint = "see labs/05-fsdp-1b/api.h and README.md") {
  return Error("the lab's FSDP: " + what, hint);
}

class LabFSDP : public ZeRO3 {
 public:
  LabFSDP(LabPlugin& plugin, ProcessGroup& pg, Model& model, Runtime& rt, ShardedOptions o, const std::string& sharding)
      : ZeRO3(pg, model, rt, o, "fsdp (the student's, " + sharding + ")"), plugin_(plugin) {
    const size_t n = size_t(flats_.num_groups());  // lab 05 refuses wrapping: a group is a unit
    running_.assign(n, 0);
    done_.assign(n, false);
    reduced_.assign(n, false);
    numel_.assign(n, 0);
    for (const auto& f : flats_.all()) numel_[size_t(f.group)] += f.numel;
  }
  nlohmann::json report() const override {
    auto r = ZeRO3::report();
    r["gathers_requested_ahead"] = ahead_;  // gather() of a unit before its wait(): prefetches
    r["root_freed_after_forward"] = root_freed_;  // the root rule broken: gathered again as backward starts
    return r;
  }

  void before_forward(int unit) override {
    if (root_ < 0) root_ = unit;  // the first unit a forward reaches encloses the others (PyTorch's root)
    fwd_order_.record(unit);
    hook(0, unit);
    if (!whole_[size_t(unit)])
      throw lab_error(fmt::format("before_forward({}) returned, and unit {}'s parameters are not whole for its forward", unit, unit),
                      "wait(unit) in before_forward");
    running_[size_t(unit)]++;
  }
  void after_forward(int unit) override {
    running_[size_t(unit)]--;
    hook(1, unit);
  }
  void begin_backward(bool sync) override {
    sync_ = sync;
    in_backward_ = true;
    fwd_order_.freeze();
    done_.assign(done_.size(), false);
    reduced_.assign(reduced_.size(), false);
  }
  void before_layer_backward(int unit) override {
    bwd_order_.record(unit);
    hook(2, unit);
    if (!whole_[size_t(unit)])
      throw lab_error(fmt::format("unit {}'s backward needs its parameters, and they are not whole: freed after its forward and not "
                                  "gathered again",
                                  unit),
                      "wait(unit) in before_backward: under FULL_SHARD every unit is gathered twice per step");
    running_[size_t(unit)]++;
  }
  void after_layer_backward(int unit, const std::vector<Parameter*>&) override {
    running_[size_t(unit)]--;
    done_[size_t(unit)] = true;
    hook(3, unit);
    if (sync_ && !reduced_[size_t(unit)])
      throw lab_error(fmt::format("after_backward({}) returned without reduce_scatter({}): its gradients would never reach the "
                                  "optimizer",
                                  unit, unit),
                      "reduce_scatter(unit) in after_backward (unless o.sync is false: accumulation)");
  }
  void finish_backward(Runtime&) override {
    in_backward_ = false;
    finish_reduces();
    bwd_order_.freeze();
  }

 private:
  void hook(int which, int unit) {
    std::vector<char> in;
    auto put = [&](const void* p, size_t n) { in.insert(in.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n); };
    for (int64_t n : numel_) put(&n, 8);
    for (const auto* order : {&fwd_order_.units(), &bwd_order_.units()}) {
      const int32_t n = int32_t(order->size());
      put(&n, 4);
      for (int u : *order) {
        const int32_t v = u;
        put(&v, 4);
      }
    }
    const int64_t flags = (o_.reshard_after_forward ? 1 : 0) | (o_.prefetch ? 2 : 0) | (sync_ ? 4 : 0);
    static const char* names[4] = {"before_forward", "after_forward", "before_backward", "after_backward"};
    const LabPlugin::Serve serve = [this](const wire::Frame& f, std::vector<char>& payload) { serve_request(f); };
    plugin_.call(labproto::kFsdpHook, {pg_.rank(), pg_.size(), which, unit, flags, int64_t(numel_.size()), root_}, in.data(), in.size(),
                 &pg_, &rt_, names[which], serve);
  }

  void serve_request(const wire::Frame& f) {
    const int64_t u = f.arg[0];
    static const char* what[] = {"gather", "wait", "free", "reduce_scatter", "is_whole"};
    const char* name = f.op >= labproto::kFsdpGather && f.op <= labproto::kFsdpIsWhole ? what[f.op - labproto::kFsdpGather] : "request";
    if (f.op < labproto::kFsdpGather || f.op > labproto::kFsdpIsWhole) throw lab_error(fmt::format("sent request {}, which lab 05 has no use for", f.op));
    if (u < 0 || u >= int64_t(numel_.size())) throw lab_error(fmt::format("{}({}): there are units 0..{}", name, u, numel_.size() - 1));
    const size_t k = size_t(u);
    switch (f.op) {
      case labproto::kFsdpGather:
        if (!whole_[k] && !in_flight_.count(int(u))) {
          issue(int(u));  // async: the wait comes later
          ahead_++;
          prefetches_++;
        }
        break;
      case labproto::kFsdpWait:
        gather(int(u));
        break;
      case labproto::kFsdpFree:
        if (running_[k] > 0)
          throw lab_error(fmt::format("free({}) while unit {}'s {} is running", u, u, done_[k] || !fwd_order_.recording() ? "backward" : "forward"),
                          "a unit is freed in its after_ hooks, or later: never between before_ and after_");
        if (int(u) == root_ && !in_backward_ && whole_[k]) root_freed_++;
        release(int(u));
        break;
      case labproto::kFsdpReduceScatter:
        if (!sync_)
          throw lab_error(fmt::format("reduce_scatter({}) on an accumulation micro-step", u),
                          "o.sync is false: the whole gradients add up locally until the last micro-step (no_sync)");
        if (!done_[k]) throw lab_error(fmt::format("reduce_scatter({}) before unit {}'s backward is done", u, u), "in after_backward(unit)");
        if (reduced_[k]) throw lab_error(fmt::format("reduce_scatter({}) twice in one step", u));
        finish_reduces();  // the unit before it (in backward), whose reduce overlapped this unit's backward
        reduce(int(u));
        reduced_[k] = true;
        break;
      default: {
        const int32_t v = whole_[k] ? 1 : 0;
        return plugin_.reply(labproto::kData, &v, 4, 0, "is_whole");
      }
    }
    plugin_.reply(labproto::kData, nullptr, 0, 0, name);
  }

  LabPlugin& plugin_;
  std::vector<int> running_;             // per unit: its forward or backward is running (between the hooks)
  std::vector<bool> done_, reduced_;     // this step: its backward finished; its gradients reduced
  std::vector<int64_t> numel_;
  int root_ = -1;
  int64_t ahead_ = 0, root_freed_ = 0;
  bool in_backward_ = false;
};

}  // namespace

std::unique_ptr<Strategy> LabPlugin::make_fsdp(ProcessGroup& pg, Model& model, Runtime& rt, const std::string& sharding, bool prefetch,
                                               bool offload) {
  return std::make_unique<LabFSDP>(*this, pg, model, rt, ShardedOptions{sharding != "shard_grad_op", prefetch, offload, 0}, sharding);
}

}  // namespace distlab
