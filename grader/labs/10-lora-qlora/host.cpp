// Lab 10's host: the student's NF4 and LoRA functions on the grader's inputs. The 4-bit bases the layer
// calls use are kept here, in the plugin's own process (their bytes are the plugin's, measured from
// outside), and read back on request, so that a base the student's code changed shows.
// Read next: grader/host/host.h (what every lab's host shares).
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "grader/host/host.h"
#include "labs/10-lora-qlora/api.h"

namespace labhost {

using namespace distlab;

namespace {

constexpr int64_t kLimit = int64_t(labproto::kMaxPayload / 4);

void append_bytes(std::vector<char>& out, const void* p, size_t bytes) {
  out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + bytes);
}

void append_nf4(std::vector<char>& out, const lab10::Nf4& q) {
  const int64_t sizes[3] = {int64_t(q.packed.size()), int64_t(q.absmax_q.size()), int64_t(q.absmax2.size())};
  append_bytes(out, sizes, sizeof sizes);
  append_bytes(out, &q.offset, 4);
  append_bytes(out, q.packed.data(), q.packed.size());
  append_bytes(out, q.absmax_q.data(), q.absmax_q.size());
  append_bytes(out, q.absmax2.data(), q.absmax2.size() * 4);
}

// An Nf4 from the grader's payload at r; false when it does not add up
bool read_nf4(Reader& r, lab10::Nf4& q) {
  const int64_t np = r.take<int64_t>(), nq = r.take<int64_t>(), n2 = r.take<int64_t>();
  q.offset = r.take<float>();
  if (np < 0 || nq < 0 || n2 < 0 || np > kLimit * 4 || nq > kLimit || n2 > kLimit) return false;
  if (r.at + size_t(np + nq + 4 * n2) > r.in.size()) return false;
  q.packed.assign(r.in.begin() + long(r.at), r.in.begin() + long(r.at + size_t(np)));
  r.at += size_t(np);
  q.absmax_q.assign(r.in.begin() + long(r.at), r.in.begin() + long(r.at + size_t(nq)));
  r.at += size_t(nq);
  q.absmax2.resize(size_t(n2));
  if (n2) std::memcpy(q.absmax2.data(), r.in.data() + r.at, size_t(n2) * 4);
  r.at += size_t(n2) * 4;
  return true;
}

// n floats of the payload at r (a view into it)
const float* floats(Reader& r, int64_t n) {
  if (n < 0 || r.at + size_t(n) * 4 > r.in.size()) _exit(3);
  const float* p = reinterpret_cast<const float*>(r.in.data() + r.at);
  r.at += size_t(n) * 4;
  return p;
}

// An output the student must write: NaN until then, so one never written can't pass for zeros.
std::vector<float> unwritten(int64_t n) { return std::vector<float>(size_t(n), std::numeric_limits<float>::quiet_NaN()); }

}  // namespace

int serve_lab10(void* plugin) {
  auto* t = load_table<const Lab10Plugin>(plugin, "distlab_lab10", kLab10Abi, "qlora.cpp", "labs/10-lora-qlora/api.h");
  if (!t) return 2;
  std::map<int64_t, lab10::Nf4> bases;
  return serve_calls([t, &bases](const wire::Frame& f, const std::vector<char>& in, std::vector<char>& out) {
    Reader r{in};
    switch (f.arg[0]) {
      case labproto::kNf4Code: {
        need(t->normal_map, "normal_map");
        if (in.size() != 4) return false;
        float offset;
        std::memcpy(&offset, in.data(), 4);
        const std::vector<float> code = t->normal_map(offset);
        if (code.size() > 4096) throw std::length_error("normal_map returned " + std::to_string(code.size()) + " levels (16 expected)");
        append_bytes(out, code.data(), code.size() * 4);
        return true;
      }
      case labproto::kQuantize: {
        const int64_t n = f.arg[1], id = f.arg[2];
        if (n < 0 || n > kLimit || in.size() != size_t(n) * 4) return false;
        need(t->quantize, "quantize");
        lab10::Nf4 q = t->quantize(reinterpret_cast<const float*>(in.data()), n);
        append_nf4(out, q);
        if (id >= 0) bases[id] = std::move(q);
        return true;
      }
      case labproto::kDequantize: {
        const int64_t n = f.arg[1];
        lab10::Nf4 q;
        if (n < 0 || n > kLimit || !read_nf4(r, q)) return false;
        need(t->dequantize, "dequantize");
        std::vector<float> v = unwritten(n);
        t->dequantize(q, n, v.data());
        append_bytes(out, v.data(), v.size() * 4);
        return true;
      }
      case labproto::kKeepBase: {
        lab10::Nf4 q;
        if (!read_nf4(r, q)) return false;
        bases[f.arg[1]] = std::move(q);
        return true;
      }
      case labproto::kBaseBytes: {
        const auto it = bases.find(f.arg[1]);
        if (it == bases.end()) return false;
        append_nf4(out, it->second);
        return true;
      }
      case labproto::kLoraForward:
      case labproto::kLoraBackward: {
        const bool forward = f.arg[0] == labproto::kLoraForward;
        const int64_t id = f.arg[1], N = f.arg[2], nin = f.arg[3], nout = f.arg[4], rank = f.arg[5];
        const bool has_bias = f.arg[6] != 0, want_dx = f.arg[7] != 0;
        const auto it = bases.find(id);
        if (it == bases.end() || N < 1 || nin < 1 || nout < 1 || rank < 1 || N > kLimit || nin > kLimit || nout > kLimit || rank > kLimit ||
            N * nin > kLimit || N * nout > kLimit || rank * nin > kLimit || rank * nout > kLimit)
          return false;
        const float scaling = r.take<float>();
        const float* x = floats(r, N * nin);
        const float* dy = forward ? nullptr : floats(r, N * nout);
        const float* A = floats(r, rank * nin);
        const float* B = floats(r, nout * rank);
        const float* bias = has_bias ? floats(r, nout) : nullptr;
        const lab10::Frozen base{&it->second, bias, nin, nout};
        const lab10::Adapter ad{A, B, rank, scaling};
        if (forward) {
          need(t->lora_forward, "lora_forward");
          std::vector<float> y = unwritten(N * nout);
          t->lora_forward(base, ad, x, N, y.data());
          append_bytes(out, y.data(), y.size() * 4);
          return true;
        }
        need(t->lora_backward, "lora_backward");
        const float* dA0 = floats(r, rank * nin);
        const float* dB0 = floats(r, nout * rank);
        std::vector<float> dx = unwritten(want_dx ? N * nin : 0), dA(dA0, dA0 + rank * nin), dB(dB0, dB0 + nout * rank);
        t->lora_backward(base, ad, x, dy, N, want_dx ? dx.data() : nullptr, dA.data(), dB.data());
        append_bytes(out, dx.data(), dx.size() * 4);
        append_bytes(out, dA.data(), dA.size() * 4);
        append_bytes(out, dB.data(), dB.size() * 4);
        return true;
      }
      default:
        return false;
    }
  });
}

}  // namespace labhost
