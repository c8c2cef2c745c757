#include "core/tensor/runtime.h"

#include <cblas.h>
#include <omp.h>

namespace distlab {

void set_compute_threads(int n) {
  if (n < 1) n = 1;
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
}

int compute_threads() { return openblas_get_num_threads(); }

}  // namespace distlab
