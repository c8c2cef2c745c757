// Context parallelism end to end (core/parallel/context_parallel.h over the mesh's cp axis):
//   - GPT-tiny and Llama-tiny (grouped-query attention) trained with parallel.cp = 2 and 4, as real
//     processes: every loss within 1e-6 (relative) of the one-rank run's, beside DDP, ZeRO-2 and FSDP over
//     dp × cp, tensor parallel (with and without sequence parallel), pipeline stages, full and op-level
//     recompute; the gathered --save within fp32 rounding of one rank's weights; the evaluation the same;
//   - a step's bytes are the ring's exactly: per layer (n − 1) blocks of k, v forward, (n − 1) of k, v and
//     their gradients backward, and one of the gradients home — Llama's kv heads once, not their repeats;
//   - per-rank activations (the meta device, a fake world) halve with each doubling of cp;
//   - the bad configurations are refused by key; runs are bitwise repeatable, dropout too.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "shell.h"
#include "train_harness.h"

using namespace distlab;
using namespace distlab::testing;
namespace fs = std::filesystem;

namespace {

const std::string kCpGpt = "configs/gpt-tiny.toml";      // L 2, n_head 4, C 64, V 256, T 64, micro_batch 16
const std::string kCpLlama = "configs/llama-tiny.toml";  // L 2, n_head 4, n_kv_head 2, C 64, T 64, micro_batch 16
const std::string kCpSets = "--set train.steps=12 --set train.eval_batches=2 ";

std::string cp_scratch(const std::string& name) { return scratch_path("cp", name); }

// the evaluation's loss (the last one)
double cp_eval_loss(const TrainRun& r) {
  for (auto it = r.records.rbegin(); it != r.records.rend(); ++it)
    if ((*it)["kind"] == "eval" && !(*it)["loss"].is_null()) return (*it)["loss"].get<double>();
  return std::nan("");
}

// Llama 3 8B's shape at 32,768 tokens, one step on the meta device
const std::string kCpLlama8b32k = R"(
[model]
name = "llama"
vocab_size = 128256
block_size = 32768
n_layer = 32
n_head = 32
n_kv_head = 8
n_embd = 4096
intermediate_size = 14336
rope_theta = 500000.0
[data]
name = "tokens"
seq_len = 32768
vocab = 128256
[train]
micro_batch = 1
steps = 1
activation_checkpointing = "full"
[precision]
mode = "bf16"
[parallel]
strategy = "fsdp"
[optim]
name = "adamw"
)";

}  // namespace

TEST_CASE("context parallel (ring attention): GPT-tiny and Llama-tiny train as one rank within 1e-6 at cp 2 and 4, beside dp (DDP, ZeRO-2, "
          "FSDP), tp (+ SP), pp and recompute, and a step sends exactly the ring's blocks",
          "[cp][train]") {
  const std::string ref_save = cp_scratch("one.safetensors");
  TrainRun one = train_ranks(1, kCpGpt, kCpSets + "--save " + ref_save);
  TrainRun l1 = train_ranks(1, kCpLlama, kCpSets);
  INFO(one.out);
  REQUIRE(one.code == 0);
  REQUIRE(l1.code == 0);
  REQUIRE(one.losses.size() == 12);

  // the ring's bytes: per layer, forward (n-1) blocks of k, v, (B, T/n, 2·Ckv) f32; backward (n-1) of k, v
  // and n of their gradients, the last one home; plus DDP's one bucket (every parameter, a ring all-reduce
  // over dp × cp)
  const int64_t B = 16, T = 64, L = 2, params = 120576;
  auto ring_bytes = [&](int n, int64_t Ckv) {
    const double block = double(B * (T / n)) * 4.0;
    return double(L) * ((n - 1) * block * 2 * Ckv + (n - 1) * block * 2 * Ckv + n * block * 2 * Ckv);
  };
  for (int n : {2, 4}) {
    const std::string save = cp_scratch(fmt::format("cp{}.safetensors", n));
    TrainRun r = train_ranks(n, kCpGpt, kCpSets + fmt::format("--set parallel.cp={} --set parallel.strategy=ddp --save {}", n, save));
    INFO("cp " << n << "\n" << r.out);
    REQUIRE(r.code == 0);
    CHECK(max_rel_diff(r.losses, one.losses) < 1e-6);
    CHECK(std::abs(cp_eval_loss(r) - cp_eval_loss(one)) < 1e-6 * cp_eval_loss(one));  // each rank its tokens' share, summed over the ring
    CHECK(r.summary["mesh"]["cp"].get<int>() == n);
    CHECK(max_weight_diff(save, ref_save) < 1e-4);
    const auto& s = r.steps.back();
    // a send_recv counts as a send and a recv: per layer (n-1) exchanges forward, (n-1) + n backward
    CHECK(s["comm_calls"].get<int64_t>() == 2 * L * (3 * n - 2) + 1);
    CHECK(s["comm_bytes_sent"].get<double>() == Approx(ring_bytes(n, 64) + 2.0 * (n - 1) / n * 4.0 * params).epsilon(1e-9));
    fs::remove(save);
  }
  // Llama's grouped-query heads: 2 kv heads of 16 travel, not the 4 repeats
  TrainRun l2 = train_ranks(2, kCpLlama, kCpSets + "--set parallel.cp=2 --set parallel.strategy=ddp");
  INFO(l2.out);
  REQUIRE(l2.code == 0);
  CHECK(max_rel_diff(l2.losses, l1.losses) < 1e-6);
  const double llama_params = l2.summary["params"].get<double>();
  CHECK(l2.steps.back()["comm_bytes_sent"].get<double>() == Approx(ring_bytes(2, 32) + 2.0 * 0.5 * 4.0 * llama_params).epsilon(1e-9));

  struct With {
    const std::string* cfg;
    const TrainRun* ref;
    int ranks;
    std::string sets;
  };
  for (const With& w : {With{&kCpGpt, &one, 4, "--set parallel.cp=2 --set parallel.strategy=zero2 --set train.micro_batch=8 "},
                        With{&kCpGpt, &one, 4, "--set parallel.cp=2 --set parallel.strategy=fsdp --set train.micro_batch=8 "},
                        With{&kCpGpt, &one, 4, "--set parallel.cp=2 --set parallel.tp=2 --set parallel.strategy=ddp "},
                        With{&kCpGpt, &one, 4, "--set parallel.cp=2 --set parallel.pp=2 --set parallel.strategy=ddp --set parallel.micro_batches=2 "
                                              "--set train.micro_batch=8 "},
                        With{&kCpGpt, &one, 2, "--set parallel.cp=2 --set parallel.strategy=ddp --set train.activation_checkpointing=full "},
                        With{&kCpLlama, &l1, 4, "--set parallel.cp=4 --set parallel.strategy=fsdp --set train.activation_checkpointing=selective_op "},
                        With{&kCpLlama, &l1, 4, "--set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true --set parallel.strategy=ddp "
                                              "--set train.activation_checkpointing=full "}}) {
    TrainRun r = train_ranks(w.ranks, *w.cfg, kCpSets + w.sets);
    INFO(*w.cfg << " " << w.sets << "\n" << r.out);
    REQUIRE(r.code == 0);
    CHECK(max_rel_diff(r.losses, w.ref->losses) < 1e-6);
  }
  fs::remove(ref_save);
}

TEST_CASE("context parallel is bitwise repeatable, dropout on each rank's own tokens too", "[cp][train]") {
  const std::string sets = "--set train.steps=6 --set train.eval_batches=1 --set parallel.cp=2 --set parallel.strategy=ddp ";
  TrainRun a = train_ranks(2, kCpGpt, sets);
  TrainRun d1 = train_ranks(2, kCpGpt, sets + "--set model.dropout=0.1");
  TrainRun d2 = train_ranks(2, kCpGpt, sets + "--set model.dropout=0.1");
  REQUIRE(a.code == 0);
  REQUIRE(d1.code == 0);
  CHECK(d1.losses == d2.losses);
  CHECK(d1.losses != a.losses);
}

TEST_CASE("context parallel memory per rank: activations / cp (Llama 3 8B at 32k tokens, full recompute, FSDP)", "[cp][memory]") {
  std::vector<double> act, sent;
  for (int n : {1, 2, 4, 8}) {
    // one rank is flash attention; a CP rank's ring keeps what flash keeps (the output and the log-sum-exps)
    TrainRun r = train_in_process(kCpLlama8b32k, {fmt::format("dist.fake_world_size={}", n), fmt::format("parallel.cp={}", n), "model.attention=flash"},
                                  DeviceKind::meta);
    INFO("cp " << n << "\n" << r.out);
    REQUIRE(r.summary.contains("peak_memory"));
    act.push_back(r.summary["peak_memory"]["activations"].get<double>());
  }
  for (size_t i = 1; i < act.size(); i++) {
    INFO("cp " << (1 << i) << ": " << act[i] / double(1 << 30) << " GiB against " << act[i - 1] / double(1 << 30));
    CHECK(act[i] < 0.55 * act[i - 1]);
    CHECK(act[i] > 0.45 * act[i - 1]);
  }
}

TEST_CASE("context parallel refuses what it cannot split, naming the key", "[cp][config]") {
  auto fails = [](const std::string& model, const std::vector<std::string>& sets, const std::string& needle) {
    std::vector<std::string> all = {"dist.fake_world_size=2"};
    all.insert(all.end(), sets.begin(), sets.end());
    try {
      train_in_process(model, all, DeviceKind::meta);
      FAIL("accepted: " << needle);
    } catch (const std::exception& e) {
      CHECK_THAT(e.what(), Catch::Contains(needle));
    }
  };
  const std::string gpt = R"(
[model]
name = "gpt"
vocab_size = 256
block_size = 64
n_layer = 2
n_head = 4
n_embd = 64
[data]
name = "tokens"
seq_len = 64
vocab = 256
[train]
micro_batch = 2
steps = 1
[parallel]
strategy = "ddp"
)";
  fails(gpt, {"parallel.cp=2", "data.seq_len=62", "model.block_size=62"}, "the sequence cuts into 2 x cp = 4 equal chunks");
  fails(gpt, {"parallel.cp=0"}, "parallel.cp");
  fails(gpt, {"parallel.cp=3", "data.seq_len=60"}, "parallel.cp 3 does not divide the 2 ranks");
  fails(gpt, {"parallel.cp=2", "parallel.tp=4", "dist.fake_world_size=6"}, "6 ranks do not split into parallel.dp ? x parallel.tp 4 x parallel.pp 1 x "
                                                                              "parallel.cp 2: 8 does not divide 6");
  fails(gpt, {"parallel.cp=2", "parallel.strategy=none"}, "2 ranks hold the same weights (parallel.cp 2)");
  fails(gpt, {"parallel.cp=2", "parallel.tp=4", "dist.fake_world_size=8", "parallel.sequence_parallel=true", "data.seq_len=20",
              "model.block_size=20"},
        "data.seq_len 20 / parallel.cp 2 does not split over parallel.tp 4");
  fails(R"(
[model]
name = "mlp"
[train]
micro_batch = 2
steps = 1
)",
        {"parallel.cp=2"}, "parallel.cp is 2 with model.name mlp");
}

TEST_CASE("distlab plan at long sequences: rows that split the tokens (TP + SP, CP, both) at the same batch, and the pick where nothing "
          "else fits",
          "[cp][plan][cli]") {
  auto rows_of = [](const std::string& args) {
    auto [code, out] = shell_in_source("timeout 300 " + std::string(DISTLAB_BINARY) + " plan --json " + args + " 2>&1");
    INFO(out);
    REQUIRE(code == 0);
    return nlohmann::json::parse(out);
  };
  auto find = [](const nlohmann::json& plan, const std::string& label) -> const nlohmann::json* {
    for (const auto& r : plan["rows"])
      if (r["strategy"] == label) return &r;
    return nullptr;
  };
  const nlohmann::json short_seq = rows_of("--model llama3-8b --gpus 8 --gpu-mem h100");
  CHECK(find(short_seq, "FSDP + CP8") == nullptr);  // 8,192 tokens: no long-sequence rows
  const nlohmann::json long_seq = rows_of("--model llama3-8b --gpus 8 --gpu-mem h100 --seq 131072");
  const nlohmann::json* full = find(long_seq, "FSDP + full AC");
  const nlohmann::json* tp = find(long_seq, "FSDP + TP8 + SP");
  const nlohmann::json* cp = find(long_seq, "FSDP + CP8");
  REQUIRE(full);
  REQUIRE(tp);
  REQUIRE(cp);
  CHECK_FALSE((*full)["fits"].get<bool>());  // one 128k sequence's activations do not fit a card, even recomputed
  CHECK((*tp)["fits"].get<bool>());
  CHECK((*cp)["fits"].get<bool>());
  // 1/8 of the tokens: 1/8 of the activations (each accumulates 8 micro-batches: the same 8 sequences a step)
  const double act = (*full)["peak_memory"]["activations"].get<double>();
  CHECK((*cp)["peak_memory"]["activations"].get<double>() == Approx(act / 8).epsilon(0.02));
  CHECK((*tp)["peak_memory"]["activations"].get<double>() == Approx(act / 8).epsilon(0.02));
  CHECK(long_seq["recommendation"] == "FSDP + CP8");  // the fastest that fits
  CHECK(long_seq["decision_tree"] == "FSDP + TP8 + SP");  // the tree's rung: TP + SP inside a node first
  CHECK(long_seq["decision_tree_reason"].get<std::string>().find("sequence parallelism") != std::string::npos);
}

TEST_CASE("context parallel resumes bitwise: FSDP sharded over dp x cp, dropout, rank 1 killed mid-run", "[cp][ckpt]") {
  const std::string dir = cp_scratch("ck");
  const std::string sets = "--set train.steps=12 --set train.eval_batches=1 --set parallel.cp=2 --set parallel.strategy=fsdp --set model.dropout=0.1 "
                           "--set checkpoint.every=4 ";
  TrainRun whole = train_ranks(2, kCpGpt, sets + "--set checkpoint.dir=" + dir + "-whole");
  REQUIRE(whole.code == 0);
  REQUIRE(whole.losses.size() == 12);
  const std::string metrics = metrics_path("cp-cut");
  auto [code, out] = shell_in_source(fmt::format("DISTLAB_TEST_FAULT=kill:1:step:7 timeout 240 {} run -n 2 --threads-per-rank 1 --master-port 0 "
                                                 "--max-restarts 1 train {} --set train.log_every=1000 --metrics {} {} --set checkpoint.dir={}-cut",
                                                 DISTLAB_BINARY, kCpGpt, metrics, sets, dir));
  INFO(out);
  REQUIRE(code == 0);
  CHECK(out.find("resumed from") != std::string::npos);
  TrainRun cut;
  read_metrics(metrics, cut);
  CHECK(cut.losses == whole.losses);
  fs::remove_all(dir + "-whole");
  fs::remove_all(dir + "-cut");
}
