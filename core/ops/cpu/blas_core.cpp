// ensure_best_blas_core and what it reads (core/ops/cpu/blas_core.h).
#include "core/ops/cpu/blas_core.h"

#include <cblas.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" char* openblas_get_corename(void);

namespace distlab {

namespace {

// OpenBLAS's x86-64 cores by the widest vectors their kernels use: 3 AVX-512, 2 AVX2 + FMA, 1 AVX, 0 SSE.
int tier(const std::string& core) {
  std::string c;
  for (char ch : core) c += char(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (c == n) return 3;
  for (const char* n : {"haswell", "zen"})
    if (c == n) return 2;
  for (const char* n : {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"})
    if (c == n) return 1;
  return 0;
}

struct Features {
  bool avx512 = false, avx2_fma = false, avx = false;
  std::string text;
};

Features cpu_features() {
  Features f;
#if defined(__x86_64__)
  __builtin_cpu_init();  // cpuid, and whether the OS saves the registers (xgetbv)
  const bool f512 = __builtin_cpu_supports("avx512f"), bw = __builtin_cpu_supports("avx512bw"), dq = __builtin_cpu_supports("avx512dq"),
             vl = __builtin_cpu_supports("avx512vl");
  const bool avx2 = __builtin_cpu_supports("avx2"), fma = __builtin_cpu_supports("fma");
  f.avx = __builtin_cpu_supports("avx");
  f.avx512 = f512 && bw && dq && vl;  // what OpenBLAS's SkylakeX kernels use
  f.avx2_fma = avx2 && fma;
  for (auto [on, name] : {std::pair{f512, "avx512f"}, {bw, "avx512bw"}, {dq, "avx512dq"}, {vl, "avx512vl"}, {avx2, "avx2"}, {fma, "fma"},
                          {f.avx, "avx"}})
    if (on) f.text += std::string(f.text.empty() ? "" : " ") + name;
#endif
  return f;
}

std::string best_for(const Features& f) { return f.avx512 ? "SkylakeX" : f.avx2_fma ? "Haswell" : f.avx ? "SandyBridge" : ""; }

}  // namespace

std::string BlasCore::describe() const {
  if (set_by == "distlab")
    return fmt::format("OpenBLAS core {} (set by distlab for this CPU's {}; OpenBLAS picked {} from its model)", chosen,
                       tier(chosen) == 3 ? "AVX-512" : tier(chosen) == 2 ? "AVX2" : "AVX", was);
  if (set_by == "user") return fmt::format("OpenBLAS core {} (OPENBLAS_CORETYPE, as set)", chosen);
  if (!best.empty() && tier(best) > tier(chosen))
    return fmt::format("OpenBLAS core {} (this CPU could run {}: `distlab` sets it for its own processes)", chosen, best);
  return fmt::format("OpenBLAS core {}", chosen);
}

BlasCore blas_core() {
  BlasCore b;
  const char* name = openblas_get_corename();
  b.chosen = name ? name : "unknown";
  const Features f = cpu_features();
  b.best = best_for(f);
  b.features = f.text;
  if (const char* was = std::getenv("DISTLAB_BLAS_WAS")) {  // we set it (inherited by our children too)
    b.set_by = "distlab";
    b.was = was;
  } else if (std::getenv("OPENBLAS_CORETYPE")) {
    b.set_by = "user";
  }
  return b;
}

bool blas_sgemm_sane() {
  // the engine's products, as core/ops/cpu/matmul.cpp calls them: plain, with A transposed (dW = X^T dY) and
  // with B transposed (dX = dY W^T), at sizes off the kernels' blocks and past one block
  struct Case {
    int m, k, n;
    bool ta, tb;
  };
  uint32_t s = 12345;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return float(int32_t(s >> 8) % 2001 - 1000) / 512.0f;
  };
  for (const Case& c : {Case{37, 29, 41, false, false}, Case{69, 131, 103, true, false}, Case{300, 257, 129, false, true}}) {
    std::vector<float> a(size_t(c.m) * c.k), b(size_t(c.k) * c.n), out(size_t(c.m) * c.n);
    for (auto& x : a) x = next();
    for (auto& x : b) x = next();
    // a is (m, k) stored as given (k, m) when transposed; b likewise
    cblas_sgemm(CblasRowMajor, c.ta ? CblasTrans : CblasNoTrans, c.tb ? CblasTrans : CblasNoTrans, c.m, c.n, c.k, 1.0f, a.data(),
                c.ta ? c.m : c.k, b.data(), c.tb ? c.k : c.n, 0.0f, out.data(), c.n);
    for (int i = 0; i < c.m; i++)
      for (int j = 0; j < c.n; j++) {
        double want = 0, mag = 0;
        for (int k = 0; k < c.k; k++) {
          const double p = double(c.ta ? a[size_t(k) * c.m + i] : a[size_t(i) * c.k + k]) * (c.tb ? b[size_t(j) * c.k + k] : b[size_t(k) * c.n + j]);
          want += p;
          mag += std::abs(p);
        }
        if (!(std::abs(out[size_t(i) * c.n + j] - want) <= 1e-5 * mag + 1e-6)) return false;
      }
  }
  return true;
}

namespace {

// This process's arguments, for a load-time call that has no argv (/proc/self/cmdline: NUL-separated).
char** own_argv() {
  static std::vector<char> text;
  static std::vector<char*> args;
  if (!args.empty()) return args.data();
  FILE* f = std::fopen("/proc/self/cmdline", "rb");
  if (!f) return nullptr;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.insert(text.end(), buf, buf + n);
  std::fclose(f);
  if (text.empty() || text.back() != '\0') text.push_back('\0');
  for (size_t i = 0; i < text.size(); i += std::strlen(&text[i]) + 1) args.push_back(&text[i]);
  args.push_back(nullptr);
  return args.data();
}

// Every program that loads the engine (distlab, its ranks, the tests, the benchmarks) takes the best core
// before its main runs: OpenBLAS's own constructor has run by then (the engine's library depends on it).
__attribute__((constructor)) void best_blas_core_at_load() { ensure_best_blas_core(nullptr); }

}  // namespace

void ensure_best_blas_core(char** argv, bool note) {
  if (!argv) argv = own_argv();
  if (!argv) return;
  // tests: start as if OpenBLAS had chosen this core itself (a CPU model it does not know), not as a user's
  // setting: the process runs again with it, then goes on as below
  if (const char* pretend = std::getenv("DISTLAB_TEST_BLAS_CHOSE"); pretend && !std::getenv("DISTLAB_BLAS_WAS")) {
    if (!std::getenv("DISTLAB_TEST_BLAS_PRETENDING")) {
      setenv("OPENBLAS_CORETYPE", pretend, 1);
      setenv("DISTLAB_TEST_BLAS_PRETENDING", "1", 1);
      execv("/proc/self/exe", argv);
      return;
    }
    unsetenv("OPENBLAS_CORETYPE");  // OpenBLAS has loaded with it: from here it is "its own choice"
    unsetenv("DISTLAB_TEST_BLAS_CHOSE");
    unsetenv("DISTLAB_TEST_BLAS_PRETENDING");
  }
  if (std::getenv("DISTLAB_BLAS_WAS")) {  // this process (or its launcher) was started again with the better core
    static bool checked = false;
    if (checked) return;
    checked = true;
    const BlasCore b = blas_core();
    if (std::getenv("DISTLAB_BLAS_NOTE") && !blas_sgemm_sane()) {
      // kernels this CPU runs wrongly: back to OpenBLAS's own choice, and say so whatever stderr is
      std::fprintf(stderr, "distlab: OpenBLAS's %s kernels gave wrong products on this CPU: running its own choice (%s) instead\n",
                   b.chosen.c_str(), b.was.c_str());
      setenv("OPENBLAS_CORETYPE", b.was.c_str(), 1);
      setenv("DISTLAB_BLAS_WAS", b.was.c_str(), 1);
      unsetenv("DISTLAB_BLAS_NOTE");
      execv("/proc/self/exe", argv);
      return;  // exec failed: go on with these kernels
    }
    if (const char* n = std::getenv("DISTLAB_BLAS_NOTE")) {  // the first process after the switch: said once, not by its children
      if (note && isatty(2) && std::strcmp(n, "1") == 0) std::fprintf(stderr, "distlab: %s\n", b.describe().c_str());
      unsetenv("DISTLAB_BLAS_NOTE");
    }
    return;
  }
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("DISTLAB_BLAS_KEEP")) return;  // the user's choice
  const BlasCore b = blas_core();
  if (b.best.empty() || tier(b.best) <= tier(b.chosen)) return;
  setenv("OPENBLAS_CORETYPE", b.best.c_str(), 1);
  setenv("DISTLAB_BLAS_WAS", b.chosen.c_str(), 1);
  setenv("DISTLAB_BLAS_NOTE", note ? "1" : "0", 1);
  execv("/proc/self/exe", argv);
  // exec failed (no /proc): OpenBLAS's choice stands
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("DISTLAB_BLAS_WAS");
  unsetenv("DISTLAB_BLAS_NOTE");
}

}  // namespace distlab
