// The cost model against published runs: `distlab bench published` over bench/published.toml, and the
// table's own rules — a run outside the band must say why, a run back inside must lose its excuse, and a
// malformed table is an error naming its line.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include <set>
#include <tuple>

#include "core/perf/hardware.h"
#include "grader/bridge/lab_extension.h"
#include "train_harness.h"

using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

std::string table_tmp(const std::string& name) {
  return (fs::temp_directory_path() / ("distlab-published-" + std::to_string(::getpid()) + "-" + name)).string();
}

std::pair<int, std::string> published(const std::string& table, const std::string& extra = "") {
  return shell_in_source("timeout 120 "s + DISTLAB_BINARY + " bench published --table " + table + " " + extra);
}

// GPT-2 124M on 8 A100s as llm.c ran it, with a published step of `step_s`
std::string gpt2_run(double step_s, const std::string& outside) {
  std::string t = "band = 0.15\n[[run]]\nid = \"gpt2\"\nsource = \"a test\"\nwhat = \"GPT-2 124M, 8 A100s, ZeRO-1\"\n"
                  "config = \"configs/gpt2-124m.toml\"\n"
                  "set = [\"dist.fake_world_size=8\", \"parallel.strategy=zero1\", \"train.micro_batch=64\", \"model.attention=flash\", "
                  "\"precision.mode=bf16\", \"log.profile=a100-nvlink\"]\n"
                  "published_step_s = " + std::to_string(step_s) + "\n";
  if (!outside.empty()) t += "outside = \"" + outside + "\"\n";
  return t;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

}  // namespace

TEST_CASE("bench published: every run of bench/published.toml is modeled, and each agrees with the table", "[costmodel][published]") {
  const std::string json = table_tmp("rows.json");
  auto [code, out] = published("bench/published.toml", "--json " + json);
  INFO(out);
  REQUIRE(code == 0);
  for (const char* id : {"llmc-gpt2-124m-8xa100", "torchtitan-llama3.1-8b-8xh100", "torchtitan-llama3-8b-64xa100", "torchtitan-llama3-70b-64xa100"})
    CHECK_THAT(out, Catch::Contains(id));
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in);
  REQUIRE(doc["runs"].size() >= 4);
  for (const auto& r : doc["runs"]) {
    INFO(r.dump());
    CHECK(r["agrees_with_table"] == true);
    CHECK(r["modeled_step_s"].get<double>() > 0);
    CHECK(r["step_ratio"].get<double>() == Approx(r["modeled_step_s"].get<double>() / r["published_step_s"].get<double>()));
    // a ratio outside the band is reported with its reason, never hidden
    CHECK(r["in_band"].get<bool>() == r["outside"].get<std::string>().empty());
  }
  // torchtitan's 8B on 8 H100s: 8 GPUs x 2 x 8192 tokens a step, 5,762 tokens/s/GPU published
  const auto& tt = doc["runs"][1];
  CHECK(tt["tokens_per_step_per_gpu"].get<double>() == 16384);
  CHECK(tt["published_step_s"].get<double>() == Approx(16384.0 / 5762));
  CHECK(tt["profile"] == "h100-96g");
  // torch.compile's gain over eager PyTorch in the same table (6,667 / 5,762), against the modeled gain of
  // fused kernels over eager op chains: the one comparison where the 500 W limit and GEMM efficiency cancel
  REQUIRE(doc["gains"].size() == 1);
  const auto& g = doc["gains"][0];
  INFO(g.dump());
  CHECK(g["published_gain"].get<double>() == Approx(6667.0 / 5762));
  CHECK(g["modeled_gain"].get<double>() > 1.05);
  CHECK(g["in_band"] == true);
  CHECK(g["agrees_with_table"] == true);
  fs::remove(json);
}

TEST_CASE("bench published: a [[gain]] compares two runs' speed-ups, and names runs the table has", "[costmodel][published]") {
  const std::string table = table_tmp("gain.toml");
  // two rows of the same configuration (published at twice the modeled step: each outside the band, with
  // its reason): the modeled gain is exactly 1; a published gain of 1.5 is outside
  auto two = [](double second_step_s, const std::string& gain_outside) {
    std::string t = gpt2_run(0.6, "known");
    std::string second = gpt2_run(second_step_s, "known");
    second = second.substr(second.find("[[run]]"));
    second.replace(second.find("id = \"gpt2\""), 11, "id = \"gpt2-b\"");
    t += second + "[[gain]]\nid = \"g\"\nwhat = \"b over a\"\nrun = \"gpt2-b\"\nover = \"gpt2\"\n";
    if (!gain_outside.empty()) t += "outside = \"" + gain_outside + "\"\n";
    return t;
  };
  write(table, two(0.6, ""));  // published gain 1.0, modeled 1.0
  auto [code0, out0] = published(table);
  INFO(out0);
  CHECK(code0 == 0);
  CHECK_THAT(out0, Catch::Contains("within the band"));
  write(table, two(0.4, ""));  // published gain 1.5: the model says 1.0
  auto [code1, out1] = published(table);
  INFO(out1);
  CHECK(code1 == 1);
  CHECK_THAT(out1, Catch::Contains("OUTSIDE the band, and the table does not say why"));
  write(table, two(0.4, "the second run had a faster network"));
  CHECK(published(table).first == 0);
  write(table, two(0.6, "stale"));
  CHECK(published(table).first == 1);
  write(table, gpt2_run(0.6, "known") + "[[gain]]\nid = \"g\"\nwhat = \"w\"\nrun = \"nope\"\nover = \"gpt2\"\n");
  auto [code2, out2] = published(table);
  CHECK(code2 != 0);
  CHECK_THAT(out2, Catch::Contains("names run 'nope', which the table does not have"));
  fs::remove(table);
}

TEST_CASE("bench published: a run outside the band without a reason, or inside with one, fails the table", "[costmodel][published]") {
  const std::string table = table_tmp("table.toml");
  // the modeled step first, from the real table's row for the same configuration
  const std::string json = table_tmp("one.json");
  write(table, gpt2_run(0.6, "known"));  // twice the modeled step: outside, with a reason
  auto [code0, out0] = published(table, "--json " + json);
  INFO(out0);
  REQUIRE(code0 == 0);
  std::ifstream in(json);
  const double modeled = nlohmann::json::parse(in)["runs"][0]["modeled_step_s"].get<double>();

  write(table, gpt2_run(modeled * 1.02, ""));  // inside, no excuse: fine
  CHECK(published(table).first == 0);
  write(table, gpt2_run(modeled * 1.02, "it used to be slow"));  // inside, with an excuse: stale
  auto [code1, out1] = published(table);
  CHECK(code1 == 1);
  CHECK_THAT(out1, Catch::Contains("now within the band: remove its `outside`"));
  write(table, gpt2_run(modeled * 2, ""));  // outside, no reason given
  auto [code2, out2] = published(table);
  CHECK(code2 == 1);
  CHECK_THAT(out2, Catch::Contains("OUTSIDE the band, and the table does not say why"));
  fs::remove(table);
  fs::remove(json);
}

TEST_CASE("bench published: a malformed table is an error naming its line and key", "[costmodel][published]") {
  const std::string table = table_tmp("bad.toml");
  write(table, gpt2_run(0.3, "") + "published_speed = 3\n");
  auto [code, out] = published(table);
  CHECK(code != 0);
  CHECK_THAT(out, Catch::Contains("unknown key 'published_speed'"));
  CHECK_THAT(out, Catch::Contains(":9:"));
  write(table, gpt2_run(0.3, "") + "published_tokens_per_s_per_gpu = 1000\n");
  auto [code2, out2] = published(table);
  CHECK(code2 != 0);
  CHECK_THAT(out2, Catch::Contains("exactly one of published_step_s and published_tokens_per_s_per_gpu"));
  write(table, "band = 0.15\n[[run]]\nid = \"x\"\nsource = \"s\"\nwhat = \"w\"\nconfig = \"configs/nope.toml\"\npublished_step_s = -1\n");
  auto [code3, out3] = published(table);
  CHECK(code3 != 0);
  CHECK_THAT(out3, Catch::Contains("published_step_s is not a positive number"));
  fs::remove(table);
}

// `distlab bench calibrate`: one traced step of the model on the meta device says which GEMMs and attention
// calls it makes; each is timed on the device and written into a profile file that train and plan take.
// On the CPU and on cuda-sim here (the kernels are the CPU's); on a GPU, bench/gpu_check.sh.
TEST_CASE("bench calibrate: every GEMM shape of the model's step measured on the device, into a profile file that train and plan take", "[costmodel][calibrate][cli]") {
  const std::string dir = table_tmp("calibrate");
  fs::create_directories(dir);
  for (const char* device : {"cpu", "cuda-sim"}) {
    INFO(device);
    const std::string file = dir + "/" + device + ".json";
    auto [code, out] = shell_in_source("timeout 300 "s + DISTLAB_BINARY + " bench calibrate configs/llama-tiny.toml --set model.attention=flash --device " +
                                       device + " --seconds 0.01 --settle 0.05" + (device == "cpu"s ? " --comm-ranks 2" : "") + " -o " + file + " 2>&1");
    INFO(out);
    REQUIRE(code == 0);
    CHECK_THAT(out, Catch::Contains("GEMM shapes and 2 attention calls of one step") && Catch::Contains("wrote " + file));
    // the GPU's sustained rate, not a burst: the largest GEMM runs first, then every timing, on random operands
    CHECK_THAT(out, Catch::Contains("settled 0.05 s under the step's largest GEMM (256 x 64 x 1024"));
    // the collectives measured too (over Gloo here; NCCL over every GPU on a GPU machine), the table read back
    if (device == "cpu"s) {
      CHECK_THAT(out, Catch::Contains("collectives: distlab bench comm --backend gloo over 2 ranks"));
      CHECK_THAT(distlab::load_profile_file(file).calibration_source, Catch::Contains("all_reduce over 2 ranks (gloo: busbw"));
      CHECK(!fs::exists(file + ".comm.json"));
    } else {
      CHECK_THAT(distlab::load_profile_file(file).calibration_source, Catch::Contains("collectives: not measured"));
    }
    const distlab::HardwareProfile hw = distlab::load_profile_file(file);
    CHECK(hw.name == "calibrated-cpu");  // a CPU device: the cpu profile is the base
    CHECK_THAT(hw.calibration_source, Catch::Contains("measured on") && Catch::Contains("configs/llama-tiny.toml") &&
                                          Catch::Contains("random operands, after 0.05 s under load"));
    // the shapes: what a meta run of the same config traces, every one measured
    auto trace = [](const std::vector<std::string>& sets) {
      std::vector<std::string> all = {"train.device=meta", "train.steps=2", "log.trace_step=2", "train.eval_every=0", "log.profile=cpu",
                                      "model.attention=flash"};
      all.insert(all.end(), sets.begin(), sets.end());
      const std::string toml = distlab::testing::file_text("configs/llama-tiny.toml");
      std::vector<distlab::TraceEvent> events;
      distlab::run_planned(distlab::parse_config(toml, "configs/llama-tiny.toml", all, {}, distlab::lab_config_sections()), &events);
      return events;
    };
    std::set<std::tuple<int64_t, int64_t, int64_t>> shapes;
    for (const auto& e : trace({}))
      for (const auto& g : e.shape.gemm)
        if (g.m > 0) shapes.insert({g.m, g.n, g.k});
    REQUIRE(shapes.size() >= 5);
    CHECK(hw.measured_gemms.size() == shapes.size());
    for (const auto& [m, n, k] : shapes) {
      bool found = false;
      for (const auto& g : hw.measured_gemms) found |= g.shape == distlab::GemmShape{m, n, k} && g.flops_per_s > 0;
      CHECK(found);
    }
    REQUIRE(hw.measured_attention.size() == 2);  // forward and backward at T 64, head size 16
    CHECK(hw.measured_attention[0].seq == 64);
    CHECK(hw.measured_attention[0].head_dim == 16);
    CHECK(hw.mem_bw_efficiency > 0);
    // train models its step on it (the summary names it), and plan takes it
    auto [tcode, tout] = shell_in_source("timeout 120 "s + DISTLAB_BINARY + " train configs/llama-tiny.toml --device meta --set train.steps=2 "
                                         "--set log.profile=" + file + " 2>&1");
    INFO(tout);
    CHECK(tcode == 0);
    CHECK_THAT(tout, Catch::Contains("modeled on calibrated-cpu"));
    auto [pcode, pout] = shell_in_source("timeout 120 "s + DISTLAB_BINARY + " plan --model configs/llama-tiny.toml --gpus 2 --gpu-mem 8GiB --profile " + file +
                                         " --json 2>&1");
    INFO(pout);
    CHECK(pcode == 0);
    CHECK(nlohmann::json::parse(pout)["profile"] == file);
  }
  // what is not a profile file is an error naming the key
  std::ofstream(dir + "/bad.json") << "{\"base\": \"cpu\", \"gemm_eficiency\": 1}";
  auto [bcode, bout] = shell_in_source(std::string(DISTLAB_BINARY) + " train configs/llama-tiny.toml --device meta --set train.steps=1 --set log.profile=" +
                                       dir + "/bad.json 2>&1");
  CHECK(bcode != 0);
  CHECK_THAT(bout, Catch::Contains("log.profile") && Catch::Contains("unknown key \"gemm_eficiency\""));
  auto [ocode, oout] = shell_in_source(std::string(DISTLAB_BINARY) + " bench calibrate configs/llama-tiny.toml --device cpu -o " + dir + "/x.txt 2>&1");
  CHECK(ocode != 0);
  CHECK_THAT(oout, Catch::Contains("ends in .json"));
  // a folder that is not there fails before anything is timed, and leaves no file behind
  auto [wcode, wout] = shell_in_source(std::string(DISTLAB_BINARY) + " bench calibrate configs/llama-tiny.toml --device cpu -o " + dir + "/no/such/x.json 2>&1");
  CHECK(wcode != 0);
  CHECK_THAT(wout, Catch::Contains("cannot write into") && !Catch::Contains("GEMM shapes"));
  CHECK(!fs::exists(dir + "/no"));
  fs::remove_all(dir);
}
