// Every CUDA kernel against its cpu twin on random inputs (core/ops/cuda/ops.h against core/ops/cpu):
// fp32 within 1e-5 of the cpu's result (the largest difference over the largest value), TF32 within 5e-3,
// bf16/fp16 GEMMs within 1e-4 of the cpu's product of the same rounded inputs, tensor-core flash attention
// within the rounding of its 16-bit P and dS (5e-3 / 1e-2 in bf16); max-pool, the embedding,
// dtype conversion and the optimizers' updates bit for bit. Without a usable GPU the program prints why
// and exits 77, which ctest reports as skipped (a build without a GPU still compiles and links all of this).
// Catch2's main is its library's (Catch2WithMain): a runner of our own would compile Catch2's whole
// implementation into this file (10 s of every build); the GPU is probed before main, below.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/context.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/nccl_group.h"
#include "core/comm/store.h"
#include "core/ops/cpu/attention.h"
#include "core/ops/cpu/llama.h"
#include "core/ops/cpu/conv.h"
#include "core/ops/cpu/loss.h"
#include "core/ops/cpu/matmul.h"
#include "core/ops/cpu/nf4.h"
#include "core/optim/optimizer.h"
#include "core/ops/cpu/norm.h"
#include "core/ops/cpu/optim.h"
#include "core/ops/cpu/pointwise.h"
#include "core/ops/cuda/ops.h"
#include "core/parallel/comm_buffers.h"
#include "core/tensor/dtype.h"
#include "core/util/rng.h"

using namespace distlab;

namespace {

// One cpu and one cuda rank side by side.
struct Pair {
  Runtime cpu{DeviceKind::cpu};
  Runtime gpu{DeviceKind::cuda};
  CudaContext cx{0};
  Pair() { gpu.cuda = &cx; }
};

template <class T>
struct Dev {
  T* p = nullptr;
  int64_t n = 0;
  explicit Dev(int64_t count) : n(count) { DL_CUDA(cudaMalloc(&p, size_t(std::max<int64_t>(n, 1)) * sizeof(T))); }
  explicit Dev(const std::vector<T>& h) : Dev(int64_t(h.size())) {
    DL_CUDA(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    // a pageable copy may still be in flight when cudaMemcpy returns, and the kernels run on a non-blocking
    // stream that does not wait for it
    DL_CUDA(cudaDeviceSynchronize());
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {  // after everything queued: the kernels run on a non-blocking stream
    DL_CUDA(cudaDeviceSynchronize());
    std::vector<T> h(static_cast<size_t>(n));
    DL_CUDA(cudaMemcpy(h.data(), p, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  Dev(const Dev&) = delete;
};

std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = scale * r.normal();
  return v;
}

// max |a - b| / max |b|: the error relative to the result's scale
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); i++) {
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    m = std::max(m, std::abs(double(b[i])));
  }
  return m > 0 ? d / m : d;
}

// bit for bit; on a difference, the first one's index and both values (bits too: NaN payloads, -0) go to the report.
// any_nan: a NaN matches any NaN. A NaN's payload is not arithmetic: on an H200 (sm_90) the GPU's relu returned
// the canonical 0x7fffffff for the input's 0x7fc00000, where the cpu's keeps the input's bits.
bool bitwise(const std::vector<float>& a, const std::vector<float>& b, bool any_nan = false) {
  if (a.size() != b.size()) {
    UNSCOPED_INFO("sizes differ: " << a.size() << " vs " << b.size());
    return false;
  }
  for (size_t i = 0; i < a.size(); i++) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y && !(any_nan && std::isnan(a[i]) && std::isnan(b[i]))) {
      UNSCOPED_INFO("first difference at [" << i << "]: gpu " << a[i] << " (0x" << std::hex << x << ") vs cpu " << b[i]
                                            << " (0x" << y << std::dec << ")");
      return false;
    }
  }
  return true;
}

constexpr double kF32 = 1e-5;

// a 16-bit tensor's values as f32 (exactly), and f32 values rounded to a 16-bit type t (to nearest even)
std::vector<float> widen16(DType t, const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  convert(h.data(), t, v.data(), DType::f32, int64_t(h.size()));
  return v;
}
std::vector<uint16_t> round16(DType t, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  convert(v.data(), DType::f32, h.data(), t, int64_t(v.size()));
  return h;
}

}  // namespace

TEST_CASE("pointwise kernels: relu, gelu, add, accumulate and their backward", "[cuda]") {
  Pair g;
  const int64_t n = 100003;  // not a multiple of any block size
  auto x = randn(n, 1), dy = randn(n, 2);
  x[5] = NAN;
  Dev<float> dx(x), ddy(dy), out(n), grad(n);
  std::vector<float> co(static_cast<size_t>(n)), cg(static_cast<size_t>(n));

  relu_forward(g.cpu, co.data(), x.data(), n);
  cuda::relu_forward(g.gpu, out.p, dx.p, n);
  CHECK(bitwise(out.get(), co, /*any_nan=*/true));  // NaN stays NaN (its payload may not)
  relu_backward(g.cpu, cg.data(), dy.data(), co.data(), n);
  cuda::relu_backward(g.gpu, grad.p, ddy.p, out.p, n);
  CHECK(bitwise(grad.get(), cg));

  x[5] = 0.5f;
  Dev<float> dx2(x);
  gelu_forward(g.cpu, co.data(), x.data(), n);
  cuda::gelu_forward(g.gpu, out.p, dx2.p, n);
  CHECK(rel(out.get(), co) < kF32);
  gelu_backward(g.cpu, cg.data(), dy.data(), x.data(), n);
  cuda::gelu_backward(g.gpu, grad.p, ddy.p, dx2.p, n);
  CHECK(rel(grad.get(), cg) < kF32);
  for (DType low : {DType::bf16, DType::f16}) {  // on the 16-bit tensors themselves: the cpu's within a rounding
    INFO("gelu in " << dtype_name(low));
    std::vector<uint16_t> x16(x.size()), dy16(dy.size()), cy(x.size()), cdx(x.size());
    convert(x.data(), DType::f32, x16.data(), low, n);
    convert(dy.data(), DType::f32, dy16.data(), low, n);
    gelu_forward_16(g.cpu, cy.data(), x16.data(), low, n);
    gelu_backward_16(g.cpu, cdx.data(), dy16.data(), x16.data(), low, n);
    Dev<uint16_t> gx(x16), gdy(dy16), gy(n), gdx(n);
    cuda::gelu_forward_16(g.gpu, gy.p, gx.p, low, n);
    cuda::gelu_backward_16(g.gpu, gdx.p, gdy.p, gx.p, low, n);
    CHECK(rel(widen16(low, gy.get()), widen16(low, cy)) < 1e-2);
    CHECK(rel(widen16(low, gdx.get()), widen16(low, cdx)) < 1e-2);
    // the residual stream's add and accumulate: one f32 add, rounded once: the cpu's bits
    std::vector<uint16_t> csum(x.size()), cacc = x16;
    add_16(g.cpu, csum.data(), x16.data(), dy16.data(), low, n);
    accumulate_16(g.cpu, cacc.data(), dy16.data(), low, n);
    Dev<uint16_t> gsum(n), gacc(x16);
    cuda::add_16(g.gpu, gsum.p, gx.p, gdy.p, low, n);
    cuda::accumulate_16(g.gpu, gacc.p, gdy.p, low, n);
    CHECK(gsum.get() == csum);
    CHECK(gacc.get() == cacc);
  }

  add_forward(g.cpu, co.data(), x.data(), dy.data(), n);
  cuda::add_forward(g.gpu, out.p, dx2.p, ddy.p, n);
  CHECK(bitwise(out.get(), co));
  accumulate(g.cpu, co.data(), dy.data(), n);
  cuda::accumulate(g.gpu, out.p, ddy.p, n);
  CHECK(bitwise(out.get(), co));
}

TEST_CASE("optimizer kernels: SGD (momentum, nesterov, decay) and AdamW bit for bit, the sum of squares, scale, the overflow check", "[cuda]") {
  Pair g;
  const int64_t n = 70001;
  const auto w0 = randn(n, 11), grad = randn(n, 12, 0.1f);
  Dev<float> dg(grad);
  for (const bool nesterov : {false, true}) {
    INFO("SGD, nesterov " << nesterov);
    std::vector<float> w = w0, buf(static_cast<size_t>(n));
    Dev<float> dw(w0), dbuf(n);
    for (int step = 0; step < 3; step++) {  // the first step starts the momentum buffer
      const SgdUpdate u{0.05f, 0.5f, 1e-2f, 0.9f, 0.1f, nesterov, step == 0};
      sgd_update(g.cpu, w.data(), buf.data(), grad.data(), n, u);
      cuda::sgd_update(g.gpu, dw.p, dbuf.p, dg.p, n, u);
    }
    CHECK(bitwise(dw.get(), w));
    CHECK(bitwise(dbuf.get(), buf));
  }
  {
    std::vector<float> w = w0, m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    Dev<float> dw(w0), dm(m), dv(v);
    for (int step = 1; step <= 3; step++) {
      const float b1 = 0.9f, b2 = 0.999f, lr = 1e-3f;
      const AdamWUpdate u{0.5f, 1.0f - lr * 0.1f, b1, b2, lr / (1.0f - std::pow(b1, float(step))), std::sqrt(1.0f - std::pow(b2, float(step))), 1e-8f};
      adamw_update(g.cpu, w.data(), m.data(), v.data(), grad.data(), n, u);
      cuda::adamw_update(g.gpu, dw.p, dm.p, dv.p, dg.p, n, u);
    }
    CHECK(bitwise(dw.get(), w));
    CHECK(bitwise(dm.get(), m));
    CHECK(bitwise(dv.get(), v));
  }
  {  // the multi-tensor AdamW: 30 tensors of sizes around its 65536-element chunks (two launches of at most
     // 24), f32, bf16 and f16 gradients, each the per-tensor update's bits
    const std::vector<int64_t> sizes = {0, 1, 7, 65535, 65536, 65537, 131073, 300001, 5, 1000};
    std::vector<std::vector<float>> w, m, v, gr;
    std::vector<std::unique_ptr<Dev<float>>> dw, dm, dv, dg32;
    std::vector<std::unique_ptr<Dev<uint16_t>>> dg16;
    std::vector<AdamWTensor> list;
    for (int k = 0; k < 30; k++) {
      const int64_t len = sizes[size_t(k) % sizes.size()];
      const DType gt = k % 3 == 1 ? DType::bf16 : k % 3 == 2 ? DType::f16 : DType::f32;
      const bool b16 = gt != DType::f32;
      w.push_back(randn(len, 100 + uint64_t(k)));
      m.push_back(std::vector<float>(size_t(len), 0.0f));
      v.push_back(std::vector<float>(size_t(len), 0.0f));
      gr.push_back(randn(len, 200 + uint64_t(k), 0.1f));
      std::vector<uint16_t> bits(static_cast<size_t>(len));
      if (b16)
        for (size_t j = 0; j < bits.size(); j++) {
          bits[j] = gt == DType::bf16 ? f32_to_bf16(gr.back()[j]) : f32_to_f16(gr.back()[j]);
          gr.back()[j] = gt == DType::bf16 ? bf16_to_f32(bits[j]) : f16_to_f32(bits[j]);  // what the kernel reads, exactly
        }
      dw.push_back(std::make_unique<Dev<float>>(w.back()));
      dm.push_back(std::make_unique<Dev<float>>(m.back()));
      dv.push_back(std::make_unique<Dev<float>>(v.back()));
      dg32.push_back(std::make_unique<Dev<float>>(gr.back()));
      dg16.push_back(std::make_unique<Dev<uint16_t>>(bits));
      const AdamWUpdate u{0.5f, 1.0f - 1e-4f * float(k % 2), 0.9f, 0.999f, 1e-3f / 0.1f, std::sqrt(1.0f - 0.999f), 1e-8f};
      list.push_back({dw.back()->p, dm.back()->p, dv.back()->p, b16 ? static_cast<const void*>(dg16.back()->p) : dg32.back()->p,
                      gt, len, u});
      adamw_update(g.cpu, w.back().data(), m.back().data(), v.back().data(), gr.back().data(), len, u);
    }
    cuda::adamw_update_many(g.gpu, list.data(), int64_t(list.size()));
    for (size_t k = 0; k < list.size(); k++) {
      INFO("tensor " << k << " of " << list[k].n);
      CHECK(bitwise(dw[k]->get(), w[k]));
      CHECK(bitwise(dm[k]->get(), m[k]));
      CHECK(bitwise(dv[k]->get(), v[k]));
    }
  }
  {  // the clip computed on the device (clip_factor): the host's norm and factor, to the bit, and the
     // updates that read the factor there (AdamWTensor::factor, SgdUpdate::factor) equal those given it
    struct Case {
      std::vector<double> sums;
      float loss_scale;
      double max_norm;
    };
    const std::vector<Case> cases = {{{0.3, 1.7, 0.0, 2.25}, 1.0f, 1.0},       // clipped
                                     {{1e-4, 2e-4}, 1.0f, 1.0},                // below the bound: 1
                                     {{4.0e6, 1.5e6}, 1024.0f, 0.5},           // scaled (fp16), clipped
                                     {{0.3, 1.7}, 65536.0f, 0.0},              // no clipping: 1 / scale
                                     {{0.3, std::nan("")}, 1.0f, 1.0},         // NaN poisons, as PyTorch's
                                     {{}, 8.0f, 1.0}};                         // no gradients
    for (const Case& c : cases) {
      double cn = 0;
      float cf = 0;
      clip_factor(g.cpu, &cf, &cn, c.sums.data(), int64_t(c.sums.size()), c.loss_scale, c.max_norm);
      Dev<double> sums(c.sums.empty() ? std::vector<double>{0.0} : c.sums), norm(std::vector<double>{-1.0});
      Dev<float> factor(std::vector<float>{-1.0f});
      cuda::clip_factor(g.gpu, factor.p, norm.p, sums.p, int64_t(c.sums.size()), c.loss_scale, c.max_norm);
      const double gn = norm.get()[0];
      const float gf = factor.get()[0];
      INFO("sums " << c.sums.size() << ", scale " << c.loss_scale << ", max " << c.max_norm);
      CHECK((std::isnan(cn) ? std::isnan(gn) : gn == cn));
      CHECK((std::isnan(cf) ? std::isnan(gf) : gf == cf));
      CHECK((std::isnan(cf) || cf == clip_coefficient(cn, c.max_norm) / c.loss_scale));  // the trainer's host arithmetic
    }
    Dev<float> factor(std::vector<float>{0.5f});
    const AdamWUpdate u{0.5f, 1.0f - 1e-4f, 0.9f, 0.999f, 1e-2f, std::sqrt(1.0f - 0.999f), 1e-8f};
    AdamWUpdate u0 = u;
    u0.grad_factor = 3.0f;  // ignored: the factor is read from device memory
    Dev<float> aw(w0), am(n), av(n), bw(w0), bm(n), bv(n);
    AdamWTensor given{aw.p, am.p, av.p, dg.p, DType::f32, n, u}, read{bw.p, bm.p, bv.p, dg.p, DType::f32, n, u0, factor.p};
    cuda::adamw_update_many(g.gpu, &given, 1);
    cuda::adamw_update_many(g.gpu, &read, 1);
    CHECK(bitwise(bw.get(), aw.get()));
    CHECK(bitwise(bv.get(), av.get()));
    Dev<float> sw(w0), sb(n), tw(w0), tb(n);
    const SgdUpdate su{0.05f, 0.5f, 1e-2f, 0.9f, 0.1f, false, true};
    SgdUpdate sr = su;
    sr.grad_factor = 3.0f;
    sr.factor = factor.p;
    cuda::sgd_update(g.gpu, sw.p, sb.p, dg.p, n, su);
    cuda::sgd_update(g.gpu, tw.p, tb.p, dg.p, n, sr);
    CHECK(bitwise(tw.get(), sw.get()));
  }
  // the sum of squares in double: another order of the same terms, so equal to about 1e-15
  const double ss = sum_squares(g.cpu, grad.data(), n), dss = cuda::sum_squares(g.gpu, dg.p, n);
  CHECK(std::abs(dss - ss) <= 1e-12 * ss);
  CHECK(cuda::sum_squares(g.gpu, dg.p, n) == dss);  // and the same bits every time
  {  // left in device memory, no wait (core/optim/reduce.h): the same bits as the value read back; 0 for n = 0
    Dev<double> slots(std::vector<double>{-1.0, -1.0});
    cuda::sum_squares_into(g.gpu, dg.p, n, slots.p);
    cuda::sum_squares_into(g.gpu, dg.p, 0, slots.p + 1);
    const std::vector<double> got = slots.get();
    CHECK(got[0] == dss);
    CHECK(got[1] == 0.0);
  }
  std::vector<float> x = grad;
  Dev<float> dx(grad);
  scale(g.cpu, x.data(), n, 0.125f);
  cuda::scale(g.gpu, dx.p, n, 0.125f);
  CHECK(bitwise(dx.get(), x));
  CHECK(cuda::all_finite(g.gpu, dx.p, n));
  x[size_t(n - 1)] = INFINITY;
  Dev<float> dinf(x);
  CHECK_FALSE(cuda::all_finite(g.gpu, dinf.p, n));
  x[size_t(n - 1)] = NAN;
  Dev<float> dnan(x);
  CHECK_FALSE(cuda::all_finite(g.gpu, dnan.p, n));
  {  // the flag a step queues per gradient: set by a non-finite value, never cleared by a finite tensor
    Dev<float> flags(std::vector<float>{0.0f, 0.0f});
    cuda::flag_nonfinite(g.gpu, dg.p, n, flags.p);
    cuda::flag_nonfinite(g.gpu, dinf.p, n, flags.p + 1);
    cuda::flag_nonfinite(g.gpu, dg.p, n, flags.p + 1);
    const std::vector<float> got = flags.get();
    CHECK(got[0] == 0.0f);
    CHECK(got[1] == 1.0f);
  }
}

TEST_CASE("dropout: a mask of 0 and 1/(1-p) at rate p, the same for the same seed, and backward applies it", "[cuda]") {
  Pair g;
  const int64_t n = 1 << 20;
  const float p = 0.1f;
  auto x = randn(n, 3);
  Dev<float> dx(x), out(n), mask(n), out2(n), mask2(n), grad(n);
  cuda::dropout_forward(g.gpu, out.p, mask.p, dx.p, n, p, 42);
  cuda::dropout_forward(g.gpu, out2.p, mask2.p, dx.p, n, p, 42);
  const auto m = mask.get(), o = out.get();
  CHECK(bitwise(m, mask2.get()));
  int64_t dropped = 0;
  bool values_ok = true, applied = true;
  for (int64_t i = 0; i < n; i++) {
    dropped += m[size_t(i)] == 0.0f;
    values_ok = values_ok && (m[size_t(i)] == 0.0f || m[size_t(i)] == 1.0f / (1.0f - p));
    applied = applied && o[size_t(i)] == x[size_t(i)] * m[size_t(i)];
  }
  CHECK(values_ok);
  CHECK(applied);
  const double rate = double(dropped) / double(n), sigma = std::sqrt(p * (1 - p) / double(n));
  CHECK(std::abs(rate - p) < 5 * sigma);
  cuda::dropout_backward(g.gpu, grad.p, dx.p, mask.p, n);
  CHECK(bitwise(grad.get(), o));
}

TEST_CASE("max pooling 2x2/2 and 3x3/2: the same maxima, winners and gradients, bit for bit (ties, NaN)", "[cuda]") {
  Pair g;
  for (auto [K, stride] : {std::pair<int64_t, int64_t>{2, 2}, {3, 2}}) {
    const int64_t B = 3, C = 5, H = 13, W = 11, OH = (H - K) / stride + 1, OW = (W - K) / stride + 1;
    auto x = randn(B * C * H * W, 4);
    for (size_t i = 0; i < x.size(); i += 7) x[i] = 1.0f;  // ties
    x[17] = NAN;
    auto dy = randn(B * C * OH * OW, 5);
    std::vector<float> co(static_cast<size_t>(B * C * OH * OW)), cg(x.size());
    std::vector<int32_t> ca(co.size());
    maxpool2d_forward(g.cpu, co.data(), ca.data(), x.data(), B, C, H, W, K, stride);
    maxpool2d_backward(g.cpu, cg.data(), dy.data(), ca.data(), B, C, H, W, OH, OW);
    Dev<float> dx(x), ddy(dy), out(int64_t(co.size())), grad(int64_t(x.size()));
    Dev<int32_t> arg(int64_t(co.size()));
    cuda::maxpool2d_forward(g.gpu, out.p, arg.p, dx.p, B, C, H, W, K, stride);
    cuda::maxpool2d_backward(g.gpu, grad.p, ddy.p, arg.p, B, C, H, W, OH, OW);
    INFO("K " << K << " stride " << stride);
    CHECK(bitwise(out.get(), co));
    CHECK(arg.get() == ca);
    CHECK(bitwise(grad.get(), cg));
  }
}

TEST_CASE("GEMM: every transpose in f32 against OpenBLAS, the tiled kernel, and TF32, bf16 and fp16 at their tolerances", "[cuda]") {
  Pair g;
  const int64_t M = 67, N = 45, K = 130;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
      auto A = randn((ta ? K : M) * lda, 6), B = randn((tb ? N : K) * ldb, 7), C0 = randn(M * ldc, 8);
      auto ref = C0;
      blas_sgemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.25f, ref.data(), ldc);
      Dev<float> dA(A), dB(B);
      INFO("ta " << ta << " tb " << tb);
      for (GemmMath math : {GemmMath::f32, GemmMath::tf32}) {
        g.cx.math = math;
        Dev<float> dC(C0);
        cuda::gemm(g.gpu, "gemm", ta, tb, M, N, K, 0.5f, dA.p, lda, dB.p, ldb, 0.25f, dC.p, ldc);
        CHECK(rel(dC.get(), ref) < (math == GemmMath::f32 ? kF32 : 5e-3));
      }
      g.cx.math = GemmMath::f32;
      Dev<float> dN(C0);
      cuda::gemm_naive(g.gpu, ta, tb, M, N, K, 0.5f, dA.p, lda, dB.p, ldb, 0.25f, dN.p, ldc);
      CHECK(rel(dN.get(), ref) < kF32);
      // 16-bit math: the cpu multiplies the same rounded inputs in f32, as tensor cores do
      for (DType low : {DType::bf16, DType::f16}) {
        auto Ar = A, Br = B, lref = C0;
        round_f32(Ar.data(), Ar.data(), int64_t(Ar.size()), low);
        round_f32(Br.data(), Br.data(), int64_t(Br.size()), low);
        blas_sgemm(ta, tb, M, N, K, 0.5f, Ar.data(), lda, Br.data(), ldb, 0.25f, lref.data(), ldc);
        g.cx.math = low == DType::bf16 ? GemmMath::bf16 : GemmMath::f16;
        Dev<float> dC(C0);
        cuda::gemm(g.gpu, "gemm", ta, tb, M, N, K, 0.5f, dA.p, lda, dB.p, ldb, 0.25f, dC.p, ldc);
        INFO(dtype_name(low));
        CHECK(rel(dC.get(), lref) < 1e-4);
      }
      g.cx.math = GemmMath::f32;
    }
}

TEST_CASE("gemm_ex on bf16 operands, f32 and bf16 results", "[cuda]") {
  Pair g;
  const int64_t M = 64, N = 96, K = 256;
  auto A = randn(M * K, 9), B = randn(K * N, 10);
  std::vector<uint16_t> Ab(A.size()), Bb(B.size());
  for (size_t i = 0; i < A.size(); i++) Ab[i] = f32_to_bf16(A[i]);
  for (size_t i = 0; i < B.size(); i++) Bb[i] = f32_to_bf16(B[i]);
  round_f32(A.data(), A.data(), int64_t(A.size()), DType::bf16);
  round_f32(B.data(), B.data(), int64_t(B.size()), DType::bf16);
  std::vector<float> ref(static_cast<size_t>(M * N));
  blas_sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, ref.data(), N);
  Dev<uint16_t> dA(Ab), dB(Bb), dCb(M * N);
  Dev<float> dC(M * N);
  cuda::gemm_ex(g.gpu, "gemm_bf16", false, false, M, N, K, 1.0f, dA.p, DType::bf16, K, dB.p, DType::bf16, N, 0.0f, dC.p, DType::f32, N,
                GemmMath::bf16);
  CHECK(rel(dC.get(), ref) < 1e-4);
  cuda::gemm_ex(g.gpu, "gemm_bf16", false, false, M, N, K, 1.0f, dA.p, DType::bf16, K, dB.p, DType::bf16, N, 0.0f, dCb.p, DType::bf16, N,
                GemmMath::bf16);
  const auto cb = dCb.get();
  std::vector<float> back(cb.size());
  for (size_t i = 0; i < cb.size(); i++) back[i] = bf16_to_f32(cb[i]);
  CHECK(rel(back, ref) < 1e-2);  // one bf16 rounding of the result: 2^-8 relative
}

TEST_CASE("matmul forward and backward, with and without bias", "[cuda]") {
  Pair g;
  // N = 1000: more than one chunk of the bias gradient's two-pass sum (kChunkRows = 256)
  for (auto [N, C, OC, with_bias] : {std::tuple<int64_t, int64_t, int64_t, bool>{37, 70, 29, true}, {37, 70, 29, false}, {1000, 64, 48, true},
                                {1000, 64, 48, false}}) {
    auto x = randn(N * C, 11), w = randn(OC * C, 12), b = randn(OC, 13), dy = randn(N * OC, 14), dw0 = randn(OC * C, 15), db0 = randn(OC, 16);
    std::vector<float> co(static_cast<size_t>(N * OC)), cdx(static_cast<size_t>(N * C)), cdw = dw0, cdb = db0;
    matmul_forward(g.cpu, co.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
    matmul_backward(g.cpu, cdx.data(), cdw.data(), with_bias ? cdb.data() : nullptr, dy.data(), x.data(), w.data(), N, C, OC);
    Dev<float> dx(x), dw(w), db(b), ddy(dy), out(N * OC), gx(N * C), gw(dw0), gb(db0);
    cuda::matmul_forward(g.gpu, out.p, dx.p, dw.p, with_bias ? db.p : nullptr, N, C, OC);
    cuda::matmul_backward(g.gpu, gx.p, gw.p, with_bias ? gb.p : nullptr, ddy.p, dx.p, dw.p, N, C, OC);
    INFO("bias " << with_bias);
    CHECK(rel(out.get(), co) < kF32);
    CHECK(rel(gx.get(), cdx) < kF32);
    CHECK(rel(gw.get(), cdw) < kF32);
    CHECK(rel(gb.get(), cdb) < kF32);
    // a frozen weight (LoRA's base): dX only, dW left as it was
    Dev<float> fx(N * C), fw(dw0);
    cuda::matmul_backward(g.gpu, fx.p, fw.p, nullptr, ddy.p, dx.p, dw.p, N, C, OC, true, false);
    CHECK(rel(fx.get(), cdx) < kF32);
    CHECK(bitwise(fw.get(), dw0));
    // the bias on its own (a row-parallel layer's, after its all-reduce): added exactly, summed in chunks
    std::vector<float> cy = co, cb2 = db0;
    bias_forward(g.cpu, cy.data(), b.data(), N, OC);
    bias_backward(g.cpu, cb2.data(), dy.data(), N, OC);
    Dev<float> gy(co), gb2(db0);
    cuda::bias_forward(g.gpu, gy.p, db.p, N, OC);
    cuda::bias_backward(g.gpu, gb2.p, ddy.p, N, OC);
    CHECK(bitwise(gy.get(), cy));
    CHECK(rel(gb2.get(), cb2) < kF32);
    // the forward's bias in cuBLASLt's epilogue under 16-bit math: the cpu's on the same rounded inputs
    for (DType low : {DType::bf16, DType::f16}) {
      auto xr = x, wr = w;
      round_f32(xr.data(), xr.data(), int64_t(xr.size()), low);
      round_f32(wr.data(), wr.data(), int64_t(wr.size()), low);
      std::vector<float> lo(co.size());
      matmul_forward(g.cpu, lo.data(), xr.data(), wr.data(), with_bias ? b.data() : nullptr, N, C, OC);
      g.cx.math = low == DType::bf16 ? GemmMath::bf16 : GemmMath::f16;
      Dev<float> lout(N * OC), lout2(N * OC);
      cuda::matmul_forward(g.gpu, lout.p, dx.p, dw.p, with_bias ? db.p : nullptr, N, C, OC);
      // a bias 4 bytes into its buffer, as a flat parameter buffer packs them: the epilogue needs 16-byte
      // alignment, so this one takes the two-pass way
      std::vector<float> shifted(1, 0.0f);
      shifted.insert(shifted.end(), b.begin(), b.end());
      Dev<float> dshift(shifted);
      cuda::matmul_forward(g.gpu, lout2.p, dx.p, dw.p, with_bias ? dshift.p + 1 : nullptr, N, C, OC);
      g.cx.math = GemmMath::f32;
      INFO(dtype_name(low));
      CHECK(rel(lout.get(), lo) < 1e-4);
      CHECK(rel(lout2.get(), lo) < 1e-4);
    }
    // linear_forward_16: the same product on the 16-bit tensors themselves (a device rank's nn.Linear), the
    // output rounded once: the cpu's within a 16-bit rounding (the f32 sums may add in another order)
    for (DType low : {DType::bf16, DType::f16}) {
      std::vector<uint16_t> x16(x.size()), w16(w.size()), b16(b.size()), want(co.size());
      convert(x.data(), DType::f32, x16.data(), low, int64_t(x.size()));
      convert(w.data(), DType::f32, w16.data(), low, int64_t(w.size()));
      convert(b.data(), DType::f32, b16.data(), low, int64_t(b.size()));
      linear_forward_16(g.cpu, want.data(), x16.data(), w16.data(), with_bias ? b16.data() : nullptr, low, N, C, OC);
      Dev<uint16_t> gx(x16), gw(w16), gb(b16), gout(N * OC);
      cuda::linear_forward_16(g.gpu, gout.p, gx.p, gw.p, with_bias ? gb.p : nullptr, low, N, C, OC);
      std::vector<float> a(co.size()), got(co.size());
      convert(want.data(), low, a.data(), DType::f32, int64_t(a.size()));
      convert(gout.get().data(), low, got.data(), DType::f32, int64_t(got.size()));
      INFO("linear_forward_16 in " << dtype_name(low));
      CHECK(rel(got, a) < 1e-2);
      {  // linear_gelu_forward_16: pre as linear_forward_16's, out the GELU of the sums (on sm 90, one cuBLASLt call
         // with the GELU_AUX epilogue where OC is a multiple of 8: 48; else the two kernels: 29), the cpu's two
         // kernels within a rounding
        std::vector<uint16_t> cpre(co.size()), cact(co.size());
        linear_gelu_forward_16(g.cpu, cact.data(), cpre.data(), x16.data(), w16.data(), with_bias ? b16.data() : nullptr, low, N, C, OC);
        Dev<uint16_t> gpre(N * OC), gact(N * OC);
        cuda::linear_gelu_forward_16(g.gpu, gact.p, gpre.p, gx.p, gw.p, with_bias ? gb.p : nullptr, low, N, C, OC);
        INFO("linear_gelu_forward_16");
        CHECK(rel(widen16(low, gpre.get()), widen16(low, cpre)) < 1e-2);
        CHECK(rel(widen16(low, gact.get()), widen16(low, cact)) < 1e-2);
        if (with_bias) {  // a bias 2 bytes into its buffer: the epilogue takes an aligned copy, the same bits
          std::vector<uint16_t> shifted(1, 0);
          shifted.insert(shifted.end(), b16.begin(), b16.end());
          Dev<uint16_t> gbs(shifted), gpre2(N * OC), gact2(N * OC);
          cuda::linear_gelu_forward_16(g.gpu, gact2.p, gpre2.p, gx.p, gw.p, gbs.p + 1, low, N, C, OC);
          CHECK(gpre2.get() == gpre.get());
          CHECK(gact2.get() == gact.get());
        }
        // which way ran (sm 90 and OC a multiple of 8: the epilogue), for the report
        int cc = 0;
        DL_CUDA(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, 0));
        UNSCOPED_INFO("linear_gelu_forward_16 N " << N << " OC " << OC << ": " << (cc >= 9 && OC % 8 == 0 ? "one cuBLASLt call (GELU_AUX)" : "two kernels"));
      }
      if (with_bias) {  // a bias 2 bytes into its buffer (a flat parameter buffer's): the epilogue takes an aligned copy
        std::vector<uint16_t> shifted(1, 0);
        shifted.insert(shifted.end(), b16.begin(), b16.end());
        Dev<uint16_t> gbs(shifted), gout2(N * OC);
        cuda::linear_forward_16(g.gpu, gout2.p, gx.p, gw.p, gbs.p + 1, low, N, C, OC);
        CHECK(gout2.get() == gout.get());
      }
      // linear_backward_16: dX written, dW and the bias gradient accumulated onto what they held
      std::vector<uint16_t> dy16(dy.size()), dw16(dw0.size()), db16(db0.size());
      convert(dy.data(), DType::f32, dy16.data(), low, int64_t(dy.size()));
      convert(dw0.data(), DType::f32, dw16.data(), low, int64_t(dw0.size()));
      convert(db0.data(), DType::f32, db16.data(), low, int64_t(db0.size()));
      std::vector<uint16_t> cdx16(static_cast<size_t>(N * C)), cdw16 = dw16, cdb16 = db16;
      linear_backward_16(g.cpu, cdx16.data(), cdw16.data(), with_bias ? cdb16.data() : nullptr, dy16.data(), x16.data(), w16.data(), low, N,
                         C, OC, true, true);
      Dev<uint16_t> gdy(dy16), gdx(N * C), gdw(dw16), gdb(db16);
      cuda::linear_backward_16(g.gpu, gdx.p, gdw.p, with_bias ? gdb.p : nullptr, gdy.p, gx.p, gw.p, low, N, C, OC, true, true);
      CHECK(rel(widen16(low, gdx.get()), widen16(low, cdx16)) < 1e-2);
      CHECK(rel(widen16(low, gdw.get()), widen16(low, cdw16)) < 1e-2);
      CHECK(rel(widen16(low, gdb.get()), widen16(low, cdb16)) < 1e-2);
      {  // a frozen weight (no dW) and a first layer (no dX): each GEMM alone
        Dev<uint16_t> fdx(N * C), fdw(dw16), fdb(db16);
        cuda::linear_backward_16(g.gpu, fdx.p, nullptr, nullptr, gdy.p, gx.p, gw.p, low, N, C, OC, true, false);
        cuda::linear_backward_16(g.gpu, nullptr, fdw.p, with_bias ? fdb.p : nullptr, gdy.p, gx.p, nullptr, low, N, C, OC, false, true);
        CHECK(fdx.get() == gdx.get());
        CHECK(fdw.get() == gdw.get());
        if (with_bias) CHECK(fdb.get() == gdb.get());
      }
    }
  }
}

TEST_CASE("conv2d forward and backward: 3x3 pad 1, 5x5 stride 2 pad 2, 1x1", "[cuda]") {
  Pair g;
  for (ConvShape s : {ConvShape{4, 3, 16, 16, 8, 3, 1, 1}, ConvShape{2, 5, 13, 11, 7, 5, 2, 2}, ConvShape{3, 6, 7, 7, 4, 1, 1, 0}}) {
    const int64_t OHW = s.OH() * s.OW(), cols = s.CKK() * s.B * OHW;
    auto x = randn(s.B * s.C * s.H * s.W, 17), w = randn(s.OC * s.CKK(), 18), b = randn(s.OC, 19), dy = randn(s.B * s.OC * OHW, 20);
    auto dw0 = randn(s.OC * s.CKK(), 21), db0 = randn(s.OC, 22);
    std::vector<float> co(static_cast<size_t>(s.B * s.OC * OHW)), ccol(static_cast<size_t>(cols)), cdx(x.size()), cdw = dw0, cdb = db0;
    conv2d_forward(g.cpu, co.data(), ccol.data(), x.data(), w.data(), b.data(), s);
    conv2d_backward(g.cpu, cdx.data(), cdw.data(), cdb.data(), dy.data(), ccol.data(), w.data(), s);
    Dev<float> dx(x), dw(w), db(b), ddy(dy), out(int64_t(co.size())), col(cols), gx(int64_t(x.size())), gw(dw0), gb(db0);
    cuda::conv2d_forward(g.gpu, out.p, col.p, dx.p, dw.p, db.p, s);
    cuda::conv2d_backward(g.gpu, gx.p, gw.p, gb.p, ddy.p, col.p, dw.p, s);
    INFO("K " << s.K << " stride " << s.stride << " pad " << s.pad);
    CHECK(bitwise(col.get(), ccol));  // im2col copies
    CHECK(rel(out.get(), co) < kF32);
    CHECK(rel(gx.get(), cdx) < kF32);
    CHECK(rel(gw.get(), cdw) < kF32);
    CHECK(rel(gb.get(), cdb) < kF32);
  }
}

TEST_CASE("layernorm and batchnorm, forward and backward", "[cuda]") {
  Pair g;
  for (const int64_t N : {33, 700}) {  // 700 rows: three chunks of dweight's and dbias's two-pass sums
    const int64_t C = 300;
    INFO("layernorm over " << N << " rows");
    auto x = randn(N * C, 23, 3.0f), w = randn(C, 24), b = randn(C, 25), dy = randn(N * C, 26), dw0 = randn(C, 27), db0 = randn(C, 28);
    for (auto& v : x) v += 2.0f;  // a mean away from zero
    std::vector<float> co(x.size()), cm(static_cast<size_t>(N)), cr(static_cast<size_t>(N)), cdx(x.size()), cdw = dw0, cdb = db0;
    layernorm_forward(g.cpu, co.data(), cm.data(), cr.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    layernorm_backward(g.cpu, cdx.data(), cdw.data(), cdb.data(), dy.data(), x.data(), w.data(), cm.data(), cr.data(), N, C);
    Dev<float> dx(x), dw(w), db(b), ddy(dy), out(N * C), m(N), r(N), gx(N * C), gw(dw0), gb(db0);
    cuda::layernorm_forward(g.gpu, out.p, m.p, r.p, dx.p, dw.p, db.p, N, C, 1e-5f);
    cuda::layernorm_backward(g.gpu, gx.p, gw.p, gb.p, ddy.p, dx.p, dw.p, m.p, r.p, N, C);
    CHECK(rel(out.get(), co) < kF32);
    CHECK(rel(m.get(), cm) < kF32);
    CHECK(rel(r.get(), cr) < kF32);
    CHECK(rel(gx.get(), cdx) < kF32);
    CHECK(rel(gw.get(), cdw) < kF32);
    CHECK(rel(gb.get(), cdb) < kF32);
    for (DType low : {DType::bf16, DType::f16}) {  // the forward on 16-bit tensors: the f32 statistics, the output within a rounding
      INFO("layernorm_forward_16 in " << dtype_name(low));
      std::vector<uint16_t> x16(x.size()), w16(w.size()), b16(b.size()), cy(x.size());
      convert(x.data(), DType::f32, x16.data(), low, N * C);
      convert(w.data(), DType::f32, w16.data(), low, C);
      convert(b.data(), DType::f32, b16.data(), low, C);
      std::vector<float> cm16(static_cast<size_t>(N)), cr16(static_cast<size_t>(N));
      layernorm_forward_16(g.cpu, cy.data(), cm16.data(), cr16.data(), x16.data(), w16.data(), b16.data(), low, N, C, 1e-5f);
      Dev<uint16_t> gx16(x16), gw16(w16), gb16(b16), gy(N * C);
      Dev<float> gm(N), gr(N);
      cuda::layernorm_forward_16(g.gpu, gy.p, gm.p, gr.p, gx16.p, gw16.p, gb16.p, low, N, C, 1e-5f);
      std::vector<float> a(x.size()), got(x.size());
      convert(cy.data(), low, a.data(), DType::f32, N * C);
      convert(gy.get().data(), low, got.data(), DType::f32, N * C);
      CHECK(rel(got, a) < 1e-2);
      CHECK(rel(gm.get(), cm16) < kF32);
      CHECK(rel(gr.get(), cr16) < kF32);
      // and the backward on 16-bit tensors (the same f32 statistics on both sides): dx within a rounding, dweight
      // and dbias accumulated onto their 16-bit values
      INFO("layernorm_backward_16 in " << dtype_name(low));
      std::vector<uint16_t> dy16(x.size()), dw16(w.size()), db16(b.size());
      convert(dy.data(), DType::f32, dy16.data(), low, N * C);
      convert(dw0.data(), DType::f32, dw16.data(), low, C);
      convert(db0.data(), DType::f32, db16.data(), low, C);
      std::vector<uint16_t> cdx16(x.size()), cdw16 = dw16, cdb16 = db16;
      layernorm_backward_16(g.cpu, cdx16.data(), cdw16.data(), cdb16.data(), dy16.data(), x16.data(), w16.data(), cm16.data(), cr16.data(),
                            low, N, C);
      Dev<uint16_t> gdy16(dy16), gdx16(N * C), gdw16(dw16), gdb16(db16);
      Dev<float> cm_d(cm16), cr_d(cr16);
      cuda::layernorm_backward_16(g.gpu, gdx16.p, gdw16.p, gdb16.p, gdy16.p, gx16.p, gw16.p, cm_d.p, cr_d.p, low, N, C);
      CHECK(rel(widen16(low, gdx16.get()), widen16(low, cdx16)) < 1e-2);
      CHECK(rel(widen16(low, gdw16.get()), widen16(low, cdw16)) < 1e-2);
      CHECK(rel(widen16(low, gdb16.get()), widen16(low, cdb16)) < 1e-2);
    }
  }
  {
    const int64_t B = 6, C = 7, HW = 50;
    auto x = randn(B * C * HW, 29, 2.0f), w = randn(C, 30), b = randn(C, 31), dy = randn(B * C * HW, 32);
    std::vector<float> cm(static_cast<size_t>(C)), cv(static_cast<size_t>(C)), cr(static_cast<size_t>(C)), co(x.size()), csd(static_cast<size_t>(C)), csx(static_cast<size_t>(C)), cdx(x.size());
    batchnorm_stats(g.cpu, cm.data(), cv.data(), x.data(), B, C, HW);
    for (int64_t c = 0; c < C; c++) cr[size_t(c)] = 1.0f / std::sqrt(cv[size_t(c)] + 1e-5f);
    batchnorm_apply(g.cpu, co.data(), x.data(), cm.data(), cr.data(), w.data(), b.data(), B, C, HW);
    batchnorm_backward_reduce(g.cpu, csd.data(), csx.data(), dy.data(), x.data(), cm.data(), cr.data(), B, C, HW);
    batchnorm_backward_apply(g.cpu, cdx.data(), dy.data(), x.data(), cm.data(), cr.data(), w.data(), csd.data(), csx.data(), double(B * HW), B, C, HW);
    Dev<float> dx(x), dw(w), db(b), ddy(dy), m(C), v(C), r(cr), out(int64_t(x.size())), sd(C), sx(C), gx(int64_t(x.size()));
    cuda::batchnorm_stats(g.gpu, m.p, v.p, dx.p, B, C, HW);
    CHECK(rel(m.get(), cm) < kF32);
    CHECK(rel(v.get(), cv) < kF32);
    Dev<float> cmean(cm);  // the same statistics on both sides from here
    cuda::batchnorm_apply(g.gpu, out.p, dx.p, cmean.p, r.p, dw.p, db.p, B, C, HW);
    cuda::batchnorm_backward_reduce(g.gpu, sd.p, sx.p, ddy.p, dx.p, cmean.p, r.p, B, C, HW);
    Dev<float> csd_d(csd), csx_d(csx);
    cuda::batchnorm_backward_apply(g.gpu, gx.p, ddy.p, dx.p, cmean.p, r.p, dw.p, csd_d.p, csx_d.p, double(B * HW), B, C, HW);
    CHECK(rel(out.get(), co) < kF32);
    CHECK(rel(sd.get(), csd) < kF32);
    CHECK(rel(sx.get(), csx) < kF32);
    CHECK(rel(gx.get(), cdx) < kF32);
  }
}

TEST_CASE("DeviceMemory::upload: copies queued through the page-locked ring land in stream order, the host's buffer free at once", "[cuda]") {
  CudaContext cx{0};
  CudaDeviceMemory mem(cx);
  // more uploads than the ring has buffers, of growing and shrinking sizes, each host vector overwritten as
  // soon as upload returns; then one above the ring's largest (16 MiB), which takes from_host's waiting copy
  std::vector<void*> dst;
  std::vector<std::vector<int32_t>> want;
  const int64_t before = mem.host_waits();
  for (int k = 0; k < 11; k++) {
    const int64_t n = k == 10 ? (int64_t(16) << 20) / 4 + 1 : int64_t(1000) << (k % 6);
    std::vector<int32_t> host(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) host[size_t(i)] = int32_t(k * 1000003 + i);
    void* d = mem.alloc(n * 4);
    REQUIRE(d != nullptr);
    mem.upload(d, host.data(), n * 4);
    want.push_back(host);
    std::fill(host.begin(), host.end(), -1);
    dst.push_back(d);
  }
  CHECK(mem.host_waits() - before <= 2);  // the large one's wait; a ring buffer still in flight may add one
  for (size_t k = 0; k < dst.size(); k++) {
    std::vector<int32_t> got(want[k].size());
    mem.to_host(got.data(), dst[k], int64_t(got.size()) * 4);
    INFO("upload " << k);
    CHECK(got == want[k]);
    mem.free(dst[k], int64_t(got.size()) * 4);
  }
}

TEST_CASE("softmax cross-entropy: loss, right answers, gradient, an ignored target, and a target out of range", "[cuda]") {
  Pair g;
  const int64_t N = 41, V = 1000;
  auto logits = randn(N * V, 33, 2.0f);
  std::vector<int32_t> t(static_cast<size_t>(N));
  Rng r(34);
  for (auto& v : t) v = int32_t(r.below(uint64_t(V)));
  t[3] = -1;                                                   // ignore_index
  for (int64_t v = 0; v < V; v++) logits[size_t(7 * V + v)] = 1.0f;  // all tied: the first wins
  t[7] = 0;
  std::vector<float> cp(logits.size()), cd(logits.size());
  int64_t c_correct = 0, g_correct = 0;
  const double cl = softmax_crossentropy_forward(g.cpu, cp.data(), logits.data(), t.data(), N, V, &c_correct);
  softmax_crossentropy_backward(g.cpu, cd.data(), cp.data(), t.data(), N, V, 0.5f);
  Dev<float> dl(logits), p(N * V), d(N * V);
  Dev<int32_t> dt(t);
  const double gl = cuda::softmax_crossentropy_forward(g.gpu, p.p, dl.p, dt.p, N, V, &g_correct, nullptr);
  {  // training's way: the mean left in a device slot (read after the step), the same bits as read back now
    Dev<double> slot(std::vector<double>{-1.0});
    Dev<float> p2(N * V);
    CHECK(cuda::softmax_crossentropy_forward(g.gpu, p2.p, dl.p, dt.p, N, V, nullptr, slot.p) == 0.0);
    CHECK(slot.get()[0] == gl);
    CHECK(bitwise(p2.get(), p.get()));
    CHECK(cuda::softmax_crossentropy_forward(g.gpu, p2.p, dl.p, dt.p, 0, V, nullptr, slot.p) == 0.0);
    CHECK(slot.get()[0] == 0.0);
  }
  cuda::softmax_crossentropy_backward(g.gpu, d.p, p.p, dt.p, N, V, 0.5f);
  CHECK(std::abs(gl - cl) / cl < kF32);
  CHECK(g_correct == c_correct);
  CHECK(g_correct >= 1);
  CHECK(rel(p.get(), cp) < kF32);
  CHECK(rel(d.get(), cd) < kF32);
  // the 16-bit forms: logits read in bf16/fp16 (the same values as their f32 widening, so the same kernel's
  // results bit for bit), the gradient written in 16 bits (the f32 gradient rounded once)
  for (DType low : {DType::bf16, DType::f16}) {
    INFO("softmax_crossentropy_*_16 in " << dtype_name(low));
    std::vector<uint16_t> l16(logits.size());
    convert(logits.data(), DType::f32, l16.data(), low, N * V);
    std::vector<float> lw(logits.size());
    convert(l16.data(), low, lw.data(), DType::f32, N * V);
    Dev<uint16_t> gl16(l16), gd16(N * V);
    Dev<float> glw(lw), p16(N * V), pw(N * V), dw(N * V);
    int64_t c16 = 0, cw = 0;
    const double m16 = cuda::softmax_crossentropy_forward_16(g.gpu, p16.p, gl16.p, low, dt.p, N, V, &c16, nullptr);
    const double mw = cuda::softmax_crossentropy_forward(g.gpu, pw.p, glw.p, dt.p, N, V, &cw, nullptr);
    CHECK(m16 == mw);
    CHECK(c16 == cw);
    CHECK(bitwise(p16.get(), pw.get()));
    cuda::softmax_crossentropy_backward_16(g.gpu, gd16.p, low, p16.p, dt.p, N, V, 0.5f);
    cuda::softmax_crossentropy_backward(g.gpu, dw.p, pw.p, dt.p, N, V, 0.5f);
    std::vector<uint16_t> rounded(logits.size());
    const auto d32 = dw.get();
    convert(d32.data(), DType::f32, rounded.data(), low, N * V);
    CHECK(gd16.get() == rounded);
  }
  t[9] = int32_t(V);
  Dev<int32_t> bad(t);
  CHECK_THROWS_WITH(cuda::softmax_crossentropy_forward(g.gpu, p.p, dl.p, bad.p, N, V, nullptr, nullptr),
                    Catch::Contains("target 1000 is out of range for 1000 classes"));
}

TEST_CASE("the vocabulary-parallel loss's three kernels on one rank's columns (no all-reduce between them: one rank)", "[cuda]") {
  Pair g;
  const int64_t N = 13, V = 700, first = 1400;  // rank 2 of a vocabulary split in slices of 700
  auto logits = randn(N * V, 33, 4.0f);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; n++) t[size_t(n)] = int32_t(n % 3 == 0 ? first + 37 * n : n % 3 == 1 ? 5 * n : first + V + n);
  t[4] = -1;                                                   // ignored
  logits[size_t(3 * V + 37 * 3)] = 50.0f;                      // row 3's target is its max: a hit
  std::vector<float> cmx(static_cast<size_t>(N)), csum(cmx.size()), czt(cmx.size()), cp(logits.size());
  int64_t c_correct = 0, g_correct = 0;
  vocab_ce_max(g.cpu, cmx.data(), logits.data(), N, V);
  vocab_ce_exp(g.cpu, cp.data(), csum.data(), czt.data(), logits.data(), cmx.data(), t.data(), first, N, V);
  const double cl = vocab_ce_finish(g.cpu, cp.data(), csum.data(), czt.data(), cmx.data(), t.data(), N, V, &c_correct);
  Dev<float> dl(logits), mx(N), sum(N), zt(N), p(N * V);
  Dev<int32_t> dt(t);
  cuda::vocab_ce_max(g.gpu, mx.p, dl.p, N, V);
  cuda::vocab_ce_exp(g.gpu, p.p, sum.p, zt.p, dl.p, mx.p, dt.p, first, N, V);
  const std::vector<float> probs_before = p.get();  // vocab_ce_finish divides them in place
  const double gl = cuda::vocab_ce_finish(g.gpu, p.p, sum.p, zt.p, mx.p, dt.p, N, V, &g_correct, nullptr);
  {  // the mean into a device slot instead: the same bits
    Dev<float> p2(probs_before);
    Dev<double> slot(std::vector<double>{-1.0});
    CHECK(cuda::vocab_ce_finish(g.gpu, p2.p, sum.p, zt.p, mx.p, dt.p, N, V, nullptr, slot.p) == 0.0);
    CHECK(slot.get()[0] == gl);
    CHECK(bitwise(p2.get(), p.get()));
  }
  CHECK(bitwise(mx.get(), cmx));
  CHECK(bitwise(zt.get(), czt));
  CHECK(rel(sum.get(), csum) < kF32);
  CHECK(rel(p.get(), cp) < kF32);
  CHECK(std::abs(gl - cl) / std::abs(cl) < kF32);
  CHECK(g_correct == c_correct);
  CHECK(c_correct >= 1);
}

TEST_CASE("LLaMA's kernels (RMSNorm, RoPE, SwiGLU, repeat_kv) on the GPU equal the cpu's", "[cuda][llama]") {
  Pair g;
  const int64_t N = 37, C = 40;
  auto x = randn(N * C, 44), w = randn(C, 45), dy = randn(N * C, 46), dw0 = randn(C, 47);
  std::vector<float> co(static_cast<size_t>(N * C)), cr(static_cast<size_t>(N)), cdx(static_cast<size_t>(N * C)), cdw = dw0;
  rmsnorm_forward(g.cpu, co.data(), cr.data(), x.data(), w.data(), N, C, 1e-5f);
  rmsnorm_backward(g.cpu, cdx.data(), cdw.data(), dy.data(), x.data(), w.data(), cr.data(), N, C);
  Dev<float> dx_(x), dw_(w), ddy(dy), out(N * C), r(N), gdx(N * C), gdw(dw0);
  cuda::rmsnorm_forward(g.gpu, out.p, r.p, dx_.p, dw_.p, N, C, 1e-5f);
  cuda::rmsnorm_backward(g.gpu, gdx.p, gdw.p, ddy.p, dx_.p, dw_.p, r.p, N, C);
  CHECK(rel(out.get(), co) < kF32);
  CHECK(rel(r.get(), cr) < kF32);
  CHECK(rel(gdx.get(), cdx) < kF32);
  CHECK(rel(gdw.get(), cdw) < kF32);
  // RoPE on q's 4 heads of 10 inside rows of 3·40 (a fused buffer's stride), there and back
  const int64_t B = 2, T = 9, H = 4, hd = 10, ld = 3 * 40;
  auto q = randn(B * T * ld, 48);
  std::vector<float> cq = q;
  rope_apply(g.cpu, cq.data(), B, T, H, hd, ld, 500000.0f, false);
  Dev<float> gq(q);
  cuda::rope_apply(g.gpu, gq.p, B, T, H, hd, ld, 500000.0f, false);
  CHECK(rel(gq.get(), cq) < kF32);
  cuda::rope_apply(g.gpu, gq.p, B, T, H, hd, ld, 500000.0f, true);
  CHECK(rel(gq.get(), q) < kF32);
  // SwiGLU
  auto gate = randn(N * C, 49), up = randn(N * C, 50);
  std::vector<float> ch(size_t(N * C)), cdg(ch.size()), cdu(ch.size());
  swiglu_forward(g.cpu, ch.data(), gate.data(), up.data(), N * C);
  swiglu_backward(g.cpu, cdg.data(), cdu.data(), dy.data(), gate.data(), up.data(), N * C);
  Dev<float> dg_(gate), du_(up), h(N * C), gdg(N * C), gdu(N * C);
  cuda::swiglu_forward(g.gpu, h.p, dg_.p, du_.p, N * C);
  cuda::swiglu_backward(g.gpu, gdg.p, gdu.p, ddy.p, dg_.p, du_.p, N * C);
  CHECK(rel(h.get(), ch) < kF32);
  CHECK(rel(gdg.get(), cdg) < kF32);
  CHECK(rel(gdu.get(), cdu) < kF32);
  // repeat_kv: 6 query heads over 2 kv heads of 4, and back (the sums bit for bit: same order)
  const int64_t Hq = 6, KV = 2, d = 4;
  auto qq = randn(B * T * Hq * d, 51), kk = randn(B * T * KV * d, 52), vv = randn(B * T * KV * d, 53), gq3 = randn(B * T * 3 * Hq * d, 54);
  std::vector<float> cqkv(gq3.size()), cdq(qq.size()), cdk(kk.size()), cdv(vv.size());
  repeat_kv_forward(g.cpu, cqkv.data(), qq.data(), kk.data(), vv.data(), B, T, Hq, KV, d);
  repeat_kv_backward(g.cpu, cdq.data(), cdk.data(), cdv.data(), gq3.data(), B, T, Hq, KV, d);
  Dev<float> a(qq), bk(kk), bv(vv), qkv(int64_t(gq3.size())), g3(gq3), oq(int64_t(qq.size())), ok(int64_t(kk.size())), ov(int64_t(vv.size()));
  cuda::repeat_kv_forward(g.gpu, qkv.p, a.p, bk.p, bv.p, B, T, Hq, KV, d);
  cuda::repeat_kv_backward(g.gpu, oq.p, ok.p, ov.p, g3.p, B, T, Hq, KV, d);
  CHECK(bitwise(qkv.get(), cqkv));
  CHECK(bitwise(oq.get(), cdq));
  CHECK(bitwise(ok.get(), cdk));
  CHECK(bitwise(ov.get(), cdv));
  // The 16-bit forms against the cpu's (widen, the f32 kernel, round once): within a rounding (1e-2 of the
  // largest value); qkv the GPU's own rotated q and k and v, repeated, bit for bit
  for (DType low : {DType::bf16, DType::f16}) {
    INFO("the 16-bit forms in " << dtype_name(low));
    const auto x16 = round16(low, x), w16 = round16(low, w), dy16 = round16(low, dy), dw16 = round16(low, dw0), gate16 = round16(low, gate), up16 = round16(low, up);
    std::vector<uint16_t> cy(x16.size()), cdx16(x16.size()), cdw16 = dw16;
    std::vector<float> cr16(static_cast<size_t>(N));
    rmsnorm_forward_16(g.cpu, cy.data(), cr16.data(), x16.data(), w16.data(), low, N, C, 1e-5f);
    rmsnorm_backward_16(g.cpu, cdx16.data(), cdw16.data(), dy16.data(), x16.data(), w16.data(), cr16.data(), low, N, C);
    Dev<uint16_t> gx(x16), gw(w16), gdy(dy16), gy(N * C), gdx16(N * C), gdw16(dw16);
    Dev<float> gr(N);
    cuda::rmsnorm_forward_16(g.gpu, gy.p, gr.p, gx.p, gw.p, low, N, C, 1e-5f);
    Dev<float> cr_d(cr16);  // the same rstd on both sides for the backward
    cuda::rmsnorm_backward_16(g.gpu, gdx16.p, gdw16.p, gdy.p, gx.p, gw.p, cr_d.p, low, N, C);
    CHECK(rel(widen16(low, gy.get()), widen16(low, cy)) < 1e-2);
    CHECK(rel(gr.get(), cr16) < kF32);
    CHECK(rel(widen16(low, gdx16.get()), widen16(low, cdx16)) < 1e-2);
    CHECK(rel(widen16(low, gdw16.get()), widen16(low, cdw16)) < 1e-2);
    std::vector<uint16_t> ch16(gate16.size()), cdg16(gate16.size()), cdu16(gate16.size());
    swiglu_forward_16(g.cpu, ch16.data(), gate16.data(), up16.data(), low, N * C);
    swiglu_backward_16(g.cpu, cdg16.data(), cdu16.data(), dy16.data(), gate16.data(), up16.data(), low, N * C);
    Dev<uint16_t> gg(gate16), gu(up16), gh(N * C), gdg16(N * C), gdu16(N * C);
    cuda::swiglu_forward_16(g.gpu, gh.p, gg.p, gu.p, low, N * C);
    cuda::swiglu_backward_16(g.gpu, gdg16.p, gdu16.p, gdy.p, gg.p, gu.p, low, N * C);
    CHECK(rel(widen16(low, gh.get()), widen16(low, ch16)) < 1e-2);
    CHECK(rel(widen16(low, gdg16.get()), widen16(low, cdg16)) < 1e-2);
    CHECK(rel(widen16(low, gdu16.get()), widen16(low, cdu16)) < 1e-2);
    // RoPE and repeat_kv: 6 query heads over 2 kv heads of 4, q and k turned in place, and back
    auto q16 = round16(low, qq), k16 = round16(low, kk);
    const auto v16 = round16(low, vv), g16 = round16(low, gq3);
    std::vector<uint16_t> cqkv16(gq3.size()), cq16 = q16, ck16 = k16;
    rope_repeat_kv_forward_16(g.cpu, cqkv16.data(), cq16.data(), ck16.data(), v16.data(), low, B, T, Hq, KV, d, 10000.0f, true);
    Dev<uint16_t> gq16(q16), gk16(k16), gv16(v16), gqkv16(int64_t(gq3.size()));
    cuda::rope_repeat_kv_forward_16(g.gpu, gqkv16.p, gq16.p, gk16.p, gv16.p, low, B, T, Hq, KV, d, 10000.0f, true);
    CHECK(rel(widen16(low, gqkv16.get()), widen16(low, cqkv16)) < 1e-2);
    CHECK(rel(widen16(low, gq16.get()), widen16(low, cq16)) < 1e-2);
    CHECK(rel(widen16(low, gk16.get()), widen16(low, ck16)) < 1e-2);
    {  // qkv holds the GPU's own turned q and k, and v, each kv head repeated for its query heads: copies, bit for bit
      const auto o = gqkv16.get(), rq = gq16.get(), rk = gk16.get();
      const int64_t Cq = Hq * d, Ckv = KV * d, group = Hq / KV;
      bool same = true;
      for (int64_t bt = 0; bt < B * T; bt++)
        for (int64_t c = 0; c < Cq; c++) {
          const int64_t kv = bt * Ckv + (c / d / group) * d + c % d;
          same = same && o[size_t(bt * 3 * Cq + c)] == rq[size_t(bt * Cq + c)] && o[size_t(bt * 3 * Cq + Cq + c)] == rk[size_t(kv)] &&
                 o[size_t(bt * 3 * Cq + 2 * Cq + c)] == v16[size_t(kv)];
        }
      CHECK(same);
    }
    std::vector<uint16_t> cdq16(qq.size()), cdk16(kk.size()), cdv16(vv.size());
    rope_repeat_kv_backward_16(g.cpu, cdq16.data(), cdk16.data(), cdv16.data(), g16.data(), low, B, T, Hq, KV, d, 10000.0f);
    Dev<uint16_t> gg16(g16), gdq(int64_t(qq.size())), gdk(int64_t(kk.size())), gdv(int64_t(vv.size()));
    cuda::rope_repeat_kv_backward_16(g.gpu, gdq.p, gdk.p, gdv.p, gg16.p, low, B, T, Hq, KV, d, 10000.0f);
    CHECK(rel(widen16(low, gdq.get()), widen16(low, cdq16)) < 1e-2);
    CHECK(rel(widen16(low, gdk.get()), widen16(low, cdk16)) < 1e-2);
    CHECK(gdv.get() == cdv16);  // no turn: the same f32 sums, rounded once
  }
}

TEST_CASE("QLoRA's dequantize: NF4 with and without double quantization, bit for bit the cpu's (no fused multiply-add)", "[cuda][qlora]") {
  Pair g;
  const int64_t n = 64 * 600 + 2;  // 601 blocks of 64 (the last short), 3 blocks of 256 constants (the last short)
  const auto w = randn(n, 60, 0.02f);
  for (const bool dq : {true, false}) {
    INFO("double quantization " << dq);
    const Nf4Weights q = nf4_quantize_weights(w.data(), n, dq);
    std::vector<float> cpu(static_cast<size_t>(n)), host(static_cast<size_t>(n));
    dequantize_nf4(g.cpu, cpu.data(), q.packed.data(), dq ? q.absmax_q.data() : nullptr, dq ? q.absmax2.data() : q.absmax.data(), q.offset, n,
                   q.block, q.block2);
    nf4_dequantize_weights(q, host.data());
    CHECK(bitwise(cpu, host));  // the kernel and the reference path agree
    Dev<uint8_t> packed(q.packed), absmax_q(dq ? q.absmax_q : std::vector<uint8_t>(1));
    Dev<float> absmax(dq ? q.absmax2 : q.absmax), out(n);
    cuda::dequantize_nf4(g.gpu, out.p, packed.p, dq ? absmax_q.p : nullptr, absmax.p, q.offset, n, q.block, q.block2);
    CHECK(bitwise(out.get(), cpu));
  }
}

TEST_CASE("flash attention on the GPU equals the cpu's flash kernels (and the naive ones), head sizes 12 to 200, repeatable bit for bit", "[cuda][flash]") {
  Pair g;
  struct Case { int64_t B, T, C, NH; };
  // hs 200 needs more than 48 KiB of shared memory a block: the opt-in path
  for (Case k : {Case{2, 1, 48, 4}, Case{2, 37, 48, 4}, Case{1, 64, 128, 2}, Case{2, 100, 200, 1}}) {
    INFO("B " << k.B << " T " << k.T << " C " << k.C << " heads " << k.NH);
    auto qkv = randn(k.B * k.T * 3 * k.C, 42), dy = randn(k.B * k.T * k.C, 43);
    std::vector<float> co(size_t(k.B * k.T * k.C)), cl(size_t(k.B * k.NH * k.T)), cd(qkv.size());
    flash_attention_forward(g.cpu, co.data(), cl.data(), qkv.data(), k.B, k.T, k.C, k.NH);
    flash_attention_backward(g.cpu, cd.data(), dy.data(), qkv.data(), co.data(), cl.data(), k.B, k.T, k.C, k.NH);
    std::vector<float> no(co.size()), na(size_t(k.B * k.NH * k.T * k.T)), nd(qkv.size());
    attention_forward(g.cpu, no.data(), na.data(), qkv.data(), k.B, k.T, k.C, k.NH);
    attention_backward(g.cpu, nd.data(), dy.data(), qkv.data(), na.data(), k.B, k.T, k.C, k.NH);
    Dev<float> dq(qkv), ddy(dy), out(k.B * k.T * k.C), lse(k.B * k.NH * k.T), dqkv(int64_t(qkv.size())), dqkv2(int64_t(qkv.size()));
    cuda::flash_attention_forward(g.gpu, out.p, lse.p, dq.p, k.B, k.T, k.C, k.NH);
    cuda::flash_attention_backward(g.gpu, dqkv.p, ddy.p, dq.p, out.p, lse.p, k.B, k.T, k.C, k.NH);
    cuda::flash_attention_backward(g.gpu, dqkv2.p, ddy.p, dq.p, out.p, lse.p, k.B, k.T, k.C, k.NH);
    CHECK(rel(out.get(), co) < kF32);
    CHECK(rel(lse.get(), cl) < kF32);
    CHECK(rel(dqkv.get(), cd) < kF32);
    CHECK(rel(out.get(), no) < kF32);
    CHECK(rel(dqkv.get(), nd) < kF32);
    CHECK(bitwise(dqkv.get(), dqkv2.get()));  // no atomics: the same bits every time
  }
}

TEST_CASE("flash attention on tensor cores (bf16 and fp16 math): the cpu's flash kernels on the same rounded inputs, within the rounding of P and dS", "[cuda][flash]") {
  // The tolerances are what the kernels' algorithm gives when emulated in f32 with P and dS rounded to 16
  // bits (bf16: out 9e-4, gradients 2.4e-3 at worst; fp16: 1.3e-4 and 5.4e-4), with room for another order.
  Pair g;
  int major = 0;
  DL_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  struct Case { int64_t B, T, C, NH; };
  for (GemmMath math : {GemmMath::bf16, GemmMath::f16}) {
    const DType low = math == GemmMath::bf16 ? DType::bf16 : DType::f16;
    const double tol_out = math == GemmMath::bf16 ? 5e-3 : 1e-3, tol_grad = math == GemmMath::bf16 ? 1e-2 : 2.5e-3;
    // head sizes 32, 64, 96, 128; T of 1, under a tile, a tile, over one; 80 is not a tensor-core size
    for (Case k : {Case{2, 37, 64, 2}, Case{1, 200, 128, 2}, Case{1, 1, 96, 1}, Case{2, 64, 64, 1}, Case{2, 130, 256, 2},
                   Case{1, 70, 160, 2}}) {
      const int64_t hs = k.C / k.NH;
      INFO(dtype_name(low) << ": B " << k.B << " T " << k.T << " C " << k.C << " heads " << k.NH);
      g.cx.math = math;
      const bool tc = cuda::flash_tensor_cores(g.gpu, hs);
      INFO("tensor cores: " << tc);
      if (major >= 8 && hs <= 64) CHECK(tc);  // 96 and 128 need more shared memory than sm 86/89 give (A100, H100: enough)
      if (major < 8 || hs == 80) CHECK(!tc);
      auto qkv = randn(k.B * k.T * 3 * k.C, 44), dy = randn(k.B * k.T * k.C, 45);
      round_f32(qkv.data(), qkv.data(), int64_t(qkv.size()), low);
      round_f32(dy.data(), dy.data(), int64_t(dy.size()), low);
      std::vector<float> co(size_t(k.B * k.T * k.C)), cl(size_t(k.B * k.NH * k.T)), cd(qkv.size());
      flash_attention_forward(g.cpu, co.data(), cl.data(), qkv.data(), k.B, k.T, k.C, k.NH);
      flash_attention_backward(g.cpu, cd.data(), dy.data(), qkv.data(), co.data(), cl.data(), k.B, k.T, k.C, k.NH);
      Dev<float> dq(qkv), ddy(dy), out(k.B * k.T * k.C), out2(k.B * k.T * k.C), lse(k.B * k.NH * k.T), dqkv(int64_t(qkv.size())),
          dqkv2(int64_t(qkv.size()));
      cuda::flash_attention_forward(g.gpu, out.p, lse.p, dq.p, k.B, k.T, k.C, k.NH);
      cuda::flash_attention_forward(g.gpu, out2.p, lse.p, dq.p, k.B, k.T, k.C, k.NH);
      cuda::flash_attention_backward(g.gpu, dqkv.p, ddy.p, dq.p, out.p, lse.p, k.B, k.T, k.C, k.NH);
      cuda::flash_attention_backward(g.gpu, dqkv2.p, ddy.p, dq.p, out.p, lse.p, k.B, k.T, k.C, k.NH);
      CHECK(rel(out.get(), co) < (tc ? tol_out : kF32));
      CHECK(rel(lse.get(), cl) < 1e-5);
      CHECK(rel(dqkv.get(), cd) < (tc ? tol_grad : kF32));
      CHECK(bitwise(out.get(), out2.get()));
      CHECK(bitwise(dqkv.get(), dqkv2.get()));  // no atomics: the same bits every time
      // The 16-bit tensors' forms (a 16-bit run's): the same sums on the same rounded operands, each result
      // rounded once, so the f32 form's results rounded, bit for bit (the backward given the rounded out);
      // where the tensor cores don't take the head size, the f32 kernels between copies: the same bits too.
      INFO("flash_attention_*_16");
      Dev<uint16_t> q16(round16(low, qkv)), dy16(round16(low, dy)), out16(k.B * k.T * k.C), dqkv16(int64_t(qkv.size()));
      Dev<float> lse16(k.B * k.NH * k.T);
      cuda::flash_attention_forward_16(g.gpu, out16.p, lse16.p, q16.p, low, k.B, k.T, k.C, k.NH);
      cuda::flash_attention_backward_16(g.gpu, dqkv16.p, dy16.p, q16.p, out16.p, lse16.p, low, k.B, k.T, k.C, k.NH);
      const std::vector<float> out_rounded = widen16(low, out16.get());
      CHECK(bitwise(out_rounded, widen16(low, round16(low, out.get()))));
      CHECK(bitwise(lse16.get(), lse.get()));
      Dev<float> out_r(out_rounded), dqkv3(int64_t(qkv.size()));
      cuda::flash_attention_backward(g.gpu, dqkv3.p, ddy.p, dq.p, out_r.p, lse.p, k.B, k.T, k.C, k.NH);
      CHECK(bitwise(widen16(low, dqkv16.get()), widen16(low, round16(low, dqkv3.get()))));
    }
  }
  g.cx.math = GemmMath::f32;
}

TEST_CASE("causal attention forward and backward (GPT-2's layout), and the embedding bit for bit", "[cuda]") {
  Pair g;
  const int64_t B = 2, T = 37, C = 48, NH = 4;
  auto qkv = randn(B * T * 3 * C, 35), dy = randn(B * T * C, 36);
  std::vector<float> co(static_cast<size_t>(B * T * C)), ca(static_cast<size_t>(B * NH * T * T)), cd(qkv.size());
  attention_forward(g.cpu, co.data(), ca.data(), qkv.data(), B, T, C, NH);
  attention_backward(g.cpu, cd.data(), dy.data(), qkv.data(), ca.data(), B, T, C, NH);
  Dev<float> dq(qkv), ddy(dy), out(B * T * C), att(B * NH * T * T), dqkv(int64_t(qkv.size()));
  cuda::attention_forward(g.gpu, out.p, att.p, dq.p, B, T, C, NH);
  cuda::attention_backward(g.gpu, dqkv.p, ddy.p, dq.p, att.p, B, T, C, NH);
  CHECK(rel(att.get(), ca) < kF32);
  CHECK(rel(out.get(), co) < kF32);
  CHECK(rel(dqkv.get(), cd) < kF32);
  {  // a bf16 run's math: the heads' products on bf16 operands with f32 sums, all heads in one call
    Runtime gb(DeviceKind::cuda);
    gb.cuda = &g.cx;
    gb.dtype = DType::bf16;
    Dev<float> out16(B * T * C), att16(B * NH * T * T), dqkv16(int64_t(qkv.size()));
    cuda::attention_forward(gb, out16.p, att16.p, dq.p, B, T, C, NH);
    cuda::attention_backward(gb, dqkv16.p, ddy.p, dq.p, att16.p, B, T, C, NH);
    CHECK(rel(att16.get(), ca) < 2e-2);  // a few bf16 roundings (2^-8) of the operands
    CHECK(rel(out16.get(), co) < 2e-2);
    CHECK(rel(dqkv16.get(), cd) < 3e-2);
  }

  const int64_t Vocab = 50;
  std::vector<int32_t> tok(static_cast<size_t>(B * T));
  Rng r(37);
  for (auto& v : tok) {  // repeats: several positions per row; -1 (about 1 in 6): another tensor-parallel rank's row
    v = int32_t(r.below(uint64_t(Vocab + 10)));
    if (v >= Vocab) v = -1;
  }
  auto wte = randn(Vocab * C, 38), wpe = randn(T * C, 39), dwte0 = randn(Vocab * C, 40), dwpe0 = randn(T * C, 41);
  std::vector<float> ce(static_cast<size_t>(B * T * C)), cdwte = dwte0, cdwpe = dwpe0;
  embedding_forward(g.cpu, ce.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  embedding_backward(g.cpu, cdwte.data(), cdwpe.data(), dy.data(), tok.data(), B, T, C);
  Dev<int32_t> dtok(tok);
  Dev<float> dwte(wte), dwpe(wpe), e(B * T * C), gwte(dwte0), gwpe(dwpe0);
  cuda::embedding_forward(g.gpu, e.p, dtok.p, dwte.p, dwpe.p, B, T, C);
  cuda::embedding_backward(g.gpu, gwte.p, gwpe.p, ddy.p, dtok.p, B, T, C);
  CHECK(bitwise(e.get(), ce));
  CHECK(bitwise(gwte.get(), cdwte));
  CHECK(bitwise(gwpe.get(), cdwpe));
  // the 16-bit tables and output (a device rank's 16-bit run): one f32 add of exact values, rounded once: the
  // cpu form's bits, with and without positions
  for (DType low : {DType::bf16, DType::f16}) {
    INFO("embedding_forward_16 in " << dtype_name(low));
    const auto wte16 = round16(low, wte), wpe16 = round16(low, wpe);
    std::vector<uint16_t> ce16(static_cast<size_t>(B * T * C)), ce16n(ce16.size());
    embedding_forward_16(g.cpu, ce16.data(), tok.data(), wte16.data(), wpe16.data(), low, B, T, C);
    embedding_forward_16(g.cpu, ce16n.data(), tok.data(), wte16.data(), nullptr, low, B, T, C);
    Dev<uint16_t> gwte16(wte16), gwpe16(wpe16), ge16(B * T * C), ge16n(B * T * C);
    cuda::embedding_forward_16(g.gpu, ge16.p, dtok.p, gwte16.p, gwpe16.p, low, B, T, C);
    cuda::embedding_forward_16(g.gpu, ge16n.p, dtok.p, gwte16.p, nullptr, low, B, T, C);
    CHECK(ge16.get() == ce16);
    CHECK(ge16n.get() == ce16n);
  }
}

TEST_CASE("dtype conversion and fill: the bits of core/tensor/dtype.cpp", "[cuda]") {
  Pair g;
  auto x = randn(4099, 42, 100.0f);
  x[0] = 1.0f + 1.0f / 256;  // a bf16 tie, to even
  x[1] = 70000.0f;           // over fp16's 65504: inf
  x[2] = 1e-8f;              // under fp16's smallest subnormal
  Dev<float> dx(x);
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> want(x.size());
    for (size_t i = 0; i < x.size(); i++) want[i] = t == DType::bf16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
    Dev<uint16_t> h(int64_t(x.size()));
    cuda::convert(g.gpu, dx.p, DType::f32, h.p, t, int64_t(x.size()));
    INFO(dtype_name(t));
    CHECK(h.get() == want);
    Dev<float> back(int64_t(x.size()));
    cuda::convert(g.gpu, h.p, t, back.p, DType::f32, int64_t(x.size()));
    std::vector<float> wback(x.size());
    for (size_t i = 0; i < x.size(); i++) wback[i] = t == DType::bf16 ? bf16_to_f32(want[i]) : f16_to_f32(want[i]);
    CHECK(bitwise(back.get(), wback));
    cuda::fill(g.gpu, h.p, t, 0.1f, int64_t(x.size()));
    CHECK(h.get() == std::vector<uint16_t>(x.size(), t == DType::bf16 ? f32_to_bf16(0.1f) : f32_to_f16(0.1f)));
  }
}

TEST_CASE("the caching allocator hands a freed block back, rounds like PyTorch, and says no instead of failing", "[cuda]") {
  Pair g;
  CudaAllocator& a = g.cx.allocator();
  CHECK(CudaAllocator::rounded(1) == 512);
  CHECK(CudaAllocator::rounded(1000) == 1024);
  CHECK(CudaAllocator::rounded((1 << 20) + 1) == int64_t(2) << 20);
  void* p = a.alloc(3000);
  REQUIRE(p);
  const int64_t reserved = a.reserved();
  a.free(p, 3000);
  CHECK(a.cached() == 3072);
  CHECK(a.alloc(2900) == p);  // same rounded size: the cached block, no cudaMalloc
  CHECK(a.reserved() == reserved);
  a.free(p, 2900);
  CHECK(a.alloc(int64_t(1) << 50) == nullptr);  // a petabyte: refused, and the error is cleared
  DL_CUDA(cudaGetLastError());
  a.empty_cache();
  CHECK(a.cached() == 0);
}

TEST_CASE("cuda tensors: GPU memory through the caching allocator, counted by category; fill, clone, copies both ways; OOM with the breakdown", "[cuda]") {
  CudaContext cx(0);
  CudaDeviceMemory mem(cx);
  Runtime rt(DeviceKind::cuda);
  attach_cuda(rt, cx, mem, int64_t(64) << 20);  // --device-mem 64 MiB: below any card's free memory
  CHECK(rt.memory.capacity() == int64_t(64) << 20);
  {
    Tensor w = rt.zeros({1000, 3}, Category::params, "w");
    Tensor g = rt.empty({1000, 3}, Category::grads, "g", DType::bf16);
    CHECK(rt.memory.current(Category::params) == 12000);
    CHECK(rt.memory.current(Category::grads) == 6000);
    CHECK(cx.allocator().reserved() >= 18000);
    Runtime host(DeviceKind::cpu);
    Tensor h = host.empty({1000, 3}, Category::params, "h");
    for (int64_t i = 0; i < 3000; i++) h.f32()[i] = float(i) * 0.001f + 1.0f;
    w.copy_from(h);  // up
    g.copy_from(w);  // on the device, rounded to bf16
    Tensor back = host.empty({1000, 3}, Category::params, "back");
    back.copy_from(g);  // down, widened on the host
    bool rounded = true;
    for (int64_t i = 0; i < 3000; i++) rounded = rounded && back.f32()[i] == round_to(h.f32()[i], DType::bf16);
    CHECK(rounded);
    Tensor c = w.clone(Category::optim_state, DType::f32);
    c.fill_(0.5f);
    back.copy_from(c);
    CHECK(back.f32()[2999] == 0.5f);
    c.zero_();
    back.copy_from(c);
    CHECK(back.f32()[17] == 0.0f);
    CHECK_THROWS_WITH(rt.empty({int64_t(16) << 20}, Category::activations, "a big activation"),
                      Catch::Contains("out of memory") && Catch::Contains("a big activation") && Catch::Contains("params"));
  }
  CHECK(rt.memory.stats().current_total == 0);  // every byte back to the accountant...
  CHECK(cx.allocator().cached() >= 18000);      // ...and the blocks to the cache, not the driver
}

TEST_CASE("CPU offload's host memory on a cuda rank is page-locked, cached, and crosses both ways in the smaller dtype", "[cuda]") {
  CudaContext cx(0);
  CudaDeviceMemory mem(cx);
  Runtime rt(DeviceKind::cuda);
  attach_cuda(rt, cx, mem);
  {
    Tensor part = Tensor::empty({5000}, rt.memory, DeviceKind::cpu, Category::host, DType::f32, "an offloaded part");
    Tensor plain = rt.host_empty({5000}, Category::activations, "a host array");
    CHECK(part.is_pinned());
    CHECK_FALSE(plain.is_pinned());
    cudaPointerAttributes attr{};
    DL_CUDA(cudaPointerGetAttributes(&attr, part.data()));
    CHECK(attr.type == cudaMemoryTypeHost);  // registered with the driver: DMA without a staging copy
    for (int64_t i = 0; i < 5000; i++) part.f32()[i] = float(i) - 2500.5f;
    Tensor up = rt.empty({5000}, Category::comm_buffers, "up");
    copy_across(rt, part.data(), DType::f32, DeviceKind::cpu, up.data(), DType::f32, DeviceKind::cuda, 5000);
    std::vector<float> check(5000);
    up.to_host(check.data());
    CHECK(std::memcmp(check.data(), part.data(), 5000 * sizeof(float)) == 0);  // up, every bit
    Tensor down = Tensor::empty({5000}, rt.memory, DeviceKind::cpu, Category::host, DType::bf16, "a gradient part");
    copy_across(rt, up.data(), DType::f32, DeviceKind::cuda, down.data(), DType::bf16, DeviceKind::cpu, 5000);  // rounded on the device, 2 bytes down
    bool same = true;
    for (int64_t i = 0; i < 5000; i++) same = same && bf16_to_f32(static_cast<const uint16_t*>(down.data())[i]) == round_to(float(i) - 2500.5f, DType::bf16);
    CHECK(same);
    copy_across(rt, down.data(), DType::bf16, DeviceKind::cpu, up.data(), DType::f32, DeviceKind::cuda, 5000);  // 2 bytes up, widened there
    up.to_host(check.data());
    for (int64_t i = 0; i < 5000; i++) same = same && check[size_t(i)] == round_to(float(i) - 2500.5f, DType::bf16);
    CHECK(same);
  }
  CHECK(cx.pinned().cached() >= 2 * 5000 + 4 * 5000);  // freed to the cache: no cudaFreeHost, which synchronizes
  cx.pinned().empty_cache();
  CHECK(cx.pinned().reserved() == 0);
  CHECK(cx.pinned().alloc(int64_t(1) << 50) == nullptr);  // a petabyte of locked memory: refused, the error cleared
  DL_CUDA(cudaGetLastError());
}

TEST_CASE("NCCL: a group over every GPU there is (ranks as threads) gives ProcessGroup's results, and a missing rank times out by name", "[cuda][nccl]") {
  int gpus = 0;
  DL_CUDA(cudaGetDeviceCount(&gpus));
  INFO("NCCL " << nccl_version_string() << ", " << gpus << " GPU(s): one rank each (NCCL refuses two ranks on one GPU)");
  const int N = gpus;
  MemoryStore store(Millis(20000));
  std::vector<std::string> errors(static_cast<size_t>(N));
  std::vector<std::vector<float>> got(static_cast<size_t>(N));
  auto rank_main = [&](int r) {
    try {
      CudaContext cx(r);
      NcclGroup g(store, r, N, cx, Millis(20000), nullptr, "t");
      const int64_t n = 1000;
      std::vector<float> mine(static_cast<size_t>(n * N));
      for (int64_t i = 0; i < n * N; i++) mine[static_cast<size_t>(i)] = float(r + 1) * 0.5f + float(i % 7);
      float* d = nullptr;
      DL_CUDA(cudaMalloc(&d, size_t(n * N) * 4 * 3));
      float* out = d + n * N;
      float* sc = out + n * N;
      auto put = [&](float* dst, const std::vector<float>& h) {
        DL_CUDA(cudaMemcpy(dst, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        DL_CUDA(cudaDeviceSynchronize());  // before the group's streams read it
      };
      auto take = [&](const float* src, int64_t count) {
        cx.sync();
        std::vector<float> h(static_cast<size_t>(count));
        DL_CUDA(cudaMemcpy(h.data(), src, size_t(count) * 4, cudaMemcpyDeviceToHost));
        return h;
      };
      std::vector<float> res;
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        put(d, mine);
        g.all_reduce_async(d, n, op)->wait();
        auto h = take(d, n);
        res.insert(res.end(), h.begin(), h.end());
      }
      put(d, mine);
      g.all_reduce_async(d, n, ReduceOp::sum, DType::bf16)->synchronize();
      auto h16 = take(d, n);
      res.insert(res.end(), h16.begin(), h16.end());
      put(d, mine);
      g.reduce_scatter_async(out, d, n, ReduceOp::sum)->wait();
      auto rs = take(out, n);
      res.insert(res.end(), rs.begin(), rs.end());
      g.all_gather_async(sc, d + r * n, n)->wait();
      auto ag = take(sc, n * N);
      res.insert(res.end(), ag.begin(), ag.end());
      // 16 bits on the wire (ZeRO's reduce_dtype, the 16-bit parameters' gathers): bf16 sums, exact gathers
      put(d, mine);
      g.reduce_scatter_async(out, d, n, ReduceOp::sum, DType::bf16)->synchronize();
      auto rs16 = take(out, n);
      res.insert(res.end(), rs16.begin(), rs16.end());
      g.all_gather_async(sc, d + r * n, n, DType::bf16)->synchronize();  // (r+1)/2 + i%7: exact in bf16
      auto ag16 = take(sc, n * N);
      res.insert(res.end(), ag16.begin(), ag16.end());
      put(d, std::vector<float>(static_cast<size_t>(n), float(r)));
      g.broadcast_async(d, n, N - 1)->wait();
      auto bc = take(d, n);
      res.insert(res.end(), bc.begin(), bc.end());
      g.barrier();
      got[static_cast<size_t>(r)] = res;
      cudaFree(d);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  };
  std::vector<std::thread> ts;
  for (int r = 0; r < N; r++) ts.emplace_back(rank_main, r);
  for (auto& t : ts) t.join();
  for (int r = 0; r < N; r++) {
    INFO("rank " << r);
    REQUIRE(errors[static_cast<size_t>(r)] == "");
  }
  // the expected values, by hand: rank r's element i is (r+1)/2 + i%7
  const int64_t n = 1000;
  for (int r = 0; r < N; r++) {
    const auto& res = got[static_cast<size_t>(r)];
    REQUIRE(res.size() == size_t(n * (7 + 2 * N)));
    bool ok = true;
    for (int64_t i = 0; i < n; i++) {
      double sum = 0, mx = -1e30;
      for (int q = 0; q < N; q++) {
        const double v = (q + 1) * 0.5 + double(i % 7);
        sum += v;
        mx = std::max(mx, v);
      }
      ok = ok && std::abs(res[size_t(i)] - sum) < 1e-4 && std::abs(res[size_t(n + i)] - sum / N) < 1e-4 &&
           res[size_t(2 * n + i)] == float(mx) && std::abs(res[size_t(3 * n + i)] - sum) < 0.02 * std::abs(sum) + 0.1;
      double slot = 0;  // reduce_scatter: rank r gets the sum of every rank's slot r
      for (int q = 0; q < N; q++) slot += (q + 1) * 0.5 + double((r * n + i) % 7);
      ok = ok && std::abs(res[size_t(4 * n + i)] - slot) < 1e-4;
      for (int q = 0; q < N; q++)  // all_gather: slot q holds rank q's slot q
        ok = ok && res[size_t(5 * n + q * n + i)] == float((q + 1) * 0.5 + double((q * n + i) % 7));
      const int64_t at16 = 5 * n + N * n;  // the bf16 reduce-scatter, then the bf16 all-gather
      ok = ok && std::abs(res[size_t(at16 + i)] - slot) < 0.02 * std::abs(slot) + 0.1;
      for (int q = 0; q < N; q++)
        ok = ok && res[size_t(at16 + n + q * n + i)] == float((q + 1) * 0.5 + double((q * n + i) % 7));
      ok = ok && res[size_t(at16 + n + N * n + i)] == float(N - 1);  // broadcast from the last rank
    }
    INFO("rank " << r);
    CHECK(ok);
  }
  if (N < 2) {
    WARN("one GPU: the timeout of a missing rank needs two (NCCL allows one rank per GPU)");
    return;
  }
  // rank 0 all-reduces once more than the others: its wait times out, naming who never got there
  MemoryStore store2(Millis(20000));
  std::string err0;
  auto late = [&](int r) {
    try {
      CudaContext cx(r);
      NcclGroup g(store2, r, 2, cx, Millis(3000), nullptr, "late");
      float* d = nullptr;
      DL_CUDA(cudaMalloc(&d, 64));
      g.all_reduce(d, 16);
      if (r == 0) g.all_reduce(d, 16);
      cudaFree(d);
    } catch (const CommError& e) {
      if (r == 0) err0 = e.full();
    }
  };
  std::thread t0(late, 0), t1(late, 1);
  t0.join();
  t1.join();
  CHECK_THAT(err0, Catch::Contains("all_reduce #1 of 16 f32 (sum) did not finish") && Catch::Contains("rank 1 never got there"));
}

// Before Catch2's main: no usable GPU, no tests (exit 77: ctest's SKIP_RETURN_CODE).
const int gpu_or_skip = [] {
  const CudaProbe probe = probe_cuda();
  if (!probe.usable) {
    std::printf("skipped: no usable GPU (%s)\n", probe.reason.c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  const auto& d = probe.devices.front();
  std::printf("GPU 0: %s, sm %d%d, %.1f GiB\n", d.name.c_str(), d.sm_major, d.sm_minor, double(d.total_bytes) / (1 << 30));
  return 0;
}();
