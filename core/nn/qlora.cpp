// QLoRA's 4-bit base weight: quantize once, dequantize for each GEMM. See qlora.h.
#include "core/nn/qlora.h"

#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/ops/cpu/nf4.h"
#include "core/tensor/as_f32.h"
#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

namespace {

const char* torch_dtype_name(DType t) { return t == DType::bf16 ? "bfloat16" : t == DType::f16 ? "float16" : "float32"; }

// bitsandbytes' packed QuantState (pack_dict_to_tensor): the non-tensor fields as JSON bytes. The offset is
// written with a fixed width (%.9e: ten digits, enough to read back the same f32), so requantizing a weight
// never changes the size of its buffer.
std::string quant_json(const QuantState& q) {
  std::string s = fmt::format(R"({{"quant_type": "nf4", "blocksize": {}, "dtype": "{}", "shape": [{}, {}])", q.block, torch_dtype_name(q.dtype),
                              q.shape[0], q.shape[1]);
  if (q.double_quant)
    s += fmt::format(R"(, "nested_blocksize": {}, "nested_dtype": "float32", "nested_offset": {:.9e})", q.block2, double(q.offset));
  return s + "}";
}

// writes host values into a buffer's tensor (whatever its device); nothing on meta
void put(Buffer& b, const void* host) { b.data.from_host(host); }

// the quantized values of w into p's tensors (already sized)
void store(Parameter& p, const Nf4Weights& w) {
  QuantState& q = *p.quant;
  q.offset = w.offset;
  p.data.from_host(w.packed.data());
  if (q.double_quant) {
    put(q.absmax, w.absmax_q.data());
    put(q.nested_absmax, w.absmax2.data());
    put(q.nested_quant_map, dynamic8_code().data());
  } else {
    put(q.absmax, w.absmax.data());
  }
  put(q.quant_map, nf4_code().data());
  const std::string js = quant_json(q);
  DL_ASSERT(int64_t(js.size()) == q.json.data.numel(), "the quant state's JSON keeps its size");
  put(q.json, js.data());
}

}  // namespace

std::vector<Buffer*> QuantState::buffers() {
  if (double_quant) return {&absmax, &quant_map, &nested_absmax, &nested_quant_map, &json};
  return {&absmax, &quant_map, &json};
}

int64_t parameter_count(const Parameter& p) { return p.quant ? shape_numel(p.quant->shape) : p.data.numel(); }

void quantize_parameter(Runtime& rt, Parameter& p, const QuantSpec& spec) {
  DL_ASSERT(!p.quant && !p.requires_grad && p.data.dim() == 2, "quantize_parameter: a frozen 2-d weight, once: " + p.name);
  if (spec.type != "nf4")
    throw ConfigError(fmt::format("quantization.type = \"{}\": only NF4 is in the engine", spec.type), "use quantization.type = \"nf4\" (QLoRA's)");
  auto q = std::make_shared<QuantState>();
  q->shape = p.data.shape();
  q->double_quant = spec.double_quant;
  q->dtype = p.data.dtype();
  const int64_t n = p.data.numel(), blocks = (n + q->block - 1) / q->block;
  auto buffer = [&](Buffer& b, const std::string& suffix, int64_t numel, DType t) {
    b.name = p.name + suffix;
    b.data = rt.empty({numel}, Category::params, b.name, t);
  };
  buffer(q->absmax, ".absmax", blocks, spec.double_quant ? DType::u8 : DType::f32);
  buffer(q->quant_map, ".quant_map", 16, DType::f32);
  if (spec.double_quant) {
    buffer(q->nested_absmax, ".nested_absmax", (blocks + q->block2 - 1) / q->block2, DType::f32);
    buffer(q->nested_quant_map, ".nested_quant_map", 256, DType::f32);
  }
  buffer(q->json, ".quant_state.bitsandbytes__nf4", int64_t(quant_json(*q).size()), DType::u8);
  std::vector<float> w;
  if (p.data.data()) {
    OnHost h(p.data);
    w.assign(h.p, h.p + n);
  }
  p.data = rt.empty({(n + 1) / 2, 1}, Category::params, p.name + " (NF4)", DType::u8);  // the 16-bit weight is freed here
  p.quant = std::move(q);
  if (!w.empty()) store(p, nf4_quantize_weights(w.data(), n, spec.double_quant, p.quant->block));
}

void requantize_parameter(Parameter& p, const float* w) {
  DL_ASSERT(p.quant != nullptr, "requantize_parameter on a weight that is not 4-bit: " + p.name);
  store(p, nf4_quantize_weights(w, shape_numel(p.quant->shape), p.quant->double_quant, p.quant->block));
}

Tensor dequantize_parameter(Runtime& rt, const Parameter& p) {
  const QuantState& q = *p.quant;
  Tensor w = rt.empty(q.shape, Category::other, "dequantized " + p.name, rt.dtype);
  AsF32 out(rt, w, AsF32::out);
  const auto* packed = static_cast<const uint8_t*>(p.data.data());
  if (q.double_quant)
    dequantize_nf4(rt, out.p, packed, static_cast<const uint8_t*>(q.absmax.data.data()), static_cast<const float*>(q.nested_absmax.data.data()),
                   q.offset, w.numel(), q.block, q.block2);
  else
    dequantize_nf4(rt, out.p, packed, nullptr, static_cast<const float*>(q.absmax.data.data()), 0.0f, w.numel(), q.block, q.block2);
  out.store();  // rounded to the compute dtype, as bitsandbytes' dequantize_4bit writes it
  return w;
}

void quant_state_loaded(Parameter& p, const std::string& source) {
  QuantState& q = *p.quant;
  if (!q.json.data.data()) return;  // meta
  std::string text(size_t(q.json.data.numel()), ' ');
  q.json.data.to_host(text.data());
  const std::string where = fmt::format("{}: {}", source, q.json.name);
  nlohmann::json js;
  try {
    js = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("{} is not the JSON of a bitsandbytes quant state: {}", where, e.what()), "the file is damaged; quantize the base model again");
  }
  auto fail = [&](const std::string& what) {
    throw IoError(fmt::format("{}: {}", where, what), "the weight was quantized another way; load the 16-bit base model and let the run quantize it");
  };
  try {
    if (js.at("quant_type") != "nf4") fail("quant_type is " + js.at("quant_type").dump() + ", not \"nf4\"");
    if (js.at("blocksize") != q.block) fail("blocksize " + js.at("blocksize").dump() + ", not " + std::to_string(q.block));
    if (js.at("shape") != nlohmann::json(q.shape)) fail("shape " + js.at("shape").dump() + ", the model's is " + shape_str(q.shape));
    const std::string dtype = js.at("dtype").get<std::string>();
    q.dtype = dtype == "bfloat16" ? DType::bf16 : dtype == "float16" ? DType::f16 : DType::f32;  // what a requantize writes again
    if (q.double_quant) {
      if (js.at("nested_blocksize") != q.block2) fail("nested_blocksize " + js.at("nested_blocksize").dump());
      q.offset = float(js.at("nested_offset").get<double>());
    } else if (js.contains("nested_offset")) {
      fail("double quantization in the file, not in the run (quantization.double_quant)");
    }
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("a field is missing or of the wrong type: ") + e.what());
  }
  std::vector<float> code(16);
  q.quant_map.data.to_host(code.data());
  if (std::memcmp(code.data(), nf4_code().data(), 16 * sizeof(float)) != 0) fail("its quant_map is not NF4's 16 levels");
  if (q.double_quant) {
    std::vector<float> code8(256);
    q.nested_quant_map.data.to_host(code8.data());
    if (std::memcmp(code8.data(), dynamic8_code().data(), 256 * sizeof(float)) != 0) fail("its nested_quant_map is not bitsandbytes' dynamic 8-bit map");
  }
}

}  // namespace distlab
