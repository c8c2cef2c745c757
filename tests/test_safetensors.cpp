// safetensors: round trips in f32/bf16/f16, PyTorch names and layouts, bad files, and (when Debian's
// PyTorch is installed) a real exchange with torch.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/ckpt/safetensors.h"
#include "core/models/zoo.h"
#include "core/nn/loss.h"
#include "core/optim/optimizer.h"
#include "core/util/error.h"
#include "shell.h"

using namespace distlab;
namespace fs = std::filesystem;

static std::string tmp(const std::string& name) {
  return (fs::temp_directory_path() / ("distlab-st-" + std::to_string(::getpid()) + "-" + name)).string();
}

static ModelSpec cnn_spec(bool bn) {
  ModelSpec s;
  s.name = "cifar_cnn";
  s.in_channels = 3;
  s.height = s.width = 32;
  s.batchnorm = bn;
  return s;
}

TEST_CASE("parameter names and layouts follow PyTorch", "[safetensors]") {
  Runtime rt;
  auto cnn = build_model(rt, cnn_spec(true));
  std::vector<std::string> names;
  for (auto* p : cnn->parameters()) names.push_back(p->name + " " + shape_str(p->data.shape()));
  CHECK(names == std::vector<std::string>{"conv1.weight [32, 3, 3, 3]", "conv1.bias [32]", "bn1.weight [32]", "bn1.bias [32]",
                                          "conv2.weight [64, 32, 3, 3]", "conv2.bias [64]", "bn2.weight [64]", "bn2.bias [64]",
                                          "fc.weight [10, 4096]", "fc.bias [10]"});
  ModelSpec g;
  g.name = "gpt";
  g.vocab_size = 50;
  g.block_size = 8;
  g.n_layer = 1;
  g.n_head = 2;
  g.n_embd = 8;
  auto gpt = build_model(rt, g);
  std::vector<std::string> gn;
  for (auto* p : gpt->parameters()) gn.push_back(p->name);
  CHECK(gn.front() == "transformer.wte.weight");
  CHECK(std::find(gn.begin(), gn.end(), "transformer.h.0.attn.c_attn.weight") != gn.end());
  CHECK(std::find(gn.begin(), gn.end(), "transformer.h.0.mlp.c_proj.bias") != gn.end());
  CHECK(gn.back() == "transformer.ln_f.bias");
  CHECK(gpt->num_parameters() == gpt_params_exact(g));
}

TEST_CASE("save and load round-trip a model in f32, bf16 and f16", "[safetensors]") {
  Runtime rt;
  auto a = build_model(rt, cnn_spec(true));
  a->init(1);
  for (const char* dt : {"f32", "bf16", "f16"}) {
    INFO(dt);
    std::string path = tmp(std::string("rt-") + dt + ".safetensors");
    save_model(*a, path, parse_dtype(dt));
    CHECK_FALSE(fs::exists(path + ".partial"));
    auto b = build_model(rt, cnn_spec(true));
    b->init(2);
    load_model(*b, path);
    auto pa = a->parameters(), pb = b->parameters();
    for (size_t i = 0; i < pa.size(); i++) {
      for (int64_t j = 0; j < pa[i]->data.numel(); j++) {
        float x = pa[i]->data.f32()[j], y = pb[i]->data.f32()[j];
        if (std::string(dt) == "f32") REQUIRE(x == y);
        else if (std::string(dt) == "bf16") REQUIRE(y == bf16_to_f32(f32_to_bf16(x)));
        else REQUIRE(y == f16_to_f32(f32_to_f16(x)));
      }
    }
    StFile f = read_safetensors(path);
    CHECK(f.tensors.at("conv1.weight").dtype == (std::string(dt) == "f32" ? "F32" : std::string(dt) == "bf16" ? "BF16" : "F16"));
    CHECK(f.tensors.at("bn1.num_batches_tracked").dtype == "I64");
    CHECK(f.tensors.at("bn1.running_var").shape == Shape{32});
    fs::remove(path);
  }
}

TEST_CASE("the header is padded to 8 bytes and offsets are contiguous", "[safetensors]") {
  StFile f;
  f.tensors["b"] = StTensor{"F32", {2}, std::vector<uint8_t>(8, 1)};
  f.tensors["a"] = StTensor{"F16", {3}, std::vector<uint8_t>(6, 2)};
  std::string path = tmp("hdr.safetensors");
  write_safetensors(path, f);
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | raw[size_t(i)];
  CHECK(n % 8 == 0);
  CHECK(raw.size() == 8 + n + 14);
  StFile g = read_safetensors(path);
  CHECK(g.tensors.at("a").bytes == f.tensors.at("a").bytes);
  CHECK(g.tensors.at("b").bytes == f.tensors.at("b").bytes);
  fs::remove(path);
}

TEST_CASE("bad safetensors files are errors naming the file and the fault", "[safetensors]") {
  std::string path = tmp("bad.safetensors");
  auto write = [&](const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; };
  write("abc");
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains(path) && Catch::Contains("too short"));
  write(std::string("\xff\x00\x00\x00\x00\x00\x00\x00", 8) + "{}");
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("runs past the end"));
  std::string h = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  std::string len(8, '\0');
  len[0] = char(h.size());
  write(len + h + std::string(8, '\0'));  // 8 of the 16 data bytes
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("'w'") && Catch::Contains("data_offsets"));
  h = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16])";
  len[0] = char(h.size());
  write(len + h + std::string(16, '\0'));
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("not valid JSON"));
  // a file from another model: missing and unexpected names are listed
  Runtime rt;
  auto cnn = build_model(rt, cnn_spec(false));
  StFile f;
  f.tensors["conv1.weight"] = StTensor{"F32", {32, 3, 3, 3}, std::vector<uint8_t>(32 * 27 * 4)};
  f.tensors["stranger.weight"] = StTensor{"F32", {1}, std::vector<uint8_t>(4)};
  write_safetensors(path, f);
  CHECK_THROWS_WITH(load_model(*cnn, path), Catch::Contains("missing from the file: conv1.bias") &&
                                                Catch::Contains("not in the model: stranger.weight"));
  fs::remove(path);
}

TEST_CASE("weights move to and from PyTorch through safetensors", "[safetensors][torch]") {
  // the peer is a test dependency (scripts/setup.sh --tests installs it): missing, the test fails
  INFO("Debian's python3-torch is not installed: run scripts/setup.sh --tests (apt-get install python3-torch)");
  REQUIRE(torch_installed());
  Runtime rt;
  auto ours = build_model(rt, cnn_spec(false));
  ours->init(3);
  std::string from_us = tmp("to-torch.safetensors"), from_torch = tmp("from-torch.safetensors"), out = tmp("torch-out.txt");
  save_model(*ours, from_us, DType::bf16);
  // torch reads our file with its own parser of the format (no safetensors package needed), runs the
  // reference CNN on a fixed input, writes its logits and a modified state dict back as safetensors
  int rc = std::system(("/usr/bin/python3 " + std::string(DISTLAB_SOURCE_DIR) + "/tests/torch_peer.py logits " + from_us + " " +
                        from_torch + " " + out).c_str());
  REQUIRE(rc == 0);
  // torch's logits on our weights equal ours
  Batch b;
  b.B = 2;
  b.x = rt.empty({2, 3, 32, 32}, Category::activations);
  for (int64_t i = 0; i < b.x.numel(); i++) b.x.f32()[i] = float(i) / 3000.0f - 1.0f;
  auto bf = build_model(rt, cnn_spec(false));
  load_model(*bf, from_us);  // the same bf16-rounded weights torch got
  Tensor logits = bf->forward(rt, b);
  std::ifstream in(out);
  for (int64_t i = 0; i < 20; i++) {
    double v;
    in >> v;
    CHECK(logits.f32()[i] == Approx(v).margin(1e-4));
  }
  // torch's doubled weights load back under the same names and layouts
  auto back = build_model(rt, cnn_spec(false));
  load_model(*back, from_torch);
  auto pb = back->parameters(), pf = bf->parameters();
  for (size_t i = 0; i < pb.size(); i++)
    for (int64_t j = 0; j < pb[i]->data.numel(); j += 97) REQUIRE(pb[i]->data.f32()[j] == 2.0f * pf[i]->data.f32()[j]);
  for (auto p : {from_us, from_torch, out}) fs::remove(p);
}

TEST_CASE("SGD steps of the CNN, with and without BatchNorm, match PyTorch's", "[safetensors][torch]") {
  // the peer is a test dependency (scripts/setup.sh --tests installs it): missing, the test fails
  INFO("Debian's python3-torch is not installed: run scripts/setup.sh --tests (apt-get install python3-torch)");
  REQUIRE(torch_installed());
  for (bool bn : {false, true}) {
    INFO("batchnorm " << bn);
    Runtime rt;
    auto model = build_model(rt, cnn_spec(bn));
    model->init(11);
    std::string init = tmp("train-init.safetensors"), after = tmp("train-after.safetensors"), losses = tmp("losses.txt");
    save_model(*model, init, DType::f32);
    const int steps = 4;
    const float lr = 0.05f;
    int rc = std::system(("/usr/bin/python3 " + std::string(DISTLAB_SOURCE_DIR) + "/tests/torch_peer.py train " + init + " " +
                          after + " " + losses + (bn ? " bn " : " plain ") + std::to_string(steps) + " 0.05").c_str());
    REQUIRE(rc == 0);
    // our side: the same batch, the same steps
    Batch b;
    b.B = 8;
    b.x = rt.empty({8, 3, 32, 32}, Category::activations);
    for (int64_t i = 0; i < b.x.numel(); i++) b.x.f32()[i] = std::sin((float(i) / 3000.0f - 1.0f) * 7.0f);
    for (int i = 0; i < 8; i++) b.targets.push_back(i % 10);
    SGD opt(model->parameters(), SGDOptions{0.9f, 0.0f, 0.0f, false});
    CrossEntropyLoss ce;
    std::ifstream in(losses);
    for (int s = 0; s < steps; s++) {
      Tensor logits = model->forward(rt, b);
      double loss = ce.forward(rt, logits, b.targets);
      Tensor d = ce.backward(rt);
      model->backward(rt, d, nullptr);
      opt.step(rt, lr);
      model->zero_grad();
      double theirs;
      in >> theirs;
      CHECK(loss == Approx(theirs).epsilon(1e-4));
    }
    auto theirs = build_model(rt, cnn_spec(bn));
    load_model(*theirs, after);
    auto po = model->parameters(), pt = theirs->parameters();
    for (size_t i = 0; i < po.size(); i++) {
      INFO(po[i]->name);
      for (int64_t j = 0; j < po[i]->data.numel(); j++) REQUIRE(po[i]->data.f32()[j] == Approx(pt[i]->data.f32()[j]).margin(2e-4));
    }
    auto bo = model->buffers(), bt = theirs->buffers();
    for (size_t i = 0; i < bo.size(); i++) {
      INFO(bo[i]->name);
      for (int64_t j = 0; j < bo[i]->data.numel(); j++) REQUIRE(bo[i]->data.f32()[j] == Approx(bt[i]->data.f32()[j]).margin(1e-4));
    }
    for (auto p : {init, after, losses}) fs::remove(p);
  }
}

TEST_CASE("safetensors with overlapping, holed or trailing data, or an integer weight, are refused", "[safetensors]") {
  std::string path = tmp("tiles.safetensors");
  auto write = [&](const std::string& h, size_t data) {
    std::string len(8, '\0');
    for (int i = 0; i < 8; i++) len[size_t(i)] = char((h.size() >> (8 * i)) & 0xff);
    std::ofstream(path, std::ios::binary) << len << h << std::string(data, '\0');
  };
  // two names for the same bytes
  write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("overlaps"));
  // a hole, and bytes after the last tensor
  write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("a hole"));
  write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12);
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("follow the last tensor"));
  // a fractional tensor: 6 bytes of F32
  write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,6]}})", 6);
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("needs 8 bytes"));
  // a negative or absurd dimension
  write(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
  CHECK_THROWS_AS(read_safetensors(path), DataError);
  write(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  CHECK_THROWS_WITH(read_safetensors(path), Catch::Contains("cannot fit"));
  // an I64 tensor where a float weight belongs
  Runtime rt;
  auto cnn = build_model(rt, cnn_spec(false));
  std::string ok = tmp("tiles-ok.safetensors");
  save_model(*cnn, ok, DType::f32);
  StFile f = read_safetensors(ok);
  f.tensors["fc.bias"] = StTensor{"I64", {10}, std::vector<uint8_t>(80, 0)};
  write_safetensors(path, f);
  CHECK_THROWS_WITH(load_model(*cnn, path), Catch::Contains("fc.bias has dtype I64 (F32, BF16 or F16 expected)"));
  fs::remove(path);
  fs::remove(ok);
}

TEST_CASE("a GPT goes to PyTorch with its tied lm_head: nanoGPT loads it strictly, its logits are ours, its state_dict comes back",
          "[safetensors][torch][gpt]") {
  INFO("Debian's python3-torch is not installed: run scripts/setup.sh --tests (apt-get install python3-torch)");
  REQUIRE(torch_installed());
  ModelSpec spec;
  spec.name = "gpt";
  spec.vocab_size = 64, spec.block_size = 16, spec.n_layer = 2, spec.n_head = 2, spec.n_embd = 32;
  Runtime rt;
  auto ours = build_model(rt, spec);
  ours->init(5);
  ours->set_training(false);
  const std::string from_us = tmp("gpt-to-torch.safetensors"), from_torch = tmp("gpt-from-torch.safetensors"), out = tmp("gpt-logits.txt");
  save_model(*ours, from_us, DType::f32);
  StFile saved = read_safetensors(from_us);
  REQUIRE(saved.tensors.count("lm_head.weight"));  // the alias: nanoGPT's strict load needs the key
  CHECK(saved.tensors["lm_head.weight"].bytes == saved.tensors["transformer.wte.weight"].bytes);
  const int rc = std::system(("/usr/bin/python3 " + std::string(DISTLAB_SOURCE_DIR) + "/tests/torch_peer.py gpt " + from_us + " " + from_torch +
                              " " + out + " 2 2 32 64 16").c_str());
  REQUIRE(rc == 0);
  Batch b;
  b.B = 1, b.T = 16;
  for (int i = 0; i < 16; i++) b.tokens.push_back(i % 64), b.targets.push_back((i + 1) % 64);
  Tensor logits = ours->forward(rt, b);  // (16, 64)
  std::ifstream in(out);
  for (int64_t i = 0; i < 16 * 64; i++) {
    double v;
    in >> v;
    INFO(i);
    REQUIRE(logits.f32()[i] == Approx(v).margin(1e-4));
  }
  // PyTorch's state_dict has both keys of the tied pair: it loads back
  auto back = build_model(rt, spec);
  load_model(*back, from_torch);
  // an lm_head that is not wte's copy (a model trained untied) is refused, never silently dropped
  StFile untied = read_safetensors(from_torch);
  untied.tensors["lm_head.weight"].bytes[0] ^= 0x40;
  write_safetensors(from_torch, untied);
  CHECK_THROWS_WITH(load_model(*back, from_torch), Catch::Contains("lm_head.weight is not a copy of transformer.wte.weight"));
  for (auto p : {from_us, from_torch, out}) fs::remove(p);
}
