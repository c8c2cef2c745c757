// The repository's shape, checked: the engine (core/) includes nothing above it and names no lab in its
// code; every "Read next" line in core/ points at a file that exists, and following them never comes back
// to where it started (docs/ENGINE.md walks the same order); every lab has the folders and files
// docs/GRADER.md lists, and is registered where its steps say.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "shell.h"

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = DISTLAB_SOURCE_DIR;

std::vector<fs::path> engine_files() {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(kRoot / "core")) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".cuh")) out.push_back(e.path());
  }
  return out;
}

std::string read_source(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("the engine includes nothing above it and has no lab logic", "[layout]") {
  const std::regex upward(R"re(#include\s+"(grader|cli|labs|solutions|tests|bench)/)re");
  // code, not comments: a lab's plugin type, a lab picked by its number, a lab's member, a [lab] key or section named in code
  const std::regex lab_code(R"re(\bLab[A-Z]\w*|\bis\("0[0-9]"\)|\blab_\w+|cfg_?\.lab\b|"lab\b|"check")re");
  std::vector<std::string> found;
  for (const fs::path& f : engine_files()) {
    std::istringstream in(read_source(f));
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      n++;
      const std::string code = line.substr(0, line.find("//"));
      if (std::regex_search(line, upward) || std::regex_search(code, lab_code))
        found.push_back(fs::relative(f, kRoot).string() + ":" + std::to_string(n) + ": " + line);
    }
  }
  INFO("lines:\n" << [&] {
    std::string s;
    for (const auto& l : found) s += l + "\n";
    return s;
  }());
  // (a lab's [lab] keys are the bridge's: grader/bridge/lab_extension.h declares them as ConfigExtras)
  CHECK(found.empty());
}

TEST_CASE("the engine's \"Read next\" lines name files that exist and never lead back to where they started", "[layout]") {
  // "Read next: a.h (why), b.h" -> the first file named: the next stop of the walk
  const std::regex next_re(R"re(Read next:\s*([\w./-]+\.(?:h|cpp|cuh|md)))re");
  std::map<std::string, std::string> next;
  for (const fs::path& f : engine_files()) {
    const std::string text = read_source(f);
    std::smatch m;
    if (!std::regex_search(text, m, next_re)) continue;
    std::string target = m[1];
    fs::path resolved = kRoot / target;
    if (!fs::exists(resolved)) resolved = f.parent_path() / target;  // a sibling: "zero2.h"
    INFO(fs::relative(f, kRoot).string() << " -> " << target);
    REQUIRE(fs::exists(resolved));
    next[fs::relative(f, kRoot).string()] = fs::relative(fs::canonical(resolved), kRoot).string();
  }
  CHECK(next.size() >= 15);
  for (const auto& [start, _] : next) {
    std::set<std::string> seen{start};
    std::string at = start;
    while (next.count(at)) {
      at = next[at];
      INFO("from " << start << " the chain comes back to " << at);
      REQUIRE(!seen.count(at));
      seen.insert(at);
    }
  }
  // the walk's spine, in order
  const std::vector<std::string> spine = {"core/train/trainer.h", "core/models/model.h", "core/parallel/strategy.h",
                                          "core/parallel/none.h", "core/parallel/ddp.h", "core/parallel/flat_param.h",
                                          "core/parallel/comm_buffers.h", "core/parallel/sharded_strategy.h", "core/parallel/zero1.h",
                                          "core/parallel/zero2.h", "core/parallel/offload.h", "core/parallel/flat_masters.h",
                                          "core/parallel/flat_slices.h", "core/parallel/exec_order.h", "core/parallel/zero3.h", "core/parallel/fsdp.h", "core/parallel/mesh.h",
                                          "core/parallel/tensor_parallel.h", "core/parallel/gpt_parallel.h", "core/parallel/pipeline.h",
                                          "core/train/trainer_ckpt.cpp", "core/ckpt/checkpoint.h", "core/train/extension.h"};
  for (size_t i = 0; i + 1 < spine.size(); i++) CHECK(next[spine[i]] == spine[i + 1]);
  const std::string walk = read_source(kRoot / "docs" / "ENGINE.md");
  for (const auto& f : spine)
    if (f != "core/parallel/none.h" && f != "core/parallel/comm_buffers.h" && f != "core/parallel/sharded_strategy.h" &&
        f != "core/parallel/flat_masters.h" && f != "core/parallel/flat_slices.h" && f != "core/parallel/exec_order.h" && f != "core/parallel/mesh.h")
      CHECK_THAT(walk, Catch::Contains(fs::path(f).filename().string()));
}

TEST_CASE("each ZeRO stage's file issues its own collectives, the flat layout issues none, and neither checks for the meta device", "[layout]") {
  auto code_of = [](const fs::path& p) {  // the file without its comments
    std::istringstream in(read_source(p));
    std::string out;
    for (std::string line; std::getline(in, line);) out += line.substr(0, line.find("//")) + "\n";
    return out;
  };
  auto lines_of = [](const fs::path& p) {
    std::istringstream in(read_source(p));
    int n = 0;
    for (std::string line; std::getline(in, line);) n++;
    return n;
  };
  const fs::path dir = kRoot / "core" / "parallel";
  const std::regex null_check(R"re(\.data\(\)\s*\?|if\s*\([^)]*\.data\(\)\)|\.data\(\)\s*&&)re");
  // stage: the collectives its own file must show
  const std::map<std::string, std::vector<std::string>> stages = {
      {"zero1.cpp", {"staged_reduce_scatter(", "staged_all_gather("}},
      {"zero2.cpp", {"staged_reduce_scatter_async(", "staged_all_gather("}},
      {"zero3.cpp", {"staged_reduce_scatter_async(", "staged_all_gather_async(", ".release()"}}};
  for (const auto& [file, calls] : stages) {
    INFO(file);
    const std::string code = code_of(dir / file);
    for (const auto& c : calls) CHECK_THAT(code, Catch::Contains(c));
    CHECK(lines_of(dir / file) <= 250);
    CHECK(!std::regex_search(code, null_check));
  }
  for (const char* file : {"flat_param.h", "flat_param.cpp"}) {
    INFO(file);
    const std::string code = code_of(dir / file);
    // (the gradient norm's scalars go through the group's own all_gather and all_reduce)
    for (const char* c : {"reduce_scatter", "staged_all_gather", "staged_all_reduce"}) CHECK_THAT(code, !Catch::Contains(c));
  }
  // the strategy interface: two halves of at most 12 virtuals each
  const std::string strategy = code_of(dir / "strategy.h");
  const auto step_hooks = strategy.substr(strategy.find("class StepHooks"), strategy.find("class StrategyState") - strategy.find("class StepHooks"));
  const auto state = strategy.substr(strategy.find("class StrategyState"), strategy.find("class Strategy :") - strategy.find("class StrategyState"));
  auto virtuals = [](const std::string& s) {
    const std::regex v(R"re(\bvirtual\b[^;{]*\(|\boverride\b)re");
    int n = 0;
    for (auto it = std::sregex_iterator(s.begin(), s.end(), v); it != std::sregex_iterator(); ++it) n++;
    return n;
  };
  INFO("StepHooks:\n" << step_hooks << "\nStrategyState:\n" << state);
  CHECK(virtuals(step_hooks) - 1 <= 12);  // the destructor (~StepHooks() override) not counted
  CHECK(virtuals(state) - 1 <= 12);       // nor virtual ~StrategyState()
}

TEST_CASE("the trainer's loop fits in 300 lines, and no trainer file compares a strategy's name", "[layout]") {
  const fs::path dir = kRoot / "core" / "train";
  std::ifstream in(dir / "trainer.cpp");
  int n = 0;
  for (std::string line; std::getline(in, line);) n++;
  CHECK(n <= 300);
  // make_strategy (strategies.cpp) is the one place that reads parallel.strategy
  const std::regex names(R"re(strategy\s*==|==\s*"(ddp|zero1|zero2|zero3|fsdp)")re");  // ("none" is also a loss-scale mode)
  for (const char* f : {"trainer.cpp", "trainer_build.cpp", "trainer_ckpt.cpp", "trainer_report.cpp", "trainer_weights.cpp", "trainer_checks.cpp",
                        "trainer_step.cpp",
                        "trainer_mesh.cpp"}) {
    INFO(f);
    CHECK(!std::regex_search(read_source(dir / f), names));
  }
}

TEST_CASE("an include that runs upward in core/ does not compile: each folder sees only the folders below it", "[layout]") {
  // CMakeLists.txt builds each folder of core/ against build/layers/<folder>: links to the folders it builds
  // on. A header of its own layer or below compiles there; one above it is "No such file or directory".
  const fs::path layers = DISTLAB_LAYERS_DIR;
  auto compiles = [&](const std::string& layer, const std::string& header) {
    const fs::path probe = fs::temp_directory_path() / ("distlab_layer_probe_" + std::to_string(::getpid()) + ".cpp");
    std::ofstream(probe) << "#include \"" << header << "\"\nint main() { return 0; }\n";
    const auto [rc, out] = shell_in_source(std::string(DISTLAB_CXX) + " -std=c++20 -fsyntax-only -I" + (layers / layer).string() + " " +
                                           probe.string());
    fs::remove(probe);
    INFO(layer << " includes " << header << ":\n" << out);
    if (rc != 0) CHECK_THAT(out, Catch::Contains("No such file or directory"));
    return rc == 0;
  };
  CHECK(compiles("util", "core/util/error.h"));
  CHECK(!compiles("util", "core/tensor/tensor.h"));
  CHECK(compiles("nn", "core/comm/process_group.h"));
  CHECK(!compiles("nn", "core/models/model.h"));
  CHECK(compiles("models", "core/nn/linear.h"));
  CHECK(!compiles("models", "core/parallel/strategy.h"));  // a split model is parallel's (gpt_parallel.h)
  CHECK(compiles("parallel", "core/models/model.h"));
  CHECK(!compiles("parallel", "core/train/trainer.h"));
  CHECK(!compiles("parallel", "core/ckpt/checkpoint.h"));
  CHECK(!compiles("launch", "core/config/config.h"));
  // every folder of core/ has its layer (a new folder must be declared in CMakeLists.txt to build at all)
  for (const auto& e : fs::directory_iterator(kRoot / "core"))
    if (e.is_directory() && e.path().filename() != "cuda") {
      INFO(e.path().filename().string());
      CHECK(fs::exists(layers / e.path().filename() / "core" / e.path().filename()));
    }
}

// ---- a lab's folders, held to docs/GRADER.md ----

namespace {

struct LabFileRule {
  std::string path;   // "grader/labs/NN-name/checks.cpp"; a folder ends in '/'
  std::string which;  // every lab | a plugin lab | where needed
};

// The table under "## A lab's files" in docs/GRADER.md: | `path` | which labs | what it holds |
std::vector<LabFileRule> lab_file_rules() {
  const std::regex row(R"re(^\| `([^`]+)` \| (every lab|a plugin lab|where needed) \|)re");
  std::istringstream in(read_source(kRoot / "docs" / "GRADER.md"));
  std::vector<LabFileRule> rules;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) rules.push_back({m[1], m[2]});
  }
  return rules;
}

// labs/ holds the labs: each folder with a lab.toml
std::vector<std::string> lab_names() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(kRoot / "labs"))
    if (e.is_directory() && fs::exists(e.path() / "lab.toml")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A lab's [lab] kind: code (the default: a plugin lab), answers or clinic
std::string lab_kind(const std::string& lab) {
  std::istringstream in(read_source(kRoot / "labs" / lab / "lab.toml"));
  const std::regex kind(R"re(^kind\s*=\s*"(\w+)")re");
  bool in_lab = false;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '[') in_lab = line.rfind("[lab]", 0) == 0;
    std::smatch m;
    if (in_lab && std::regex_search(line, m, kind)) return m[1];
  }
  return "code";
}

std::string for_lab(std::string path, const std::string& lab) { return path.replace(path.find("NN-name"), 7, lab); }

}  // namespace

TEST_CASE("docs/GRADER.md's table of a lab's files holds: labs/, solutions/ and grader/labs/ have the same folders, each with the files its row asks for and no other", "[layout]") {
  const std::vector<LabFileRule> rules = lab_file_rules();
  const std::vector<std::string> labs = lab_names();
  REQUIRE(labs.size() >= 10);
  std::set<std::string> named;  // the files the table names in grader/labs/NN-name/
  for (const char* want : {"labs/NN-name/lab.toml", "labs/NN-name/api.h", "solutions/NN-name/", "grader/labs/NN-name/checks.cpp",
                           "grader/labs/NN-name/hints.toml", "grader/labs/NN-name/host.cpp", "grader/labs/NN-name/bridge.cpp"}) {
    INFO(want);
    CHECK(std::any_of(rules.begin(), rules.end(), [&](const LabFileRule& r) { return r.path == want; }));
  }
  const std::string cmake = read_source(kRoot / "CMakeLists.txt");
  for (const LabFileRule& r : rules) {
    INFO(r.path);
    REQUIRE(r.path.find("NN-name") != std::string::npos);
    if (r.path.rfind("grader/labs/NN-name/", 0) == 0) named.insert(r.path.substr(20));
    // CMake picks a lab's code up by its name: each .cpp of the table is in a glob of CMakeLists.txt
    if (r.path.rfind("grader/labs/", 0) == 0 && fs::path(r.path).extension() == ".cpp")
      CHECK(cmake.find("grader/labs/*/" + fs::path(r.path).filename().string()) != std::string::npos);
  }
  for (const std::string& lab : labs) {
    const bool plugin = lab_kind(lab) == "code";
    for (const LabFileRule& r : rules) {
      const fs::path p = kRoot / for_lab(r.path, lab);
      const bool there = r.path.back() == '/' ? fs::is_directory(p) : fs::is_regular_file(p);
      INFO(lab << (plugin ? " (a plugin lab)" : " (no plugin)") << ": " << for_lab(r.path, lab));
      if (r.which == "every lab") CHECK(there);
      if (r.which == "a plugin lab") CHECK(there == plugin);
    }
  }
  // every lab's twin folders, and nothing in them the table does not name (it would not be built)
  for (const char* root : {"grader/labs", "solutions"})
    for (const auto& e : fs::directory_iterator(kRoot / root)) {
      INFO(e.path().string());
      CHECK(std::count(labs.begin(), labs.end(), e.path().filename().string()) == 1);
    }
  for (const auto& e : fs::recursive_directory_iterator(kRoot / "grader" / "labs")) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), kRoot / "grader" / "labs");  // NN-name/file
    INFO("grader/labs/" << rel.string());
    CHECK(std::distance(rel.begin(), rel.end()) == 2);
    CHECK(named.count(e.path().filename().string()) == 1);
  }
}

TEST_CASE("every lab is registered as docs/GRADER.md's steps say, and every path the page names exists", "[layout]") {
  // the paths the page names in backticks, placeholders (NN, *) aside: each a file or folder of the tree
  const std::string page = read_source(kRoot / "docs" / "GRADER.md");
  const std::regex ticked(R"re(`((?:labs|solutions|grader|tests|scripts|cli|chapters|core|docs)/[\w./-]*)`)re");
  int paths = 0;
  for (auto it = std::sregex_iterator(page.begin(), page.end(), ticked); it != std::sregex_iterator(); ++it) {
    const std::string p = (*it)[1];
    if (p.find("NN") != std::string::npos) continue;
    paths++;
    INFO(p);
    CHECK(fs::exists(kRoot / p));
  }
  CHECK(paths >= 15);
  // each registration is a line in a shared file: on a miss, the file and the line (not the whole file)
  std::map<std::string, std::string> shared;
  for (const char* f : {"grader/check.h", "grader/harness.cpp", "grader/host/host.h", "grader/host/main.cpp", "README.md",
                        "cli/doctor_cmd.cpp", "tests/test_grader.cpp"})
    shared[f] = read_source(kRoot / f);
  auto holds = [](const std::string& file, const std::string& text, const std::string& line) {
    INFO(file << " should hold: " << line);
    CHECK(text.find(line) != std::string::npos);
  };
  for (const std::string& lab : lab_names()) {
    const std::string nn = lab.substr(0, 2);
    const fs::path dir = kRoot / "grader" / "labs" / lab;
    const std::string checks = read_source(dir / "checks.cpp");
    INFO(lab);
    holds(lab + "/checks.cpp", checks, "namespace checks" + nn + " {");  // step 5: unity batches
    if (lab_kind(lab) != "clinic") {  // (the clinic's cases are graded by other labs' checks)
      holds(lab + "/checks.cpp", checks, "std::map<std::string, CheckDef> lab" + nn + "_checks() {");
      holds("grader/check.h", shared["grader/check.h"], "std::map<std::string, CheckDef> lab" + nn + "_checks();");
      holds("grader/harness.cpp", shared["grader/harness.cpp"], "if (id == \"" + nn + "\") return lab" + nn + "_checks();");
    }
    if (lab_kind(lab) == "code") {  // step 4
      holds(lab + "/host.cpp", read_source(dir / "host.cpp"), "int serve_lab" + nn + "(void* plugin) {");
      holds("grader/host/host.h", shared["grader/host/host.h"], "int serve_lab" + nn + "(void* plugin);");
      holds("grader/host/main.cpp", shared["grader/host/main.cpp"], "if (lab == \"" + nn + "\") return serve_lab" + nn + "(h);");
    }
    holds("README.md", shared["README.md"], "| " + lab + " |");  // step 8
    holds("cli/doctor_cmd.cpp", shared["cli/doctor_cmd.cpp"], "{\"" + lab + "\",");
    holds("tests/test_grader.cpp", shared["tests/test_grader.cpp"], "[grader][lab" + nn + "]");  // step 9
    // a "Read next:" line in the lab's grader files names a file beside it or from the repository's root
    if (!fs::is_directory(dir)) continue;  // (the test above names the missing folder)
    for (const auto& e : fs::directory_iterator(dir)) {
      std::smatch m;
      const std::string text = read_source(e.path());
      if (!std::regex_search(text, m, std::regex(R"re(Read next:\s*([\w./-]+\.(?:h|cpp|toml|md)))re"))) continue;
      INFO(e.path().filename().string() << " -> " << m[1]);
      CHECK((fs::exists(dir / std::string(m[1])) || fs::exists(kRoot / std::string(m[1]))));
    }
  }
}
