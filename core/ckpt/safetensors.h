// The safetensors format (what Hugging Face and PyTorch users exchange weights in):
//   8 bytes: N, the header length, little-endian u64
//   N bytes: a JSON object {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"k": "v"}} — offsets relative to the end of the header
//   the tensors' bytes, little-endian, row-major, no gaps.
// distlab writes the header padded with spaces to a multiple of 8 and tensors sorted by name.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/models/model.h"
#include "core/optim/optimizer.h"

namespace distlab {

struct StTensor {
  std::string dtype;  // "F32", "BF16", "F16", "I64", ...
  Shape shape;
  std::vector<uint8_t> bytes;
};

struct StFile {
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> metadata;
};

StFile read_safetensors(const std::string& path);  // DataError naming the file and the fault
// The same from the file's bytes (`path` names it in messages).
StFile parse_safetensors(const std::vector<uint8_t>& raw, const std::string& path);
// Atomic (.partial then rename); `before_commit` runs once the bytes are written, before the rename.
// Returns the file's size and CRC-32 (core/ckpt/checkpoint.h).
struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
WrittenFile write_safetensors(const std::string& path, const StFile& file, const std::function<void()>& before_commit = {});

// A model's parameters and buffers under their PyTorch names, stored as `dtype` (f32, bf16 or f16).
// BatchNorm's num_batches_tracked is stored as I64, as PyTorch keeps it. With `masters`, a 16-bit
// parameter is saved from its f32 master weights (mixed precision), not from its rounded copy.
// `metadata` joins the header's __metadata__.
void save_model(Model& model, const std::string& path, DType dtype, const Optimizer* masters = nullptr,
                const std::map<std::string, std::string>& metadata = {});
// GPT's tied pair in the file as PyTorch's state_dict holds it: nanoGPT's and Hugging Face's GPT-2 have both
// transformer.wte.weight and lm_head.weight (one tensor, two keys). safetensors stores no shared storage, so
// the alias is a copy: written where the file has wte and no lm_head (save_model, ckpt export).
void add_tied_lm_head(StFile& f);
// Loads every parameter and buffer by name, converting from F32/BF16/F16. Names missing from the file,
// extra names in it, and shape mismatches are errors that list them. A tied lm_head.weight (the alias
// above) is taken when it equals transformer.wte.weight, refused when it does not (distlab's GPT ties them).
void load_model(Model& model, const std::string& path);

}  // namespace distlab
