// Which of OpenBLAS's kernels multiply our matrices, and the best this CPU can run.
//
// Debian's OpenBLAS (0.3.21, built DYNAMIC_ARCH) picks its kernels once, when the library loads, from the
// CPU's vendor, family and model. A model it does not know gets an older core than the CPU can run: a
// cloud VM whose CPUID says only "Intel(R) Xeon(R) Processor" gets Prescott (SSE3) on an AVX-512 CPU
// (sgemm 32.5 GFLOP/s on one thread, 157.5 with SkylakeX: the CIFAR CNN trained at 706 images/s instead
// of 1,705), and a newer AMD family gets Haswell's AVX2 kernels on a CPU with AVX-512. Every product of
// the engine runs through sgemm, so the whole workbench, grading included, ran at that speed.
//
// Some machines set OPENBLAS_CORETYPE themselves (older OpenBLAS builds give wrong products or crash with the
// core they would pick on some new CPUs): a setting found in the environment is never changed.
//
// The choice can only be changed before the library loads: OPENBLAS_CORETYPE in a new process's
// environment. ensure_best_blas_core (the first call of main) reads the CPU's features with cpuid and,
// where OpenBLAS chose a core of an older family than they allow, runs this program again with
// OPENBLAS_CORETYPE set; every process it starts (the launcher's ranks, a grader's jobs) inherits it. A
// user's own OPENBLAS_CORETYPE is kept as it is. After the switch one small sgemm is checked against a
// naive product: kernels that give wrong numbers are not kept.
// Read next: core/ops/cpu/matmul.cpp (the products), core/tensor/runtime.cpp (their threads).
#pragma once
#include <string>

namespace distlab {

struct BlasCore {
  std::string chosen;    // the core OpenBLAS runs now ("Haswell", "Prescott", ...)
  std::string best;      // the best core this CPU's features allow ("SkylakeX", "Haswell", "SandyBridge"; "" off x86-64)
  std::string features;  // what cpuid says: "avx512f avx512bw avx512dq avx512vl avx2 fma avx"
  std::string set_by;    // "distlab" (we set OPENBLAS_CORETYPE), "user" (it was set), "" (OpenBLAS's own choice)
  std::string was;       // with set_by "distlab": the core OpenBLAS had chosen itself
  std::string describe() const;  // one line: "OpenBLAS core SkylakeX (chosen by distlab for AVX-512; OpenBLAS picked Haswell)"
};

// The kernels running in this process, and the CPU's best.
BlasCore blas_core();

// The first call of main: returns when this process already runs the best core (or one the user chose),
// else re-executes it with OPENBLAS_CORETYPE set (it does not return then). `note`: say so on stderr once,
// when stderr is a terminal.
void ensure_best_blas_core(char** argv, bool note = true);

// Three sgemms as the engine calls them (plain, A transposed, B transposed; sizes off the kernels' blocks)
// against a naive double-precision product; false when an element is off by more than float rounding allows.
bool blas_sgemm_sane();

}  // namespace distlab
