#include "core/config/llamafactory.h"

#include <fmt/format.h>

#include <cmath>

#include "core/util/error.h"

namespace distlab {

const char* const kLlamaFactoryFinetuningFields[7] = {"finetuning_type", "lora_rank", "lora_alpha", "lora_dropout",
                                                      "lora_target", "use_rslora", "quantization_bit"};

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

}  // namespace

void map_llamafactory_finetuning(EcosystemConfig& e, const nlohmann::json& doc) {
  if (!doc.is_object()) return;
  bool recipe = doc.contains("stage");
  for (const char* f : kLlamaFactoryFinetuningFields) recipe = recipe || doc.contains(f);
  if (!recipe) return;
  Out o{e};
  if (doc.contains("quantization_bit") && !doc["quantization_bit"].is_null())
    throw ConfigError(fmt::format("{} = {} is not supported: QLoRA's {}-bit base weights are not in distlab's engine yet (its NF4 format is: "
                                  "core/ops/cpu/nf4.h)",
                                  o.where("quantization_bit"), shown(doc["quantization_bit"]), shown(doc["quantization_bit"])),
                      "drop quantization_bit to train LoRA on a 16-bit base (bf16: true), and plan the 4-bit memory with chapter 11");
  const std::string type = doc.contains("finetuning_type") ? shown(doc["finetuning_type"]) : "lora";
  const std::string type_shown = doc.contains("finetuning_type") ? type : "(absent: lora, LLaMA-Factory's default)";
  if (type == "full") {
    o.set("finetuning_type", type_shown, "lora.r", "0");
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
}

}  // namespace distlab
