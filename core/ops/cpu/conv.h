// 2-D convolution as im2col + GEMM (PyTorch's layout: input (B, C, H, W), weight (OC, C, K, K), output
// (B, OC, OH, OW)). im2col fills a block of kConvImageBlock images' columns at a time; the products then run
// image by image on slices of that block, writing each image's output (OC, OH*OW) in place and reading its
// output gradient where it lies: no transposes. One image's product is as fast as a block's here (64 x 256 x
// 288 for the CIFAR CNN's second layer: 97 GFLOP/s on one core, OpenBLAS's square-matrix speed). Forward keeps
// the im2col columns for backward's weight gradient, as PyTorch's CPU convolution (thnn_conv2d's "finput")
// does: memory for time. conv2d_forward_naive below is the seven-loop definition, for reading and the tests.
#pragma once
#include <cstdint>

#include "core/tensor/runtime.h"

namespace distlab {

struct ConvShape {
  int64_t B, C, H, W;  // input
  int64_t OC, K, stride, pad;
  int64_t OH() const { return (H + 2 * pad - K) / stride + 1; }
  int64_t OW() const { return (W + 2 * pad - K) / stride + 1; }
  int64_t CKK() const { return C * K * K; }
};

// Images per im2col block: 8 CIFAR images' columns (2.4 MB for the second layer) stay in the caches
// between im2col and the 8 products that read them.
inline constexpr int64_t kConvImageBlock = 8;

// col (C*K*K, B*OH*OW): column j = (b, oh, ow) holds the input patch that output pixel reads.
void im2col(float* col, const float* inp, const ConvShape& s);
// The adjoint: scatters-and-adds columns back into dinp (B, C, H, W), which is overwritten.
void col2im(float* dinp, const float* col, const ConvShape& s);

// out (B, OC, OH, OW) = conv(inp (B, C, H, W), w (OC, C, K, K)) + bias (OC) or nullptr;
// col receives the im2col columns, kept for backward: block after block, each (C*K*K, nb*OH*OW) for its nb
// images (with B <= kConvImageBlock, im2col's layout above)
void conv2d_forward(Runtime& rt, float* out, float* col, const float* inp, const float* w, const float* bias,
                    const ConvShape& s);
// From forward's columns: dinp (overwritten, skipped unless need_dinp); dw, dbias (or nullptr) accumulated.
// FLOPs count the matrix products only, as matmul_backward.
void conv2d_backward(Runtime& rt, float* dinp, float* dw, float* dbias, const float* dout, const float* col,
                     const float* w, const ConvShape& s, bool need_dinp = true);
// Direct seven-loop convolution, for tests.
void conv2d_forward_naive(float* out, const float* inp, const float* w, const float* bias, const ConvShape& s);

}  // namespace distlab
