// QLoRA (core/nn/qlora.h, core/models/peft.h quantize_base): a Linear whose frozen weight is NF4 computes what
// a plain Linear holding the dequantized weight computes, bit for bit; a QLoRA Llama trains as LoRA on the
// dequantized base (the 4-bit bytes never move); the model saved with bitsandbytes' names loads back
// bitwise, and a 16-bit base file is quantized as it loads; [quantization] through the trainer (its memory,
// cuda-sim, DDP, a resume, the refusals); Llama 3 8B and 70B on one card.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/ckpt/safetensors.h"
#include "core/models/peft.h"
#include "core/nn/loss.h"
#include "core/ops/attach.h"
#include "core/ops/cpu/nf4.h"
#include "core/optim/optimizer.h"
#include "lora_fixtures.h"
#include "shell.h"
#include "train_harness.h"

using namespace distlab;
using namespace distlab::testing;
namespace fs = std::filesystem;

namespace {

// NF4 there and back on the host (core/ops/cpu/nf4.h): what the 4-bit weight stands for
std::vector<float> nf4_round_trip(const std::vector<float>& w) {
  const Nf4Weights q = nf4_quantize_weights(w.data(), int64_t(w.size()));
  std::vector<float> out(w.size());
  nf4_dequantize_weights(q, out.data());
  return out;
}

Tensor host_tensor(Runtime& rt, const Shape& shape, const std::vector<float>& v) {
  Tensor t = rt.empty(shape, Category::other, "test values", DType::f32);
  std::copy(v.begin(), v.end(), t.f32());
  return t;
}

// a tiny Llama with adapters on q_proj, v_proj and down_proj; `quantize`: its base in NF4, else each
// Linear's weight replaced by the values its NF4 form stands for
std::unique_ptr<Model> qlora_llama(Runtime& rt, bool quantize) {
  auto m = build_model(rt, tiny_llama());
  m->init(5);
  LoraSpec lora;
  lora.r = 4, lora.alpha = 8;
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  apply_lora(rt, *m, lora, 5);
  if (quantize) {
    CHECK(quantize_base(rt, *m, QuantSpec{4}) == 14);  // seven Linears a block; the lm_head stays 16-bit
    return m;
  }
  for (auto& [name, l] : named_linears(*m))
    if (name != "lm_head") l->weight.data.copy_from(host_tensor(rt, l->weight.data.shape(), nf4_round_trip(values(l->weight.data))));
  return m;
}

std::vector<double> train(Runtime& rt, Model& m, int steps) {
  AdamW opt(trainable(m.parameters()), AdamWOptions{0.9f, 0.999f, 1e-8f, 0.01f});
  std::vector<double> losses;
  for (int s = 0; s < steps; s++) {
    m.zero_grad();
    const Batch b = lora_batch(s, 2, 16, 64);
    Tensor logits = m.forward(rt, b);
    CrossEntropyLoss ce;
    losses.push_back(ce.forward(rt, logits, b.targets));
    m.backward(rt, ce.backward(rt), nullptr);
    opt.step(rt, 3e-3f, 1.0f);
  }
  return losses;
}

// every parameter's and buffer's bytes, by name
std::map<std::string, std::vector<float>> state_of(Model& m) {
  std::map<std::string, std::vector<float>> s;
  for (Parameter* p : m.parameters()) s[p->name] = values(p->data);
  for (Buffer* b : m.buffers()) s[b->name] = values(b->data);
  return s;
}

}  // namespace

TEST_CASE("a QLoRA Linear computes with its NF4 weight dequantized: the bits of a Linear holding those values, in f32 and bf16",
          "[qlora]") {
  const int64_t N = 8, in = 96, out = 40;
  for (const DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    Runtime rt;
    rt.dtype = dt;
    Linear q(rt, "proj", in, out), plain(rt, "proj", in, out);
    Rng rng(3);
    q.init(rng);
    q.weight.requires_grad = plain.weight.requires_grad = false;
    q.bias.requires_grad = plain.bias.requires_grad = false;
    plain.weight.data.copy_from(host_tensor(rt, {out, in}, nf4_round_trip(values(q.weight.data))));
    plain.bias.data.copy_from(q.bias.data);
    quantize_parameter(rt, q.weight, QuantSpec{4});
    // bitsandbytes' Params4bit: (numel/2, 1) bytes; an absmax byte per 64 weights; an f32 per 256 of those
    REQUIRE(q.weight.data.dtype() == DType::u8);
    CHECK(q.weight.data.shape() == Shape{in * out / 2, 1});
    CHECK(q.weight.quant->absmax.data.numel() == in * out / 64);
    CHECK(q.weight.quant->absmax.data.dtype() == DType::u8);
    CHECK(q.weight.quant->nested_absmax.data.numel() == 1);
    CHECK(q.buffers().size() == 5);
    CHECK(q.buffers()[0]->name == "proj.weight.absmax");
    CHECK(parameter_count(q.weight) == in * out);
    Rng xr(4);
    Tensor x = rt.empty({N, in}, Category::activations, "x", dt), dy = rt.empty({N, out}, Category::activations, "dy", dt);
    init_normal(x, xr, 1.0f);
    init_normal(dy, xr, 1.0f);
    CHECK(values(q.forward(rt, x)) == values(plain.forward(rt, x)));
    CHECK(values(q.backward(rt, dy)) == values(plain.backward(rt, dy)));
    CHECK_FALSE(q.weight.grad.defined());
    // on the GPU path (the kernel table, cuda-sim): the same bits
    Runtime sim(DeviceKind::cuda);
    auto dev = attach_device(sim, "cuda-sim", 0);
    REQUIRE(dev);
    sim.dtype = dt;
    Linear qs(sim, "proj", in, out);
    qs.weight.requires_grad = qs.bias.requires_grad = false;
    Rng rng2(3);
    Linear host_init(rt, "proj", in, out);
    host_init.init(rng2);
    qs.weight.data.copy_from(host_init.weight.data);
    qs.bias.data.copy_from(host_init.bias.data);
    quantize_parameter(sim, qs.weight, QuantSpec{4});
    Tensor xs = sim.empty({N, in}, Category::activations, "x", dt);
    xs.copy_from(x);
    Tensor ys = qs.forward(sim, xs), yh = rt.empty(ys.shape(), Category::other, "y", dt);
    yh.copy_from(ys);
    CHECK(values(yh) == values(plain.forward(rt, x)));
  }
}

TEST_CASE("a QLoRA Llama trains as LoRA on its dequantized base, bit for bit, and its 4-bit bytes never move", "[qlora]") {
  for (const DType dt : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dt));
    Runtime rt;
    rt.dtype = dt;
    auto q = qlora_llama(rt, true);
    auto twin = qlora_llama(rt, false);
    const auto before = state_of(*q);
    const std::vector<double> ours = train(rt, *q, 8), theirs = train(rt, *twin, 8);
    CHECK(ours == theirs);
    const auto after = state_of(*q);
    for (auto& [name, v] : before) {
      INFO(name);
      if (name.find(".lora_B.") != std::string::npos) CHECK(after.at(name) != v);  // the adapters trained
      else if (name.find(".lora_A.") == std::string::npos) CHECK(after.at(name) == v);  // the base, its constants, norms, embeddings: as they were
    }
    // PEFT's count: a 4-bit weight counts its own shape
    CHECK(count_parameters(*q).all == count_parameters(*twin).all);
    CHECK(count_parameters(*q).trainable == count_parameters(*twin).trainable);
  }
}

TEST_CASE("a QLoRA model saved under bitsandbytes' names loads back bit for bit, and a 16-bit base file is quantized as it loads",
          "[qlora][safetensors]") {
  Runtime rt;
  const fs::path dir = fs::path(scratch_path("qlora", "save"));
  fs::create_directories(dir);
  const std::string path = (dir / "q.safetensors").string(), base = (dir / "base.safetensors").string();
  auto q = qlora_llama(rt, true);
  train(rt, *q, 2);  // trained adapters
  save_model(*q, path, DType::f32);
  StFile f = read_safetensors(path);
  const std::string w = "model.layers.0.self_attn.q_proj.weight";
  REQUIRE(f.tensors.count(w));
  CHECK(f.tensors.at(w).dtype == "U8");
  CHECK(f.tensors.at(w).shape == Shape{32 * 32 / 2, 1});
  CHECK(f.tensors.at(w + ".absmax").dtype == "U8");
  CHECK(f.tensors.at(w + ".nested_absmax").dtype == "F32");
  CHECK(f.tensors.at(w + ".quant_map").shape == Shape{16});
  CHECK(f.tensors.at(w + ".nested_quant_map").shape == Shape{256});
  const auto& js_bytes = f.tensors.at(w + ".quant_state.bitsandbytes__nf4").bytes;
  const nlohmann::json js = nlohmann::json::parse(std::string(js_bytes.begin(), js_bytes.end()));
  CHECK(js["quant_type"] == "nf4");
  CHECK(js["blocksize"] == 64);
  CHECK(js["shape"] == nlohmann::json::array({32, 32}));
  CHECK(js["nested_blocksize"] == 256);
  CHECK(f.tensors.at("lm_head.weight").dtype == "F32");  // the head stays 16/32-bit
  // into a fresh QLoRA model of another seed: every byte as saved, the offset read back from the JSON
  auto back = build_model(rt, tiny_llama());
  back->init(99);
  LoraSpec lora;
  lora.r = 4, lora.alpha = 8, lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  apply_lora(rt, *back, lora, 99);
  quantize_base(rt, *back, QuantSpec{4});
  load_model(*back, path);
  CHECK(state_of(*back) == state_of(*q));
  const Batch b = lora_batch(0, 1, 16, 64);
  CHECK(values(back->forward(rt, b)) == values(q->forward(rt, b)));

  // a base model's file (16-bit weights at their own shape) into a QLoRA run: quantized as it loads, as
  // transformers' from_pretrained(load_in_4bit) does: the bytes of quantizing those weights in the model
  auto plain = build_model(rt, tiny_llama());
  plain->init(7);
  save_model(*plain, base, DType::f32);
  auto from_file = qlora_llama(rt, true);
  load_model(*from_file, base);
  auto direct = build_model(rt, tiny_llama());
  direct->init(7);
  apply_lora(rt, *direct, lora, 5);
  quantize_base(rt, *direct, QuantSpec{4});
  for (auto& [name, l] : named_linears(*direct)) {
    INFO(name);
    Linear* other = nullptr;
    for (auto& [n2, l2] : named_linears(*from_file))
      if (n2 == name) other = l2;
    REQUIRE(other);
    CHECK(values(other->weight.data) == values(l->weight.data));
    if (l->weight.quant)
      for (size_t i = 0; i < l->buffers().size(); i++) CHECK(values(other->buffers()[i]->data) == values(l->buffers()[i]->data));
  }

  // a damaged quant state is an error naming the tensor
  StFile bad = read_safetensors(path);
  bad.tensors.at(w + ".quant_map").bytes[0] ^= 1;
  write_safetensors((dir / "bad.safetensors").string(), bad);
  try {
    load_model(*back, (dir / "bad.safetensors").string());
    FAIL("a quant_map that is not NF4's loaded");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains(w + ".quant_state.bitsandbytes__nf4") && Catch::Contains("quant_map"));
  }
  fs::remove_all(dir);
}

TEST_CASE("[quantization] through the trainer: 4-bit base memory, cuda-sim's bits, DDP as one rank, a resume, the refusals",
          "[qlora][train][dist]") {
  const std::string cfg = "configs/llama-tiny.toml";
  const std::string qlora = "--set lora.r=8 --set lora.alpha=16 --set lora.target_modules=q_proj,v_proj,o_proj --set train.steps=6 "
                            "--set train.eval_batches=2 --set optim.warmup_steps=2 --set quantization.bits=4 ";
  TrainRun one = train_ranks(1, cfg, qlora);
  INFO(one.out);
  REQUIRE(one.code == 0);
  CHECK_THAT(one.out, Catch::Contains("QLoRA: 14 Linear weight(s) in NF4, double-quantized"));
  CHECK(one.summary["lora"]["all_params"] == 130880);  // as the 16-bit base: a 4-bit weight counts its own shape
  CHECK(one.summary["lora"]["quantization"]["linears"] == 14);
  // params: the Linears at half a byte a weight, an absmax byte per 64, an f32 per 256 absmax, the code books
  // and the JSON; embeddings, norms, the head and the adapters at 4 bytes
  const int64_t linear = 2 * (4096 + 2048 + 2048 + 4096 + 3 * 11264), rest = 130880 - 5632 - linear;
  const int64_t min_bytes = linear / 2 + linear / 64 + 14 * (4 + 64 + 1024) + 4 * (rest + 5632);
  const int64_t params = one.summary["peak_memory"]["params"];
  CHECK(params > min_bytes);
  CHECK(params < min_bytes + 14 * 200);  // the JSON: under 200 bytes a weight
  CHECK(one.summary["peak_memory"]["grads"] == 5632 * 4);
  TrainRun sim = train_ranks(1, cfg, qlora + "--device cuda-sim");
  INFO(sim.out);
  REQUIRE(sim.code == 0);
  CHECK(sim.losses == one.losses);
  TrainRun ddp = train_ranks(2, cfg, qlora + "--set train.micro_batch=8 --set parallel.strategy=ddp");
  INFO(ddp.out);
  REQUIRE(ddp.code == 0);
  CHECK(max_rel_diff(ddp.losses, one.losses) < 1e-6);
  // a resume: the 4-bit base and its constants come back from the checkpoint
  check_resume_bitwise(cfg, qlora, 3, "qlora");

  const std::string toml = file_text(cfg);
  auto fails = [&](const std::vector<std::string>& sets, const std::string& needle) { expect_train_error(toml, sets, needle); };
  fails({"quantization.bits=4"}, "lora.r = 0");
  fails({"lora.r=8", "quantization.bits=8"}, "quantization.bits");
  fails({"lora.r=8", "quantization.bits=4", "quantization.type=fp4"}, "quantization.type");
}

TEST_CASE("QLoRA puts Llama 3 8B on one 24 GB card and 70B on one 80 GB card, where their 16-bit LoRA needs 2.6x more for the base",
          "[qlora][meta]") {
  const double gib = 1024.0 * 1024 * 1024;
  const std::vector<std::string> sets = {"train.micro_batch=1",   "data.seq_len=2048", "model.attention=flash", "train.activation_checkpointing=full",
                                         "lora.r=16",             "lora.alpha=32",     "lora.target_modules=all-linear"};
  std::vector<std::string> q = sets;
  q.push_back("quantization.bits=4");
  TrainRun r8 = train_in_process(file_text("configs/llama3-8b.toml"), q, DeviceKind::meta);
  CHECK(r8.summary["lora"]["all_params"] == 8072204288LL);
  CHECK(r8.summary["lora"]["quantization"]["linears"] == 224);
  // 8B: 6,979,321,856 Linear weights at 4.127 bits, 1,051,205,632 of embedding and head and 266,240 of norms
  // in bf16, the adapters in bf16
  const double linear = 6979321856.0, bf16_rest = 2.0 * (2 * 525336576.0 + 266240.0 + 41943040.0);
  const double params = r8.summary["peak_memory"]["params"].get<double>();
  CHECK(params > linear * 4.127 / 8 + bf16_rest);
  CHECK(params < linear * 4.128 / 8 + bf16_rest);
  CHECK(r8.summary["peak_memory_reserved"].get<double>() < 21.8 * gib);  // a 24 GiB card less 1 GiB and 5 %
  TrainRun r70 = train_in_process(file_text("configs/llama3-70b.toml"), q, DeviceKind::meta);
  CHECK(r70.summary["peak_memory_reserved"].get<double>() < 74.0 * gib);  // an 80 GiB card less 1 GiB and 5 %
  TrainRun l70 = train_in_process(file_text("configs/llama3-70b.toml"), sets, DeviceKind::meta);
  CHECK(l70.summary["peak_memory_reserved"].get<double>() > 130 * gib);  // its bf16 base alone is 131 GiB
}

TEST_CASE("ckpt export of a QLoRA checkpoint: bitsandbytes' file as it was, or --merge into the dequantized base (the adapted model's logits)",
          "[qlora][ckpt][cli]") {
  const std::string cfg = "configs/llama-tiny.toml", dir = scratch_path("qlora-export", "d") + "/";
  fs::create_directories(dir);
  const std::string q = "--set lora.r=4 --set lora.alpha=8 --set lora.target_modules=all-linear --set quantization.bits=4 --set train.steps=3 "
                        "--set train.eval_batches=1 ";
  TrainRun r = train_ranks(1, cfg, q + "--set checkpoint.dir=" + dir + "ckpt --save " + dir + "q.safetensors");
  INFO(r.out);
  REQUIRE(r.code == 0);
  auto [code, out] = shell_in_source(std::string(DISTLAB_BINARY) + " ckpt export " + dir + "ckpt --out " + dir + "merged.safetensors --merge");
  INFO(out);
  REQUIRE(code == 0);
  auto [code2, out2] = shell_in_source(std::string(DISTLAB_BINARY) + " ckpt export " + dir + "ckpt --out " + dir + "exported.safetensors");
  INFO(out2);
  REQUIRE(code2 == 0);
  const ModelSpec spec = llama_tiny_toml();
  Runtime rt;
  auto adapted = [&] {
    auto m = build_model(rt, spec);
    LoraSpec l;
    l.r = 4, l.alpha = 8, l.target_modules = {"all-linear"};
    apply_lora(rt, *m, l, 0);
    quantize_base(rt, *m, QuantSpec{4});
    return m;
  };
  auto saved = adapted(), exported = adapted();
  load_model(*saved, dir + "q.safetensors");
  load_model(*exported, dir + "exported.safetensors");  // the checkpoint's bytes: the --save file's, bit for bit
  CHECK(state_of(*exported) == state_of(*saved));
  StFile merged = read_safetensors(dir + "merged.safetensors");
  CHECK(merged.tensors.at("model.layers.0.mlp.down_proj.weight").shape == Shape{64, 176});
  for (const auto& [name, t] : merged.tensors) CHECK((name.find("lora_") == std::string::npos && name.find("absmax") == std::string::npos));
  auto plain = build_model(rt, spec);
  load_model(*plain, dir + "merged.safetensors");
  CHECK(logits_diff(rt, *saved, *plain) < 1e-4);
  fs::remove_all(dir);
}
