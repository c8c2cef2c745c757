// `distlab train` end to end, as a user runs it: exit codes, messages, files left behind.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <sys/wait.h>

#include <unistd.h>

#include <cstring>

#include "core/perf/hardware.h"
#include "core/ops/cpu/blas_core.h"
#include "core/report/tfevents.h"
#include "shell.h"

using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

struct Result {
  int code;
  std::string out;
};

// A shell command line run in the source folder: its exit code and its stdout and stderr together.
Result capture(const std::string& cmd) {
  auto [code, out] = shell_in_source(cmd);
  return {code, out};
}

Result shell(const std::string& script) { return capture("bash -c '" + script + "'"); }
Result run(const std::string& args) { return capture("timeout 120 "s + DISTLAB_BINARY + " " + args); }

std::string tmp(const std::string& name) {
  return (fs::temp_directory_path() / ("distlab-cli-" + std::to_string(::getpid()) + "-" + name)).string();
}

}  // namespace

TEST_CASE("distlab train writes metrics and weights, and --init reads them back", "[cli]") {
  std::string m = tmp("m.jsonl"), w = tmp("w.safetensors"), m2 = tmp("m2.jsonl");
  Result r = run("train configs/cifar-cnn.toml --set train.steps=3 --set data.synthetic_train=512 --metrics " + m + " --save " + w);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("SYNTHETIC") || Catch::Contains("CIFAR-10 train"));
  CHECK_THAT(r.out, Catch::Contains("step     3/3"));
  CHECK(fs::exists(m));
  CHECK(fs::exists(w));
  std::ifstream in(m);
  std::string line, last;
  int steps = 0;
  while (std::getline(in, line)) {
    steps += nlohmann::json::parse(line)["kind"] == "step";
    last = line;
  }
  CHECK(steps == 3);
  CHECK(nlohmann::json::parse(last)["kind"] == "summary");
  Result r2 = run("train configs/cifar-cnn.toml --set train.steps=1 --set data.synthetic_train=512 --init " + w + " --metrics " + m2);
  CHECK(r2.code == 0);
  CHECK_THAT(r2.out, Catch::Contains("loaded weights from"));
  for (auto f : {m, w, m2}) fs::remove(f);
}

TEST_CASE("out of memory exits non-zero with the breakdown and leaves no complete-looking files", "[cli][oom]") {
  std::string m = tmp("oom.jsonl"), w = tmp("oom.safetensors");
  { std::ofstream(m) << "{\"kind\":\"summary\",\"earlier\":true}\n"; }  // an earlier run's file must survive
  Result r = run("train configs/cifar-cnn.toml --device-mem 2MiB --metrics " + m + " --save " + w);
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("out of memory") && Catch::Contains("2.00 MiB total capacity") && Catch::Contains("hint:"));
  CHECK(!fs::exists(w));
  std::ifstream in(m);
  std::string first;
  std::getline(in, first);
  CHECK(first == "{\"kind\":\"summary\",\"earlier\":true}");
  std::ifstream part(m + ".partial");
  std::string all((std::istreambuf_iterator<char>(part)), std::istreambuf_iterator<char>());
  CHECK_THAT(all, Catch::Contains("\"kind\":\"error\""));
  for (auto f : {m, m + ".partial"}) fs::remove(f);
}

TEST_CASE("bad invocations explain themselves", "[cli]") {
  Result r = run("train configs/nope.toml");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("does not exist"));
  r = run("train configs/fashion-mnist-mlp.toml --set train.stpes=3");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("did you mean 'train.steps'"));
  r = run("train configs/fashion-mnist-mlp.toml --device-mem 12 potatoes");
  CHECK(r.code != 0);
  r = run("train configs/fashion-mnist-mlp.toml --device cuda");
  CHECK(r.code == 1);  // refused, saying what this build and machine have: no CUDA, no GPU, or the GPUs
  CHECK_THAT(r.out, Catch::Contains("is 'cuda', but this build or machine cannot train on a GPU (cuda: ") &&
                        (Catch::Contains("not in this build") || Catch::Contains("cudaGetDeviceCount")));
  // NCCL's benchmark without a GPU: refused by a build without CUDA, or the rank names the failing CUDA call
  r = run("bench comm -n 1 --backend nccl --max 4KiB");
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Catch::Contains("--backend nccl: not in this build") || Catch::Contains("cudaSetDevice(device) failed"));
  // a planned world on a real device: its ranks were never started (it said "8 ranks were started")
  r = run("train configs/fashion-mnist-mlp.toml --set dist.fake_world_size=8");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("dist.fake_world_size 8 on device cpu: the fake world moves no data"));
  // a timeout no collective can meet (it said the launcher had exited)
  r = run("train configs/fashion-mnist-mlp.toml --set dist.timeout_s=0.0001");
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("dist.timeout_s is 0.0001 s, under a second"));
  r = run("frobnicate");
  CHECK(r.code == 2);
  r = run("train --help-config");
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("optim.clip_grad_norm"));
}

TEST_CASE("the 1B GPT on meta prints its parameter count and memory by category", "[cli][meta]") {
  Result r = run("train configs/gpt-1b.toml --device meta --set train.steps=1");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("closed form") && Catch::Contains("optim_state") && Catch::Contains("8.00 bytes/param"));
}

TEST_CASE("Fashion-MNIST MLP reaches 85 % test accuracy", "[cli][slow]") {
  INFO("dataset-fashion-mnist is not installed: run scripts/setup.sh");
  REQUIRE(fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"));
  std::string m = tmp("fm.jsonl");
  Result r = run("train configs/fashion-mnist-mlp.toml --metrics " + m);
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::ifstream in(m);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  CHECK(nlohmann::json::parse(last)["test_accuracy"].get<double>() >= 0.85);
  fs::remove(m);
}

TEST_CASE("bench comm --ring measures lab 01's ring beside Gloo's and counts its wrong values", "[cli][bench]") {
  const std::string json = tmp("ring.json");
  Result r = run("bench comm -n 2 --ring solutions/01-collectives --min 4KiB --max 64KiB --iters 2 --json " + json);
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("your ring_all_reduce at 64.00 KiB") != std::string::npos);
  auto j = nlohmann::json::parse(std::ifstream(json));
  int ring_rows = 0;
  for (const auto& row : j["rows"])
    if (row["op"].get<std::string>().rfind("ring_", 0) == 0) {
      ring_rows++;
      CHECK(row["wrong"] == 0);
      CHECK(row["busbw_gbps"].get<double>() > 0);
    }
  CHECK(ring_rows == 3 * 5);  // three functions, 4..64 KiB
  CHECK(j["ring_wrong"] == 0);

  // a ring_all_reduce that returns at once: counted as wrong; the unimplemented functions are skipped
  const fs::path dir = tmp("ring-mutant");
  fs::create_directories(dir);
  std::ifstream skel(std::string(DISTLAB_SOURCE_DIR) + "/labs/01-collectives/student/ring.cpp");
  std::string src((std::istreambuf_iterator<char>(skel)), {});
  const auto at = src.find("// TODO(01-collectives): implement ring_all_reduce");
  REQUIRE(at != std::string::npos);
  src.insert(at, "return;\n");
  std::ofstream(dir / "ring.cpp") << src;
  r = run("bench comm -n 2 --ring " + dir.string() + " --min 4KiB --max 8KiB --iters 2 --json " + json);
  INFO(r.out);
  CHECK(r.code == 0);  // the engine's collectives were right; your ring's wrong values are reported
  CHECK(r.out.find("ring_reduce_scatter skipped: 01-collectives: ring_reduce_scatter is not implemented yet") != std::string::npos);
  j = nlohmann::json::parse(std::ifstream(json));
  CHECK(j["ring_wrong"].get<int64_t>() > 0);
  CHECK(j["wrong"] == 0);
  fs::remove_all(dir);
  fs::remove(json);
}

TEST_CASE("a full disk fails the run and keeps the earlier metrics file, missing output folders fail before training", "[cli][io]") {
  const std::string m = tmp("full.jsonl");
  std::ofstream(m) << "an earlier run's metrics\n";
  // a file size limit of 8 KiB stands in for a full disk: the writes past it fail (EFBIG)
  Result r = shell("ulimit -f 8; exec timeout 120 "s + DISTLAB_BINARY +
                   " train configs/cifar-cnn.toml --set train.steps=40 --set data.synthetic_train=512 --metrics " + m);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Catch::Contains("is the disk full"));
  std::ifstream in(m);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text == "an earlier run's metrics\n");
  CHECK(!fs::exists(m + ".partial"));  // cut short by the full disk: not left behind
  fs::remove(m);
  // the weights too: no file, no .partial (a 2 MB checkpoint past a 200 KiB limit)
  const std::string w = tmp("full.safetensors");
  r = shell("ulimit -f 200; exec timeout 120 "s + DISTLAB_BINARY + " train configs/cifar-cnn.toml --set train.steps=2 --set data.synthetic_train=512 --save " + w);
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Catch::Contains("is the disk full"));
  CHECK(!fs::exists(w));
  CHECK(!fs::exists(w + ".partial"));

  for (const std::string& flag : {"--save /nonexistent-folder/w.safetensors"s, "--metrics /nonexistent-folder/m.jsonl"s,
                                  "--set log.trace=/nonexistent-folder/t.json"s, "--save /tmp"s}) {
    r = run("train configs/cifar-cnn.toml --set train.steps=3 --set data.synthetic_train=512 " + flag);
    INFO(flag << "\n" << r.out);
    CHECK(r.code != 0);
    CHECK_THAT(r.out, Catch::Contains("does not exist") || Catch::Contains("is a folder"));
    CHECK_THAT(r.out, !Catch::Contains("step     1/3"));  // refused before any training
  }
}

namespace {

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) n++;
  return n;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The words of an SVG: the text of its <text> elements that holds a letter (titles, axes, legends, row
// names), in order -- tick labels and values are numbers and left out.
std::vector<std::string> svg_words(const std::string& svg) {
  std::vector<std::string> words;
  for (size_t at = svg.find("<text"); at != std::string::npos; at = svg.find("<text", at + 1)) {
    const size_t a = svg.find('>', at) + 1, b = svg.find("</text>", a);
    const std::string t = svg.substr(a, b - a);
    if (std::any_of(t.begin(), t.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); })) words.push_back(t);
  }
  return words;
}

}  // namespace

// The chapters (chapters/NN-topic.md) through `distlab chapter`, and every `distlab` command they quote in a
// sh block runs as quoted: a chapter that quotes a command that fails is a failing test.
TEST_CASE("chapters: list and show them, and every distlab command a chapter quotes runs", "[cli][chapters][early]") {
  Result list = run("chapter list");
  INFO(list.out);
  REQUIRE(list.code == 0);
  CHECK_THAT(list.out, Catch::Contains(" 8  8. Tensor and pipeline parallelism"));
  Result show = run("chapter show 8");
  CHECK(show.code == 0);
  CHECK_THAT(show.out, Catch::Contains("(p − 1) / (m + p − 1)") && Catch::Contains("Lab 06-tp-pp"));
  CHECK(run("chapter show 08-tp-pp").out == show.out);
  // rendered: no Markdown's marks, tables in aligned columns; --raw is the file itself
  CHECK_THAT(show.out, !Catch::Contains("**") && !Catch::Contains("|---") && !Catch::Contains("```"));
  CHECK(run("chapter show 8 --raw").out == slurp(std::string(DISTLAB_SOURCE_DIR) + "/chapters/08-tp-pp.md"));
  Result none = run("chapter show 99");
  CHECK(none.code == 1);
  CHECK_THAT(none.out, Catch::Contains("no chapter '99'") && Catch::Contains("distlab chapter list"));
  // the chapters' commands write under /tmp/distlab-chapters (the chapters say: mkdir -p it first), and
  // their figures to chapters/figures/, which the test redirects and compares with the committed SVG
  const fs::path out = "/tmp/distlab-chapters", figs = tmp("figures");
  fs::remove_all(out);
  fs::create_directories(out);
  fs::create_directories(figs);
  std::set<std::string> drawn;
  int quoted = 0;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(DISTLAB_SOURCE_DIR) / "chapters"))
    if (e.path().extension() == ".md") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::ifstream in(file);
    bool in_sh = false;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("```", 0) == 0) {
        in_sh = !in_sh && line == "```sh";
        continue;
      }
      if (!in_sh || line.rfind("distlab ", 0) != 0) continue;
      quoted++;
      std::string args = line.substr(8);
      if (args.rfind("run ", 0) == 0) args = "run --master-port 0 " + args.substr(4);  // a free port: tests run side by side
      std::string figure;
      const size_t o = args.find(" -o chapters/figures/");
      if (o != std::string::npos) {
        figure = args.substr(o + 21, args.find(' ', o + 21) - (o + 21));
        args.replace(o + 4, 16, figs.string() + "/");
      }
      Result r = run(args);
      INFO(file.filename().string() << ": " << line << "\n" << r.out);
      CHECK(r.code == 0);
      if (figure.empty()) continue;
      drawn.insert(figure);
      // the committed picture is what this command draws: the same elements and the same words (numbers
      // may move in their last digits between machines; a figure drawn from other runs would not match)
      const std::string made = slurp((figs / figure).string()), kept = slurp((fs::path(DISTLAB_SOURCE_DIR) / "chapters/figures" / figure).string());
      INFO("chapters/figures/" << figure);
      REQUIRE(!kept.empty());
      for (const char* element : {"<path ", "<rect ", "<text ", "<line "}) {
        INFO(element);
        CHECK(count_of(made, element) == count_of(kept, element));
      }
      CHECK(svg_words(made) == svg_words(kept));
    }
  }
  CHECK(quoted >= 5);
  // every committed figure is drawn by a command a chapter quotes, and shown by a chapter
  for (const auto& e : fs::directory_iterator(fs::path(DISTLAB_SOURCE_DIR) / "chapters/figures")) {
    const std::string name = e.path().filename().string();
    INFO("chapters/figures/" << name << " is drawn by no quoted command");
    CHECK(drawn.count(name) == 1);
  }
  std::string all_text;
  for (const fs::path& file : files) all_text += slurp(file.string());
  for (const std::string& name : drawn) {
    INFO(name << " is not shown by any chapter");
    CHECK(all_text.find("](figures/" + name + ")") != std::string::npos);
  }
  fs::remove_all(figs);
}


// Every quiz file loads, and its own answers score full marks while wrong ones score nothing: the answer
// keys are consistent with the choices, and the grading reads letters, numbers and units.
TEST_CASE("quiz: every quiz grades its right answers full and wrong ones zero, and bad answer files are named", "[cli][quiz]") {
  Result list = run("quiz list");
  INFO(list.out);
  REQUIRE(list.code == 0);
  CHECK_THAT(list.out, Catch::Contains("7.3  7.3 self-test"));
  std::vector<std::string> ids;
  std::istringstream lines(list.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ls(line);
    std::string id;
    ls >> id;
    if (!id.empty()) ids.push_back(id);
  }
  CHECK(ids.size() >= 1);
  const std::string empty = tmp("empty.json"), right = tmp("right.json"), wrong = tmp("wrong.json");
  std::ofstream(empty) << "{}";
  std::map<std::string, int> same_letter;
  int choices = 0;
  for (const std::string& id : ids) {
    Result blank = run("quiz " + id + " --answers " + empty);
    INFO("quiz " << id << "\n" << blank.out);
    REQUIRE(blank.code == 0);
    const auto doc = nlohmann::json::parse(blank.out);
    CHECK(doc["score"] == 0);
    CHECK(doc["total"].get<int>() >= 4);
    nlohmann::json r = nlohmann::json::object(), w = nlohmann::json::object();
    for (const auto& q : doc["questions"]) {
      const std::string expected = q["expected"];
      const std::string id_q = q["id"];
      CHECK(!q["explain"].get<std::string>().empty());
      if (expected.size() > 1 && expected[1] == ')') {  // "b) ...": a choice
        r[id_q] = expected.substr(0, 1);
        w[id_q] = std::string(1, expected[0] == 'a' ? 'b' : 'a');
      } else {  // "14 GB": a number and its unit
        const double v = std::stod(expected);
        r[id_q] = expected;
        w[id_q] = v == 0 ? 1e9 : v * 10 + 1;
      }
    }
    std::ofstream(right) << r.dump();
    std::ofstream(wrong) << w.dump();
    Result good = run("quiz " + id + " --answers " + right), bad = run("quiz " + id + " --answers " + wrong);
    INFO(good.out << bad.out);
    REQUIRE(good.code == 0);
    REQUIRE(bad.code == 0);
    CHECK(nlohmann::json::parse(good.out)["score"] == doc["total"]);
    CHECK(nlohmann::json::parse(bad.out)["score"] == 0);
    // the same letter everywhere: how far does it get?
    for (const char* letter : {"a", "b", "c", "d"}) {
      nlohmann::json same = nlohmann::json::object();
      for (const auto& q : doc["questions"])
        if (q["expected"].get<std::string>().size() > 1 && q["expected"].get<std::string>()[1] == ')') same[q["id"].get<std::string>()] = letter;
      std::ofstream(wrong) << same.dump();
      Result g = run("quiz " + id + " --answers " + wrong);
      same_letter[letter] += nlohmann::json::parse(g.out)["score"].get<int>();
      if (std::string(letter) == "a") choices += int(same.size());
    }
  }
  // the right answers are spread over the letters: guessing one letter everywhere earns little
  for (const auto& [letter, score] : same_letter) {
    INFO("answering " << letter << " everywhere scores " << score << " of " << choices << " choice questions");
    CHECK(score <= choices * 4 / 10);
  }
  std::ofstream(wrong) << "{\"no-such-question\": \"a\"}";
  Result unknown = run("quiz 7.3 --answers " + wrong);
  CHECK(unknown.code == 1);
  CHECK_THAT(unknown.out, Catch::Contains("no question 'no-such-question' in quiz 7.3") && Catch::Contains("same-curve-no-speedup"));
  std::ofstream(wrong) << "[1, 2";
  CHECK_THAT(run("quiz 7.3 --answers " + wrong).out, Catch::Contains("is not a JSON object"));
  CHECK_THAT(run("quiz 99").out, Catch::Contains("no quiz '99'") && Catch::Contains("7.3"));
  for (auto f : {empty, right, wrong}) fs::remove(f);
}

// A quiz file is checked key by key: a typo is an error naming the file and line, not a dropped question.
TEST_CASE("quiz: a malformed quiz file is an error naming its file, line and key", "[cli][quiz]") {
  const fs::path dir = tmp("chapters");
  fs::create_directories(dir);
  auto attempt = [&](const std::string& text) {
    std::ofstream(dir / "05-x.quiz.toml") << text;
    return capture("DISTLAB_CHAPTERS=" + dir.string() + " timeout 60 " + DISTLAB_BINARY + " quiz list");
  };
  const std::string q = "title = \"t\"\n[[question]]\nid = \"a\"\nask = \"?\"\nkind = \"choice\"\nchoices = [\"x\", \"y\"]\nexplain = \"e\"\n";
  CHECK(attempt(q + "answer = \"b\"\n").code == 0);
  Result typo = attempt(q + "answer = \"b\"\nanwser = \"a\"\n");
  CHECK(typo.code == 1);
  CHECK_THAT(typo.out, Catch::Contains("05-x.quiz.toml:") && Catch::Contains("unknown key 'anwser'"));
  CHECK_THAT(attempt(q + "answer = \"c\"\n").out, Catch::Contains("answer 'c' is not one of the letters a..b"));
  CHECK_THAT(attempt(q + "answer = \"a\"\nscenario = \"gone\"\n").out, Catch::Contains("names scenario 'gone'"));
  CHECK_THAT(attempt("title = \"t\"\n[[question]]\nid = \"n\"\nask = \"?\"\nkind = \"number\"\nexplain = \"e\"\n").out,
             Catch::Contains("has no numeric answer"));
  CHECK_THAT(attempt("title = \"t\"\n[[question\n").out, Catch::Contains("05-x.quiz.toml:2"));
  fs::remove_all(dir);
}

// Quiz 7.3's last question, as a student meets it: the scenario runs two ranks without a DistributedSampler
// next to one rank (the same losses, bitwise: two equal gradients average to themselves) and next to two
// ranks with the sampler (half the steps per epoch), then the answers on stdin are scored.
TEST_CASE("quiz 7.3: the no-sampler scenario shows one rank's curve and epoch, then the answers are scored", "[cli][quiz]") {
  const std::string empty = tmp("none.json");
  std::ofstream(empty) << "{}";
  Result key = run("quiz 7.3 --answers " + empty);
  REQUIRE(key.code == 0);
  std::string letters;  // the right letters, as shown
  const nlohmann::json answers = nlohmann::json::parse(key.out);  // held: a range-for over a temporary's member dangles
  for (const auto& q : answers["questions"]) letters += q["expected"].get<std::string>().substr(0, 1) + "\\n";
  fs::remove(empty);
  Result r = shell("printf \"" + letters + "\" | timeout 300 "s + DISTLAB_BINARY + " quiz 7.3");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("scenario: no-sampler") && Catch::Contains("score: 6 of 6 (6 asked)"));
  std::istringstream lines(r.out.substr(r.out.find("scenario: no-sampler")));
  int loss_rows = 0;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ls(line);
    std::string a, b;
    ls >> a >> b;
    if (a == "loss,") {  // "loss, step N  one  plain  sampler"
      std::string n, one, plain, sampler;
      std::istringstream(line.substr(line.find("step"))) >> b >> n >> one >> plain >> sampler;
      CHECK(one == plain);
      loss_rows++;
    }
    if (a == "steps_per_epoch") {
      std::string plain, sampler;
      ls >> plain >> sampler;
      CHECK(b == "937");  // 60,000 / 64, drop_last
      CHECK(plain == "937");
      CHECK(sampler == "468");
    }
  }
  CHECK(loss_rows >= 10);
}

// The figures: SVG drawn from real runs' metrics and a modeled trace, and the errors for bad inputs.
TEST_CASE("plot: loss curves, memory bars and a timeline as SVG, and errors that name the file", "[cli][plot]") {
  const std::string one = tmp("one.jsonl"), two = tmp("two.jsonl"), ddp = tmp("ddp.jsonl"), z3 = tmp("z3.jsonl"), trace = tmp("trace.json"),
                    svg = tmp("fig.svg");
  REQUIRE(run("train configs/fashion-mnist-mlp.toml --set train.steps=6 --set train.eval_batches=1 --metrics " + one).code == 0);
  REQUIRE(run("run -n 2 --master-port 0 train configs/fashion-mnist-mlp.toml --set train.steps=6 --set train.micro_batch=64 "
              "--set parallel.strategy=ddp --set train.eval_batches=1 --set log.profile=t4-pcie --set log.trace=" + trace + " --metrics " + two)
              .code == 0);
  Result loss = run("plot loss " + one + " " + two + " --label \"1 rank\" --label \"2 <ranks>\" -o " + svg);
  INFO(loss.out);
  REQUIRE(loss.code == 0);
  std::string s = slurp(svg);
  CHECK(s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(s.size() > 20);
  CHECK(s.substr(s.size() - 7) == "</svg>\n");
  CHECK(count_of(s, "<path ") == 2);
  CHECK(count_of(s, " L") == 2 * 5);  // 6 points each: a move and 5 lines
  CHECK_THAT(s, Catch::Contains(">1 rank</text>") && Catch::Contains(">2 &lt;ranks&gt;</text>"));
  for (const char* strat : {"ddp", "zero3"})
    REQUIRE(run(std::string("train configs/gpt-tiny.toml --device meta --set dist.fake_world_size=4 --set train.steps=2 --set parallel.strategy=") +
                strat + " --metrics " + (strat == std::string("ddp") ? ddp : z3))
                .code == 0);
  Result mem = run("plot memory " + ddp + " " + z3 + " --label DDP --label ZeRO-3 --capacity 8MiB -o " + svg);
  INFO(mem.out);
  REQUIRE(mem.code == 0);
  s = slurp(svg);
  CHECK_THAT(s, Catch::Contains(">DDP</text>") && Catch::Contains(">ZeRO-3</text>") && Catch::Contains(">optim_state</text>") &&
                    Catch::Contains("device 8.00 MiB"));
  CHECK(count_of(s, "<title>params:") == 2);
  Result tl = run("plot timeline " + trace + " -o " + svg);
  INFO(tl.out);
  REQUIRE(tl.code == 0);
  s = slurp(svg);
  CHECK_THAT(s, Catch::Contains("modeled on t4-pcie") && Catch::Contains(">all_reduce</text>") && Catch::Contains(">backward</text>") &&
                    Catch::Contains(">1 comm</text>"));
  Result missing = run("plot loss " + tmp("none.jsonl") + " -o " + svg);
  CHECK(missing.code == 1);
  CHECK_THAT(missing.out, Catch::Contains("cannot read metrics file"));
  std::ofstream(tmp("bad.jsonl")) << "{\"kind\": \"step\"}\nnot json\n";
  CHECK_THAT(run("plot loss " + tmp("bad.jsonl") + " -o " + svg).out, Catch::Contains("bad.jsonl:2: not a JSON object"));
  CHECK_THAT(run("plot memory " + tmp("bad.jsonl") + " -o " + svg).out, Catch::Contains("bad.jsonl:2"));
  CHECK_THAT(run("plot timeline " + one + " -o " + svg).out, Catch::Contains("is not a Chrome trace"));
  Result ro = run("plot loss " + one + " -o /proc/distlab-fig.svg");
  CHECK(ro.code == 1);
  CHECK_THAT(run("plot loss " + one + " --label a --label b -o " + svg).out, Catch::Contains("2 --label for 1 files"));
  for (auto f : {one, two, ddp, z3, trace, svg, tmp("bad.jsonl")}) fs::remove(f);
}

// `--deepspeed` and `--fsdp-config` with the example files of configs/ecosystem/: the mapping is printed,
// the run takes it, and accelerate's num_processes is checked against the run's world.
TEST_CASE("train --deepspeed and --fsdp-config: the examples' fields mapped, printed and run", "[cli][ecosystem]") {
  Result ds = run("train configs/gpt-1b.toml --device meta --set dist.fake_world_size=8 --set train.steps=1 "
                  "--deepspeed configs/ecosystem/ds_zero3_offload.json");
  INFO(ds.out);
  REQUIRE(ds.code == 0);
  CHECK_THAT(ds.out, Catch::Contains("zero_optimization.stage = 3") && Catch::Contains("parallel.strategy = zero3") &&
                         Catch::Contains("strategy zero3 (") && Catch::Contains("cpu offload"));
  Result acc = run("run -n 2 --master-port 0 train configs/gpt-tiny.toml --set train.steps=2 --set train.eval_batches=1 "
                   "--fsdp-config configs/ecosystem/accelerate_fsdp.yaml");
  INFO(acc.out);
  REQUIRE(acc.code == 0);
  CHECK_THAT(acc.out, Catch::Contains("fsdp_config.fsdp_sharding_strategy = FULL_SHARD") && Catch::Contains("strategy fsdp (full_shard") &&
                          Catch::Contains("precision bf16"));
  Result world = run("train configs/gpt-tiny.toml --set train.steps=1 --fsdp-config configs/ecosystem/accelerate_fsdp.yaml");
  CHECK(world.code == 1);
  CHECK_THAT(world.out, Catch::Contains("num_processes says 2 ranks, the run has 1") && Catch::Contains("distlab run -n 2"));
  Result lf = run("run -n 2 --master-port 0 train configs/gpt-tiny.toml --set train.steps=1 --set train.eval_batches=1 "
                  "--set checkpoint.dir=" + tmp("lf-ckpt") + " --fsdp-config configs/ecosystem/llamafactory_fsdp.yaml");
  INFO(lf.out);
  CHECK(lf.code == 0);
  CHECK_THAT(lf.out, Catch::Contains("micro_batch 1 x 2 rank(s) x accum 8"));
  fs::remove_all(tmp("lf-ckpt"));
  Result seed = run("train configs/gpt-tiny.toml --device meta --set dist.fake_world_size=2 --set train.steps=1 --set train.micro_batch=16 "
                    "--deepspeed configs/ecosystem/ds_zero2.json");
  INFO(seed.out);
  CHECK(seed.code == 0);
  CHECK_THAT(seed.out, Catch::Contains("strategy zero2") && Catch::Contains("precision fp16"));
  // DeepSpeed's train_batch_size against the TOML's micro-batch: both named, and how to make them agree
  Result clash = run("train configs/gpt-tiny.toml --set train.steps=1 --deepspeed configs/ecosystem/ds_zero2.json");
  CHECK(clash.code == 1);
  CHECK_THAT(clash.out, Catch::Contains("configs/gpt-tiny.toml:18: train.micro_batch 16 contradicts train.global_batch 32 "
                                        "(configs/ecosystem/ds_zero2.json: train_batch_size)") &&
                            Catch::Contains("--set train.micro_batch=32"));
}

// A checkpoint past the run's end is refused before anything is written: saving "the end of the run" would
// have labelled the later state step 2, over the real step-000002.
TEST_CASE("resuming a checkpoint past train.steps is refused and leaves the earlier checkpoints as they were", "[cli][ckpt]") {
  const std::string dir = tmp("past-end");
  fs::remove_all(dir);
  const std::string base = "train configs/gpt-tiny.toml --set train.eval_batches=1 --set checkpoint.every=2 --set checkpoint.keep=0 --set checkpoint.dir=" + dir;
  REQUIRE(run(base + " --set train.steps=4").code == 0);
  std::map<std::string, std::string> before;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) before[e.path().string()] = slurp(e.path().string());
  Result r = run(base + " --set train.steps=2");
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("at step 4, past the run's end: train.steps is 2") && Catch::Contains("raise train.steps above 4"));
  std::map<std::string, std::string> after;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) after[e.path().string()] = slurp(e.path().string());
  CHECK(after == before);
  CHECK(run(base + " --set train.steps=4").code == 0);  // at its end: nothing left to train, and that is fine
  fs::remove_all(dir);
}

// Every quiz's scenarios run as a student meets them (Enter skips each question, so every scenario is
// reached): a scenario whose run fails is a failing test, as a chapter's failing command is.
TEST_CASE("quiz: every quiz's scenarios run to the end when the questions are skipped", "[cli][quiz][early]") {
  Result list = run("quiz list");
  REQUIRE(list.code == 0);
  std::istringstream lines(list.out);
  int with = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("with a scenario") == std::string::npos) continue;
    std::string id;
    std::istringstream(line) >> id;
    Result r = shell("yes \"\" | head -n 40 | timeout 300 "s + DISTLAB_BINARY + " quiz " + id);
    INFO("quiz " << id << "\n" << r.out);
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("── scenario:") && Catch::Contains("score: 0 of"));
    with++;
  }
  CHECK(with >= 8);
}

// core/ops/cpu/blas_core.h: an OpenBLAS that picked an older core than the CPU runs (Prescott on an AVX-512
// Xeon VM whose CPUID model it did not know: 4.8x slower sgemm) is started again with the best one. The
// test pretends OpenBLAS picked Prescott (DISTLAB_TEST_BLAS_CHOSE: as if chosen by the library, not set by a
// user); this process's own settings (inherited from its own start) are taken out of the children's way.
TEST_CASE("OpenBLAS runs the best kernels the CPU has: a generic pick is replaced and checked, a user's OPENBLAS_CORETYPE kept", "[cli][blas]") {
  const std::string best = distlab::blas_core().best;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("distlab-blas-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string clean = "env -u OPENBLAS_CORETYPE -u DISTLAB_BLAS_WAS -u DISTLAB_BLAS_NOTE -u DISTLAB_BLAS_KEEP ";
  auto train = [&](const std::string& env, const std::string& name) {
    const std::string metrics = (dir / (name + ".jsonl")).string();
    auto [code, out] = shell_in_source(clean + env + " " + DISTLAB_BINARY + " train configs/fashion-mnist-mlp.toml --set train.steps=3 "
                                       "--set train.log_every=1 --set train.eval_every=0 --set train.threads=1 --metrics " + metrics);
    INFO(out);
    REQUIRE(code == 0);
    std::vector<double> losses;
    std::string core;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.value("kind", "") == "step") losses.push_back(j["loss"].get<double>());
      if (j.value("kind", "") == "summary") core = j.value("blas_core", "");
    }
    return std::tuple{out, losses, core};
  };
  // OpenBLAS "picked" Prescott: distlab runs itself again with the CPU's best, and says so in the run's log
  const auto [out, losses, core] = train("DISTLAB_TEST_BLAS_CHOSE=Prescott", "generic");
  if (best.empty()) {
    CHECK(core == "Prescott");  // a CPU without AVX: nothing better to run
  } else {
    CHECK(core == best);
    CHECK_THAT(out, Catch::Contains("OpenBLAS core " + best + " (set by distlab") && Catch::Contains("OpenBLAS picked Prescott"));
  }
  // the same kernels set by hand give the same numbers, bit for bit
  if (!best.empty()) {
    const auto [uout, ulosses, ucore] = train("OPENBLAS_CORETYPE=" + best, "user");
    CHECK(ucore == best);
    CHECK_THAT(uout, Catch::Contains("OpenBLAS core " + best + " (OPENBLAS_CORETYPE, as set)"));
    CHECK(ulosses == losses);
  }
  // a user's own choice is kept, even an older one; and DISTLAB_BLAS_KEEP keeps OpenBLAS's
  const auto [pout, plosses, pcore] = train("OPENBLAS_CORETYPE=Prescott", "prescott");
  CHECK(pcore == "Prescott");
  CHECK_THAT(pout, Catch::Contains("OpenBLAS core Prescott (OPENBLAS_CORETYPE, as set)"));
  const auto [kout, klosses, kcore] = train("DISTLAB_BLAS_KEEP=1 DISTLAB_TEST_BLAS_CHOSE=Prescott", "keep");
  CHECK(kcore == "Prescott");
  if (!best.empty()) CHECK_THAT(kout, Catch::Contains("this CPU could run " + best));
  std::filesystem::remove_all(dir);
}

// DeepSpeed's ZeRO-Offload on one GPU is its headline use: a single process applies the strategy and the
// offload it was given (it ran "strategy none (one rank)" and held no host memory), on meta and for real.
TEST_CASE("one process runs the strategy and offload it was given: ZeRO-3 + CPU offload from a DeepSpeed file, and on the CPU, with progress in tokens, a bar, live MFU and HFU with a profile", "[cli]") {
  const std::string dir = (std::filesystem::temp_directory_path() / ("distlab-one-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  auto [code, out] = shell_in_source(std::string(DISTLAB_BINARY) + " train configs/gpt-1b.toml --device meta --deepspeed configs/ecosystem/ds_zero3_offload.json "
                                     "--set train.steps=2 --metrics " + dir + "/meta.jsonl");
  INFO(out);
  REQUIRE(code == 0);
  CHECK_THAT(out, Catch::Contains("strategy zero3") && !Catch::Contains("strategy none"));
  nlohmann::json summary;
  std::ifstream in(dir + "/meta.jsonl");
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line); j.value("kind", "") == "summary") summary = j;
  REQUIRE(summary.is_object());
  CHECK(summary["peak_memory"].value("host", 0.0) > 1e9);  // the optimizer state went to the host
  // on the CPU: the same losses as without a strategy (one rank's shards are the whole model)
  auto losses = [&](const std::string& sets, const std::string& name) {
    auto [c, o] = shell_in_source(std::string(DISTLAB_BINARY) + " train configs/gpt-tiny.toml --set train.steps=4 --set train.log_every=1 "
                                  "--set train.eval_every=0 --set train.threads=1 " + sets + " --metrics " + dir + "/" + name);
    INFO(o);
    REQUIRE(c == 0);
    std::vector<double> v;
    std::ifstream f(dir + "/" + name);
    for (std::string line; std::getline(f, line);)
      if (auto j = nlohmann::json::parse(line); j.value("kind", "") == "step") v.push_back(j["loss"].get<double>());
    return std::pair{v, o};
  };
  const auto [plain, plain_out] = losses("", "none.jsonl");
  const auto [zero3, zero3_out] = losses("--set parallel.strategy=zero3 --set parallel.offload=cpu", "zero3.jsonl");
  CHECK_THAT(zero3_out, Catch::Contains("strategy zero3"));
  // a language model's progress in tokens, with the time left (not on the last step's line)
  CHECK_THAT(plain_out, Catch::Contains(" tokens/s | ") && Catch::Contains(" | ETA 0:"));
  CHECK_THAT(plain_out, !Catch::Contains("\r"));  // not a terminal: plain lines only
  // a terminal's progress bar (forced here: the test's output is a pipe), rewritten in place between lines
  // with a profile of the hardware it runs on (log.profile = cpu on the CPU), the live MFU and HFU too
  auto [bc, bar] = shell_in_source("DISTLAB_PROGRESS=bar " + std::string(DISTLAB_BINARY) + " train configs/gpt-tiny.toml --set train.steps=4 "
                                   "--set train.log_every=2 --set train.eval_every=0 --set train.threads=1 --set log.profile=cpu --metrics " + dir + "/bar.jsonl");
  INFO(bar);
  CHECK(bc == 0);
  CHECK_THAT(bar, Catch::Contains("\r 25% [#######.......................] step 1/4 | loss ") && Catch::Contains("tokens/s | ETA ") &&
                      Catch::Contains("\r\033[Kstep     2/4 | loss"));
  CHECK_THAT(bar, Catch::Contains(" tokens/s | MFU ") && Catch::Contains("% HFU "));
  CHECK_THAT(plain_out, !Catch::Contains("MFU"));  // no profile: no peak to divide by
  nlohmann::json live;
  std::ifstream bar_metrics(dir + "/bar.jsonl");
  for (std::string line; std::getline(bar_metrics, line);)
    if (auto j = nlohmann::json::parse(line); j.value("kind", "") == "summary") live = j;
  REQUIRE(live.is_object());
  CHECK(live.value("mfu_peak_of", "") == "cpu fp32");
  CHECK(live.value("mfu_peak_flops_per_s", 0.0) == 87e9);
  // MFU: the model's FLOPs (6 per parameter and token, plus attention) per second of the steady steps over
  // the peak; HFU: the kernels' FLOPs. Both from the measured steps, so only their ratio is exact
  const double tokens = live.value("tokens_per_step", 0.0), step_s = live.value("measured_step_s", 0.0);
  REQUIRE(tokens > 0);
  REQUIRE(step_s > 0);
  CHECK(live.value("mfu", 0.0) == Approx(live.value("model_flops_per_step", 0.0) / step_s / 87e9).epsilon(1e-9));
  CHECK(live.value("hfu", 0.0) == Approx(live.value("hardware_flops_per_step", 0.0) / step_s / 87e9).epsilon(1e-9));
  CHECK(live.value("hfu", 0.0) >= live.value("mfu", 0.0));  // HFU adds the recompute (none here): never below MFU
  CHECK(live.value("recompute_flops_per_step", -1.0) == 0);
  CHECK_THAT(live.value("flops_convention", ""), Catch::Contains("6·N + 12·L·H·Q·T"));
  CHECK(live.value("mfu", 0.0) > 0);
  CHECK(live.value("mfu", 0.0) < 1);
  // the GPU's own profile, by the name CUDA gives it
  CHECK(distlab::profile_for_gpu("NVIDIA H100 80GB HBM3")->name == "h100-nvlink");
  CHECK(distlab::profile_for_gpu("NVIDIA H100 PCIe")->name == "h100-pcie");
  CHECK(distlab::profile_for_gpu("NVIDIA H100 NVL")->name == "h100-96g");
  CHECK(distlab::profile_for_gpu("NVIDIA H200")->name == "h200");
  CHECK(distlab::profile_for_gpu("NVIDIA A100-SXM4-80GB")->name == "a100-nvlink");
  CHECK(distlab::profile_for_gpu("Tesla T4")->name == "t4-pcie");
  CHECK_FALSE(distlab::profile_for_gpu("NVIDIA GeForce RTX 4090").has_value());
  REQUIRE(plain.size() == zero3.size());
  for (size_t i = 0; i < plain.size(); i++) CHECK(zero3[i] == Approx(plain[i]).epsilon(1e-6));
  std::filesystem::remove_all(dir);
}

namespace {
// A protocol buffer's fields, read as TensorBoard reads them: (field, wire type, the bytes or the number).
struct PbField {
  int field, wire;
  uint64_t num = 0;
  std::string bytes;
};
std::vector<PbField> pb_fields(const std::string& s) {
  std::vector<PbField> out;
  size_t i = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0; i < s.size(); shift += 7) {
      const uint8_t b = uint8_t(s[i++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  while (i < s.size()) {
    const uint64_t k = varint();
    PbField f{int(k >> 3), int(k & 7)};
    if (f.wire == 0) f.num = varint();
    else if (f.wire == 1) f.bytes = s.substr(i, 8), i += 8;
    else if (f.wire == 5) f.bytes = s.substr(i, 4), i += 4;
    else if (f.wire == 2) {
      const uint64_t n = varint();
      f.bytes = s.substr(i, n);
      i += n;
    } else break;
    out.push_back(f);
  }
  return out;
}
}  // namespace

TEST_CASE("distlab export tensorboard: a run's scalars as TFRecords of Events, every checksum as TensorBoard checks it", "[cli]") {
  CHECK(distlab::crc32c("123456789", 9) == 0xE3069283u);  // CRC-32C's check value
  const std::string dir = (std::filesystem::temp_directory_path() / ("distlab-tb-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  auto [code, out] = shell_in_source(std::string(DISTLAB_BINARY) + " train configs/gpt-tiny.toml --set train.steps=3 --set train.log_every=1 "
                                     "--set train.eval_every=0 --set train.threads=1 --metrics " + dir + "/m.jsonl && " + DISTLAB_BINARY +
                                     " export tensorboard " + dir + "/m.jsonl -o " + dir + "/tb");
  INFO(out);
  REQUIRE(code == 0);
  std::vector<double> want;
  std::ifstream m(dir + "/m.jsonl");
  for (std::string line; std::getline(m, line);)
    if (auto j = nlohmann::json::parse(line); j.value("kind", "") == "step") want.push_back(j["loss"].get<double>());
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/tb")) file = e.path().string();
  REQUIRE(file.find("events.out.tfevents.") != std::string::npos);
  const std::string bytes = slurp(file);
  auto masked = [](uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; };
  std::map<int64_t, float> losses;
  bool version = false;
  for (size_t at = 0; at < bytes.size();) {
    REQUIRE(at + 12 <= bytes.size());
    uint64_t n;
    uint32_t len_crc, data_crc;
    std::memcpy(&n, bytes.data() + at, 8);
    std::memcpy(&len_crc, bytes.data() + at + 8, 4);
    CHECK(len_crc == masked(distlab::crc32c(bytes.data() + at, 8)));
    REQUIRE(at + 12 + n + 4 <= bytes.size());
    const std::string data = bytes.substr(at + 12, n);
    std::memcpy(&data_crc, bytes.data() + at + 12 + n, 4);
    CHECK(data_crc == masked(distlab::crc32c(data.data(), data.size())));
    at += 12 + n + 4;
    int64_t step = 0;
    for (const auto& f : pb_fields(data)) {
      if (f.field == 2) step = int64_t(f.num);
      if (f.field == 3) version = f.bytes == "brain.Event:2";
      if (f.field == 5)
        for (const auto& v : pb_fields(f.bytes))  // Summary.value
          if (v.field == 1) {
            std::string tag;
            float x = 0;
            for (const auto& g : pb_fields(v.bytes)) {
              if (g.field == 1) tag = g.bytes;
              if (g.field == 2) std::memcpy(&x, g.bytes.data(), 4);
            }
            if (tag == "train/loss") losses[step] = x;
          }
    }
  }
  CHECK(version);
  REQUIRE(losses.size() == want.size());
  for (size_t i = 0; i < want.size(); i++) CHECK(losses[int64_t(i + 1)] == float(want[i]));
  std::filesystem::remove_all(dir);
}

// The README's and every lab README's commands work as printed: each `distlab ...` line of their code blocks
// is parsed by distlab itself (DISTLAB_ARGS_ONLY=1: the arguments checked, nothing run: a grading or a
// training is the other tests' business), every config, lab file or folder it names exists, and those that
// only read and print (plan, lab show, chapter, quiz list, env) run for real and exit 0.
TEST_CASE("every distlab command of README.md and the labs' READMEs parses as printed, the files it names exist, and those that only print run", "[cli][readme]") {
  const std::filesystem::path src = DISTLAB_SOURCE_DIR;
  std::vector<std::filesystem::path> docs = {src / "README.md"};
  for (const auto& e : std::filesystem::directory_iterator(src / "labs"))
    if (std::filesystem::exists(e.path() / "README.md")) docs.push_back(e.path() / "README.md");
  int checked = 0, ran = 0;
  for (const auto& doc : docs) {
    std::istringstream in(slurp(doc.string()));
    bool code = false;
    std::string pending;
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
      line_no++;
      if (line.rfind("```", 0) == 0) {
        code = !code;
        continue;
      }
      if (!code) continue;
      if (!pending.empty()) line = pending + " " + line, pending.clear();
      if (!line.empty() && line.back() == '\\') {  // continued on the next line
        pending = line.substr(0, line.size() - 1);
        continue;
      }
      // the comment, then a redirection of the output (a file the command would write)
      for (size_t at = line.find(" #"); at != std::string::npos; at = std::string::npos) line = line.substr(0, at);
      if (const size_t r = line.find(" > "); r != std::string::npos) line = line.substr(0, r);
      size_t start = line.find_first_not_of(' ');
      if (start == std::string::npos) continue;
      // environment assignments before the command (DISTLAB_TEST_FAULT=... distlab run ...)
      std::string cmd = line.substr(start);
      while (cmd.find('=') != std::string::npos && cmd.find('=') < cmd.find(' ') && cmd.find(' ') != std::string::npos)
        cmd = cmd.substr(cmd.find(' ') + 1);
      std::string rest;
      if (cmd.rfind("distlab ", 0) == 0) rest = cmd.substr(8);
      else if (cmd.rfind("build/bin/distlab ", 0) == 0) rest = cmd.substr(18);
      else continue;
      if (rest.find("...") != std::string::npos || rest.find('<') != std::string::npos || rest.find('|') != std::string::npos ||
          rest.find('$') != std::string::npos)
        continue;  // a sketch, not a command
      INFO(doc.filename().string() << ":" << line_no << ": distlab " << rest);
      auto [c, out] = shell_in_source("DISTLAB_ARGS_ONLY=1 " + std::string(DISTLAB_BINARY) + " " + rest);
      INFO(out);
      CHECK(c == 0);
      std::istringstream words(rest);
      for (std::string w; words >> w;) {
        if (w.find('=') != std::string::npos) w = w.substr(w.find('=') + 1);
        const bool named = (w.rfind("configs/", 0) == 0 || w.rfind("labs/", 0) == 0 || w.rfind("chapters/", 0) == 0);
        if (named) CHECK(std::filesystem::exists(src / w));
      }
      checked++;
      // the ones that only read and print run for real, as a reader would type them
      for (const char* quick : {"plan ", "lab show ", "lab list", "quiz list", "chapter list", "chapter show ", "env", "doctor"})
        if (rest.rfind(quick, 0) == 0) {
          auto [rc, rout] = shell_in_source("PAGER=cat " + std::string(DISTLAB_BINARY) + " " + rest + " < /dev/null");
          INFO(rout);
          CHECK(rc == 0);
          CHECK(rout.size() > 100);
          ran++;
          break;
        }
    }
  }
  CHECK(checked > 40);
  CHECK(ran >= 9);
}

// distlab doctor: a rented box's facts in one command. Here (no GPU, or a build without CUDA) it says why and
// what the labs run on instead; on a GPU machine, every GPU, the versions and the links between them.
TEST_CASE("distlab doctor prints the CPU, the GPUs or why there are none, the versions, and what each lab runs on", "[cli]") {
  auto [jc, jout] = shell_in_source(std::string(DISTLAB_BINARY) + " doctor --json");
  INFO(jout);
  REQUIRE(jc == 0);
  const auto j = nlohmann::json::parse(jout);
  REQUIRE(j["cuda"].is_object());
  CHECK(j["cuda"].contains("usable"));
  CHECK(j["labs"].size() == 10);
  CHECK(j["labs"].value("09-configs-plan", "").find("meta") != std::string::npos);
  const bool usable = j["cuda"].value("usable", false);
  auto [tc, tout] = shell_in_source(std::string(DISTLAB_BINARY) + " doctor");
  INFO(tout);
  CHECK(tc == 0);
  CHECK_THAT(tout, Catch::Contains("cpu        ") && Catch::Contains("OpenBLAS kernels") && Catch::Contains("labs       what `distlab grade NN` runs on here"));
  if (!usable) {
    CHECK(j["cuda"]["gpus"].empty());
    CHECK_THAT(tout, Catch::Contains("not in this build") || Catch::Contains("none usable"));
    CHECK_THAT(tout, Catch::Contains("cpu ranks over Gloo (--device cuda-sim"));
  } else {
    CHECK(!j["cuda"]["gpus"].empty());
    CHECK_THAT(tout, Catch::Contains("gpu 0") && Catch::Contains("NCCL"));
  }
}

// A build carried to another machine (bench/gpu_bundle.sh to a lent GPU) finds the tree it grades and the
// folder it builds in through DISTLAB_SOURCE_DIR and DISTLAB_BUILD_DIR; a wrong one is an error naming it.
TEST_CASE("DISTLAB_SOURCE_DIR and DISTLAB_BUILD_DIR point a carried build at a tree and a build folder of its own", "[cli]") {
  namespace fs = std::filesystem;
  const fs::path src = DISTLAB_SOURCE_DIR, tmp = fs::temp_directory_path() / ("distlab-tree-" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp / "tree");
  for (const char* d : {"labs", "solutions", "grader/labs"}) {
    fs::create_directories((tmp / "tree" / d).parent_path());
    fs::copy(src / d, tmp / "tree" / d, fs::copy_options::recursive);
  }
  std::ofstream(tmp / "tree/labs/01-collectives/README.md", std::ios::app) << "\n(the carried tree)\n";
  const std::string env = "DISTLAB_SOURCE_DIR=" + (tmp / "tree").string() + " DISTLAB_BUILD_DIR=" + (tmp / "build").string() + " ";
  auto [sc, sout] = shell_in_source(env + DISTLAB_BINARY + " lab show 01");
  INFO(sout);
  CHECK(sc == 0);
  CHECK_THAT(sout, Catch::Contains("(the carried tree)"));
  auto [bc, bout] = shell_in_source(env + DISTLAB_BINARY + " lab build 01 --solution");
  INFO(bout);
  CHECK(bc == 0);
  CHECK(fs::exists(tmp / "build/labs/01-collectives"));
  auto [wc, wout] = shell_in_source("DISTLAB_SOURCE_DIR=/nonexistent/tree " + std::string(DISTLAB_BINARY) + " lab list");
  CHECK(wc == 1);
  CHECK_THAT(wout, Catch::Contains("DISTLAB_SOURCE_DIR='/nonexistent/tree' is not a distlab tree"));
  fs::remove_all(tmp);
}
