#include "core/models/peft.h"

#include <fmt/format.h>

#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

namespace {

// PEFT's check_target_module_exists for a list: the whole name, or a suffix after a dot
bool matches(const std::string& module, const std::string& target) {
  if (module == target) return true;
  return module.size() > target.size() && module.compare(module.size() - target.size(), target.size(), target) == 0 &&
         module[module.size() - target.size() - 1] == '.';
}

bool is_output_head(const std::string& module) { return module == "lm_head" || module.ends_with(".lm_head"); }

}  // namespace

std::vector<std::pair<std::string, Linear*>> named_linears(Model& model) {
  std::vector<std::pair<std::string, Linear*>> out;
  for (Layer* l : model.layers()) collect_linears(l, out);
  return out;
}

std::vector<std::string> apply_lora(Runtime& rt, Model& model, const LoraSpec& spec, uint64_t seed) {
  const auto linears = named_linears(model);
  const bool all_linear = spec.target_modules.size() == 1 && spec.target_modules[0] == "all-linear";
  std::vector<bool> used(spec.target_modules.size(), false);
  std::vector<std::string> adapted;
  for (Parameter* p : model.parameters()) p->requires_grad = false;  // PEFT: everything but the adapters frozen
  Rng rng(seed ^ 0x4c6f5241ULL);  // the adapters' own stream: the base weights are those of a run without LoRA
  uint64_t k = 0;
  for (auto& [name, lin] : linears) {
    bool hit = all_linear && !is_output_head(name);
    for (size_t t = 0; !all_linear && t < spec.target_modules.size(); t++)
      if (matches(name, spec.target_modules[t])) hit = used[t] = true;
    if (!hit) continue;
    lin->add_lora(rt, name, spec, seed * 7919ULL + 104729ULL * ++k);
    lin->lora->init(rng);
    adapted.push_back(name);
  }
  std::string missing;
  for (size_t t = 0; !all_linear && t < used.size(); t++)
    if (!used[t]) missing += (missing.empty() ? "" : ", ") + spec.target_modules[t];
  if (!missing.empty() || adapted.empty()) {
    std::string names;
    for (size_t i = 0; i < linears.size() && i < 12; i++) names += (i ? ", " : "") + linears[i].first;
    if (linears.size() > 12) names += fmt::format(", ... ({} in all)", linears.size());
    throw ConfigError(fmt::format("lora.target_modules: {} not found in the model", missing.empty() ? "nothing" : missing),
                      names.empty() ? "this model has no Linear layers for LoRA" : "its Linear layers: " + names +
                                                                                      " (a target is a whole name or its last parts, as PEFT matches them; \"all-linear\": every one but the output head)");
  }
  return adapted;
}

int64_t quantize_base(Runtime& rt, Model& model, const QuantSpec& spec) {
  int64_t n = 0;
  for (auto& [name, lin] : named_linears(model)) {
    if (is_output_head(name)) continue;  // transformers keeps the lm_head in 16 bits (llm_int8_skip_modules)
    DL_ASSERT(!lin->weight.requires_grad, "quantize_base before apply_lora: " + name);
    quantize_parameter(rt, lin->weight, spec);
    n++;
  }
  if (n == 0) throw ConfigError("quantization.bits = 4: the model has no Linear layers to quantize", "QLoRA quantizes the transformer's Linears (model.name = llama or gpt)");
  return n;
}

// W (out, in) += sign · scaling · B (out, r) @ A (r, in), in f32 and rounded once into W's dtype
static void fold(Linear& l, float sign) {
  LoraAdapter& a = *l.lora;
  if (l.weight.quant)
    throw ConfigError(fmt::format("merging LoRA into {}: its base weight is 4-bit (QLoRA), and W + s·BA is not", l.weight.name),
                      "write the merged model in 16 or 32 bits from a checkpoint: distlab ckpt export DIR --out F --merge");
  const int64_t out = l.out_features, in = l.in_features, r = a.lora_A.data.size(0);
  OnHost w(l.weight.data, OnHost::inout), A(a.lora_A.data), B(a.lora_B.data);
  if (!w.p) return;  // meta
  lora_fold(w.p, A.p, B.p, out, in, r, sign * a.scaling);
  w.store();
}

void merge_lora(Model& model) {
  for (auto& [name, l] : named_linears(model))
    if (l->lora && !l->merged) {
      fold(*l, 1.0f);
      l->merged = true;
    }
}

void unmerge_lora(Model& model) {
  for (auto& [name, l] : named_linears(model))
    if (l->lora && l->merged) {
      fold(*l, -1.0f);
      l->merged = false;
    }
}

ParamCount count_parameters(Model& model) {
  ParamCount c;
  for (Parameter* p : model.parameters()) {
    c.all += parameter_count(*p);
    if (p->requires_grad) c.trainable += parameter_count(*p);
  }
  return c;
}

}  // namespace distlab
