// PEFT's model-level calls on distlab's models: get_peft_model (apply_lora), merge_and_unload and
// unmerge_adapter, print_trainable_parameters. The adapter itself is core/nn/lora.h.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/models/model.h"
#include "core/nn/linear.h"
#include "core/nn/qlora.h"

namespace distlab {

// Puts an adapter on every Linear of `model` that `spec.target_modules` names (PEFT's rule: the module's
// whole name, or its last parts after a dot) and freezes every other parameter; A drawn from `seed`.
// Returns the adapted module names. A target that matches nothing is a ConfigError naming it and listing
// the model's Linears.
std::vector<std::string> apply_lora(Runtime& rt, Model& model, const LoraSpec& spec, uint64_t seed);
// QLoRA's base (transformers' load_in_4bit): every Linear but the output head stores its frozen weight in
// NF4 (core/nn/qlora.h), adapted or not; the embeddings and norms stay in the compute dtype. After
// apply_lora. Returns how many weights were quantized.
int64_t quantize_base(Runtime& rt, Model& model, const QuantSpec& spec);
// Every Linear of a model with its module name, in the model's order
std::vector<std::pair<std::string, Linear*>> named_linears(Model& model);
// PEFT's merge_and_unload / unmerge_adapter on every adapted Linear: W += (or -=) scaling · B A. A 4-bit base
// is refused (the sum is not 4-bit): `distlab ckpt export --merge` writes the merged model in 16 or 32 bits.
void merge_lora(Model& model);
void unmerge_lora(Model& model);

// Trainable and all parameters (PEFT's print_trainable_parameters)
struct ParamCount {
  int64_t trainable = 0, all = 0;
};
ParamCount count_parameters(Model& model);

}  // namespace distlab
