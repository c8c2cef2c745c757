// Lab 01's host: runs the student's ring functions; their sends and receives go to the grader's relay
// (grader/labs/01-collectives/checks.cpp), which delivers and counts every byte.
// Read next: grader/host/host.h (what every lab's host shares).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "grader/host/host.h"
#include "labs/01-collectives/api.h"

namespace labhost {

using namespace distlab;

namespace {

struct Rank {
  int rank = 0, size = 1;
};

void send(void* ctx, const float* data, int64_t count, int dst) {
  const Rank& me = *static_cast<Rank*>(ctx);
  if (dst < 0 || dst >= me.size || dst == me.rank)
    throw std::invalid_argument("send to rank " + std::to_string(dst) + ": the other ranks are 0.." + std::to_string(me.size - 1) +
                                " except yourself (" + std::to_string(me.rank) + ")");
  if (count < 0 || uint64_t(count) * 4 > labproto::kMaxPayload)
    throw std::invalid_argument("send of " + std::to_string(count) + " floats: the count must be 0.." +
                                std::to_string(labproto::kMaxPayload / 4));
  put(labproto::kSend, data, uint64_t(count) * 4, {dst});
}

void recv(void* ctx, float* data, int64_t count, int src) {
  const Rank& me = *static_cast<Rank*>(ctx);
  if (src < 0 || src >= me.size || src == me.rank)
    throw std::invalid_argument("recv from rank " + std::to_string(src) + ": the other ranks are 0.." +
                                std::to_string(me.size - 1) + " except yourself (" + std::to_string(me.rank) + ")");
  if (count < 0 || uint64_t(count) * 4 > labproto::kMaxPayload)
    throw std::invalid_argument("recv of " + std::to_string(count) + " floats: the count must be 0.." +
                                std::to_string(labproto::kMaxPayload / 4));
  put(labproto::kRecv, nullptr, 0, {src, count});
  wire::Frame f;
  std::vector<char> payload;
  get(f, payload);
  if (f.op != labproto::kData || payload.size() != size_t(count) * 4) _exit(3);  // the relay says why, not us
  if (count) std::memcpy(data, payload.data(), payload.size());
}

const lab01::Comm::Ops kOps = {send, recv};

}  // namespace

int serve_lab01(void* plugin) {
  auto* t = load_table<const Lab01Plugin>(plugin, "distlab_lab01", kLab01Abi, "ring.cpp", "labs/01-collectives/api.h");
  if (!t) return 2;
  Rank me;
  for (;;) {
    wire::Frame f;
    std::vector<char> in;
    get(f, in);
    if (f.op != labproto::kCall) return 3;
    const int64_t fn = f.arg[0], n = f.arg[3];
    me.rank = int(f.arg[1]);
    me.size = int(f.arg[2]);
    lab01::Comm comm(me.rank, me.size, &kOps, &me);
    std::vector<float> data(in.size() / 4), out;
    if (!in.empty()) std::memcpy(data.data(), in.data(), in.size());
    try {
      if (fn == labproto::kRingReduceScatter) {
        if (!t->reduce_scatter) throw std::logic_error("the plugin's table has no reduce_scatter");
        out.assign(size_t(n), 0.0f);
        t->reduce_scatter(comm, out.data(), data.data(), n);
      } else if (fn == labproto::kRingAllGather) {
        if (!t->all_gather) throw std::logic_error("the plugin's table has no all_gather");
        out.assign(size_t(n) * size_t(me.size), 0.0f);
        t->all_gather(comm, out.data(), data.data(), n);
      } else if (fn == labproto::kRingAllReduce) {
        if (!t->all_reduce) throw std::logic_error("the plugin's table has no all_reduce");
        t->all_reduce(comm, data.data(), n);
        out.swap(data);
      } else {
        return 3;
      }
    } catch (...) {
      return report_raised(std::current_exception());
    }
    put(labproto::kReturn, out.data(), out.size() * 4);
  }
}

}  // namespace labhost
