// DistributedSampler's PyTorch semantics, and DDP's buckets, with ranks as threads.
#include <catch2/catch.hpp>
#include <numeric>
#include <set>

#include "core/data/distributed_sampler.h"
#include "core/models/zoo.h"
#include "core/nn/loss.h"
#include "core/parallel/ddp.h"
#include "core/config/config.h"
#include "core/train/strategies.h"
#include "dist_harness.h"

using namespace distlab;
using namespace distlab::testing;

TEST_CASE("DistributedSampler: disjoint, covering, padded by wrapping, or dropped", "[sampler]") {
  for (int64_t n : {0, 1, 7, 10, 13, 100}) {
    for (int world = 1; world <= 4; world++) {
      for (bool drop : {false, true}) {
        INFO("n " << n << " world " << world << " drop_last " << drop);
        std::vector<int64_t> all;
        for (int r = 0; r < world; r++) {
          DistributedSampler s(n, world, r, true, 7, drop);
          auto idx = s.indices(0);
          CHECK(int64_t(idx.size()) == (drop ? n / world : (n + world - 1) / world));
          CHECK(int64_t(idx.size()) == s.size());
          all.insert(all.end(), idx.begin(), idx.end());
        }
        std::set<int64_t> distinct(all.begin(), all.end());
        if (!drop) {
          CHECK(int64_t(distinct.size()) == n);  // every sample is seen
          CHECK(int64_t(all.size()) - n == (n ? (world - n % world) % world : 0));  // the padding repeats only that many
        } else {
          CHECK(distinct.size() == all.size());  // nothing twice
        }
      }
    }
  }
}

TEST_CASE("DistributedSampler: rank r takes every world-th index of one shared permutation", "[sampler]") {
  const int64_t n = 20;
  DistributedSampler r0(n, 2, 0, true, 3), r1(n, 2, 1, true, 3);
  RandomSampler single(n, 3);
  auto perm = single.indices(0), a = r0.indices(0), b = r1.indices(0);
  for (size_t i = 0; i < a.size(); i++) {
    CHECK(a[i] == perm[2 * i]);
    CHECK(b[i] == perm[2 * i + 1]);
  }
  // set_epoch reshuffles, the same way on every rank
  r0.set_epoch(1);
  r1.set_epoch(1);
  CHECK(r0.indices() != a);
  auto perm1 = single.indices(1);
  CHECK(r0.indices()[0] == perm1[0]);
  CHECK(r1.indices()[0] == perm1[1]);
  // without set_epoch every epoch repeats the order
  DistributedSampler stale(n, 2, 0, true, 3);
  CHECK(stale.indices() == stale.indices());
  // no shuffle: 0, world, 2·world...
  DistributedSampler plain(10, 3, 1, false);
  CHECK(plain.indices(0) == std::vector<int64_t>{1, 4, 7, 0});  // 10 padded to 12 by wrapping: ..., 9, 0, 1
  CHECK_THROWS(DistributedSampler(10, 2, 2));
}

TEST_CASE("bucketed DDP: buckets in reverse order, at most bucket_mb each, one all_reduce per bucket", "[ddp]") {
  run_ranks(2, [](ProcessGroup& pg) {
    Runtime rt;
    ModelSpec s;
    s.name = "mlp";
    s.in_channels = 1;
    s.height = s.width = 8;
    s.hidden = {64, 32};
    auto model = build_model(rt, s);
    model->init(uint64_t(pg.rank()));  // different on each rank: DDP's broadcast must make them equal
    BucketedDDP ddp(pg, *model, rt, 0.01);  // 10 KiB buckets: fc1.weight (16 KiB) alone, the rest shared
    for (auto* p : model->parameters()) {
      std::vector<float> mine(p->data.f32(), p->data.f32() + p->data.numel()), other(mine.size());
      std::vector<float> both(mine.size() * 2);
      pg.all_gather(both.data(), mine.data(), int64_t(mine.size()));
      CHECK(std::equal(both.begin(), both.begin() + long(mine.size()), both.begin() + long(mine.size())));
    }
    CHECK(ddp.bucket_names(0).front() == "fc3.bias");  // the last parameter's gradient is ready first
    CHECK(ddp.bucket_names(ddp.num_buckets() - 1).back() == "fc1.weight");
    for (int64_t b = 0; b < ddp.num_buckets(); b++) {
      int64_t bytes = 0;
      for (const auto& name : ddp.bucket_names(b))
        for (auto* p : model->parameters())
          if (p->name == name) bytes += p->data.nbytes();
      CHECK((bytes <= 10485 || ddp.bucket_names(b).size() == 1));
    }
    // a step: every rank ends with the average gradient, with one all_reduce per bucket
    Batch batch;
    batch.B = 4;
    batch.x = rt.zeros({4, 1, 8, 8}, Category::activations);
    for (int64_t i = 0; i < batch.x.numel(); i++) batch.x.f32()[i] = float((i * 7 + pg.rank() * 3) % 11) / 11.0f;
    batch.targets = {0, 1, 2, 3};
    CrossEntropyLoss ce;
    pg.reset_counters();
    Tensor logits = model->forward(rt, batch);
    ce.forward(rt, logits, batch.targets);
    model->backward(rt, ce.backward(rt), &ddp);
    ddp.finish_backward(rt);
    CHECK(pg.counters()["all_reduce"].calls == ddp.num_buckets());
    for (auto* p : model->parameters()) {
      std::vector<float> g(p->grad.f32(), p->grad.f32() + p->grad.numel()), both(g.size() * 2);
      pg.all_gather(both.data(), g.data(), int64_t(g.size()));
      CHECK(std::equal(both.begin(), both.begin() + long(g.size()), both.begin() + long(g.size())));
    }
  });
}

// The two data bugs a config can switch on (lab 08, quiz 7.3): train.sampler = plain gives every rank the
// one-rank order of the whole set; train.set_epoch = false repeats epoch 0's order.
TEST_CASE("train.sampler plain and train.set_epoch false: the missing sampler and the forgotten set_epoch", "[sampler]") {
  RunConfig cfg = parse_config("[parallel]\nstrategy = \"ddp\"\n", "t.toml");
  auto r0 = make_train_sampler(cfg, 10, 2, 0, nullptr), r1 = make_train_sampler(cfg, 10, 2, 1, nullptr);
  CHECK(r0->size() == 5);
  CHECK(r0->indices(0) != r1->indices(0));
  CHECK(r0->indices(0) != r0->indices(1));  // set_epoch: a new order every epoch
  cfg = parse_config("[parallel]\nstrategy = \"ddp\"\n[train]\nsampler = \"plain\"\n", "t.toml");
  auto p0 = make_train_sampler(cfg, 10, 2, 0, nullptr), p1 = make_train_sampler(cfg, 10, 2, 1, nullptr);
  auto one = make_train_sampler(parse_config("", "t.toml"), 10, 1, 0, nullptr);
  CHECK(p0->size() == 10);
  CHECK(p0->indices(3) == p1->indices(3));   // both ranks read the same samples
  CHECK(p0->indices(3) == one->indices(3));  // in the one-rank order
  cfg = parse_config("[parallel]\nstrategy = \"ddp\"\n[train]\nset_epoch = false\n", "t.toml");
  auto f0 = make_train_sampler(cfg, 10, 2, 0, nullptr);
  CHECK(f0->indices(0) == f0->indices(1));
  CHECK(f0->indices(0) == r0->indices(0));
  CHECK_THROWS_WITH(parse_config("[train]\nsampler = \"none\"\n", "t.toml"), Catch::Contains("train.sampler"));
}
