// LLaMA-Factory's fine-tuning arguments (its FinetuningArguments), field by field onto distlab's [lora]:
//   finetuning_type  lora (LLaMA-Factory's default) | full (lora.r = 0) | freeze (refused: not in the engine)
//   lora_rank        lora.r            (default 8)
//   lora_alpha       lora.alpha        (default: twice the rank, as LLaMA-Factory sets it)
//   lora_dropout     lora.dropout      (default 0)
//   lora_target      lora.target_modules ("all", the default, is PEFT's all-linear; or "q_proj,v_proj")
//   use_rslora       lora.use_rslora
//   quantization_bit quantization.bits (4: QLoRA's NF4 base, core/nn/qlora.h; 8 refused: LLM.int8() is not in the engine)
//   quantization_type quantization.type (nf4, the default; fp4 refused)
//   double_quantization quantization.double_quant (default true)
//   quantization_method bnb (the default) only
// A file is a LLaMA-Factory recipe when it has any of these fields or `stage`. Called by map_fsdp
// (core/config/ecosystem.cpp) once the rest of the file is mapped.
#pragma once
#include <nlohmann/json.hpp>

#include "core/config/ecosystem.h"

namespace distlab {

void map_llamafactory_finetuning(EcosystemConfig& out, const nlohmann::json& doc);
// The fields above, for the file's table (map_llamafactory_finetuning maps them; the table only knows them)
extern const char* const kLlamaFactoryFinetuningFields[10];

}  // namespace distlab
