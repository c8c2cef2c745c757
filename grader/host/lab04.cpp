// Lab 04's host: the student's partition and ZeRO. shard_of is called directly (the grader's quick check);
// zero1_reduce, zero2_reduce and zero_step get a Step served by the trainer (grader/bridge/lab_zero.cpp): every
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

struct LabReader : Reader {  // the lab's records on top of take<T>() (host.h)
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
  auto* t = load_table<const Lab04Plugin>(plugin, "distlab_lab04", kLab04Abi, "zero.cpp", "labs/04-zero/api.h");
  if (!t) return 2;
  return serve_calls([t](const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
    switch (f.arg[0]) {
      case labproto::kShardOf: {
        need(t->shard_of, "shard_of");
        const lab04::Shard s = t->shard_of(f.arg[1], int(f.arg[2]), int(f.arg[3]));
        for (int64_t v : {s.padded, s.begin, s.end}) out.insert(out.end(), reinterpret_cast<const char*>(&v), reinterpret_cast<const char*>(&v) + 8);
        return true;
      }
      case labproto::kZero1Reduce:
      case labproto::kZero2Reduce:
      case labproto::kZeroStep: {
        LabReader r{{in}};
        RemoteStep step(int(f.arg[1]), int(f.arg[2]), r.flats(f.arg[3]));
        if (f.arg[0] == labproto::kZero1Reduce) {
          need(t->zero1_reduce, "zero1_reduce");
          t->zero1_reduce(step);
        } else if (f.arg[0] == labproto::kZero2Reduce) {
          need(t->zero2_reduce, "zero2_reduce");
          t->zero2_reduce(step, int(f.arg[4]));
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
