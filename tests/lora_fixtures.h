// What the LoRA and QLoRA tests share (tests/test_lora.cpp, tests/test_qlora.cpp): the tiny Llama of
// torch_peer.py's lora mode, its batches, and a tensor's values as f32.
#pragma once
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "core/data/batch.h"
#include "core/models/zoo.h"
#include "core/tensor/tensor.h"
#include "train_harness.h"

namespace distlab::testing {

inline ModelSpec tiny_llama() {
  ModelSpec s;
  s.name = "llama";
  s.vocab_size = 64, s.block_size = 16, s.n_layer = 2, s.n_head = 4, s.n_kv_head = 2, s.n_embd = 32;
  s.intermediate_size = 48, s.rope_theta = 10000.0f;
  return s;
}

// the batches of torch_peer.py's lora_batch()
inline Batch lora_batch(int step, int64_t B, int64_t T, int64_t V) {
  Batch b;
  b.B = B, b.T = T;
  for (int64_t i = 0; i < B; i++) {
    std::vector<int32_t> row;
    for (int64_t t = 0; t <= T; t++) row.push_back(int32_t((step * 7 + i * 13 + t * 5 + (t * t) % 11) % V));
    for (int64_t t = 0; t < T; t++) b.tokens.push_back(row[size_t(t)]), b.targets.push_back(row[size_t(t + 1)]);
  }
  return b;
}

// a host tensor's values as f32 (its bytes as 0..255 for u8)
inline std::vector<float> values(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  convert(t.data(), t.dtype(), v.data(), DType::f32, t.numel());
  return v;
}

// configs/llama-tiny.toml's model, for the files its runs save
inline ModelSpec llama_tiny_toml() {
  ModelSpec spec;
  spec.name = "llama", spec.vocab_size = 256, spec.block_size = 64, spec.n_layer = 2, spec.n_head = 4, spec.n_kv_head = 2, spec.n_embd = 64;
  spec.intermediate_size = 176;
  return spec;
}

// the largest difference between two models' logits on one batch of 32 tokens
inline double logits_diff(Runtime& rt, Model& a, Model& b) {
  Batch batch;
  batch.B = 1, batch.T = 32;
  for (int t = 0; t < 32; t++) batch.tokens.push_back((t * 37) % 256), batch.targets.push_back(0);
  const std::vector<float> x = values(a.forward(rt, batch)), y = values(b.forward(rt, batch));
  double diff = 0;
  for (size_t i = 0; i < x.size(); i++) diff = std::max(diff, double(std::abs(x[i] - y[i])));
  return diff;
}

// A run of `cfg` with `args` on `ranks` ranks stopped after `at` of its steps (a checkpoint) and resumed: the resumed steps'
// losses bitwise those of the run straight through (a constant lr: the same schedule either way)
inline void check_resume_bitwise(const std::string& cfg, const std::string& args, int at, const std::string& tag, int ranks = 1) {
  const std::string dir = scratch_path(tag, "ckpt");
  const std::string run = args + "--set optim.schedule=constant ";
  TrainRun first = train_ranks(ranks, cfg, run + "--set train.steps=" + std::to_string(at) + " --set checkpoint.dir=" + dir);
  TrainRun rest = train_ranks(ranks, cfg, run + "--set checkpoint.dir=" + dir);
  TrainRun straight = train_ranks(ranks, cfg, run);
  INFO(rest.out);
  REQUIRE(first.code == 0);
  REQUIRE(rest.code == 0);
  REQUIRE(straight.losses.size() > size_t(at));
  REQUIRE(rest.losses.size() == straight.losses.size() - size_t(at));
  CHECK(std::vector<double>(straight.losses.begin() + at, straight.losses.end()) == rest.losses);
  std::filesystem::remove_all(dir);
}

// a run of `toml` with `sets` (and one step) on the meta device fails with an error that says `needle`
inline void expect_train_error(const std::string& toml, std::vector<std::string> sets, const std::string& needle) {
  sets.push_back("train.steps=1");
  try {
    train_in_process(toml, sets, DeviceKind::meta);
    FAIL("no error for " << needle);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::Contains(needle));
  }
}

}  // namespace distlab::testing
