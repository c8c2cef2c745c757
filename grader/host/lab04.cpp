// Lab 04's host: the student's partition and ZeRO. shard_of is called directly (the grader's quick check);
// zero1_reduce, zero2_reduce and zero_step get a Step served by the trainer (core/train/lab_zero.cpp): every
// gradient fetched, part kept, optimizer step and weight written is a request the trainer runs, checks and
// answers, and every collective runs on the trainer's real process group.
#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "grader/host/host.h"
#include "labs/04-zero/api.h"

namespace labhost {

using namespace distlab;

namespace {

// The trainer's answer: kData of `bytes` (or any size when bytes < 0); anything else breaks the protocol.
std::vector<char> expect_data(int64_t bytes) {
  wire::Frame f;
  std::vector<char> payload;
  get(f, payload);
  if (f.op != labproto::kData || (bytes >= 0 && payload.size() != uint64_t(bytes))) _exit(3);
  return payload;
}

void check_count(const char* what, int64_t n, uint64_t per, const void* a, const void* b) {
  if (n < 0 || uint64_t(n) * per * 4 > labproto::kMaxPayload || (n > 0 && (!a || !b)))
    throw std::invalid_argument(std::string(what) + " of " + std::to_string(n) + " floats: give buffers of 0.." +
                                std::to_string(labproto::kMaxPayload / 4 / per) + " floats");
}

struct World {
  int size = 1;
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

const lab04::Comm::Ops kOps = {all_reduce, reduce_scatter, all_gather};

std::vector<float> floats(const std::vector<char>& raw) {
  std::vector<float> v(raw.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), raw.data(), v.size() * 4);
  return v;
}

// The trainer's side of the Step, one request per call.
class RemoteStep : public lab04::Step {
 public:
  RemoteStep(int rank, int size, std::vector<std::pair<std::string, int64_t>> flats)
      : world_{size}, comm_(rank, size, &kOps, &world_), flats_(std::move(flats)) {}
  int num_flats() const override { return int(flats_.size()); }
  int64_t numel(int flat) const override { return at(flat).second; }
  std::string name(int flat) const override { return at(flat).first; }
  std::vector<float> grad(int flat) override {
    put(labproto::kZeroGrad, nullptr, 0, {index(flat)});
    return floats(expect_data(numel(flat) * 4));
  }
  void keep_grad(int flat, int64_t begin, const float* part, int64_t n) override {
    check_count("keep_grad", n, 1, part, part);
    put(labproto::kZeroKeep, part, uint64_t(n) * 4, {index(flat), begin});
    expect_data(0);
  }
  void optimizer_step() override {
    put(labproto::kZeroOptimizer, nullptr, 0);
    expect_data(0);
  }
  std::vector<float> part_weights(int flat) override {
    put(labproto::kZeroPartWeights, nullptr, 0, {index(flat)});
    return floats(expect_data(-1));
  }
  void set_weights(int flat, int64_t begin, const float* w, int64_t n) override {
    check_count("set_weights", n, 1, w, w);
    put(labproto::kZeroSetWeights, w, uint64_t(n) * 4, {index(flat), begin});
    expect_data(0);
  }
  lab04::Comm& comm() override { return comm_; }

 private:
  const std::pair<std::string, int64_t>& at(int flat) const { return flats_.at(size_t(index(flat))); }
  int64_t index(int flat) const {
    if (flat < 0 || flat >= int(flats_.size()))
      throw std::out_of_range("flat " + std::to_string(flat) + " of " + std::to_string(flats_.size()) + " (0.." +
                              std::to_string(int(flats_.size()) - 1) + ")");
    return flat;
  }
  World world_;
  lab04::Comm comm_;
  std::vector<std::pair<std::string, int64_t>> flats_;
};

struct Reader {
  const std::vector<char>& in;
  size_t at = 0;
  template <class T>
  T take() {
    T v{};
    if (at + sizeof(T) > in.size()) _exit(3);
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::vector<std::pair<std::string, int64_t>> flats(int64_t count) {
    if (count < 0 || count > 1 << 20) _exit(3);
    std::vector<std::pair<std::string, int64_t>> v;
    for (int64_t k = 0; k < count; k++) {
      const int64_t numel = take<int64_t>();
      std::string name;
      for (char ch; (ch = take<char>()) != '\0';) name += ch;
      v.push_back({name, numel});
    }
    return v;
  }
};

}  // namespace

int serve_lab04(void* plugin) {
  auto* t = static_cast<const Lab04Plugin*>(dlsym(plugin, "distlab_lab04"));
  if (!t || t->abi != kLab04Abi) {
    const std::string why = !t ? "the plugin has no distlab_lab04 table (keep the table at the bottom of zero.cpp)"
                               : "the plugin's distlab_lab04 table is of another version: rebuild it against labs/04-zero/api.h";
    put(labproto::kLoadFailed, why.data(), why.size());
    return 2;
  }
  put(labproto::kHello, nullptr, 0, {kLab04Abi});
  for (;;) {
    wire::Frame f;
    std::vector<char> in;
    get(f, in);
    if (f.op != labproto::kCall) return 3;
    Reader r{in};
    std::vector<char> out;
    try {
      const auto need = [](const void* fn, const char* name) {
        if (!fn) throw std::logic_error(std::string("the plugin's table has no ") + name);
      };
      switch (f.arg[0]) {
        case labproto::kShardOf: {
          need(reinterpret_cast<const void*>(t->shard_of), "shard_of");
          const lab04::Shard s = t->shard_of(f.arg[1], int(f.arg[2]), int(f.arg[3]));
          for (int64_t v : {s.padded, s.begin, s.end}) out.insert(out.end(), reinterpret_cast<const char*>(&v), reinterpret_cast<const char*>(&v) + 8);
          break;
        }
        case labproto::kZero1Reduce:
        case labproto::kZero2Reduce:
        case labproto::kZeroStep: {
          RemoteStep step(int(f.arg[1]), int(f.arg[2]), r.flats(f.arg[3]));
          if (f.arg[0] == labproto::kZero1Reduce) {
            need(reinterpret_cast<const void*>(t->zero1_reduce), "zero1_reduce");
            t->zero1_reduce(step);
          } else if (f.arg[0] == labproto::kZero2Reduce) {
            need(reinterpret_cast<const void*>(t->zero2_reduce), "zero2_reduce");
            t->zero2_reduce(step, int(f.arg[4]));
          } else {
            need(reinterpret_cast<const void*>(t->zero_step), "zero_step");
            t->zero_step(step);
          }
          break;
        }
        default:
          return 3;
      }
    } catch (...) {
      return report_raised(std::current_exception());
    }
    put(labproto::kReturn, out.data(), out.size());
  }
}

}  // namespace labhost
