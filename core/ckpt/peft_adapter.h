// Hugging Face PEFT's adapter folder, as save_pretrained writes it and PeftModel.from_pretrained reads it:
//   DIR/adapter_model.safetensors   the adapters only, under PEFT's names without the adapter's name:
//                                   base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight (r, in)
//   DIR/adapter_config.json         peft_type "LORA", r, lora_alpha, lora_dropout, target_modules,
//                                   use_rslora, bias "none", task_type, base_model_name_or_path, ...
// A few MiB where the model is GiB: what a LoRA fine-tune ships. Both files are written whole or not at all
// (core/util/atomic_file.h). merge_checkpoint_lora folds a checkpoint's adapters into its base weights for
// `distlab ckpt export --merge` (PEFT's merge_and_unload, then save_pretrained of the base model).
// Read next: core/nn/lora.h (the adapter), core/models/peft.h (the model-level calls).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/ckpt/safetensors.h"
#include "core/models/model.h"
#include "core/nn/lora.h"
#include "core/optim/optimizer.h"

namespace distlab {

// PEFT's key of a distlab adapter parameter: "base_model.model." + its name
std::string peft_adapter_key(const std::string& name);
// Writes DIR (created if missing) from `model`'s adapters; `masters`: their f32 values under 16-bit runs.
// `base_model`: the config's base_model_name_or_path ("" leaves it null).
void save_adapter(Model& model, const LoraSpec& spec, const std::string& dir, DType dtype, const Optimizer* masters,
                  const std::string& base_model);
// Loads DIR into `model`'s adapters: the config must agree with `spec` (r, lora_alpha, use_rslora: the
// key it contradicts is named), every adapter of the model must be in the file and nothing else.
void load_adapter(Model& model, const LoraSpec& spec, const std::string& dir);
// A tensor read whole, as f32 (what `ckpt export` assembles)
struct F32Tensor {
  Shape shape;
  std::vector<float> v;
};
// Folds every adapter among `t` (distlab's names: X.lora_A.weight and X.lora_B.weight beside X.weight) into
// its base, W += scaling · B A, and drops the adapters. Returns how many it folded.
int merge_lora_tensors(std::map<std::string, F32Tensor>& t, float scaling);

}  // namespace distlab
