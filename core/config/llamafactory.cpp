#include "core/config/llamafactory.h"

#include <fmt/format.h>

#include <cmath>

#include "core/util/error.h"

namespace distlab {

const char* const kLlamaFactoryFinetuningFields[10] = {"finetuning_type",  "lora_rank",         "lora_alpha",         "lora_dropout",
                                                       "lora_target",      "use_rslora",        "quantization_bit",   "quantization_type",
                                                       "double_quantization", "quantization_method"};

namespace {

std::string shown(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

struct Out {
  EcosystemConfig& e;
  std::string where(const std::string& field) const { return fmt::format("{}: {}", e.file, field); }
  void set(const std::string& field, const std::string& value_shown, const std::string& key, const std::string& value) {
    e.fields.push_back({field, value_shown, key, value});
    e.settings.push_back({key, value, where(field)});
  }
};

double number(const Out& o, const std::string& field, const nlohmann::json& v) {
  if (!v.is_number()) throw ConfigError(fmt::format("{} = {} is not a number", o.where(field), shown(v)));
  return v.get<double>();
}

// QLoRA: quantization_bit 4 with bitsandbytes (quantization_method, its default) → [quantization]
void map_quantization(Out& o, const nlohmann::json& doc) {
  if (!doc.contains("quantization_bit") || doc["quantization_bit"].is_null()) {
    for (const char* f : {"quantization_type", "double_quantization"})
      if (doc.contains(f)) o.e.fields.push_back({f, shown(doc[f]), "", "unused: no quantization_bit"});
    return;
  }
  const double bits = number(o, "quantization_bit", doc["quantization_bit"]);
  if (bits != 4)
    throw ConfigError(fmt::format("{} = {} is not supported: the engine's quantized base is 4-bit NF4 (QLoRA)", o.where("quantization_bit"), bits),
                      "use quantization_bit: 4, or drop it to train LoRA on a 16-bit base (bf16: true)");
  if (doc.contains("quantization_method") && shown(doc["quantization_method"]) != "bnb" && shown(doc["quantization_method"]) != "bitsandbytes")
    throw ConfigError(fmt::format("{} = {} is not supported: the engine quantizes as bitsandbytes does", o.where("quantization_method"),
                                  shown(doc["quantization_method"])),
                      "use quantization_method: bnb (LLaMA-Factory's default)");
  if (doc.contains("quantization_method")) o.e.fields.push_back({"quantization_method", shown(doc["quantization_method"]), "", "bitsandbytes' 4-bit layout"});
  o.set("quantization_bit", shown(doc["quantization_bit"]), "quantization.bits", "4");
  const std::string type = doc.contains("quantization_type") ? shown(doc["quantization_type"]) : "nf4";
  if (type != "nf4")
    throw ConfigError(fmt::format("{} = {} is not supported: NF4 is the engine's 4-bit type", o.where("quantization_type"), type), "use quantization_type: nf4");
  o.set("quantization_type", doc.contains("quantization_type") ? type : "(absent: nf4)", "quantization.type", "nf4");
  if (doc.contains("double_quantization")) {
    if (!doc["double_quantization"].is_boolean())
      throw ConfigError(fmt::format("{} = {} is not true or false", o.where("double_quantization"), shown(doc["double_quantization"])));
    o.set("double_quantization", shown(doc["double_quantization"]), "quantization.double_quant", doc["double_quantization"].get<bool>() ? "true" : "false");
  } else {
    o.set("double_quantization", "(absent: true)", "quantization.double_quant", "true");
  }
}

}  // namespace

void map_llamafactory_finetuning(EcosystemConfig& e, const nlohmann::json& doc) {
  if (!doc.is_object()) return;
  bool recipe = doc.contains("stage");
  for (const char* f : kLlamaFactoryFinetuningFields) recipe = recipe || doc.contains(f);
  if (!recipe) return;
  Out o{e};
  const std::string type = doc.contains("finetuning_type") ? shown(doc["finetuning_type"]) : "lora";
  const std::string type_shown = doc.contains("finetuning_type") ? type : "(absent: lora, LLaMA-Factory's default)";
  if (type == "full") {
    o.set("finetuning_type", type_shown, "lora.r", "0");
    if (doc.contains("quantization_bit") && !doc["quantization_bit"].is_null())  // LLaMA-Factory refuses it too
      throw ConfigError(fmt::format("{} = {} with finetuning_type: full: a quantized base is frozen, so nothing would train", o.where("quantization_bit"),
                                    shown(doc["quantization_bit"])),
                        "use finetuning_type: lora (QLoRA), or drop quantization_bit");
    for (const char* f : {"lora_rank", "lora_alpha", "lora_dropout", "lora_target", "use_rslora"})
      if (doc.contains(f)) e.fields.push_back({f, shown(doc[f]), "", "unused: finetuning_type is full (every parameter trains)"});
    return;
  }
  if (type != "lora")
    throw ConfigError(fmt::format("{} = {} is not supported: distlab trains full or LoRA", o.where("finetuning_type"), type),
                      "use finetuning_type: lora or full");
  e.fields.push_back({"finetuning_type", type_shown, "", "LoRA: adapters on the targets, every other weight frozen (the fields below)"});
  const double rank = doc.contains("lora_rank") ? number(o, "lora_rank", doc["lora_rank"]) : 8;
  if (rank < 1 || rank != std::floor(rank)) throw ConfigError(fmt::format("{} = {} is not a positive whole number", o.where("lora_rank"), rank));
  o.set("lora_rank", doc.contains("lora_rank") ? shown(doc["lora_rank"]) : "(absent: 8)", "lora.r", fmt::format("{}", int64_t(rank)));
  const bool has_alpha = doc.contains("lora_alpha") && !doc["lora_alpha"].is_null();
  const double alpha = has_alpha ? number(o, "lora_alpha", doc["lora_alpha"]) : 2 * rank;
  o.set("lora_alpha", has_alpha ? shown(doc["lora_alpha"]) : "(absent: twice lora_rank)", "lora.alpha", fmt::format("{}", alpha));
  if (doc.contains("lora_dropout")) o.set("lora_dropout", shown(doc["lora_dropout"]), "lora.dropout", fmt::format("{}", number(o, "lora_dropout", doc["lora_dropout"])));
  std::string target = doc.contains("lora_target") ? shown(doc["lora_target"]) : "all";
  o.set("lora_target", doc.contains("lora_target") ? target : "(absent: all)", "lora.target_modules", target == "all" ? "all-linear" : target);
  if (doc.contains("use_rslora")) {
    if (!doc["use_rslora"].is_boolean()) throw ConfigError(fmt::format("{} = {} is not true or false", o.where("use_rslora"), shown(doc["use_rslora"])));
    o.set("use_rslora", shown(doc["use_rslora"]), "lora.use_rslora", doc["use_rslora"].get<bool>() ? "true" : "false");
  }
  map_quantization(o, doc);
}

}  // namespace distlab
