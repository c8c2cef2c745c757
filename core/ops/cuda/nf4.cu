// QLoRA's dequantize on the GPU (bitsandbytes' kDequantizeBlockwise for NF4): one thread per weight, the
// code books passed by value (1,088 bytes of kernel arguments), the products of core/ops/cpu/nf4.cpp's
// dequantize_nf4 in its order — __fmul_rn/__fadd_rn keep nvcc from fusing them into one FMA, so the GPU's
// bits are the cpu's. Read the cpu kernel first.
#include "core/ops/cpu/nf4.h"
#include "core/ops/cuda/common.cuh"

namespace distlab::cuda {

namespace {

struct Codes {
  float nf4[16];
  float dynamic8[256];
};

__global__ void dequantize_nf4_k(float* out, const uint8_t* packed, const uint8_t* absmax_q, const float* absmax, float offset,
                                 int64_t n, int64_t block, int64_t block2, Codes codes) {
  DL_GRID_LOOP(i, n) {
    const int64_t b = i / block;
    float c = absmax[absmax_q ? b / block2 : b];
    if (absmax_q) c = __fadd_rn(__fmul_rn(codes.dynamic8[absmax_q[b]], c), offset);
    const int level = i % 2 == 0 ? packed[i / 2] >> 4 : packed[i / 2] & 0xF;
    out[i] = __fmul_rn(codes.nf4[level], c);
  }
}

}  // namespace

void dequantize_nf4(Runtime& rt, float* out, const uint8_t* packed, const uint8_t* absmax_q, const float* absmax, float offset,
                    int64_t n, int64_t block, int64_t block2) {
  OpScope op(rt, "dequantize_nf4", 2.0 * double(n), 0.5 * double(n) + double((n + block - 1) / block) + double(n) * dtype_size(rt.dtype),
             false);
  if (n == 0) return;
  Codes codes;
  for (int i = 0; i < 16; i++) codes.nf4[i] = nf4_code()[size_t(i)];
  for (int i = 0; i < 256; i++) codes.dynamic8[i] = dynamic8_code()[size_t(i)];
  dequantize_nf4_k<<<blocks_for(n), kThreads, 0, stream(rt)>>>(out, packed, absmax_q, absmax, offset, n, block, block2, codes);
  DL_CUDA_LAUNCHED("dequantize_nf4");
}

}  // namespace distlab::cuda
