// A hostile plugin for the protocol fuzzer (tests/test_lab_fuzz.cpp): whichever of its lab's functions the
// trainer calls first, it never runs student code. It writes frames straight onto the socket to the trainer
// (fd 3, grader/bridge/wire.h), past every check of the host, from a seeded stream: every opcode of the protocol
// and some that are none, arguments at the edges of int64 (and the sizes that make n·world or begin + n
// wrap), payloads empty, short, long, of the claimed size or not, file names that climb out of their
// folder, lab 07's load_state answers with counts at the edges. After each frame it reads one answer, whatever it is, and sends the next; it stops only when
// the trainer closes the socket. The trainer must answer or refuse each with an Error, never crash,
// over-read or hang.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "labs/02-ddp-cifar/api.h"
#include "labs/03-amp-accum/api.h"
#include "labs/04-zero/api.h"
#include "labs/05-fsdp-1b/api.h"
#include "labs/06-tp-pp/api.h"
#include "labs/07-checkpoint/api.h"

namespace {

struct Frame {  // wire::Frame, spelled out: the plugin sees nothing of the engine
  uint32_t op = 0, reserved = 0;
  uint64_t bytes = 0;
  int64_t arg[8] = {};
};
static_assert(sizeof(Frame) == 80);

bool write_all(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(3, c, n);
    if (w <= 0) return false;
    c += w;
    n -= size_t(w);
  }
  return true;
}

bool read_all(void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(3, c, n);
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}

int64_t edge(std::mt19937_64& g) {
  static const int64_t kEdges[] = {0, 1, -1, 2, 3, 4, 7, 16, 63, 64, 65, 1000, INT32_MAX, int64_t(1) << 32, (int64_t(1) << 32) + 1,
                                   (int64_t(1) << 62) + 16, INT64_MAX - 15, INT64_MAX, INT64_MIN, INT64_MIN + 1, -16};
  switch (g() % 4) {
    case 0: return kEdges[g() % (sizeof kEdges / sizeof kEdges[0])];
    case 1: return int64_t(g() % 64);
    case 2: return int64_t(g() % 100000);
    default: return int64_t(g());
  }
}

std::vector<char> payload(std::mt19937_64& g, const Frame& f) {
  std::vector<char> p;
  switch (g() % 8) {
    case 0: break;                                                    // empty
    case 1: p.resize(size_t(g() % 16)); break;                        // short
    case 2: p.resize(size_t(4 * (g() % 4096))); break;                // floats, any count
    case 3: p.resize(size_t(4 * (uint64_t(f.arg[1]) % 70000))); break;  // floats as if arg1 were their count
    case 4: p.resize(size_t(g() % (1 << 20))); break;                 // up to 1 MiB
    case 5: {                                                         // a file name, or two
      static const std::string kNames[] = {"rank-0.state", "../../etc/passwd", "model.safetensors", "model.safetensors.partial", ".reference",
                                           std::string("a\0b", 3), "", "x/y", "rank-0.state.tmp", "rank-1.state", "t", "..", "."};
      const std::string a = kNames[g() % 13], b = kNames[g() % 13];
      p.assign(a.begin(), a.end());
      if (g() % 2) {
        p.push_back('\0');
        p.insert(p.end(), b.begin(), b.end());
      }
      return p;  // as it is: the NUL between two names is the request's
    }
    case 6: p.resize(4); break;  // one float or int32
    default: p.resize(size_t(8 * (g() % 64))); break;
  }
  for (auto& c : p)
    if (!c) c = char(g());
  if (g() % 8 == 0 && p.size() >= 4) {  // NaN, inf and huge floats
    const float bad[] = {NAN, INFINITY, -INFINITY, 3e38f, -0.0f};
    std::memcpy(p.data(), &bad[g() % 5], 4);
  }
  return p;
}

// Half of the requests are the lab's own (so that the trainer's deeper states are reached: a ZeRO step's
// set_weights, a Step's optimizer_step), the rest any opcode of the protocol, or none.
std::vector<uint32_t> own_ops(uint64_t lab) {
  switch (lab) {
    case 2: return {20, 21, 22, 4};
    case 3: return {30, 31, 32, 33, 34, 20, 4};
    case 4: return {24, 25, 26, 22, 39, 40, 41, 42, 43, 44, 20, 4};
    case 5: return {70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 4};
    case 6: return {20, 21, 22, 81, 82, 83, 84, 85, 86, 87, 88, 4};
    default: return {50, 51, 52, 53, 54, 55, 56, 4};
  }
}

// Lab 07: a return shaped like load_state's answer (grader/bridge/lab_files.h), its counts at the edges: the
// test's model has parameters of 20, 5, 15 and 3 values, two optimizer states each and one dropout stream.
std::vector<char> load_answer(std::mt19937_64& g) {
  std::vector<char> out;
  auto put = [&](const void* p, size_t n) { out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n); };
  auto i64 = [&](int64_t v) { put(&v, 8); };
  const int32_t len = g() % 4 == 0 ? int32_t(edge(g)) : g() % 2 ? 0 : 5;
  put(&len, 4);
  if (len > 0 && len < 64) out.resize(out.size() + size_t(len), 'r');
  i64(g() % 2), i64(g() % 3 ? 7 : edge(g));
  static const int64_t kCounts[] = {20, 5, 15, 3};
  const int entries = g() % 4 == 0 ? int(g() % 12) : 8;
  for (int e = 0; e < entries; e++) {
    const int64_t n = g() % 3 == 0 ? -1 : g() % 5 == 0 ? edge(g) : kCounts[(e / 2) % 4];
    i64(n);
    if (n > 0 && n < 64) out.resize(out.size() + size_t(n) * 4);
  }
  i64(g() % 2), i64(g() % 4 ? 1 : edge(g)), i64(int64_t(g()));
  i64(g() % 2), i64(g() % 3 ? 1 : edge(g)), i64(g() % 3 ? 2 : edge(g));
  if (g() % 8 == 0) out.resize(size_t(g() % (out.size() + 16)));  // cut short, or with bytes to spare
  return out;
}

[[noreturn]] void fuzz(uint64_t lab) {
  std::mt19937_64 g(lab);
  static const uint32_t kOps[] = {4,  5,  10, 11, 12, 20, 21, 22, 23, 24, 25, 26, 30, 31, 32, 33, 34, 39, 40, 41, 42,
                                  43, 44, 50, 51, 52, 53, 54, 55, 56, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80,
                                  81, 82, 83, 84, 85, 86, 87, 88};
  const std::vector<uint32_t> own = own_ops(lab);
  int32_t handle = 1;
  for (;;) {
    Frame f;
    const bool lab_op = g() % 2;
    f.op = lab_op ? own[g() % own.size()] : g() % 16 == 0 ? uint32_t(g()) : kOps[g() % (sizeof kOps / sizeof kOps[0])];
    for (auto& a : f.arg) a = edge(g);
    if (lab_op && g() % 4 != 0) f.arg[0] = int64_t(g() % 4);  // an index that exists (a flat, a unit, a handle, an op)
    if (lab_op && g() % 2) {                                  // an offset or a count that makes sums and products wrap
      static const int64_t kWrap[] = {INT64_MAX - 15, INT64_MAX, (int64_t(1) << 62) + 16, (int64_t(1) << 63) - 4, -1, 0};
      f.arg[1] = kWrap[g() % 6];
    }
    std::vector<char> p = payload(g, f);
    if (lab_op && g() % 2) p.resize(size_t(4) << (g() % 12));  // 4 bytes to 8 KiB of floats
    if (lab == 7 && f.op == 4 && g() % 2) p = load_answer(g);   // load_state's return, shaped to get past its first fields
    if (lab == 7 && g() % 4 != 0) {  // lab 07's files as a student's code would use them, most of the time: names
      // that are allowed, the handle the last open gave, writes of up to 256 KiB (several reach the quota)
      static const uint32_t kFileOps[] = {50, 51, 51, 51, 52, 53, 54, 55, 56};
      static const char* kPlain[] = {"rank-0.state", "rank-1.state", "rank-0.state.tmp", "t"};
      f.op = kFileOps[g() % 9];
      const std::string a = g() % 3 ? kPlain[g() % 4] : "n" + std::to_string(g() % 40), b = kPlain[g() % 4];  // up to 44 names
      p.assign(a.begin(), a.end());
      if (f.op == 54) (p.push_back('\0'), p.insert(p.end(), b.begin(), b.end()));
      if (f.op >= 51 && f.op <= 53) f.arg[0] = g() % 8 ? handle : edge(g), p.clear();
      if (f.op == 51) p.resize(size_t(g() % (256 << 10)));
    }
    f.bytes = p.size();
    if (!write_all(&f, sizeof f) || (!p.empty() && !write_all(p.data(), p.size()))) _exit(0);
    Frame answer;  // whatever comes back (data, a handle, the next call): read whole, then the next request
    if (!read_all(&answer, sizeof answer)) _exit(0);
    std::vector<char> sink(65536);
    for (uint64_t left = answer.bytes; left > 0;) {
      const size_t n = size_t(std::min<uint64_t>(left, sink.size()));
      if (!read_all(sink.data(), n)) _exit(0);
      left -= n;
    }
    if (f.op == 50 && answer.op == 12 && answer.bytes == 4) std::memcpy(&handle, sink.data(), 4);  // lab 07's open
  }
}

}  // namespace

// Every lab's table: each entry starts the same stream (the seed: the lab's number), so that the ranks of a
// multi-rank test send the same requests in the same order and their collectives meet.
extern "C" Lab02Plugin distlab_lab02 = {
    kLab02Abi, nullptr, [](int64_t, int, int, uint64_t, int64_t, bool, bool) -> std::vector<int64_t> { fuzz(2); },
    [](lab02::Comm&, std::vector<lab02::Grad>&) { fuzz(2); }, [](lab02::Comm&, std::vector<lab02::Grad>&, double) -> lab02::Bucketed* { fuzz(2); }};
extern "C" Lab03Plugin distlab_lab03 = {kLab03Abi,
                                        [](const lab03::ScalerConfig&) -> lab03::ScalerState { fuzz(3); },
                                        [](lab03::Comm&, const lab03::ScalerState&, std::vector<lab03::Grad>&) -> bool { fuzz(3); },
                                        [](const lab03::ScalerConfig&, lab03::ScalerState&, bool) { fuzz(3); },
                                        [](std::vector<lab03::Grad>&, double) -> double { fuzz(3); },
                                        [](lab03::Step&, const lab03::ScalerConfig&, lab03::ScalerState&) { fuzz(3); }};
extern "C" Lab04Plugin distlab_lab04 = {kLab04Abi,
                                        [](int64_t, int, int) -> lab04::Shard { fuzz(4); },
                                        [](const lab04::AdamW&, bool, float, float*, float*, float*, const float*, int64_t) { fuzz(4); },
                                        [](lab04::Step&) { fuzz(4); },
                                        [](lab04::Step&) { fuzz(4); },
                                        [](lab04::Step&, int) { fuzz(4); },
                                        [](lab04::Step&) { fuzz(4); }};
extern "C" Lab05Plugin distlab_lab05 = {kLab05Abi,
                                        [](const std::vector<int64_t>&, int) -> lab05::FlatLayout { fuzz(5); },
                                        [](lab05::Fsdp&, const lab05::Options&, int) { fuzz(5); },
                                        [](lab05::Fsdp&, const lab05::Options&, int) { fuzz(5); },
                                        [](lab05::Fsdp&, const lab05::Options&, int) { fuzz(5); },
                                        [](lab05::Fsdp&, const lab05::Options&, int) { fuzz(5); },
                                        [](lab05::Fsdp&, const lab05::Options&) { fuzz(5); }};
extern "C" Lab06Plugin distlab_lab06 = {
    kLab06Abi,
    [](lab06::Group&, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t) { fuzz(6); },
    [](lab06::Group&, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t) { fuzz(6); },
    [](lab06::Group&, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t) { fuzz(6); },
    [](lab06::Group&, const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, int64_t) { fuzz(6); },
    [](lab06::Stage&) { fuzz(6); }};
extern "C" Lab07Plugin distlab_lab07 = {kLab07Abi, [](lab07::State&, lab07::Files&) { fuzz(7); },
                                        [](lab07::State&, lab07::Files&) -> std::string { fuzz(7); }};
