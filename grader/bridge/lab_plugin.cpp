#include "grader/bridge/lab_plugin.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

namespace {

constexpr size_t kMaxPending = 4096;  // async collectives the plugin may have in flight

wire::Clock::time_point deadline_in(double s) { return wire::after_seconds(s); }

// The buffer of a collective the student asks for: host memory whatever the rank's device (the payload
// comes from and goes back to the student's process), at least one element.
Tensor host_buffer(Runtime& rt, int64_t n, const char* what) { return rt.host_empty({std::max<int64_t>(n, 1)}, Category::comm_buffers, what); }

// The student's sampler: indices come from the plugin, checked before the loader uses them.
class LabSampler : public Sampler {
 public:
  LabSampler(LabPlugin& plugin, int64_t n, int world, int rank, uint64_t seed, bool shuffle)
      : plugin_(plugin), n_(n), world_(world), rank_(rank), seed_(seed), shuffle_(shuffle), size_(int64_t(indices(0).size())) {}

  std::vector<int64_t> indices(int64_t epoch) const override {
    const std::vector<char> raw = plugin_.call(labproto::kSamplerIndices, {n_, world_, rank_, int64_t(seed_), epoch, shuffle_ ? 1 : 0},
                                               nullptr, 0, nullptr, nullptr, "sampler_indices");
    if (raw.size() % 8) throw Error("the lab's sampler_indices returned a broken list", "return a std::vector<int64_t>");
    std::vector<int64_t> v(raw.size() / 8);
    if (!v.empty()) std::memcpy(v.data(), raw.data(), raw.size());
    for (int64_t i : v)
      if (i < 0 || i >= n_)
        throw Error(fmt::format("the lab's sampler_indices returned index {} for a data set of {} samples (epoch {}, rank {})", i, n_,
                                epoch, rank_),
                    "indices are positions 0..n-1 of the data set");
    // the epoch's length is the sampler's: one shorter than DistributedSampler's would end every epoch early
    // (and make the run's steps per epoch, and its modeled speed-up, what the student chose)
    if (const int64_t want = (n_ + world_ - 1) / world_; int64_t(v.size()) != want)
      throw Error(fmt::format("the lab's sampler_indices returned {} indices for rank {} of {} (epoch {}, {} samples): DistributedSampler "
                              "gives every rank ceil(n / world) = {}",
                              v.size(), rank_, world_, epoch, n_, want),
                  "every sample once per epoch over the ranks, the first ones repeated to fill the last rank (drop_last = False)");
    return v;
  }
  int64_t size() const override { return size_; }

 private:
  LabPlugin& plugin_;
  int64_t n_;
  int world_, rank_;
  uint64_t seed_;
  bool shuffle_;
  int64_t size_;
};

// The student's DDP (naive or bucketed) behind the engine's DataParallel.
class LabDDP : public DataParallel {
 public:
  LabDDP(LabPlugin& plugin, bool naive, ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb)
      : plugin_(plugin), naive_(naive), pg_(pg), rt_(rt), params_(model.parameters()) {
    broadcast_model(pg, model);
    std::vector<char> table;
    for (size_t i = 0; i < params_.size(); i++) {
      index_[params_[i]] = int(i);
      const int64_t numel = params_[i]->data.numel();
      table.insert(table.end(), reinterpret_cast<const char*>(&numel), reinterpret_cast<const char*>(&numel) + 8);
      table.insert(table.end(), params_[i]->name.begin(), params_[i]->name.end());
      table.push_back('\0');
      total_ += numel;
    }
    plugin_.call(labproto::kDdpInit, {pg.rank(), pg.size(), naive ? 0 : 1, int64_t(bucket_mb * 1e6), int64_t(params_.size())},
                 table.data(), table.size(), &pg, &rt, naive ? "the naive DDP's setup" : "make_bucketed");
  }

  std::string describe() const override { return naive_ ? "ddp (naive, the student's)" : "ddp (bucketed, the student's)"; }

  // The student's bucketed DDP sees every micro-step and decides itself what a no_sync micro-step sends
  // (nothing); the naive one is called once per optimizer step, as the engine's NaiveDDP is.
  void begin_backward(bool sync) override {
    sync_ = sync;
    if (!naive_) plugin_.call(labproto::kDdpBeginBackward, {sync ? 1 : 0}, nullptr, 0, &pg_, &rt_, "begin_backward");
  }

  void after_layer_backward(int unit, const std::vector<Parameter*>& params) override {
    if (naive_) return;
    std::vector<int32_t> ready;
    for (auto* p : params) ready.push_back(index_.at(p));
    std::vector<char> in(ready.size() * 4);
    if (!ready.empty()) std::memcpy(in.data(), ready.data(), in.size());
    for (auto* p : params) append(in, *p);
    plugin_.call(labproto::kDdpAfterBackward, {unit, int64_t(ready.size())}, in.data(), in.size(), &pg_, &rt_, "after_backward");
  }

  void finish_backward(Runtime& rt) override {
    if (!sync_ && naive_) return;
    std::vector<char> in;
    if (naive_)
      for (auto* p : params_) append(in, *p);
    const std::vector<char> out = plugin_.call(labproto::kDdpFinish, {}, in.data(), in.size(), &pg_, &rt_,
                                               naive_ ? "average_gradients" : "finish_backward");
    if (out.size() != size_t(total_) * 4)
      throw Error(fmt::format("the lab's DDP handed back {} bytes of gradients instead of {}", out.size(), total_ * 4),
                  "keep the grads vector as the trainer gave it: write the averages into grads[i].data");
    size_t at = 0;
    for (auto* p : params_) {
      const size_t bytes = size_t(p->data.numel()) * 4;
      OnHost g(p->grad_for_accumulate(), OnHost::out);  // a cuda rank's: up to the device
      std::memcpy(g.p, out.data() + at, bytes);
      g.store();
      at += bytes;
    }
  }

  int64_t all_reduces_per_step() const override { return -1; }  // the student's choice: the counters tell

 private:
  // a parameter that got no gradient this step (unused) contributes zeros, as DDP's find_unused_parameters
  static void append(std::vector<char>& v, Parameter& p) {
    const OnHost h(p.grad_for_accumulate());  // a cuda rank's: down from the device
    const char* g = reinterpret_cast<const char*>(h.p);
    v.insert(v.end(), g, g + p.data.numel() * 4);
  }

  LabPlugin& plugin_;
  bool naive_;
  ProcessGroup& pg_;
  Runtime& rt_;
  std::vector<Parameter*> params_;
  std::map<Parameter*, int> index_;
  int64_t total_ = 0;
};

}  // namespace

LabPlugin::LabPlugin(const LabPluginOptions& o) : opt_(o) {
  // auto: probe first (a bwrap that runs `true`), and run unboxed where bubblewrap does not work. require
  // (what the grader asks of the ranks it starts, having probed once itself): no probe per rank, which
  // costs a sandbox's start (~25 ms) on every rank of every check; a failed start is probed to say why.
  bool boxed = o.sandbox != "off";
  if (boxed && o.sandbox != "require") boxed = probe_sandbox().bwrap;
  PluginLaunch l;
  l.host_exe = o.host_exe;
  l.plugin = o.plugin;
  l.lab_id = o.lab_name.substr(0, 2);
  l.sandbox = boxed;
  l.memory_mb = 4096;
  l.name = "the lab's plugin (" + o.plugin + ")";
  l.output_fd = 2;  // what the student prints shows up with the rank's output
  if (!o.memory_cgroup.empty()) {
    // a cgroup of the plugin's own under the one the grader gave this job: its peak is the plugin's alone
    const std::string dir = fmt::format("{}/plugin-{}", o.memory_cgroup, getpid());
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      throw ConfigError(fmt::format("lab.memory_cgroup = {}: cannot make the plugin's cgroup {} ({})", o.memory_cgroup, dir, std::strerror(errno)),
                        "give a memory cgroup folder this user may write, or leave lab.memory_cgroup unset");
    cgroup_dir_ = dir;
    l.memory_cgroup = dir;
  }
  try {
    proc_ = std::make_unique<PluginProcess>(l);
    proc_->wait_ready(deadline_in(std::min(60.0, o.timeout_s)));
  } catch (const std::exception& e) {
    if (o.sandbox == "require") {
      if (const SandboxSupport sb = probe_sandbox(); !sb.bwrap)
        throw ConfigError("lab.sandbox = require, but " + sb.why_not, "install bubblewrap, or set lab.sandbox = auto");
    }
    if (dynamic_cast<const PluginError*>(&e) == nullptr) throw;
    throw ConfigError(e.what(), fmt::format("rebuild it: distlab lab build {}", o.lab_name.substr(0, 2)));
  }
}

LabPlugin::~LabPlugin() {
  for (auto& [handle, p] : pending_) {
    try {
      p.work->wait();
    } catch (...) {  // the collective failed: the process group has let go of the buffer
    }
  }
  proc_.reset();  // killed and reaped: its cgroup is empty
  if (!cgroup_dir_.empty()) ::rmdir(cgroup_dir_.c_str());
}

nlohmann::json LabPlugin::memory_report() const {
  const PluginMemory m = proc_ ? proc_->memory() : PluginMemory{};
  return {{"method", m.method}, {"before_load", m.before_load}, {"peak", m.peak}, {"counted_by_trainer", host_counted_},
          {"largest_message", largest_message_}};
}

std::vector<char> LabPlugin::call(labproto::Fn fn, std::initializer_list<int64_t> args, const void* in, size_t in_bytes,
                                  ProcessGroup* pg, Runtime* rt, const char* during, const Serve& serve) {
  wire::Frame f;
  f.op = labproto::kCall;
  f.arg[0] = fn;
  int k = 1;
  for (int64_t a : args) f.arg[k++] = a;
  const auto deadline = deadline_in(opt_.timeout_s);
  proc_->send(f, in, in_bytes, deadline, during);
  largest_message_ = std::max<uint64_t>(largest_message_, in_bytes);
  for (;;) {
    wire::Frame r;
    std::vector<char> payload;
    proc_->receive(r, payload, deadline_in(opt_.timeout_s), during, max_message_);
    largest_message_ = std::max<uint64_t>(largest_message_, payload.size());
    if (r.op == labproto::kReturn) return payload;
    if (r.op == labproto::kRaised)
      throw Error(fmt::format("{} (in the lab's {})", sanitize_output(std::string(payload.begin(), payload.end()), 2000), during),
                  "the exception came from your code in " + opt_.plugin);
    const bool lab_request = (r.op >= labproto::kStepForwardBackward && r.op <= labproto::kFileRead) ||
                             (r.op >= labproto::kFsdpAlloc && r.op <= labproto::kPipeSendBackwardRecvForward);
    if (serve && lab_request) serve(r, payload);  // a Step's, lab 05's FSDP's, lab 06's pipeline's or lab 07's files' request
    else serve_collective(r, payload, pg, rt, during, bool(serve));
  }
}

void LabPlugin::reply(labproto::Op op, const void* data, size_t bytes, int64_t arg, const char* during) {
  wire::Frame a;
  a.op = op;
  a.arg[0] = arg;
  proc_->send(a, data, bytes, deadline_in(opt_.timeout_s), during);
  largest_message_ = std::max<uint64_t>(largest_message_, bytes);
}

void LabPlugin::serve_collective(const wire::Frame& f, std::vector<char>& payload, ProcessGroup* pg, Runtime* rt, const char* during,
                                 bool one_rank_ok) {
  auto refuse = [&](const std::string& why) { throw Error(fmt::format("the lab's {} {}", during, why)); };
  if (f.op != labproto::kAllReduce && f.op != labproto::kAllReduceAsync && f.op != labproto::kWait && f.op != labproto::kReduceScatter &&
      f.op != labproto::kAllGather && f.op != labproto::kReduceScatterAsync)
    refuse(fmt::format("sent opcode {}", f.op));
  if (!pg && one_rank_ok && f.op == labproto::kAllReduce) {  // the sum, average or max over one rank: its own data
    if (f.arg[0] < 0 || f.arg[0] > 2 || payload.size() % 4) refuse(fmt::format("asked for an all_reduce with op {} of {} bytes", f.arg[0], payload.size()));
    return reply(labproto::kData, payload.data(), payload.size(), 0, during);
  }
  if (!pg || !rt) refuse("asked for a collective where none is possible (the sampler has no process group)");
  const auto reply = [&](labproto::Op op, const void* data, size_t bytes, int64_t arg) {
    wire::Frame a;
    a.op = op;
    a.arg[0] = arg;
    proc_->send(a, data, bytes, deadline_in(opt_.timeout_s), during);
  };
  if (f.op == labproto::kWait) {
    auto it = pending_.find(f.arg[0]);
    if (it == pending_.end()) refuse(fmt::format("waited for handle {}, which no async collective returned (or it was waited for already)", f.arg[0]));
    it->second.work->wait();
    reply(labproto::kData, it->second.bytes ? it->second.buffer.data() : nullptr, it->second.bytes, 0);
    pending_.erase(it);
    return;
  }
  if (f.op == labproto::kReduceScatter || f.op == labproto::kAllGather || f.op == labproto::kReduceScatterAsync)
    return serve_scatter_gather(f, payload, *pg, *rt, during);
  const int64_t op = f.arg[0];
  if (op < 0 || op > 2 || payload.size() % 4) refuse(fmt::format("asked for an all_reduce with op {} of {} bytes", op, payload.size()));
  const int64_t n = int64_t(payload.size() / 4);
  largest_all_reduce_ = std::max<uint64_t>(largest_all_reduce_, payload.size());
  const ReduceOp rop = op == 0 ? ReduceOp::sum : op == 1 ? ReduceOp::avg : ReduceOp::max;
  Tensor buf = host_buffer(*rt, n, "lab all_reduce buffer");
  if (n) std::memcpy(buf.f32(), payload.data(), payload.size());
  if (f.op == labproto::kAllReduce) {
    pg->all_reduce(buf.f32(), n, rop);
    reply(labproto::kData, buf.data(), payload.size(), 0);
    return;
  }
  if (pending_.size() >= kMaxPending) refuse(fmt::format("has more than {} all_reduce_async in flight: wait for them", kMaxPending));
  Pending p;
  p.work = pg->all_reduce_async(buf.f32(), n, rop);
  p.buffer = std::move(buf);  // at least one element; `bytes` is what the plugin sent, and gets back (0 for an empty vector)
  p.bytes = payload.size();
  const int64_t h = next_handle_++;
  pending_[h] = std::move(p);
  reply(labproto::kHandle, nullptr, 0, h);
}

// Lab 04's and lab 06's (sequence parallel) two collectives: every rank's sizes are checked by the process group itself (a mismatch fails
// the collective, naming it, instead of hanging).
void LabPlugin::serve_scatter_gather(const wire::Frame& f, std::vector<char>& payload, ProcessGroup& pg, Runtime& rt, const char* during) {
  const bool async = f.op == labproto::kReduceScatterAsync, rs = f.op == labproto::kReduceScatter || async;
  const int64_t n = rs ? f.arg[1] : f.arg[0];
  const int64_t world = pg.size(), floats = int64_t(payload.size() / 4);
  // n comes from the plugin: compared by division, never multiplied (n·world may wrap)
  if (n < 0 || payload.size() % 4 || (rs ? floats % world != 0 || floats / world != n : floats != n) || (rs && (f.arg[0] < 0 || f.arg[0] > 1)))
    throw Error(fmt::format("the lab's {} asked for a {} of n = {} with {} bytes", during, rs ? "reduce_scatter" : "all_gather", n, payload.size()));
  if (!rs && uint64_t(n) * uint64_t(world) * 4 > labproto::kMaxPayload)
    throw Error(fmt::format("the lab's {} asked for an all_gather of {} floats per rank: over the {} MiB a message may hold", during, n,
                            labproto::kMaxPayload >> 20));
  Tensor in = host_buffer(rt, rs ? n * world : n, "lab collective input"), out = host_buffer(rt, rs ? n : n * world, "lab collective output");
  if (!payload.empty()) std::memcpy(in.f32(), payload.data(), payload.size());
  if (async) {  // lab 04's ZeRO-2: the reduction runs while backward goes on; kWait answers its result
    if (pending_.size() >= kMaxPending) throw Error(fmt::format("the lab's {} has more than {} async collectives in flight: wait for them", during, kMaxPending));
    Pending p;
    p.work = pg.reduce_scatter_async(out.f32(), in.f32(), n, f.arg[0] == 1 ? ReduceOp::avg : ReduceOp::sum);
    p.bytes = size_t(n) * 4;
    p.buffer = std::move(out);
    p.input = std::move(in);
    const int64_t h = next_handle_++;
    pending_[h] = std::move(p);
    return reply(labproto::kHandle, nullptr, 0, h, during);
  }
  if (rs) pg.reduce_scatter(out.f32(), in.f32(), n, f.arg[0] == 1 ? ReduceOp::avg : ReduceOp::sum);
  else pg.all_gather(out.f32(), in.f32(), n);
  reply(labproto::kData, out.data(), size_t(rs ? n : n * world) * 4, 0, during);
}

LabStepResult LabPlugin::train_step(LabStepOps& ops, int accum_steps, double max_norm, const float cfg[3], int32_t growth_interval,
                                    ProcessGroup* pg, Runtime& rt) {
  const auto params = ops.parameters();
  std::vector<char> in;
  auto put = [&](const void* p, size_t n) { in.insert(in.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n); };
  put(&max_norm, 8);
  put(cfg, 12);
  put(&growth_interval, 4);
  int64_t total = 0;
  for (auto* p : params) {
    const int64_t numel = p->data.numel();
    put(&numel, 8);
    put(p->name.c_str(), p->name.size() + 1);
    total += numel;
  }
  const char* during = "train_step";
  auto grads_f32 = [&] {
    std::vector<float> g(static_cast<size_t>(total), 0.0f);
    int64_t at = 0;
    for (auto* p : params) {
      if (p->grad.defined() && p->grad.data()) {
        const OnHost h(p->grad);  // f32, on the host
        std::copy(h.p, h.p + p->grad.numel(), g.data() + at);
      }
      at += p->data.numel();
    }
    return g;
  };
  const Serve serve = [&](const wire::Frame& f, std::vector<char>& payload) {
    switch (f.op) {
      case labproto::kStepForwardBackward: {
        float factor = 0;
        if (payload.size() != 4) throw Error("the lab's forward_backward request is broken");
        std::memcpy(&factor, payload.data(), 4);
        const double loss = ops.forward_backward(f.arg[0], factor);
        return reply(labproto::kData, &loss, 8, 0, "forward_backward");
      }
      case labproto::kStepGrads: {
        const auto g = grads_f32();
        return reply(labproto::kData, g.data(), g.size() * 4, 0, "grads");
      }
      case labproto::kStepOptimizer: {
        if (payload.size() != size_t(total) * 4)
          throw Error(fmt::format("the lab's optimizer_step handed over {} bytes of gradients instead of {}", payload.size(), total * 4),
                      "change the gradients in place through step.grads(): keep their sizes");
        std::vector<float> g(static_cast<size_t>(total));
        if (total) std::memcpy(g.data(), payload.data(), payload.size());
        ops.optimizer_step(g);
        return reply(labproto::kData, nullptr, 0, 0, "optimizer_step");
      }
      case labproto::kStepSkip:
        ops.skip_step();
        return reply(labproto::kData, nullptr, 0, 0, "skip_step");
      case labproto::kStepScheduler:
        ops.scheduler_step();
        return reply(labproto::kData, nullptr, 0, 0, "scheduler_step");
      default:
        throw Error(fmt::format("the lab's train_step sent request {}, which lab 03 has no use for", f.op),
                    "a Step asks for forward_backward, grads, optimizer_step, skip_step and scheduler_step only");
    }
  };
  const std::vector<char> out = call(labproto::kTrainStep, {pg ? pg->rank() : 0, pg ? pg->size() : 1, accum_steps, int64_t(params.size())},
                                     in.data(), in.size(), pg, &rt, during, serve);
  if (out.size() != 12) throw Error("the lab's train_step returned a broken answer");
  LabStepResult r;
  std::memcpy(&r.scale_used, out.data(), 4);
  std::memcpy(&r.scale_after, out.data() + 4, 4);
  return r;
}

std::shared_ptr<Sampler> LabPlugin::make_sampler(int64_t n, int world, int rank, uint64_t seed, bool shuffle) {
  return std::make_shared<LabSampler>(*this, n, world, rank, seed, shuffle);
}

std::unique_ptr<DataParallel> LabPlugin::make_ddp(const std::string& mode, ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb) {
  return std::make_unique<LabDDP>(*this, mode == "naive", pg, model, rt, bucket_mb);
}

}  // namespace distlab
