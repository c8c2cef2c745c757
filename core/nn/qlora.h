// QLoRA (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"): LoRA (core/nn/lora.h) on a
// base model whose frozen weights are stored in 4 bits. Each Linear's weight is quantized once to NF4
// (core/ops/cpu/nf4.h: 16 levels, an absmax per 64 weights, the absmax constants quantized again to 8 bits)
// and dequantized to the compute dtype right before each GEMM that reads it — forward's y = x Wᵀ and
// backward's dX = dY W — then dropped. Nothing else changes: the adapters train in the compute dtype, the
// gradients flow through the dequantized W, W itself never gets a gradient.
//
//   weight  4 bits + 8/64 (absmax) + 32/(64·256) (nested absmax) = 4.127 bits a weight, against bf16's 16
//
// The layout is bitsandbytes' Linear4bit / Params4bit (what transformers' BitsAndBytesConfig(load_in_4bit,
// bnb_4bit_quant_type = "nf4", bnb_4bit_use_double_quant) gives), and a state dict holds it under the same
// names: "<module>.weight" (u8, (numel/2, 1)), ".weight.absmax", ".weight.quant_map", ".weight.nested_absmax",
// ".weight.nested_quant_map" and ".weight.quant_state.bitsandbytes__nf4" (the JSON of the rest: quant_type,
// blocksize, dtype, shape, nested_blocksize, nested_dtype, nested_offset).
// Read next: core/models/peft.h (quantize_base: which Linears), core/nn/linear.cpp (where the GEMMs read it).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/runtime.h"

namespace distlab {

// [quantization]: bitsandbytes' BitsAndBytesConfig for the frozen base (LLaMA-Factory's quantization_bit,
// quantization_type, double_quantization)
struct QuantSpec {
  int64_t bits = 0;          // 0: the base in the compute dtype; 4: NF4 (QLoRA)
  std::string type = "nf4";  // bnb_4bit_quant_type; fp4 is not in the engine
  bool double_quant = true;  // bnb_4bit_use_double_quant: the absmax constants in 8 bits too
  bool on() const { return bits == 4; }
};

// One weight's QuantState, as bitsandbytes keeps it beside a Params4bit: the constants as buffers (they
// move with the model: checkpoints, files, broadcasts), the rest as values.
struct QuantState {
  Shape shape;                    // the weight's own shape, (out, in)
  int64_t block = 64, block2 = 256;
  bool double_quant = true;
  DType dtype = DType::f32;       // the weight's before quantization (bnb_4bit_compute_dtype); also in `json`
  float offset = 0;               // the constants' mean (double quantization); also in `json`
  Buffer absmax;                  // u8 indices into the dynamic map (double quantization), or the f32 constants
  Buffer nested_absmax;           // f32, one per block2 constants (double quantization)
  Buffer quant_map;               // f32, the 16 NF4 levels
  Buffer nested_quant_map;        // f32, the 256 values of the dynamic map (double quantization)
  Buffer json;                    // u8: {"quant_type": "nf4", "blocksize": 64, "dtype": ..., "shape": [...], ...}
  std::vector<Buffer*> buffers(); // in bitsandbytes' order
};

// The weights a parameter holds: its numel, or for a 4-bit one its own shape's (two a byte), as
// transformers' num_parameters counts a Params4bit twice
int64_t parameter_count(const Parameter& p);

// Quantizes p in place (frozen; its values on the rank's device in any float dtype): p.data becomes the u8
// indices, (ceil(numel/2), 1), and p.quant the constants, all in category params. On meta: the sizes only.
void quantize_parameter(Runtime& rt, Parameter& p, const QuantSpec& spec);
// A 4-bit p quantized again from host f32 values of its own shape (a base model's file loaded into a QLoRA
// run: transformers quantizes as it loads); the tensors keep their storage.
void requantize_parameter(Parameter& p, const float* w);
// p's weight, (out, in), in rt.dtype (category other): what a QLoRA layer's GEMMs read, dropped after them
Tensor dequantize_parameter(Runtime& rt, const Parameter& p);
// After a file or a checkpoint filled p.quant's buffers: the JSON read back (the offset), the code books
// and the shape checked. `source` names the file for the error.
void quant_state_loaded(Parameter& p, const std::string& source);

}  // namespace distlab
