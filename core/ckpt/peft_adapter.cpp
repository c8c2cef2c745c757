#include "core/ckpt/peft_adapter.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/tensor/on_host.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"

namespace distlab {

namespace fs = std::filesystem;

namespace {

bool is_adapter(const std::string& name) { return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos; }

const char* kPrefix = "base_model.model.";

// the adapted modules' last names, sorted and once each: PEFT's target_modules as it writes them back
std::vector<std::string> module_kinds(Model& model) {
  std::set<std::string> kinds;
  for (Parameter* p : model.parameters()) {
    if (p->name.size() < 20 || !p->name.ends_with(".lora_A.weight")) continue;
    const std::string module = p->name.substr(0, p->name.size() - 14);
    const size_t dot = module.rfind('.');
    kinds.insert(dot == std::string::npos ? module : module.substr(dot + 1));
  }
  return {kinds.begin(), kinds.end()};
}

}  // namespace

std::string peft_adapter_key(const std::string& name) { return kPrefix + name; }

void save_adapter(Model& model, const LoraSpec& spec, const std::string& dir, DType dtype, const Optimizer* masters,
                  const std::string& base_model) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("--save-adapter: cannot create '{}': {}", dir, ec.message()), "is the folder writable, and is there space?");
  StFile f;
  for (Parameter* p : model.parameters()) {
    if (!is_adapter(p->name)) continue;
    if (p->data.is_meta()) throw IoError("cannot save adapters that live on the meta device: they have no values", "run on --device cpu");
    const Tensor* master = masters ? masters->master(p) : nullptr;
    OnHost h(master ? *master : p->data);
    StTensor t;
    t.dtype = dtype_safetensors_name(dtype);
    t.shape = p->data.shape();
    t.bytes.resize(size_t(p->data.numel() * dtype_size(dtype)));
    convert(h.p, DType::f32, t.bytes.data(), dtype, p->data.numel());
    f.tensors[peft_adapter_key(p->name)] = std::move(t);
  }
  if (f.tensors.empty()) throw ConfigError("--save-adapter: the model has no LoRA adapters", "set lora.r (and lora.target_modules) to train some");
  f.metadata["format"] = "pt";
  f.metadata["producer"] = "distlab";
  nlohmann::json c = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"r", spec.r},
                      {"lora_alpha", spec.alpha},
                      {"lora_dropout", spec.dropout},
                      {"target_modules", module_kinds(model)},
                      {"use_rslora", spec.use_rslora},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"init_lora_weights", true},
                      {"inference_mode", true},
                      {"modules_to_save", nullptr},
                      {"use_dora", false},
                      {"base_model_name_or_path", base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model)},
                      {"revision", nullptr}};
  // the weights first, the config last: a folder with a config always has its weights
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), f);
  AtomicFile out((fs::path(dir) / "adapter_config.json").string());
  out.write(c.dump(2) + "\n");
  out.commit();
}

void load_adapter(Model& model, const LoraSpec& spec, const std::string& dir) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string st_path = (fs::path(dir) / "adapter_model.safetensors").string();
  std::ifstream in(cfg_path);
  if (!in) throw IoError(fmt::format("--init-adapter: cannot read {}", cfg_path), "DIR must hold PEFT's adapter_config.json and adapter_model.safetensors");
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not JSON ({})", cfg_path, e.what()), "PEFT writes it with save_pretrained");
  }
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!c.is_object() || !c.contains(key)) throw DataError(fmt::format("{}: no \"{}\"", cfg_path, key), "PEFT's LoraConfig has it");
    return c.at(key);
  };
  if (field("peft_type") != "LORA")
    throw DataError(fmt::format("{}: peft_type is {}, not \"LORA\"", cfg_path, field("peft_type").dump()), "only LoRA adapters load here");
  const nlohmann::json& r = field("r");
  const nlohmann::json& alpha = field("lora_alpha");
  if (!r.is_number_integer() || r.get<int64_t>() != spec.r)
    throw ConfigError(fmt::format("{}: r is {}, the run's lora.r is {}", cfg_path, r.dump(), spec.r), fmt::format("--set lora.r={}", r.dump()));
  if (!alpha.is_number() || std::abs(alpha.get<double>() - spec.alpha) > 1e-9 * std::max(1.0, std::abs(spec.alpha)))
    throw ConfigError(fmt::format("{}: lora_alpha is {}, the run's lora.alpha is {}", cfg_path, alpha.dump(), spec.alpha),
                      fmt::format("--set lora.alpha={}", alpha.dump()));
  if (c.contains("use_rslora") && c.at("use_rslora").is_boolean() && c.at("use_rslora").get<bool>() != spec.use_rslora)
    throw ConfigError(fmt::format("{}: use_rslora is {}, the run's lora.use_rslora is {}", cfg_path, c.at("use_rslora").dump(), spec.use_rslora),
                      "the scaling differs: alpha / sqrt(r) against alpha / r");
  if (c.contains("use_dora") && c.at("use_dora").is_boolean() && c.at("use_dora").get<bool>())
    throw DataError(fmt::format("{}: a DoRA adapter (use_dora)", cfg_path), "only plain LoRA adapters load here");
  StFile f = read_safetensors(st_path);
  std::string missing, mismatched, unexpected;
  std::set<std::string> used;
  for (Parameter* p : model.parameters()) {
    if (!is_adapter(p->name)) continue;
    const std::string key = peft_adapter_key(p->name);
    auto it = f.tensors.find(key);
    if (it == f.tensors.end()) {
      missing += (missing.empty() ? "" : ", ") + key;
      continue;
    }
    used.insert(key);
    const StTensor& s = it->second;
    if (s.shape != p->data.shape() || (s.dtype != "F32" && s.dtype != "BF16" && s.dtype != "F16")) {
      mismatched += fmt::format("{}{} is {} {} in the file, {} in the model", mismatched.empty() ? "" : "; ", key, s.dtype, shape_str(s.shape),
                                shape_str(p->data.shape()));
      continue;
    }
    std::vector<float> v(static_cast<size_t>(p->data.numel()));
    convert(s.bytes.data(), parse_dtype(s.dtype), v.data(), DType::f32, p->data.numel());
    OnHost h(p->data, OnHost::out);
    if (h.p) std::copy(v.begin(), v.end(), h.p);
    h.store();
  }
  for (const auto& [name, s] : f.tensors)
    if (!used.count(name)) unexpected += (unexpected.empty() ? "" : ", ") + name;
  if (!missing.empty() || !mismatched.empty() || !unexpected.empty())
    throw DataError(fmt::format("{}: does not match the run's adapters.{}{}{}", st_path, missing.empty() ? "" : "\n  missing from the file: " + missing,
                                unexpected.empty() ? "" : "\n  not in the model: " + unexpected, mismatched.empty() ? "" : "\n  " + mismatched),
                    "lora.target_modules must name the modules the adapter was trained on (its adapter_config.json's target_modules)");
}

int merge_lora_tensors(std::map<std::string, F32Tensor>& t, float scaling) {
  int folded = 0;
  std::vector<std::string> gone;
  for (auto& [name, a] : t) {
    if (!name.ends_with(".lora_A.weight")) continue;
    const std::string module = name.substr(0, name.size() - 14);
    auto b = t.find(module + ".lora_B.weight");
    auto w = t.find(module + ".weight");
    if (b == t.end() || w == t.end())
      throw DataError(fmt::format("{} has no {}", name, b == t.end() ? module + ".lora_B.weight" : module + ".weight"),
                      "a LoRA adapter is lora_A and lora_B beside its base weight");
    const int64_t r = a.shape.at(0), in = a.shape.at(1), out = b->second.shape.at(0);
    if (w->second.shape != Shape{out, in} || b->second.shape != Shape{out, r})
      throw DataError(fmt::format("{}: lora_A {} and lora_B {} do not fit the weight {}", module, shape_str(a.shape), shape_str(b->second.shape),
                                  shape_str(w->second.shape)),
                      "the checkpoint is damaged");
    lora_fold(w->second.v.data(), a.v.data(), b->second.v.data(), out, in, r, scaling);
    gone.push_back(name);
    gone.push_back(b->first);
    folded++;
  }
  for (const std::string& g : gone) t.erase(g);
  return folded;
}

}  // namespace distlab
