// Lab 02's host: the student's sampler and DDP beside a trainer (grader/bridge/lab_plugin.cpp). The trainer
// sends gradients in, runs the collectives the plugin asks for on its own process group (and counts
// them), and takes the averaged gradients back.
// Read next: grader/host/host.h (what every lab's host shares).
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/data/sampler.h"
#include "grader/host/host.h"
#include "labs/02-ddp-cifar/api.h"

namespace labhost {

using namespace distlab;

namespace {

struct State {
  std::vector<lab02::Grad> grads;
  std::vector<std::vector<float>> storage;  // grads[i].data points here
  std::map<int, std::pair<float*, int64_t>> pending;  // async handle -> where its result goes
  std::unique_ptr<lab02::Bucketed> ddp;
  bool naive = true;
};

void expect_data(float* data, int64_t n) {
  wire::Frame f;
  std::vector<char> payload;
  get(f, payload);
  if (f.op != labproto::kData || payload.size() != size_t(n) * 4) _exit(3);
  if (n) std::memcpy(data, payload.data(), payload.size());
}

void check_args(float* data, int64_t n, lab02::ReduceOp op, const char* what) {
  if (n < 0 || uint64_t(n) * 4 > labproto::kMaxPayload || (n > 0 && !data))
    throw std::invalid_argument(std::string(what) + " of " + std::to_string(n) + " floats: give a buffer of 0.." +
                                std::to_string(labproto::kMaxPayload / 4) + " floats");
  if (int(op) < 0 || int(op) > 2) throw std::invalid_argument(std::string(what) + ": unknown ReduceOp " + std::to_string(int(op)));
}

void all_reduce(void* ctx, float* data, int64_t n, lab02::ReduceOp op) {
  check_args(data, n, op, "all_reduce");
  put(labproto::kAllReduce, data, uint64_t(n) * 4, {int64_t(op)});
  expect_data(data, n);
}

int all_reduce_async(void* ctx, float* data, int64_t n, lab02::ReduceOp op) {
  check_args(data, n, op, "all_reduce_async");
  put(labproto::kAllReduceAsync, data, uint64_t(n) * 4, {int64_t(op)});
  wire::Frame f;
  std::vector<char> payload;
  get(f, payload);
  if (f.op != labproto::kHandle) _exit(3);
  static_cast<State*>(ctx)->pending[int(f.arg[0])] = {data, n};
  return int(f.arg[0]);
}

void wait(void* ctx, int handle) {
  auto& pending = static_cast<State*>(ctx)->pending;
  auto it = pending.find(handle);
  if (it == pending.end())
    throw std::invalid_argument("wait(" + std::to_string(handle) + "): no all_reduce_async returned that handle, or it was waited already");
  put(labproto::kWait, nullptr, 0, {handle});
  expect_data(it->second.first, it->second.second);
  pending.erase(it);
}

const lab02::Comm::Ops kOps = {all_reduce, all_reduce_async, wait};
const Lab02Services kServices = {distlab::seeded_permutation};

// kDdpInit's payload: for each parameter an int64 numel and its name, zero-terminated.
void read_params(State& s, const std::vector<char>& in, int64_t count) {
  size_t at = 0;
  for (int64_t k = 0; k < count; k++) {
    int64_t numel = 0;
    if (at + 8 > in.size()) _exit(3);
    std::memcpy(&numel, in.data() + at, 8);
    at += 8;
    const size_t end = std::string(in.data() + at, in.size() - at).find('\0');
    if (end == std::string::npos || numel < 0 || uint64_t(numel) * 4 > labproto::kMaxPayload) _exit(3);
    s.storage.emplace_back(size_t(numel), 0.0f);
    s.grads.push_back({std::string(in.data() + at, end), nullptr, numel});
    at += end + 1;
  }
  for (size_t k = 0; k < s.grads.size(); k++) s.grads[k].data = s.storage[k].data();
}

std::vector<char> all_grads(const State& s) {
  std::vector<char> out;
  for (const auto& g : s.grads) out.insert(out.end(), reinterpret_cast<const char*>(g.data), reinterpret_cast<const char*>(g.data + g.numel));
  return out;
}

void load_grads(State& s, const std::vector<char>& in, size_t at, const std::vector<int>& which) {
  for (int i : which) {
    const size_t bytes = size_t(s.grads[size_t(i)].numel) * 4;
    if (at + bytes > in.size()) _exit(3);
    std::memcpy(s.grads[size_t(i)].data, in.data() + at, bytes);
    at += bytes;
  }
}

}  // namespace

int serve_lab02(void* plugin) {
  auto* t = load_table<Lab02Plugin>(plugin, "distlab_lab02", kLab02Abi, "ddp.cpp", "labs/02-ddp-cifar/api.h");
  if (!t) return 2;
  t->services = &kServices;
  State s;
  std::unique_ptr<lab02::Comm> comm;
  for (;;) {
    wire::Frame f;
    std::vector<char> in;
    get(f, in);
    if (f.op != labproto::kCall) return 3;
    std::vector<char> out;
    try {
      switch (f.arg[0]) {
        case labproto::kSamplerIndices: {
          if (!t->sampler_indices) throw std::logic_error("02-ddp-cifar: the plugin's table has no sampler_indices (its entry is empty)");
          auto v = t->sampler_indices(f.arg[1], int(f.arg[2]), int(f.arg[3]), uint64_t(f.arg[4]), f.arg[5], f.arg[6] & 1, f.arg[6] & 2);
          out.assign(reinterpret_cast<const char*>(v.data()), reinterpret_cast<const char*>(v.data() + v.size()));
          break;
        }
        case labproto::kDdpInit: {
          if (comm) return 3;
          comm = std::make_unique<lab02::Comm>(int(f.arg[1]), int(f.arg[2]), &kOps, &s);
          s.naive = f.arg[3] == 0;
          read_params(s, in, f.arg[5]);
          if (s.naive && !t->average_gradients)
            throw std::logic_error("02-ddp-cifar: the plugin's table has no average_gradients (its entry is empty)");
          if (!s.naive) {
            if (!t->make_bucketed) throw std::logic_error("02-ddp-cifar: the plugin's table has no make_bucketed (its entry is empty)");
            s.ddp.reset(t->make_bucketed(*comm, s.grads, double(f.arg[4]) * 1e-6));
            if (!s.ddp) throw std::logic_error("02-ddp-cifar: make_bucketed returned nullptr");
          }
          break;
        }
        case labproto::kDdpBeginBackward: {
          if (!comm || !s.ddp) return 3;
          // a gradient is there once after_backward says it is ready: until then NaN, as the garbage of a
          // real framework's uncomputed buffer would be (a bucket sent early carries it to every rank)
          for (auto& g : s.grads) std::fill(g.data, g.data + g.numel, std::numeric_limits<float>::quiet_NaN());
          s.ddp->begin_backward(f.arg[1] != 0);
          break;
        }
        case labproto::kDdpAfterBackward: {
          if (!comm) return 3;
          const int64_t k = f.arg[2];
          if (k < 0 || in.size() < size_t(k) * 4) return 3;
          std::vector<int> ready(static_cast<size_t>(k));
          if (k) std::memcpy(ready.data(), in.data(), size_t(k) * 4);
          for (int i : ready)
            if (i < 0 || size_t(i) >= s.grads.size()) return 3;
          load_grads(s, in, size_t(k) * 4, ready);
          if (s.ddp) s.ddp->after_backward(int(f.arg[1]), ready);
          break;
        }
        case labproto::kDdpFinish: {
          if (!comm) return 3;
          if (s.naive) {
            std::vector<int> every(s.grads.size());
            for (size_t i = 0; i < every.size(); i++) every[i] = int(i);
            load_grads(s, in, 0, every);
            t->average_gradients(*comm, s.grads);
          } else {
            s.ddp->finish_backward();
          }
          out = all_grads(s);
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
