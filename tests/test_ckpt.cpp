// Checkpoint and resume (core/ckpt/checkpoint.h, core/train/trainer_ckpt.cpp):
//   - the llm.c / Megatron test: 60 steps uninterrupted; the same run with a rank killed by SIGKILL at a
//     random step past the first checkpoint (or in the middle of a save) and `distlab run --max-restarts 1` resuming it: the final
//     weights and every logged loss are the uninterrupted run's, bit for bit — DDP, ZeRO-2 and FSDP, fp32
//     and bf16 (GPT-tiny with dropout: the RNG streams matter), and DDP with BatchNorm (per-rank buffers);
//   - SIGTERM saves and stops, and the resumed run finishes bitwise too;
//   - a corrupt, truncated or incomplete checkpoint is refused with its file and reason, and the previous
//     complete one is used; another model's is refused naming the keys;
//   - resharding: a checkpoint of N ranks loads on M and under another strategy, every value in place.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "core/ckpt/checkpoint.h"
#include "core/ckpt/safetensors.h"
#include "core/train/metrics.h"
#include "train_harness.h"

using namespace distlab;
namespace fs = std::filesystem;

namespace {

struct Scratch {  // a folder for one test, removed after it
  fs::path dir;
  explicit Scratch(const std::string& tag) : dir(fs::temp_directory_path() / fmt::format("distlab-ckpt-{}-{}", tag, ::getpid())) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

struct Run {
  int code = 0;
  std::string out;
  std::vector<nlohmann::json> records;
  std::vector<double> losses;
  std::vector<int64_t> steps;
};

Run read_run(int code, std::string out, const std::string& metrics) {
  Run r{code, std::move(out), {}, {}, {}};
  std::ifstream in(fs::exists(metrics) ? metrics : metrics + ".partial");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    r.records.push_back(j);
    if (j["kind"] == "step") {
      r.losses.push_back(j["loss"].get<double>());
      r.steps.push_back(j["step"].get<int64_t>());
    }
  }
  return r;
}

// `distlab run -n N [--max-restarts 1] train CONFIG SETS`, with `env` before it (DISTLAB_TEST_FAULT=...)
Run launch(int ranks, const std::string& config, const std::string& sets, const std::string& metrics, const std::string& env = "",
           int restarts = 0) {
  const std::string cmd = fmt::format("{} timeout 240 {} run -n {} --master-port 0 --max-restarts {} train {} --set train.log_every=1000 "
                                      "--metrics {} {}",
                                      env, DISTLAB_BINARY, ranks, restarts, config, metrics, sets);
  auto [code, out] = shell_in_source(cmd);
  return read_run(code, out, metrics);
}

std::string slurp_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::string kCkptGpt = "configs/gpt-tiny.toml";
// AdamW with decay groups, clipping, a cosine schedule, and dropout: every piece of state matters
const std::string kGptSets = "--set train.steps=60 --set train.micro_batch=4 --set train.eval_batches=2 --set model.dropout=0.1 ";
const std::string kCnnBn = "configs/cifar-cnn-bn.toml";
const std::string kCnnBnSets = "--set train.steps=60 --set train.global_batch=16 --set data.synthetic_train=2048 --set data.synthetic_test=256 "
                               "--set train.eval_batches=2 ";

// The uninterrupted run, then the same with a fault and a restart: the same weights and losses, bitwise.
void check_resume_is_bitwise(const std::string& config, const std::string& sets, const std::string& fault, const std::string& tag) {
  Scratch s(tag);
  const std::string ck = " --set checkpoint.every=10 --set checkpoint.keep=2 ";
  Run whole = launch(2, config, sets + ck + "--set checkpoint.dir=" + (s / "ck-whole") + " --save " + (s / "whole.safetensors"),
                     s / "whole.jsonl");
  INFO(whole.out);
  REQUIRE(whole.code == 0);
  REQUIRE(whole.losses.size() == 60);
  Run cut = launch(2, config, sets + ck + "--set checkpoint.dir=" + (s / "ck-cut") + " --save " + (s / "cut.safetensors"), s / "cut.jsonl",
                   "DISTLAB_TEST_FAULT=" + fault, 1);
  INFO(fault << "\n" << cut.out);
  REQUIRE(cut.code == 0);
  CHECK(cut.out.find("killed by signal 9") != std::string::npos);
  CHECK(cut.out.find("resumed from") != std::string::npos);
  // the metrics continue the same file: every step once, in order, with the uninterrupted run's losses
  std::vector<int64_t> one_to_60(60);
  for (int i = 0; i < 60; i++) one_to_60[size_t(i)] = i + 1;
  CHECK(cut.steps == one_to_60);
  CHECK(cut.losses == whole.losses);
  CHECK(slurp_file(s / "cut.safetensors") == slurp_file(s / "whole.safetensors"));
  int resumes = 0;
  for (const auto& r : cut.records) resumes += r["kind"] == "resume";
  CHECK(resumes == 1);
}

}  // namespace

TEST_CASE("a resumed run that fails before its first record keeps the interrupted run's metrics", "[ckpt]") {
  Scratch s("metrics");
  const std::string path = s / "m.jsonl";
  std::ofstream(path + ".partial") << R"({"kind":"step","step":1,"loss":2.5})" "\n" R"({"kind":"step","step":2,"loss":2.4})" "\n";
  {
    MetricsWriter w(path);
    w.fail("checkpoint.dir cannot be written");  // e.g. the resume itself failed
  }
  const std::string kept = slurp_file(path + ".partial");
  CHECK(kept.find(R"("step":2)") != std::string::npos);
  CHECK(kept.find("cannot be written") != std::string::npos);
  // the next resume continues the file: its error record is dropped, the steps up to the checkpoint kept
  {
    MetricsWriter w(path);
    CHECK(w.continue_from(1) == 1);
    w.write({{"kind", "step"}, {"step", 2}, {"loss", 2.3}});
    w.finish();
  }
  Run r = read_run(0, "", path);
  CHECK(r.steps == std::vector<int64_t>{1, 2});
  CHECK(r.losses == std::vector<double>{2.5, 2.3});
}

TEST_CASE("CRC-32 is zlib's", "[ckpt]") {
  CHECK(crc32("123456789", 9) == 0xCBF43926u);
  CHECK(crc32_hex(crc32("", 0)) == "00000000");
  CHECK(crc32("6789", 4, crc32("12345", 5)) == 0xCBF43926u);  // incremental
}

TEST_CASE("kill -9 at a random step under DDP: the resumed run is the uninterrupted one, bitwise (fp32, bf16, BatchNorm)", "[ckpt][e2e]") {
  std::mt19937 rng(std::random_device{}());
  for (const std::string prec : {"fp32", "bf16"}) {
    const int step = std::uniform_int_distribution<int>(11, 59)(rng);
    INFO("DDP " << prec << ", rank 1 killed at step " << step);
    check_resume_is_bitwise(kCkptGpt, kGptSets + "--set parallel.strategy=ddp --set precision.mode=" + prec + " ",
                            fmt::format("kill:1:step:{}", step), "ddp-" + prec);
  }
  // BatchNorm's running statistics are per rank under DDP: each rank gets its own back
  const int step = std::uniform_int_distribution<int>(11, 59)(rng);
  INFO("DDP CNN with BatchNorm, rank 0 killed at step " << step);
  check_resume_is_bitwise(kCnnBn, kCnnBnSets + "--set parallel.strategy=ddp ", fmt::format("kill:0:step:{}", step), "ddp-bn");
}

TEST_CASE("kill -9 at a random step under ZeRO-2, and in the middle of a save: bitwise, from the previous complete checkpoint", "[ckpt][e2e]") {
  std::mt19937 rng(std::random_device{}());
  for (const std::string prec : {"fp32", "bf16"}) {
    const int step = std::uniform_int_distribution<int>(11, 59)(rng);
    INFO("ZeRO-2 " << prec << ", rank 1 killed at step " << step);
    check_resume_is_bitwise(kCkptGpt, kGptSets + "--set parallel.strategy=zero2 --set precision.mode=" + prec + " ",
                            fmt::format("kill:1:step:{}", step), "zero2-" + prec);
  }
  // rank 1 dies with its file of step 30 written but not renamed: step-000030 has no COMPLETE, and the
  // restart resumes from step 20, intact
  Scratch s("torn");
  const std::string sets = kGptSets + "--set parallel.strategy=zero2 --set precision.mode=bf16 --set checkpoint.every=10 --set checkpoint.dir=" + (s / "ck");
  Run whole = launch(2, kCkptGpt, kGptSets + "--set parallel.strategy=zero2 --set precision.mode=bf16", s / "whole.jsonl");
  Run cut = launch(2, kCkptGpt, sets, s / "cut.jsonl", "DISTLAB_TEST_FAULT=kill:1:save:30", 1);
  INFO(cut.out);
  REQUIRE(cut.code == 0);
  CHECK(cut.out.find("rank 1 kills itself with SIGKILL at save 30") != std::string::npos);
  CHECK(cut.out.find("skipping " + (s / "ck/step-000030") + ": incomplete") != std::string::npos);
  CHECK(cut.out.find("resumed from " + (s / "ck/step-000020") + " (step 20)") != std::string::npos);
  CHECK(cut.losses == whole.losses);
}

TEST_CASE("kill -9 at a random step under FSDP: bitwise, fp32, bf16, and fp16 with skipped steps (the loss scaler's state)", "[ckpt][e2e]") {
  std::mt19937 rng(std::random_device{}());
  for (const std::string prec : {"fp32", "bf16", "fp16 --set precision.init_scale=1e9"}) {
    const int step = std::uniform_int_distribution<int>(11, 59)(rng);
    INFO("FSDP " << prec << ", rank 0 killed at step " << step);
    check_resume_is_bitwise(kCkptGpt, kGptSets + "--set parallel.strategy=fsdp --set precision.mode=" + prec + " ",
                            fmt::format("kill:0:step:{}", step), "fsdp-" + prec.substr(0, 4));
  }
}

TEST_CASE("SIGTERM saves a checkpoint and stops with 143, and the resumed run finishes as the uninterrupted one", "[ckpt][e2e]") {
  Scratch s("term");
  const std::string sets = "--set train.steps=250 --set train.micro_batch=4 --set train.eval_batches=2 --set parallel.strategy=zero2 "
                           "--set checkpoint.every=100 --set checkpoint.dir=" + (s / "ck") + " --set train.log_every=1000 ";
  const std::string metrics = s / "m.jsonl";
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cmd = fmt::format("cd {} && exec {} run -n 2 --master-port 0 train {} {} --metrics {} > {} 2>&1", DISTLAB_SOURCE_DIR,
                                        DISTLAB_BINARY, kCkptGpt, sets, metrics, s / "out.txt");
    execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
    _exit(127);
  }
  // wait until it is past its first checkpoint, then stop it as a scheduler would
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  size_t lines = 0;
  while (std::chrono::steady_clock::now() < until && lines < 130) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(metrics + ".partial");
    lines = 0;
    for (std::string l; std::getline(in, l);) lines++;
  }
  REQUIRE(lines >= 130);
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string out = slurp_file(s / "out.txt");
  INFO(out);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 143);  // 128 + SIGTERM, as the README says (it was 130, Ctrl-C's)
  CHECK(out.find("(SIGTERM)") != std::string::npos);
  CHECK(out.find("stopped by SIGTERM after step") != std::string::npos);
  REQUIRE(fs::exists(metrics + ".partial"));  // not finished: the metrics stay .partial
  CHECK(!fs::exists(metrics));
  Run resumed = launch(2, kCkptGpt, sets + " --save " + (s / "cut.safetensors"), metrics);
  INFO(resumed.out);
  REQUIRE(resumed.code == 0);
  Run whole = launch(2, kCkptGpt, sets + "--set checkpoint.dir=" + (s / "ck2") + " --save " + (s / "whole.safetensors"), s / "whole.jsonl");
  REQUIRE(whole.code == 0);
  CHECK(resumed.losses == whole.losses);
  CHECK(resumed.losses.size() == 250);
  CHECK(slurp_file(s / "cut.safetensors") == slurp_file(s / "whole.safetensors"));
}

namespace {

// Every weight and optimizer value of a checkpoint, by logical name (buffers left out: per rank).
std::map<std::string, std::vector<float>> consolidate(const std::string& dir) {
  Checkpoint c(dir);
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, t] : c.manifest().at("tensors").items()) {
    if (t.at("category") == "buffers") continue;
    std::vector<float> v(size_t(shape_numel(c.shape(name))));
    c.read(name, 0, int64_t(v.size()), v.data());
    out[name] = std::move(v);
  }
  return out;
}

bool bitwise_equal(const std::map<std::string, std::vector<float>>& a, const std::map<std::string, std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || it->second.size() != v.size() || std::memcmp(v.data(), it->second.data(), v.size() * 4) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("resharding: N ranks' checkpoint loads on M ranks and under another strategy, every value in place", "[ckpt][e2e]") {
  Scratch s("reshard");
  // global batch 12 on every world (micro-batch 12 / ranks); AdamW's moments in bf16 runs' f32
  const std::string base = "--set train.steps=10 --set train.eval_batches=2 --set precision.mode=bf16 --set checkpoint.every=10 ";
  auto sets = [&](int ranks, const std::string& strategy) {
    return base + fmt::format("--set train.micro_batch={} --set parallel.strategy={} ", 12 / ranks, strategy);
  };
  struct Source {
    int ranks;
    std::string strategy;
  };
  for (const Source& src : {Source{2, "zero2"}, Source{4, "fsdp"}, Source{2, "fsdp"}, Source{2, "ddp"}}) {
    Run r = launch(src.ranks, kCkptGpt, sets(src.ranks, src.strategy) + "--set checkpoint.dir=" + (s / fmt::format("{}-{}", src.ranks, src.strategy)),
                   s / "src.jsonl");
    INFO(r.out);
    REQUIRE(r.code == 0);
  }
  struct Case {
    int from;
    std::string from_strategy;
    int to;
    std::string to_strategy;
  };
  for (const Case& c : {Case{2, "zero2", 1, "none"}, Case{2, "zero2", 3, "zero2"}, Case{4, "fsdp", 2, "fsdp"}, Case{2, "fsdp", 2, "ddp"},
                        Case{2, "ddp", 2, "fsdp"}, Case{2, "zero2", 3, "zero1"}}) {
    INFO(c.from << " ranks " << c.from_strategy << " -> " << c.to << " ranks " << c.to_strategy);
    const std::string from = s / fmt::format("{}-{}/step-000010", c.from, c.from_strategy);
    const std::string to = s / fmt::format("re-{}-{}-{}-{}", c.from, c.from_strategy, c.to, c.to_strategy);
    // loaded and saved again at the same step: every weight and moment where it was
    Run r = launch(c.to, kCkptGpt, sets(c.to, c.to_strategy) + "--set checkpoint.resume=" + from + " --set checkpoint.dir=" + to, s / "re.jsonl");
    INFO(r.out);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("resumed from " + from) != std::string::npos);
    const auto a = consolidate(from), b = consolidate(to + "/step-000010");
    CHECK(a.size() == 84);  // GPT-tiny's 28 parameters, each with its weights, exp_avg and exp_avg_sq
    CHECK(bitwise_equal(a, b));
  }
  // and training goes on from it: 2 ranks of ZeRO-2 -> 1 rank, the same global batches (the sampler's
  // interleave puts the same samples in each), so the same curve up to the order of the sums
  const std::string cont = "--set train.steps=20 --set train.eval_batches=2 --set checkpoint.every=10 ";
  Run whole = launch(2, kCkptGpt, cont + "--set train.micro_batch=6 --set parallel.strategy=zero2 --set checkpoint.dir=" + (s / "c2"), s / "w.jsonl");
  REQUIRE(whole.code == 0);
  Run one = launch(1, kCkptGpt, cont + "--set train.micro_batch=12 --set checkpoint.resume=" + (s / "c2/step-000010") + " --set checkpoint.dir=" + (s / "c1"),
                   s / "one.jsonl");
  INFO(one.out);
  REQUIRE(one.code == 0);
  REQUIRE(one.losses.size() == 10);  // steps 11..20 (a fresh metrics file)
  std::vector<double> a(whole.losses.begin() + 10, whole.losses.end());
  CHECK(distlab::testing::max_rel_diff(a, one.losses) < 1e-5);
}

TEST_CASE("split models: tensor- and pipeline-parallel runs resume bitwise after a kill, and their checkpoints load on one rank, every value in place",
          "[ckpt][e2e][tp][pp]") {
  std::mt19937 rng(std::random_device{}());
  // tp 2: each rank writes its slices (a row-split matrix one piece per row), the whole small tensors rank 0
  int step = std::uniform_int_distribution<int>(11, 59)(rng);
  INFO("tp 2, rank 1 killed at step " << step);
  check_resume_is_bitwise(kCkptGpt, kGptSets + "--set parallel.tp=2 ", fmt::format("kill:1:step:{}", step), "tp2");
  // pp 2: each stage its blocks; the last stage's copy of wte is not written (it is wte); dropout in both stages
  step = std::uniform_int_distribution<int>(11, 59)(rng);
  INFO("pp 2, rank 0 killed at step " << step);
  check_resume_is_bitwise(kCkptGpt, kGptSets + "--set parallel.pp=2 --set parallel.micro_batches=2 --set train.micro_batch=2 ",
                          fmt::format("kill:0:step:{}", step), "pp2");

  // a 2-rank split's checkpoint, loaded on one rank and saved again at the same step: every weight and moment
  Scratch s("split-reshard");
  const std::string base = "--set train.steps=10 --set train.eval_batches=2 --set checkpoint.every=10 --set model.dropout=0.1 ";
  // zero1: dp 2 x tp 2 x pp 2 under ZeRO-1, each rank writing its part of its slices of its stage
  // fsdp: dp 2 x tp 2 under FSDP, each rank its part of each unit's flat vector of TP slices
  for (const std::string split : {"tp", "pp", "zero1", "fsdp"}) {
    INFO(split << " -> 1 rank");
    const std::string sets = split == "tp"      ? "--set parallel.tp=2 --set train.micro_batch=4 "
                             : split == "pp"    ? "--set parallel.pp=2 --set parallel.micro_batches=2 --set train.micro_batch=2 "
                             : split == "zero1" ? "--set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set parallel.strategy=zero1 "
                                                  "--set parallel.micro_batches=2 --set train.micro_batch=2 "
                                                : "--set parallel.tp=2 --set parallel.dp=2 --set parallel.strategy=fsdp --set train.micro_batch=2 ";
    Run r = launch(split == "zero1" ? 8 : split == "fsdp" ? 4 : 2, kCkptGpt, base + sets + "--set checkpoint.dir=" + (s / split), s / "src.jsonl");
    INFO(r.out);
    REQUIRE(r.code == 0);
    const std::string from = s / (split + "/step-000010"), to = s / (split + "-one");
    const std::string one_sets = split == "tp" || split == "fsdp" ? "--set train.micro_batch=4 "
                                 : split == "pp"                  ? "--set train.micro_batch=2 --set train.accum_steps=2 "
                                                                  : "--set train.micro_batch=2 --set train.accum_steps=4 ";
    Run one = launch(1, kCkptGpt, base + one_sets + "--set checkpoint.resume=" + from + " --set checkpoint.dir=" + to, s / "one.jsonl");
    INFO(one.out);
    REQUIRE(one.code == 0);
    CHECK(one.out.find("resumed from " + from) != std::string::npos);
    const auto a = consolidate(from), b = consolidate(to + "/step-000010");
    CHECK(a.size() == 84);  // GPT-tiny's 28 parameters (wte once), each with its weights, exp_avg and exp_avg_sq
    CHECK(bitwise_equal(a, b));
  }
}

TEST_CASE("a corrupt, truncated or incomplete checkpoint is refused naming the file, and auto falls back to the previous complete one", "[ckpt]") {
  Scratch s("corrupt");
  const std::string toml = slurp_file(std::string(DISTLAB_SOURCE_DIR) + "/" + kCkptGpt);
  const std::vector<std::string> sets = {"train.steps=20", "train.micro_batch=4", "train.eval_batches=2", "checkpoint.every=5",
                                         "checkpoint.keep=0", "checkpoint.dir=" + (s / "ck")};
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = sets;
    all.insert(all.end(), extra.begin(), extra.end());
    return distlab::testing::train_in_process(toml, all);
  };
  auto whole = run({});
  REQUIRE(list_checkpoints(s / "ck").size() == 4);
  const std::string s20 = s / "ck/step-000020", s15 = s / "ck/step-000015", s10 = s / "ck/step-000010", s5 = s / "ck/step-000005";
  CHECK_NOTHROW(Checkpoint(s20).verify_files());
  // a flipped byte in the data of step 20: its CRC-32 no longer matches
  {
    std::fstream f(s20 + "/rank-00000.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    char c;
    f.read(&c, 1);
    f.seekp(-100, std::ios::end);
    c ^= 0x10;
    f.write(&c, 1);
  }
  CHECK_THROWS_WITH(Checkpoint(s20).verify_files(), Catch::Contains(s20 + "/rank-00000.safetensors") && Catch::Contains("CRC-32"));
  // step 15 truncated
  fs::resize_file(s15 + "/rank-00000.safetensors", fs::file_size(s15 + "/rank-00000.safetensors") - 7);
  CHECK_THROWS_WITH(Checkpoint(s15), Catch::Contains("rank-00000.safetensors") && Catch::Contains("truncated"));
  // step 10: its manifest edited by hand
  {
    std::string m = slurp_file(s10 + "/manifest.json");
    m.replace(m.find("\"step\": 10"), 10, "\"step\": 11");
    std::ofstream(s10 + "/manifest.json") << m;
  }
  CHECK_THROWS_WITH(Checkpoint(s10), Catch::Contains("manifest.json does not match its checksum"));
  Scratch t("corrupt-only");  // the two bad folders alone, for below (the resume re-saves these steps)
  fs::create_directories(t / "ck");
  fs::copy(s15, t / "ck/step-000015", fs::copy_options::recursive);
  fs::copy(s10, t / "ck/step-000010", fs::copy_options::recursive);
  // resume = auto: skips 20, 15 and 10, saying why, and resumes from 5; the rest of the run is the same
  auto resumed = run({});
  INFO(resumed.out);
  CHECK(resumed.out.find("skipping " + s20) != std::string::npos);
  CHECK(resumed.out.find("skipping " + s15) != std::string::npos);
  CHECK(resumed.out.find("resumed from " + s5 + " (step 5)") != std::string::npos);
  CHECK(resumed.losses == std::vector<double>(whole.losses.begin() + 5, whole.losses.end()));
  CHECK(resumed.weights == whole.weights);
  // the refused complete folders were kept aside when their steps were saved again, not deleted
  int aside = 0;
  for (const auto& e : fs::directory_iterator(s / "ck")) aside += e.path().filename().string().find(".replaced-") != std::string::npos;
  CHECK(aside == 3);  // steps 10, 15 and 20
  CHECK(resumed.out.find("was complete but not resumed from: kept as") != std::string::npos);
  // an incomplete folder (no COMPLETE) is skipped as a save that did not finish
  fs::remove(s20 + "/COMPLETE");
  CHECK_THROWS_AS(Checkpoint(s20), IncompleteCheckpoint);
  // nothing usable left but corrupt folders: an error, not a silent restart from step 0
  CHECK_THROWS_WITH(distlab::testing::train_in_process(toml, {"train.steps=20", "train.micro_batch=4", "checkpoint.dir=" + (t / "ck")}),
                    Catch::Contains("no usable checkpoint") && Catch::Contains("truncated") && Catch::Contains("does not match its checksum"));
  // checkpoint.resume naming a bad folder: its fault
  CHECK_THROWS_WITH(run({"checkpoint.resume=" + (t / "ck/step-000010")}), Catch::Contains("manifest.json does not match"));
}

TEST_CASE("a rank's state that no run saves, with every checksum recomputed, is refused naming the field, and auto falls back", "[ckpt]") {
  Scratch s("state");
  const std::string toml = slurp_file(std::string(DISTLAB_SOURCE_DIR) + "/" + kCkptGpt);
  const std::vector<std::string> sets = {"train.steps=4", "train.micro_batch=4", "train.eval_batches=1", "checkpoint.every=2",
                                         "checkpoint.keep=0", "checkpoint.dir=" + (s / "ck")};
  distlab::testing::train_in_process(toml, sets);
  const std::string s4 = s / "ck/step-000004", s2 = s / "ck/step-000002";
  const std::string file = s4 + "/rank-00000.safetensors", kept = s / "rank0.kept", manifest_kept = s / "manifest.kept";
  fs::copy_file(file, kept);
  fs::copy_file(s4 + "/manifest.json", manifest_kept);
  // an edit of the state that also rewrites the file's size and CRC-32 in the manifest, and COMPLETE's
  auto forge = [&](const std::function<void(nlohmann::json&)>& edit) {
    StFile f = read_safetensors(kept);
    nlohmann::json st = nlohmann::json::parse(f.metadata.at("distlab.state"));
    edit(st);
    f.metadata["distlab.state"] = st.dump();
    const WrittenFile w = write_safetensors(file, f);
    nlohmann::json m = nlohmann::json::parse(slurp_file(manifest_kept));
    m["files"]["rank-00000.safetensors"]["bytes"] = w.bytes;
    m["files"]["rank-00000.safetensors"]["crc32"] = crc32_hex(w.crc32);
    const std::string text = m.dump(1);
    std::ofstream(s4 + "/manifest.json", std::ios::trunc) << text;
    std::ofstream(s4 + "/COMPLETE", std::ios::trunc) << "step 4\nmanifest.json crc32 " << crc32_hex(crc32(text.data(), text.size())) << "\n";
  };
  forge([](nlohmann::json&) {});
  REQUIRE_NOTHROW(Checkpoint(s4).verify_files());  // the forge itself leaves a good checkpoint good
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> edits = {
      {"data/epoch is -7", [](nlohmann::json& st) { st["data"]["epoch"] = -7; }},
      {"optimizer/steps is -1", [](nlohmann::json& st) { st["optimizer"]["steps"] = -1; }},
      {"data/position is -3", [](nlohmann::json& st) { st["data"]["position"] = -3; }},
      {"scaler/scale is -1.0", [](nlohmann::json& st) { st["scaler"]["scale"] = -1.0; }},
      {"trainer/skipped_steps is 99", [](nlohmann::json& st) { st["trainer"]["skipped_steps"] = 99; }},
      {"micro_batch is 0", [](nlohmann::json& st) { st["micro_batch"] = 0; }},
      {"optimizer/param_steps/", [](nlohmann::json& st) { st["optimizer"]["param_steps"].begin().value() = -1; }},
  };
  for (const auto& [said, edit] : edits) {
    INFO(said);
    forge(edit);
    CHECK_THROWS_WITH(Checkpoint(s4).verify_files(), Catch::Contains("rank 0's state holds what no run saves") && Catch::Contains(said));
    // ckpt inspect says so too (it passed them: the checksums were right)
    auto [code, out] = shell_in_source(fmt::format("{} ckpt inspect {}", DISTLAB_BINARY, s4));
    CHECK(code != 0);
    CHECK_THAT(out, Catch::Contains(said));
  }
  // resume = auto: the newest is skipped with the reason, the run goes on from step 2 (it stopped here)
  forge([](nlohmann::json& st) { st["data"]["epoch"] = -7; });
  std::vector<std::string> again = sets;
  again.push_back("train.steps=6");
  const auto resumed = distlab::testing::train_in_process(toml, again);
  INFO(resumed.out);
  CHECK_THAT(resumed.out, Catch::Contains("skipping " + s4) && Catch::Contains("data/epoch is -7"));
  CHECK_THAT(resumed.out, Catch::Contains("resumed from " + s2 + " (step 2)"));
}

TEST_CASE("a hostile manifest (paths out of the folder, pieces past the end, impossible shapes) is refused, never read past", "[ckpt]") {
  Scratch s("hostile");
  const std::string toml = slurp_file(std::string(DISTLAB_SOURCE_DIR) + "/" + kCkptGpt);
  distlab::testing::train_in_process(toml, {"train.steps=2", "train.micro_batch=4", "train.eval_batches=1", "checkpoint.dir=" + (s / "ck")});
  const std::string dir = s / "ck/step-000002";
  const std::string original = slurp_file(dir + "/manifest.json");
  // an attacker who rewrites the manifest also rewrites COMPLETE's checksum
  auto forge = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json m = nlohmann::json::parse(original);
    edit(m);
    const std::string text = m.dump(1);
    std::ofstream(dir + "/manifest.json") << text;
    std::ofstream(dir + "/COMPLETE") << "step 2\nmanifest.json crc32 " << crc32_hex(crc32(text.data(), text.size())) << "\n";
  };
  forge([](nlohmann::json& m) {
    auto f = m["files"]["rank-00000.safetensors"];
    m["files"].erase("rank-00000.safetensors");
    m["files"]["../../../../etc/passwd"] = f;
  });
  CHECK_THROWS_WITH(Checkpoint(dir), Catch::Contains("rank-NNNNN.safetensors expected"));
  forge([](nlohmann::json& m) { m["tensors"]["transformer.wpe.weight"]["pieces"][0]["offset"] = int64_t(1) << 62; });
  CHECK_THROWS_WITH(Checkpoint(dir), Catch::Contains("transformer.wpe.weight has a piece") && Catch::Contains("outside"));
  forge([](nlohmann::json& m) { m["tensors"]["transformer.wpe.weight"]["pieces"][0]["numel"] = -5; });
  CHECK_THROWS_AS(Checkpoint(dir), CheckpointError);
  forge([](nlohmann::json& m) { m["tensors"]["transformer.wpe.weight"]["shape"] = {int64_t(1) << 40, int64_t(1) << 40}; });
  CHECK_THROWS_WITH(Checkpoint(dir), Catch::Contains("impossible shape"));
  forge([](nlohmann::json& m) { m["world_size"] = -1; });
  CHECK_THROWS_WITH(Checkpoint(dir), Catch::Contains("world_size -1"));
  forge([](nlohmann::json& m) { m["tensors"] = "not an object"; });
  CHECK_THROWS_AS(Checkpoint(dir), CheckpointError);
  // a step that is not the folder's: it would resume at step -5 and save over the checkpoints after it
  forge([](nlohmann::json& m) { m["step"] = -5; });
  CHECK_THROWS_WITH(Checkpoint(dir), Catch::Contains("step -5 in a folder of step 2"));
  forge([](nlohmann::json& m) { m["step"] = 7; });
  CHECK_THROWS_WITH(Checkpoint(dir), Catch::Contains("step 7 in a folder of step 2"));
  forge([](nlohmann::json&) {});
  CHECK_NOTHROW(Checkpoint(dir).verify_files());  // the untouched manifest is fine
  // files that are not files: a link to /dev/zero (was read without end, then bad_alloc) and a FIFO (a hang)
  const std::string manifest = dir + "/manifest.json", kept = s / "manifest.kept";
  fs::rename(manifest, kept);
  fs::create_symlink("/dev/zero", manifest);
  CHECK_THROWS_WITH(Checkpoint(dir), Catch::Contains("not a regular file"));
  fs::remove(manifest);
  REQUIRE(mkfifo(manifest.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(Checkpoint(dir), Catch::Contains("not a regular file"));
  auto [code, out] = shell_in_source(fmt::format("timeout 20 {} ckpt inspect {}", DISTLAB_BINARY, dir));
  CHECK(code != 0);
  CHECK(code != 124);  // refused, not timed out
  CHECK_THAT(out, Catch::Contains("not a regular file"));
  fs::remove(manifest);
  fs::rename(kept, manifest);
  const std::string rank0 = dir + "/rank-00000.safetensors";
  fs::rename(rank0, kept);
  fs::create_symlink("/dev/zero", rank0);
  CHECK_THROWS_AS(Checkpoint(dir).verify_files(), CheckpointError);
  fs::remove(rank0);
  fs::rename(kept, rank0);
  CHECK_NOTHROW(Checkpoint(dir).verify_files());
}

TEST_CASE("a checkpoint of another model is refused naming the keys, and resume = never will not overwrite one", "[ckpt]") {
  Scratch s("compat");
  const std::string toml = slurp_file(std::string(DISTLAB_SOURCE_DIR) + "/" + kCkptGpt);
  const std::vector<std::string> base = {"train.steps=4", "train.micro_batch=4", "train.eval_batches=1", "checkpoint.dir=" + (s / "ck")};
  distlab::testing::train_in_process(toml, base);
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = base;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  CHECK_THROWS_WITH(distlab::testing::train_in_process(toml, with({"model.n_layer=3"})),
                    Catch::Contains("model.n_layer: 2 in the checkpoint, 3 now"));
  CHECK_THROWS_WITH(distlab::testing::train_in_process(toml, with({"optim.name=sgd", "optim.weight_decay=0"})),
                    Catch::Contains("optim.name: \"adamw\" in the checkpoint, \"sgd\" now"));
  CHECK_THROWS_WITH(distlab::testing::train_in_process(toml, with({"checkpoint.resume=never"})),
                    Catch::Contains("already holds checkpoints"));
  // a changed learning rate resumes, with a note
  auto r = distlab::testing::train_in_process(toml, with({"optim.lr=0.001", "train.steps=6"}));
  CHECK(r.out.find("note: resuming with changed settings: optim.lr") != std::string::npos);
  CHECK(r.losses.size() == 2);
  // a folder that cannot be created
  CHECK_THROWS_WITH(distlab::testing::train_in_process(toml, {"train.steps=2", "train.micro_batch=4", "checkpoint.dir=/proc/version/ck"}),
                    Catch::Contains("checkpoint.dir '/proc/version/ck' cannot be created"));
}

TEST_CASE("distlab ckpt inspect and export: the manifest with checksums, and the weights PyTorch loads", "[ckpt][cli]") {
  Scratch s("cli");
  Run r = launch(2, kCkptGpt, "--set train.steps=6 --set train.micro_batch=4 --set train.eval_batches=1 --set parallel.strategy=fsdp "
                          "--set precision.mode=bf16 --set checkpoint.dir=" + (s / "ck") + " --save " + (s / "saved.safetensors"),
                 s / "m.jsonl");
  INFO(r.out);
  REQUIRE(r.code == 0);
  auto [code, out] = shell_in_source(fmt::format("{} ckpt inspect {}", DISTLAB_BINARY, s / "ck"));
  INFO(out);
  CHECK(code == 0);
  CHECK(out.find("step 6 | strategy fsdp | 2 rank(s) | precision bf16 | optimizer adamw") != std::string::npos);
  CHECK(out.find("CRC-32 checked: OK") != std::string::npos);
  CHECK(out.find("rank-00001.safetensors") != std::string::npos);
  CHECK(out.find("optim_state") != std::string::npos);
  // the exported weights are the --save file's (the f32 masters, gathered), tensor for tensor
  auto [ecode, eout] = shell_in_source(fmt::format("{} ckpt export {} --out {}", DISTLAB_BINARY, s / "ck", s / "export.safetensors"));
  INFO(eout);
  REQUIRE(ecode == 0);
  StFile a = read_safetensors(s / "export.safetensors"), b = read_safetensors(s / "saved.safetensors");
  REQUIRE(a.tensors.size() == b.tensors.size());
  // both hold the tied pair as PyTorch's GPT state_dict does: lm_head.weight, a copy of wte
  REQUIRE(a.tensors.count("lm_head.weight"));
  CHECK(a.tensors["lm_head.weight"].bytes == a.tensors["transformer.wte.weight"].bytes);
  for (const auto& [name, t] : b.tensors) {
    INFO(name);
    REQUIRE(a.tensors.count(name));
    CHECK(a.tensors[name].bytes == t.bytes);
    CHECK(a.tensors[name].shape == t.shape);
  }
  // a corrupt file: inspect fails naming it
  {
    std::fstream f(s / "ck/step-000006/rank-00001.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-8, std::ios::end);
    f.write("garbage!", 8);
  }
  auto [bcode, bout] = shell_in_source(fmt::format("{} ckpt inspect {}", DISTLAB_BINARY, s / "ck/step-000006"));
  CHECK(bcode != 0);
  CHECK(bout.find("rank-00001.safetensors: CRC-32") != std::string::npos);
}

TEST_CASE("what a checkpoint weighs per rank: 12 bytes per parameter of f32 weights and Adam's moments, split N ways under FSDP", "[ckpt][meta]") {
  const std::string toml = slurp_file(std::string(DISTLAB_SOURCE_DIR) + "/configs/gpt-1b.toml");
  for (int n : {1, 8}) {
    INFO(n << " ranks");
    auto r = distlab::testing::train_in_process(
        toml, {"train.steps=1", fmt::format("dist.fake_world_size={}", n), n > 1 ? "parallel.strategy=fsdp" : "parallel.strategy=none",
               "checkpoint.dir=" + (fs::temp_directory_path() / "distlab-meta-ck-unused").string()},
        DeviceKind::meta);
    const auto& est = r.summary["checkpoint"]["estimate"];
    const double psi = r.summary["params"].get<double>();
    const double per_rank = est["bytes_per_rank"]["total"].get<double>();
    CHECK(per_rank / (12.0 * psi / n) == Approx(1.0).epsilon(0.01));  // padding adds a little
    CHECK(est["modeled_write_s"].get<double>() == Approx(per_rank * n / 2e9).epsilon(0.01));  // one node at 2 GB/s
    CHECK(r.out.find("checkpoint (meta: not written)") != std::string::npos);
    CHECK(!fs::exists(fs::temp_directory_path() / "distlab-meta-ck-unused"));
  }
}
