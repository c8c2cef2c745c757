#include "core/tensor/on_host.h"
#include "core/ckpt/safetensors.h"

#include <algorithm>
#include <set>
#include <map>
#include <tuple>
#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/util/atomic_file.h"
#include "core/ckpt/checkpoint.h"
#include "core/nn/qlora.h"
#include "core/util/error.h"
#include "core/util/read_file.h"

namespace distlab {

static int64_t st_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

StFile read_safetensors(const std::string& path) {
  std::vector<uint8_t> raw;
  try {  // a regular file only: never a link to /dev/zero, nor a FIFO that blocks forever
    raw = read_regular_file(path, uint64_t(1) << 40, "a safetensors file");
  } catch (const IoError& e) {
    throw DataError(e.what(), "check the path given to --init");
  }
  return parse_safetensors(raw, path);
}

StFile parse_safetensors(const std::vector<uint8_t>& raw, const std::string& path) {
  if (raw.size() < 8) throw DataError(fmt::format("{}: {} bytes is too short for a safetensors file", path, raw.size()));
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | raw[size_t(i)];
  if (n > raw.size() - 8)
    throw DataError(fmt::format("{}: header length {} runs past the end of the {}-byte file", path, n, raw.size()),
                    "the file is truncated or not safetensors");
  if (n > (uint64_t(100) << 20))  // the format's own limit
    throw DataError(fmt::format("{}: a header of {} bytes (safetensors allows 100 MB)", path, n), "is this a safetensors file?");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(raw.begin() + 8, raw.begin() + 8 + int64_t(n));
  } catch (const std::exception& e) {
    throw DataError(fmt::format("{}: the header is not valid JSON ({})", path, e.what()));
  }
  if (!h.is_object()) throw DataError(fmt::format("{}: the header is not a JSON object", path));
  const uint64_t data_bytes = raw.size() - 8 - n;
  StFile out;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans;  // [begin, end) of each tensor
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      for (auto& [k, mv] : v.items())
        if (mv.is_string()) out.metadata[k] = mv.get<std::string>();
      continue;
    }
    StTensor t;
    try {
      t.dtype = v.at("dtype").get<std::string>();
      t.shape = v.at("shape").get<Shape>();
      auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
      int64_t es = st_dtype_size(t.dtype);
      if (es == 0) throw DataError(fmt::format("{}: tensor '{}' has unknown dtype '{}'", path, name, t.dtype));
      uint64_t numel = 1;  // multiplied with a bound at each step, so it cannot wrap around
      for (int64_t d : t.shape) {
        if (d < 0 || d > (int64_t(1) << 40))
          throw DataError(fmt::format("{}: tensor '{}' has a dimension of {}", path, name, d), "the header is corrupt");
        numel = d == 0 ? 0 : numel > data_bytes ? numel : numel * uint64_t(d);
      }
      if (numel > data_bytes)
        throw DataError(fmt::format("{}: tensor '{}' of shape {} cannot fit in {} data bytes", path, name, shape_str(t.shape), data_bytes));
      if (off.size() != 2 || off[0] > off[1] || off[1] > data_bytes)
        throw DataError(fmt::format("{}: tensor '{}' has data_offsets outside the file's {} data bytes", path, name, data_bytes),
                        "the file is truncated or corrupt");
      if (int64_t(off[1] - off[0]) != shape_numel(t.shape) * es)
        throw DataError(fmt::format("{}: tensor '{}' of shape {} {} needs {} bytes but its offsets span {}", path, name,
                                    shape_str(t.shape), t.dtype, shape_numel(t.shape) * es, off[1] - off[0]));
      t.bytes.assign(raw.begin() + 8 + int64_t(n + off[0]), raw.begin() + 8 + int64_t(n + off[1]));
      spans.emplace_back(off[0], off[1], name);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: entry '{}' of the header is malformed ({})", path, name, e.what()));
    }
    out.tensors[name] = std::move(t);
  }
  // The tensors tile the data buffer exactly, as the format requires: no overlap (two names for the same
  // bytes), no holes, nothing after the last one.
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [begin, end, name] : spans) {
    if (begin != at)
      throw DataError(fmt::format("{}: tensor '{}' starts at byte {} of the data, where {} was expected ({})", path, name, begin, at,
                                  begin < at ? "it overlaps the tensor before it" : "a hole before it"),
                      "the file is corrupt or was not written by a safetensors writer");
    at = end;
  }
  if (at != data_bytes)
    throw DataError(fmt::format("{}: {} bytes of data follow the last tensor", path, data_bytes - at), "the file is corrupt");
  return out;
}

WrittenFile write_safetensors(const std::string& path, const StFile& file, const std::function<void()>& before_commit) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (const auto& [name, t] : file.tensors) {  // std::map: sorted by name
    h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  if (!file.metadata.empty()) h["__metadata__"] = file.metadata;
  std::string header = h.dump();
  while (header.size() % 8) header += ' ';
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
  AtomicFile f(path);
  WrittenFile w;
  auto put = [&](const void* p, size_t n) {
    f.write(p, n);
    w.crc32 = crc32(p, n, w.crc32);
    w.bytes += n;
  };
  put(len, 8);
  put(header.data(), header.size());
  for (const auto& [name, t] : file.tensors) put(t.bytes.data(), t.bytes.size());
  f.flush();
  if (before_commit) before_commit();
  f.commit();
  return w;
}

static StTensor to_st(const Tensor& t, DType dtype) {
  StTensor s;
  s.dtype = dtype_safetensors_name(dtype);
  s.shape = t.shape();
  s.bytes.resize(size_t(t.numel() * dtype_size(dtype)));
  if (!t.data() || !t.numel()) return s;
  if (t.device() != DeviceKind::cuda) {
    convert(t.data(), t.dtype(), s.bytes.data(), dtype, t.numel());
  } else {  // a GPU's tensor: down first
    std::vector<uint8_t> raw(size_t(t.nbytes()));
    t.to_host(raw.data());
    convert(raw.data(), t.dtype(), s.bytes.data(), dtype, t.numel());
  }
  return s;
}

void save_model(Model& model, const std::string& path, DType dtype, const Optimizer* masters, const std::map<std::string, std::string>& metadata) {
  StFile f;
  for (auto* p : model.parameters()) {
    if (p->data.is_meta())
      throw IoError("cannot save a model that lives on the meta device: it has no values", "run on --device cpu to --save");
    const Tensor* master = masters ? masters->master(p) : nullptr;
    // a 4-bit weight (QLoRA) as bitsandbytes saves it: its bytes, the constants among the buffers
    f.tensors[p->name] = to_st(master ? *master : p->data, p->data.dtype() == DType::u8 ? DType::u8 : dtype);
  }
  for (auto* b : model.buffers()) {
    if (b->name.size() >= 20 && b->name.compare(b->name.size() - 20, 20, ".num_batches_tracked") == 0) {
      StTensor s{"I64", {}, std::vector<uint8_t>(8)};
      OnHost h(b->data);
      int64_t v = int64_t(h.p[0]);
      std::memcpy(s.bytes.data(), &v, 8);
      f.tensors[b->name] = s;
    } else {
      f.tensors[b->name] = to_st(b->data, b->data.dtype() == DType::u8 ? DType::u8 : DType::f32);  // running statistics stay f32
    }
  }
  add_tied_lm_head(f);
  f.metadata = metadata;
  f.metadata["format"] = "pt";
  f.metadata["producer"] = "distlab";
  write_safetensors(path, f);
}

void add_tied_lm_head(StFile& f) {
  const auto wte = f.tensors.find("transformer.wte.weight");
  if (wte != f.tensors.end() && !f.tensors.count("lm_head.weight")) {
    const StTensor copy = wte->second;
    f.tensors["lm_head.weight"] = copy;
  }
}

void load_model(Model& model, const std::string& path) {
  StFile f = read_safetensors(path);
  // QLoRA's 4-bit weights come as the file holds them: their NF4 bytes and constants (a quantized model), or
  // their 16/32-bit values at their own shape (the base model: quantized as it loads, as transformers does;
  // the constants then are not in the file)
  std::map<std::string, Parameter*> quantize_on_load;
  std::set<std::string> computed;
  for (auto* p : model.parameters()) {
    if (!p->quant) continue;
    const auto it = f.tensors.find(p->name);
    if (it == f.tensors.end() || it->second.shape != p->quant->shape || it->second.dtype == "U8") continue;
    quantize_on_load[p->name] = p;
    for (Buffer* b : p->quant->buffers()) computed.insert(b->name);
  }
  std::vector<std::pair<std::string, Tensor*>> want;
  for (auto* p : model.parameters()) want.push_back({p->name, &p->data});
  for (auto* b : model.buffers())
    if (!computed.count(b->name)) want.push_back({b->name, &b->data});
  std::string missing, mismatched;
  // a base model's file under LoRA: it has no adapters, which keep their fresh values (PEFT loads the base,
  // then adds them); a file with some adapters must have them all
  auto is_adapter = [](const std::string& n) { return n.find(".lora_A.") != std::string::npos || n.find(".lora_B.") != std::string::npos; };
  bool file_has_adapters = false;
  for (const auto& [name, s] : f.tensors) file_has_adapters = file_has_adapters || is_adapter(name);
  for (auto& [name, dst] : want) {
    auto it = f.tensors.find(name);
    if (it == f.tensors.end()) {
      if (!file_has_adapters && is_adapter(name)) continue;
      missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    const StTensor& s = it->second;
    if (quantize_on_load.count(name) && (s.dtype == "F32" || s.dtype == "BF16" || s.dtype == "F16")) {
      std::vector<float> v(size_t(shape_numel(s.shape)));
      convert(s.bytes.data(), parse_dtype(s.dtype), v.data(), DType::f32, int64_t(v.size()));
      if (dst->data()) requantize_parameter(*quantize_on_load.at(name), v.data());
      continue;
    }
    if (s.shape != dst->shape()) {
      mismatched += fmt::format("{}{} is {} in the file, {} in the model", mismatched.empty() ? "" : "; ", name,
                                shape_str(s.shape), shape_str(dst->shape()));
      continue;
    }
    if (!dst->data()) continue;  // meta
    if (s.dtype == "I64" && dst->numel() == 1 && name.size() >= 20 && name.ends_with("num_batches_tracked")) {
      int64_t v;  // BatchNorm's step counter, the one integer tensor of PyTorch's state dicts here
      std::memcpy(&v, s.bytes.data(), 8);
      OnHost h(*dst, OnHost::out);
      h.p[0] = float(v);
      h.store();
    } else if ((s.dtype == "U8") != (dst->dtype() == DType::u8)) {  // bytes (a 4-bit weight, its constants) against values
      mismatched += fmt::format("{}{} has dtype {} ({} expected)", mismatched.empty() ? "" : "; ", name, s.dtype,
                                dst->dtype() == DType::u8 ? "U8: the model holds it in 4 bits" : "F32, BF16 or F16");
    } else if ((s.dtype == "F32" || s.dtype == "BF16" || s.dtype == "F16" || s.dtype == "U8") && dst->device() != DeviceKind::cuda) {
      convert(s.bytes.data(), parse_dtype(s.dtype), dst->data(), dst->dtype(), dst->numel());
    } else if (s.dtype == "F32" || s.dtype == "BF16" || s.dtype == "F16" || s.dtype == "U8") {  // a GPU's tensor: converted here, then up
      std::vector<uint8_t> raw(size_t(dst->nbytes()));
      convert(s.bytes.data(), parse_dtype(s.dtype), raw.data(), dst->dtype(), dst->numel());
      dst->from_host(raw.data());
    } else {
      mismatched += fmt::format("{}{} has dtype {} ({} expected)", mismatched.empty() ? "" : "; ", name, s.dtype,
                                name.ends_with("num_batches_tracked") ? "I64" : "F32, BF16 or F16");
    }
  }
  std::string unexpected;
  for (const auto& [name, s] : f.tensors) {
    bool known = false;
    for (auto& w : want) known = known || w.first == name;
    if (!known && name == "lm_head.weight") {  // the tied alias (add_tied_lm_head): the same values as wte, or refused
      const auto wte = f.tensors.find("transformer.wte.weight");
      bool model_ties = false;
      for (auto& w : want) model_ties = model_ties || w.first == "transformer.wte.weight";
      if (model_ties && wte != f.tensors.end() && wte->second.dtype == s.dtype && wte->second.shape == s.shape && wte->second.bytes == s.bytes)
        continue;
      if (model_ties)
        throw DataError(fmt::format("{}: lm_head.weight is not a copy of transformer.wte.weight", path),
                        "distlab's GPT ties the lm_head to the token embedding (nanoGPT's weight tying): an untied lm_head has "
                        "no place in it");
    }
    if (!known) unexpected += (unexpected.empty() ? "" : ", ") + name;
  }
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty())
    throw DataError(fmt::format("{}: does not match the model.{}{}{}", path,
                                missing.empty() ? "" : "\n  missing from the file: " + missing,
                                unexpected.empty() ? "" : "\n  not in the model: " + unexpected,
                                mismatched.empty() ? "" : "\n  mismatched: " + mismatched),
                    "was it saved from a model with the same config (model.* keys)?");
  for (auto* p : model.parameters())
    if (p->quant && !quantize_on_load.count(p->name)) quant_state_loaded(*p, path);
}

}  // namespace distlab
