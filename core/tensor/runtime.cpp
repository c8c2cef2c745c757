#include "core/tensor/runtime.h"

#include <cblas.h>
#include <omp.h>

namespace distlab {

// OpenBLAS stays single-threaded: the kernels parallelize with OpenMP, GEMMs included (see blas_sgemm).
void set_compute_threads(int n) {
  if (n < 1) n = 1;
  openblas_set_num_threads(1);
  omp_set_num_threads(n);
}

int compute_threads() { return omp_get_max_threads(); }

}  // namespace distlab
