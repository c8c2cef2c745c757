// Lab 04's host: the student's partition, AdamW and ZeRO. shard_of and adamw_step are called directly (the
// grader's quick checks); zero1_reduce, zero2_reduce and zero_step get a Step served by the trainer
// (bridge.cpp, beside this file): every gradient fetched, part kept, optimizer step and weight written is a
// request the trainer runs, checks and answers, and every collective runs on the trainer's real process group.
// Read next: grader/host/host.h (what every lab's host shares).
#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "grader/host/host.h"
#include "labs/04-zero/api.h"

namespace labhost {

using namespace distlab;

namespace {

void check_count(const char* what, int64_t n, uint64_t per, const void* a, const void* b) {
  if (n < 0 || uint64_t(n) * per * 4 > labproto::kMaxPayload || (n > 0 && (!a || !b)))
    throw std::invalid_argument(std::string(what) + " of " + std::to_string(n) + " floats: give buffers of 0.." +
                                std::to_string(labproto::kMaxPayload / 4 / per) + " floats");
}

struct World {
  int size = 1;
  std::map<int, std::pair<float*, int64_t>> pending;  // async reduce_scatters: handle -> where their result goes
};

void all_reduce(void* ctx, float* data, int64_t n, lab04::ReduceOp op) {
  check_count("all_reduce", n, 1, data, data);
  if (int(op) < 0 || int(op) > 1) throw std::invalid_argument("all_reduce: unknown ReduceOp " + std::to_string(int(op)));
  put(labproto::kAllReduce, data, uint64_t(n) * 4, {int64_t(op)});
  auto back = expect_data(n * 4);
  if (n) std::memcpy(data, back.data(), back.size());
}

void reduce_scatter(void* ctx, const float* in, float* out, int64_t n, lab04::ReduceOp op) {
  const int size = static_cast<World*>(ctx)->size;
  check_count("reduce_scatter", n, uint64_t(size), in, out);
  if (int(op) < 0 || int(op) > 1) throw std::invalid_argument("reduce_scatter: unknown ReduceOp " + std::to_string(int(op)));
  put(labproto::kReduceScatter, in, uint64_t(n) * uint64_t(size) * 4, {int64_t(op), n});
  auto back = expect_data(n * 4);
  if (n) std::memcpy(out, back.data(), back.size());
}

void all_gather(void* ctx, const float* in, float* out, int64_t n) {
  const int size = static_cast<World*>(ctx)->size;
  check_count("all_gather", n, uint64_t(size), in, out);
  put(labproto::kAllGather, in, uint64_t(n) * 4, {n});
  auto back = expect_data(n * size * 4);
  if (n) std::memcpy(out, back.data(), back.size());
}

// The async reduce_scatter: the trainer answers a handle; wait() fetches the result into the `out` the
// student gave when it started.
int reduce_scatter_async(void* ctx, const float* in, float* out, int64_t n, lab04::ReduceOp op) {
  World& w = *static_cast<World*>(ctx);
  check_count("reduce_scatter_async", n, uint64_t(w.size), in, out);
  if (int(op) < 0 || int(op) > 1) throw std::invalid_argument("reduce_scatter_async: unknown ReduceOp " + std::to_string(int(op)));
  put(labproto::kReduceScatterAsync, in, uint64_t(n) * uint64_t(w.size) * 4, {int64_t(op), n});
  wire::Frame f;
  std::vector<char> payload;
  get(f, payload);
  if (f.op != labproto::kHandle) _exit(3);
  w.pending[int(f.arg[0])] = {out, n};
  return int(f.arg[0]);
}

void wait(void* ctx, int handle) {
  World& w = *static_cast<World*>(ctx);
  auto it = w.pending.find(handle);
  if (it == w.pending.end()) throw std::invalid_argument("wait(" + std::to_string(handle) + "): no reduce_scatter_async returned it, or it was waited for");
  const auto [out, n] = it->second;
  w.pending.erase(it);
  put(labproto::kWait, nullptr, 0, {handle});
  auto back = expect_data(n * 4);
  if (n) std::memcpy(out, back.data(), back.size());
}

const lab04::Comm::Ops kOps = {all_reduce, reduce_scatter, all_gather, reduce_scatter_async, wait};

std::vector<float> floats(const std::vector<char>& raw) {
  std::vector<float> v(raw.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}

// Every buffer Step::state made, for the rest of the run: (flat, name) -> the floats.
using StateBuffers = std::map<std::pair<int, std::string>, std::vector<float>>;

struct Flat {
  std::string name;
  int64_t numel = 0;
  bool decay = false;
  int unit = 0;
};

// The trainer's side of the Step, one request per call.
class RemoteStep : public lab04::Step {
 public:
  RemoteStep(int rank, World& world, std::vector<Flat> flats, StateBuffers& state, const lab04::AdamW& hyper)
      : comm_(rank, world.size, &kOps, &world), flats_(std::move(flats)), state_(state), hyper_(hyper) {}
  int num_flats() const override { return int(flats_.size()); }
  int64_t numel(int flat) const override { return at(flat).numel; }
  std::string name(int flat) const override { return at(flat).name; }
  bool decay(int flat) const override { return at(flat).decay; }
  int unit(int flat) const override { return at(flat).unit; }
  std::vector<float> grad(int flat) override {
    put(labproto::kZeroGrad, nullptr, 0, {index(flat)});
    return floats(expect_data(numel(flat) * 4));
  }
  void keep_grad(int flat, int64_t begin, const float* part, int64_t n) override {
    check_count("keep_grad", n, 1, part, part);
    put(labproto::kZeroKeep, part, uint64_t(n) * 4, {index(flat), begin});
    expect_data(0);
  }
  void release_grad(int flat) override {
    put(labproto::kZeroRelease, nullptr, 0, {index(flat)});
    expect_data(0);
  }
  std::vector<float> kept_grad(int flat) override {
    put(labproto::kZeroKeptGrad, nullptr, 0, {index(flat)});
    return floats(expect_data(-1));
  }
  std::vector<float> weights(int flat) override {
    put(labproto::kZeroWeights, nullptr, 0, {index(flat)});
    return floats(expect_data(numel(flat) * 4));
  }
  float* state(int flat, const std::string& name, int64_t n) override {
    auto it = state_.find({int(index(flat)), name});
    if (it != state_.end()) {
      if (int64_t(it->second.size()) != n)
        throw std::invalid_argument("state(" + std::to_string(flat) + ", \"" + name + "\", " + std::to_string(n) + "): it was made with " +
                                    std::to_string(it->second.size()) + " floats");
      return it->second.data();
    }
    check_count("state", n, 1, this, this);
    put(labproto::kZeroState, name.data(), name.size(), {index(flat), n});  // counted by the trainer before it exists here
    expect_data(0);
    auto& buf = state_[{flat, name}];
    buf.assign(size_t(n), 0.0f);
    return buf.data();
  }
  void set_weights(int flat, int64_t begin, const float* w, int64_t n) override {
    check_count("set_weights", n, 1, w, w);
    put(labproto::kZeroSetWeights, w, uint64_t(n) * 4, {index(flat), begin});
    expect_data(0);
  }
  const lab04::AdamW& hyper() const override { return hyper_; }
  lab04::Comm& comm() override { return comm_; }

 private:
  const Flat& at(int flat) const { return flats_.at(size_t(index(flat))); }
  int64_t index(int flat) const {
    if (flat < 0 || flat >= int(flats_.size()))
      throw std::out_of_range("flat " + std::to_string(flat) + " of " + std::to_string(flats_.size()) + " (0.." +
                              std::to_string(int(flats_.size()) - 1) + ")");
    return flat;
  }
  lab04::Comm comm_;
  std::vector<Flat> flats_;
  StateBuffers& state_;
  lab04::AdamW hyper_;
};

struct LabReader : Reader {  // the lab's records on top of take<T>() (host.h)
  std::vector<Flat> flats(int64_t count) {
    if (count < 0 || count > 1 << 20) _exit(3);
    std::vector<Flat> v;
    for (int64_t k = 0; k < count; k++) {
      Flat f;
      f.numel = take<int64_t>();
      f.decay = take<int64_t>() != 0;
      f.unit = int(take<int64_t>());
      for (char ch; (ch = take<char>()) != '\0';) f.name += ch;
      v.push_back(f);
    }
    return v;
  }
  lab04::AdamW hyper() {
    lab04::AdamW h;
    h.lr = take<float>(), h.beta1 = take<float>(), h.beta2 = take<float>(), h.eps = take<float>();
    h.weight_decay = take<float>(), h.max_norm = take<float>(), h.t = take<int64_t>();
    return h;
  }
};

void append(std::vector<char>& out, const void* p, size_t n) {
  out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
}

}  // namespace

int serve_lab04(void* plugin) {
  auto* t = load_table<const Lab04Plugin>(plugin, "distlab_lab04", kLab04Abi, "zero.cpp", "labs/04-zero/api.h");
  if (!t) return 2;
  StateBuffers state;  // lives as long as the run: the student's optimizer state
  World world;         // and its reductions in flight
  return serve_calls([t, &state, &world](const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
    switch (f.arg[0]) {
      case labproto::kShardOf: {
        need(t->shard_of, "shard_of");
        const lab04::Shard s = t->shard_of(f.arg[1], int(f.arg[2]), int(f.arg[3]));
        for (int64_t v : {s.padded, s.begin, s.end}) append(out, &v, 8);
        return true;
      }
      case labproto::kAdamWStep: {
        need(t->adamw_step, "adamw_step");
        const int64_t n = f.arg[1];
        if (n < 0 || n > (int64_t(1) << 24) || in.size() != 36 + 16 * size_t(n)) _exit(3);
        LabReader r{{in}};
        const lab04::AdamW h = r.hyper();
        const float scale = r.take<float>();
        const size_t count = static_cast<size_t>(n);
        std::vector<float> w(count), m(count), v(count), g(count);
        for (auto* x : {&w, &m, &v, &g})
          if (n) std::memcpy(x->data(), in.data() + r.at, size_t(n) * 4), r.at += size_t(n) * 4;
        t->adamw_step(h, f.arg[2] != 0, scale, w.data(), m.data(), v.data(), g.data(), n);
        for (auto* x : {&w, &m, &v}) append(out, x->data(), size_t(n) * 4);
        return true;
      }
      case labproto::kZeroStateDump: {  // arg1: one flat's buffers (the host's copy stays the size of one flat's part), -1: all
        for (const auto& [key, buf] : state) {
          if (f.arg[1] >= 0 && key.first != f.arg[1]) continue;
          const int64_t flat = key.first, n = int64_t(buf.size());
          append(out, &flat, 8);
          append(out, &n, 8);
          append(out, key.second.c_str(), key.second.size() + 1);
          append(out, buf.data(), buf.size() * 4);
        }
        return true;
      }
      case labproto::kZero1Reduce:
      case labproto::kZero2Reduce:
      case labproto::kZero2Finish:
      case labproto::kZeroStep: {
        LabReader r{{in}};
        const lab04::AdamW h = f.arg[0] == labproto::kZeroStep ? r.hyper() : lab04::AdamW{};
        world.size = int(f.arg[2]);
        RemoteStep step(int(f.arg[1]), world, r.flats(f.arg[3]), state, h);
        if (f.arg[0] == labproto::kZero1Reduce) {
          need(t->zero1_reduce, "zero1_reduce");
          t->zero1_reduce(step);
        } else if (f.arg[0] == labproto::kZero2Reduce) {
          need(t->zero2_reduce, "zero2_reduce");
          t->zero2_reduce(step, int(f.arg[4]));
        } else if (f.arg[0] == labproto::kZero2Finish) {
          need(t->zero2_finish, "zero2_finish");
          t->zero2_finish(step);
        } else {
          need(t->zero_step, "zero_step");
          t->zero_step(step);
        }
        return true;
      }
      default:
        return false;
    }
  });
}

}  // namespace labhost
