// The device mesh (Megatron's rank layout, one group per axis) and Megatron's column- and row-parallel
// Linear, ranks as threads: each is held to the whole nn.Linear on one rank — forward, every gradient —
// and to the communication the paper counts (one all-reduce of the activations per layer pair, forward
// and backward).
#include <catch2/catch.hpp>
#include <cmath>
#include <mutex>

#include <fmt/format.h>

#include "core/nn/loss.h"
#include "core/nn/simple.h"
#include "core/parallel/gpt_parallel.h"
#include "core/parallel/mesh.h"
#include "core/parallel/tensor_parallel.h"
#include "core/util/error.h"
#include "core/util/rng.h"
#include "dist_harness.h"

using namespace distlab;
using distlab::testing::run_ranks;

namespace {

std::vector<float> tp_values(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  convert(t.data(), t.dtype(), v.data(), DType::f32, t.numel());
  return v;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, scale = 1e-6;
  for (float x : b) scale = std::max(scale, double(std::abs(x)));
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::abs(double(a[i]) - double(b[i])) / scale);
  return a.size() == b.size() ? m : INFINITY;
}

// A copy of `t` accounted in `rt`: a rank's thread never allocates through another rank's (or the test's)
// Runtime — its memory accounting is not shared between threads.
Tensor copy_in(Runtime& rt, const Tensor& t) {
  Tensor c = rt.empty(t.shape(), Category::activations, "copy", DType::f32);
  convert(t.data(), t.dtype(), c.data(), DType::f32, t.numel());
  return c;
}

Tensor random_shard_tensor(Runtime& rt, const Shape& s, uint64_t seed) {
  Tensor t = rt.empty(s, Category::activations, "input", DType::f32);
  Rng rng(seed);
  init_normal(t, rng, 1.0f);
  return t;
}

}  // namespace

TEST_CASE("the mesh lays ranks out as Megatron does: TP fastest, then DP, then PP", "[tp][mesh]") {
  const MeshShape s{2, 2, 2};  // dp, tp, pp
  CHECK(group_ranks(0, s, MeshAxis::tp) == std::vector<int>{0, 1});
  CHECK(group_ranks(5, s, MeshAxis::tp) == std::vector<int>{4, 5});
  CHECK(group_ranks(1, s, MeshAxis::dp) == std::vector<int>{1, 3});
  CHECK(group_ranks(6, s, MeshAxis::dp) == std::vector<int>{4, 6});
  CHECK(group_ranks(3, s, MeshAxis::pp) == std::vector<int>{3, 7});
  for (int r = 0; r < 8; r++) CHECK(rank_of(coord_of(r, s), s) == r);
  const MeshShape t{2, 4, 1};  // 8 ranks, tp 4: a TP group is 4 consecutive ranks, one node's
  CHECK(group_ranks(6, t, MeshAxis::tp) == std::vector<int>{4, 5, 6, 7});
  CHECK(group_ranks(6, t, MeshAxis::dp) == std::vector<int>{2, 6});

  CHECK(resolve_mesh(8, 0, 2, 2).dp == 2);
  CHECK(resolve_mesh(8, 2, 0, 2).tp == 2);
  CHECK(resolve_mesh(6, 0, 0, 0).dp == 6);
  CHECK_THROWS_WITH(resolve_mesh(8, 3, 2, 0), Catch::Contains("6 does not divide 8"));
  CHECK_THROWS_WITH(resolve_mesh(8, 2, 2, 3), Catch::Contains("= 12 ranks, but the job has 8"));
  CHECK_THROWS_WITH(resolve_mesh(8, 0, 0, 2), Catch::Contains("only one of them"));
  CHECK_THROWS_WITH(resolve_mesh(8, -1, 2, 2), Catch::Contains("positive"));
}

TEST_CASE("the mesh's groups: an all-reduce over each axis sums exactly its members", "[tp][mesh]") {
  // (Catch's INFO and CHECK are not for threads: the ranks write down what is wrong, the test checks it)
  for (const MeshShape s : {MeshShape{2, 2, 2}, MeshShape{4, 1, 2}, MeshShape{1, 8, 1}}) {
    std::mutex mu;
    std::vector<std::string> wrong;
    run_ranks(8, [&](ProcessGroup& world) {
      Mesh mesh(world, s);
      for (MeshAxis a : {MeshAxis::tp, MeshAxis::dp, MeshAxis::pp}) {
        float v = float(world.rank());
        mesh.group(a).all_reduce(&v, 1);
        float want = 0;
        for (int r : group_ranks(world.rank(), s, a)) want += float(r);
        const int size = a == MeshAxis::tp ? s.tp : a == MeshAxis::dp ? s.dp : s.pp;  // a group of 1 too
        if (v != want || mesh.group(a).size() != size) {
          std::lock_guard<std::mutex> lock(mu);
          wrong.push_back(fmt::format("{} group of rank {}: sum {} (want {}), size {} (want {})", axis_name(a), world.rank(), v, want,
                                      mesh.group(a).size(), size));
        }
      }
      if (mesh.describe().find(fmt::format("dp {} x tp {} x pp {}", s.dp, s.tp, s.pp)) != 0) {
        std::lock_guard<std::mutex> lock(mu);
        wrong.push_back(mesh.describe());
      }
    });
    INFO("dp " << s.dp << " x tp " << s.tp << " x pp " << s.pp);
    CHECK(wrong == std::vector<std::string>{});
  }
}

TEST_CASE("column- and row-parallel Linear equal the whole nn.Linear: forward, dx, dW, db, on 2 and 4 ranks", "[tp]") {
  const int64_t B = 6, in = 16, out = 24;
  for (int t : {2, 4}) {
    INFO(t << " TP ranks");
    // the reference: one whole Linear, its forward and backward on one rank
    Runtime rt1;
    Linear whole(rt1, "fc", in, out);
    Rng rng(7);
    whole.init(rng);
    Tensor x = random_shard_tensor(rt1, {B, in}, 1), dy = random_shard_tensor(rt1, {B, out}, 2);
    const auto y_ref = tp_values(whole.forward(rt1, x));
    const auto dx_ref = tp_values(whole.backward(rt1, dy));
    const auto dw_ref = tp_values(whole.weight.grad), db_ref = tp_values(whole.bias.grad);

    std::mutex mu;
    double worst = 0;  // over the ranks: what each checks of its own (CHECK stays on the test's thread)
    std::vector<float> y_col(size_t(B * out)), dw_col(size_t(out * in)), db_col(static_cast<size_t>(out));
    run_ranks(t, [&](ProcessGroup& tp) {
      Runtime rt;
      ColumnParallelLinear col(rt, tp, "fc", in, out);
      col.load_slice(whole);
      const int64_t rows = out / t, first = tp.rank() * rows;
      Tensor xr = copy_in(rt, x);
      const auto y = tp_values(col.forward(rt, xr));  // (B, out/t): this rank's outputs
      Tensor dyr = rt.empty({B, rows}, Category::activations, "dy slice", DType::f32);
      for (int64_t i = 0; i < B; i++)
        for (int64_t j = 0; j < rows; j++) dyr.f32()[i * rows + j] = dy.f32()[i * out + first + j];
      const auto dx = tp_values(col.backward(rt, dyr));  // summed over the group: whole on every rank
      const auto dw = tp_values(col.local().weight.grad), db = tp_values(col.local().bias.grad);
      std::lock_guard<std::mutex> lock(mu);
      worst = std::max(worst, max_rel(dx, dx_ref));
      for (int64_t i = 0; i < B; i++)
        for (int64_t j = 0; j < rows; j++) y_col[size_t(i * out + first + j)] = y[size_t(i * rows + j)];
      std::copy(dw.begin(), dw.end(), dw_col.begin() + first * in);
      std::copy(db.begin(), db.end(), db_col.begin() + first);
    });
    CHECK(worst < 1e-6);  // dx on every rank
    CHECK(max_rel(y_col, y_ref) < 1e-6);
    CHECK(max_rel(dw_col, dw_ref) < 1e-6);
    CHECK(max_rel(db_col, db_ref) < 1e-6);

    std::vector<float> dx_row(size_t(B * in)), dw_row(size_t(out * in));
    double worst_y = 0, worst_db = 0;
    run_ranks(t, [&](ProcessGroup& tp) {
      Runtime rt;
      RowParallelLinear row(rt, tp, "fc", in, out);
      row.load_slice(whole);
      const int64_t cols = in / t, first = tp.rank() * cols;
      Tensor xr = rt.empty({B, cols}, Category::activations, "x slice", DType::f32);
      for (int64_t i = 0; i < B; i++)
        for (int64_t j = 0; j < cols; j++) xr.f32()[i * cols + j] = x.f32()[i * in + first + j];
      const auto y = tp_values(row.forward(rt, xr));  // summed over the group: whole on every rank
      Tensor dyr = copy_in(rt, dy);
      const auto dx = tp_values(row.backward(rt, dyr));
      const auto dw = tp_values(row.parameters()[0]->grad);
      std::lock_guard<std::mutex> lock(mu);
      worst_y = std::max(worst_y, max_rel(y, y_ref));
      worst_db = std::max(worst_db, max_rel(tp_values(row.bias.grad), db_ref));
      for (int64_t i = 0; i < B; i++)
        for (int64_t j = 0; j < cols; j++) dx_row[size_t(i * in + first + j)] = dx[size_t(i * cols + j)];
      for (int64_t i = 0; i < out; i++)
        for (int64_t j = 0; j < cols; j++) dw_row[size_t(i * in + first + j)] = dw[size_t(i * cols + j)];
    });
    CHECK(worst_y < 1e-5);   // the sum over `in` split t ways: another order of the adds
    CHECK(worst_db < 1e-6);  // every rank: the whole bias gradient
    CHECK(max_rel(dx_row, dx_ref) < 1e-6);
    CHECK(max_rel(dw_row, dw_ref) < 1e-6);
  }
}

TEST_CASE("an MLP split column -> GELU -> row equals the whole MLP, with one all-reduce of B x C forward and one backward", "[tp]") {
  const int64_t B = 8, C = 16;
  Runtime rt1;
  Linear fc(rt1, "mlp.c_fc", C, 4 * C), proj(rt1, "mlp.c_proj", 4 * C, C);
  Rng rng(3);
  fc.init(rng);
  proj.init(rng);
  GELU gelu;
  Tensor x = random_shard_tensor(rt1, {B, C}, 5), dy = random_shard_tensor(rt1, {B, C}, 6);
  const auto y_ref = tp_values(proj.forward(rt1, gelu.forward(rt1, fc.forward(rt1, x))));
  const auto dx_ref = tp_values(fc.backward(rt1, gelu.backward(rt1, proj.backward(rt1, dy))));
  for (int t : {2, 4}) {
    INFO(t << " TP ranks");
    std::mutex mu;
    double worst_y = 0, worst_dx = 0;
    std::vector<CommCounters> fwds, boths;
    run_ranks(t, [&](ProcessGroup& tp) {
      Runtime rt;
      ColumnParallelLinear c_fc(rt, tp, "mlp.c_fc", C, 4 * C);
      RowParallelLinear c_proj(rt, tp, "mlp.c_proj", 4 * C, C);
      c_fc.load_slice(fc);
      c_proj.load_slice(proj);
      GELU g;
      Tensor xr = copy_in(rt, x), dyr = copy_in(rt, dy);
      tp.reset_counters();
      const auto y = tp_values(c_proj.forward(rt, g.forward(rt, c_fc.forward(rt, xr))));
      const CommCounters fwd = tp.total_counters();
      const auto dx = tp_values(c_fc.backward(rt, g.backward(rt, c_proj.backward(rt, dyr))));
      const CommCounters both = tp.total_counters();
      std::lock_guard<std::mutex> lock(mu);
      worst_y = std::max(worst_y, max_rel(y, y_ref));
      worst_dx = std::max(worst_dx, max_rel(dx, dx_ref));
      fwds.push_back(fwd);
      boths.push_back(both);
    });
    CHECK(worst_y < 1e-5);
    CHECK(worst_dx < 1e-5);
    // one ring all-reduce of B·C floats each way: 2(t-1)/t · B·C·4 bytes sent per rank
    const int64_t ring = 2 * (t - 1) * B * C * 4 / t;
    REQUIRE(fwds.size() == size_t(t));
    for (int r = 0; r < t; r++) {
      CHECK(fwds[size_t(r)].calls == 1);
      CHECK(fwds[size_t(r)].bytes_sent == ring);
      CHECK(boths[size_t(r)].calls == 2);
      CHECK(boths[size_t(r)].bytes_sent == 2 * ring);
    }
  }
}

TEST_CASE("a width the TP group does not divide is refused naming the layer", "[tp]") {
  std::mutex mu;
  std::vector<std::string> said;
  run_ranks(4, [&](ProcessGroup& tp) {
    Runtime rt;
    for (int k = 0; k < 2; k++) try {
        if (k == 0) ColumnParallelLinear(rt, tp, "transformer.h.0.mlp.c_fc", 16, 30);
        else RowParallelLinear(rt, tp, "transformer.h.0.attn.c_proj", 18, 16);
      } catch (const ConfigError& e) {
        std::lock_guard<std::mutex> lock(mu);
        said.push_back(e.what());
      }
  });
  REQUIRE(said.size() == 8);
  for (const auto& s : said) CHECK((s.find("transformer.h.0.mlp.c_fc: out_features 30 does not split over 4") != std::string::npos ||
                                    s.find("transformer.h.0.attn.c_proj: in_features 18 does not split over 4") != std::string::npos));
}

TEST_CASE("attention with its heads split over 2 and 4 ranks equals the whole attention: output, dx and every weight gradient", "[tp]") {
  const int64_t B = 2, T = 5, C = 16, NH = 4;
  Runtime rt1;
  CausalSelfAttention whole(rt1, "transformer.h.0.attn", C, NH);
  Rng rng(11);
  init_normal(whole.c_attn.weight.data, rng, 0.2f);
  init_normal(whole.c_attn.bias.data, rng, 0.2f);
  init_normal(whole.c_proj.weight.data, rng, 0.2f);
  init_normal(whole.c_proj.bias.data, rng, 0.2f);
  Tensor x = random_shard_tensor(rt1, {B, T, C}, 21), dy = random_shard_tensor(rt1, {B, T, C}, 22);
  const auto y_ref = tp_values(whole.forward(rt1, x));
  const auto dx_ref = tp_values(whole.backward(rt1, dy));
  const auto dwa_ref = tp_values(whole.c_attn.weight.grad), dwp_ref = tp_values(whole.c_proj.weight.grad);
  for (int t : {2, 4}) {
    INFO(t << " TP ranks");
    std::mutex mu;
    double worst_y = 0, worst_dx = 0;
    std::vector<float> dwa(dwa_ref.size()), dwp(dwp_ref.size());
    run_ranks(t, [&](ProcessGroup& tp) {
      Runtime rt;
      ParallelSelfAttention attn(rt, tp, "transformer.h.0.attn", C, NH);
      attn.load_slice(whole);
      Tensor xr = copy_in(rt, x), dyr = copy_in(rt, dy);
      const auto y = tp_values(attn.forward(rt, xr));
      const auto dx = tp_values(attn.backward(rt, dyr));
      const auto ga = tp_values(attn.c_attn.local().weight.grad), gp = tp_values(attn.c_proj.parameters()[0]->grad);
      std::lock_guard<std::mutex> lock(mu);
      worst_y = std::max(worst_y, max_rel(y, y_ref));
      worst_dx = std::max(worst_dx, max_rel(dx, dx_ref));
      const int64_t rows = C / t;  // of each of q, k, v
      for (int p = 0; p < 3; p++)
        std::copy(ga.begin() + p * rows * C, ga.begin() + (p + 1) * rows * C, dwa.begin() + (p * C + tp.rank() * rows) * C);
      for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < rows; j++) dwp[size_t(i * C + tp.rank() * rows + j)] = gp[size_t(i * rows + j)];
    });
    CHECK(worst_y < 1e-5);
    CHECK(worst_dx < 1e-5);
    CHECK(max_rel(dwa, dwa_ref) < 1e-5);
    CHECK(max_rel(dwp, dwp_ref) < 1e-5);
  }
  std::mutex mu;
  std::string said;
  run_ranks(3, [&](ProcessGroup& tp) {
    Runtime rt;
    try {
      ParallelSelfAttention(rt, tp, "transformer.h.0.attn", 24, 4);
    } catch (const ConfigError& e) {
      std::lock_guard<std::mutex> lock(mu);
      said = e.what();
    }
  });
  CHECK_THAT(said, Catch::Contains("4 heads do not split over 3"));
}

TEST_CASE("the vocabulary split: embedding and cross-entropy equal the whole ones, the full logits never gathered", "[tp]") {
  const int64_t V = 24, block = 8, C = 6, B = 2, T = 5;
  Runtime rt1;
  Embedding whole(rt1, "transformer.", V, block, C);
  Rng rng(31);
  whole.init(rng);
  std::vector<int32_t> tokens;
  for (int i = 0; i < B * T; i++) tokens.push_back(int32_t((i * 7 + 3) % V));
  const auto e_ref = tp_values(whole.forward(rt1, tokens, B, T));
  Tensor dy = random_shard_tensor(rt1, {B, T, C}, 32);
  whole.backward(rt1, dy);
  const auto dwte_ref = tp_values(whole.wte.grad), dwpe_ref = tp_values(whole.wpe.grad);
  // the loss over random logits, one target ignored (-1) as nn.CrossEntropyLoss(ignore_index) does
  Tensor logits = random_shard_tensor(rt1, {B * T, V}, 33);
  std::vector<int32_t> targets = tokens;
  targets[3] = -1;
  CrossEntropyLoss ce;
  const double loss_ref = ce.forward(rt1, logits, targets);
  const auto dlogits_ref = tp_values(ce.backward(rt1, 0.5f));
  for (int t : {2, 3, 4}) {
    INFO(t << " TP ranks");
    std::mutex mu;
    double worst_e = 0, worst_dwpe = 0, worst_loss = 0;
    std::vector<float> dwte(dwte_ref.size()), dlogits(dlogits_ref.size());
    std::vector<CommCounters> comm;
    run_ranks(t, [&](ProcessGroup& tp) {
      Runtime rt;
      VocabParallelEmbedding emb(rt, tp, "transformer.", V, block, C);
      emb.load_slice(whole);
      const auto e = tp_values(emb.forward(rt, tokens, B, T));
      emb.backward(rt, copy_in(rt, dy));
      const int64_t cols = V / t, first = tp.rank() * cols;
      Tensor mine = rt.empty({B * T, cols}, Category::activations, "this rank's logits", DType::f32);
      for (int64_t n = 0; n < B * T; n++)
        for (int64_t v = 0; v < cols; v++) mine.f32()[n * cols + v] = logits.f32()[n * V + first + v];
      VocabParallelCrossEntropy vce(tp);
      tp.reset_counters();
      const double loss = vce.forward(rt, mine, targets, first);
      const CommCounters c = tp.total_counters();
      const auto d = tp_values(vce.backward(rt, 0.5f));
      const auto g = tp_values(emb.wte.grad);
      std::lock_guard<std::mutex> lock(mu);
      worst_e = std::max(worst_e, max_rel(e, e_ref));
      worst_dwpe = std::max(worst_dwpe, max_rel(tp_values(emb.wpe.grad), dwpe_ref));
      worst_loss = std::max(worst_loss, std::abs(loss - loss_ref) / loss_ref);
      std::copy(g.begin(), g.end(), dwte.begin() + first * C);
      for (int64_t n = 0; n < B * T; n++)
        for (int64_t v = 0; v < cols; v++) dlogits[size_t(n * V + first + v)] = d[size_t(n * cols + v)];
      comm.push_back(c);
    });
    CHECK(worst_e == 0);  // one rank's row plus zeros: the row itself, to the bit
    CHECK(worst_dwpe < 1e-6);
    CHECK(max_rel(dwte, dwte_ref) < 1e-6);
    CHECK(worst_loss < 1e-6);
    CHECK(max_rel(dlogits, dlogits_ref) < 1e-6);
    for (const auto& c : comm) CHECK(c.calls == 3);  // max, sum of exp, the target's logit: N numbers each, never N x V
  }
}

TEST_CASE("a split GPT is GPT itself with the tensor-parallel layers substituted for nn's: the same blocks, names and order", "[tp]") {
  Runtime rt(DeviceKind::meta, 0);
  ProcessGroup tp(ProcessGroup::Fake{}, 1, 2, &rt.trace, "tp");  // rank 1 of 2: no collective runs while building
  ModelSpec s;
  s.name = "gpt";
  s.n_layer = 4, s.n_head = 2, s.n_embd = 16, s.vocab_size = 64, s.block_size = 8;
  auto whole = build_model(rt, s);
  auto split = build_split_model(rt, s, &tp, 0, 1);
  auto* w = dynamic_cast<GPT*>(whole.get());
  auto* g = dynamic_cast<GPT*>(split.get());
  REQUIRE(w);
  REQUIRE(g);  // not a second model class
  for (auto& b : w->blocks()) {
    CHECK(dynamic_cast<CausalSelfAttention*>(b->attn.get()));
    CHECK(dynamic_cast<Linear*>(b->c_fc.get()));
    CHECK(dynamic_cast<Linear*>(b->c_proj.get()));
  }
  for (auto& b : g->blocks()) {
    CHECK(dynamic_cast<ParallelSelfAttention*>(b->attn.get()));
    CHECK(dynamic_cast<ColumnParallelLinear*>(b->c_fc.get()));
    CHECK(dynamic_cast<RowParallelLinear*>(b->c_proj.get()));
  }
  CHECK(g->tp_group() == &tp);
  CHECK(g->vocab_first() == 32);
  // PyTorch's names in the whole model's order; split tensors hold this rank's half
  const auto wp = whole->parameters(), gp = split->parameters();
  REQUIRE(wp.size() == gp.size());
  for (size_t i = 0; i < wp.size(); i++) {
    INFO(wp[i]->name);
    CHECK(gp[i]->name == wp[i]->name);
    CHECK(whole_shape(*gp[i], 2) == wp[i]->data.shape());
  }
  CHECK(gp[0]->data.shape() == Shape{32, 16});  // wte: this rank's rows of the vocabulary
  // pipeline stages come from the same constructor: stage 1 of 2 holds blocks 2 and 3, ln_f and the lm_head's copy
  auto stage = build_split_model(rt, s, &tp, 1, 2);
  auto* st = dynamic_cast<GPT*>(stage.get());
  REQUIRE(st);
  CHECK(st->blocks().size() == 2);
  CHECK(st->units().size() == 3);
  CHECK(st->tied_embedding() != nullptr);
  CHECK(st->tied_embedding()->name == "lm_head.weight");
  // the layers' replaceable arithmetic reaches every split block, and a whole GPT refuses it
  CHECK_NOTHROW(set_tp_kernels(*g, nullptr));
  CHECK_THROWS(set_tp_kernels(*w, nullptr));
}
