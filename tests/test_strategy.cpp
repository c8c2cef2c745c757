// The strategy interface (core/parallel/strategy.h) as the models and the trainer drive it: the models
// call before_forward/after_forward around every unit in order and before_layer_backward/after_layer_backward
// in reverse, and the trainer's loop
// calls begin_backward / finish_backward once per micro-step and step once per optimizer step.
#include <algorithm>
#include <catch2/catch.hpp>
#include <sstream>

#include "core/models/zoo.h"
#include "core/nn/loss.h"
#include "core/parallel/strategy.h"
#include "core/config/config.h"
#include "core/train/strategies.h"

using namespace distlab;

namespace {

// Writes down every call it gets.
struct Recorder : Strategy {
  std::vector<std::string> calls;
  std::string describe() const override { return "recorder"; }
  void before_forward(int unit) override { calls.push_back("fwd " + std::to_string(unit)); }
  void after_forward(int unit) override { calls.push_back("end " + std::to_string(unit)); }
  void before_layer_backward(int unit) override { calls.push_back("pre " + std::to_string(unit)); }
  void begin_backward(bool sync) override { calls.push_back(sync ? "begin sync" : "begin no_sync"); }
  void after_layer_backward(int unit, const std::vector<Parameter*>& params) override {
    calls.push_back("bwd " + std::to_string(unit) + " (" + std::to_string(params.size()) + ")");
  }
  void finish_backward(Runtime&) override { calls.push_back("finish"); }
};

Batch strategy_image_batch(Runtime& rt, const ModelSpec& s, int64_t B) {
  Batch b;
  b.B = B;
  b.x = rt.zeros({B, s.in_channels, s.height, s.width}, Category::activations, "x");
  b.targets.assign(size_t(B), 1);
  return b;
}

}  // namespace

TEST_CASE("models call the strategy around each unit's forward, in order, and around each unit's backward, in reverse",
          "[strategy]") {
  Runtime rt;
  ModelSpec cnn;
  cnn.name = "cifar_cnn";
  cnn.in_channels = 3;
  cnn.height = cnn.width = 32;
  ModelSpec gpt;
  gpt.name = "gpt";
  gpt.vocab_size = 20;
  gpt.block_size = 8;
  gpt.n_layer = 2;
  gpt.n_head = 2;
  gpt.n_embd = 8;
  for (const ModelSpec& spec : {ModelSpec{}, cnn, gpt}) {
    INFO(spec.name);
    auto model = build_model(rt, spec);
    model->init(1);
    const int units = int(model->units().size());
    Batch b;
    if (spec.name == "gpt") {
      b.B = 2;
      b.T = 4;
      b.tokens.assign(8, 3);
      b.targets.assign(8, 4);
    } else {
      b = strategy_image_batch(rt, spec, 2);
    }
    Recorder rec;
    CrossEntropyLoss ce;
    Tensor logits = model->forward(rt, b, &rec);
    ce.forward(rt, logits, b.targets);
    model->backward(rt, ce.backward(rt, 1.0f), &rec);
    // before_forward in unit order, after_layer_backward in reverse
    std::vector<std::string> fwd, bwd, want_fwd, want_bwd;
    for (const auto& c : rec.calls) {
      if (c.rfind("fwd", 0) == 0) fwd.push_back(c);
      if (c.rfind("bwd", 0) == 0) bwd.push_back(c);
    }
    auto all_units = model->units();
    for (int u = 0; u < units; u++) want_fwd.push_back("fwd " + std::to_string(u));
    for (int u = units; u-- > 0;) want_bwd.push_back("bwd " + std::to_string(u) + " (" + std::to_string(all_units[size_t(u)].size()) + ")");
    CHECK(fwd == want_fwd);
    CHECK(bwd == want_bwd);
    // each unit: before_forward < after_forward < before_layer_backward < after_layer_backward, once each;
    // a unit's backward comes only after every forward ended (ZeRO-3 frees a unit between the two)
    auto at = [&](const std::string& what) {
      auto it = std::find(rec.calls.begin(), rec.calls.end(), what);
      REQUIRE(it != rec.calls.end());
      CHECK(std::count(rec.calls.begin(), rec.calls.end(), what) == 1);
      return it - rec.calls.begin();
    };
    for (int u = 0; u < units; u++) {
      const std::string k = std::to_string(u);
      INFO("unit " << u);
      const auto f = at("fwd " + k), e = at("end " + k), p = at("pre " + k), b = at(want_bwd[size_t(units - 1 - u)]);
      CHECK(f < e);
      CHECK(e < p);
      CHECK(p < b);
      for (int v = 0; v < units; v++) CHECK(at("end " + std::to_string(v)) < p);
    }
    if (spec.name == "gpt") {  // wte is the lm_head too: unit 0's forward ends last and its backward starts first
      CHECK(at("end 0") == at("end " + std::to_string(units - 1)) + 1);
      CHECK(rec.calls[size_t(at("end 0") + 1)] == "pre 0");
    } else {  // a chain: each unit's forward ends before the next one starts
      for (int u = 0; u + 1 < units; u++) CHECK(at("end " + std::to_string(u)) + 1 == at("fwd " + std::to_string(u + 1)));
    }
  }
}

TEST_CASE("the factory: none on one rank, refused on several, the samplers follow the strategy", "[strategy]") {
  Runtime rt;
  RunConfig cfg = parse_config("", "run.toml");
  auto model = build_model(rt, ModelSpec{});
  auto s = make_strategy(cfg, nullptr, *model, rt, nullptr);
  CHECK(s->describe() == "none (one rank)");
  CHECK_NOTHROW(check_strategy_fits(cfg, 1));
  CHECK_THROWS_WITH(check_strategy_fits(cfg, 2), Catch::Contains("parallel.strategy is none, but 2 ranks"));
  // one rank, shuffled: a permutation of everything; DDP on 2 ranks: rank 1 takes every second position
  auto one = make_train_sampler(cfg, 10, 1, 0, nullptr);
  RunConfig ddp = parse_config("[parallel]\nstrategy = \"ddp\"\n", "run.toml");
  auto half = make_train_sampler(ddp, 10, 2, 1, nullptr);
  CHECK(one->indices(0).size() == 10);
  CHECK(half->indices(0).size() == 5);
}
