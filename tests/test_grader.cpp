// The grader must be able to fail: the solution gets full marks, the untouched skeleton zero on every
// implementation check, and each mutant loses the points of the check that targets it. A submission that
// doesn't compile, crashes, hangs, allocates without bound or writes outside its temp folder costs only
// its own points, and the batch goes on.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto pos = s.find(from);
  REQUIRE(pos != std::string::npos);
  return s.replace(pos, from.size(), to);
}

// The body of function `name` (from its opening brace to the matching close) replaced by `body`.
std::string replace_body(const std::string& s, const std::string& signature, const std::string& body) {
  auto pos = s.find(signature);
  REQUIRE(pos != std::string::npos);
  auto open = s.find('{', pos);
  int depth = 0;
  size_t i = open;
  for (; i < s.size(); i++) {
    if (s[i] == '{') depth++;
    if (s[i] == '}' && --depth == 0) break;
  }
  return s.substr(0, open) + "{\n" + body + "\n}" + s.substr(i + 1);
}

struct Row {
  std::map<std::string, int> points;
  int total = 0;
  std::string error;
};

std::map<std::string, Row> parse_csv(const std::string& csv) {
  std::istringstream in(csv);
  std::string header;
  std::getline(in, header);
  std::vector<std::string> cols;
  std::stringstream hs(header);
  for (std::string c; std::getline(hs, c, ',');) cols.push_back(c);
  std::map<std::string, Row> rows;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f;
    std::string cur;
    bool q = false;
    for (char c : line) {
      if (c == '"') q = !q;
      else if (c == ',' && !q) {
        f.push_back(cur);
        cur.clear();
      } else cur += c;
    }
    f.push_back(cur);
    Row r;
    for (size_t k = 1; k + 3 < cols.size(); k++) r.points[cols[k]] = std::stoi(f[k]);
    r.total = std::stoi(f[cols.size() - 3]);
    r.error = f.back();
    rows[f[0]] = r;
  }
  return rows;
}

}  // namespace

TEST_CASE("lab 01: solution, skeleton, mutants and misbehaving submissions", "[grader][lab01]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/01-collectives/ring.cpp");
  const std::string skeleton = read(src / "labs/01-collectives/student/ring.cpp");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs-" + std::to_string(getpid()));
  const fs::path marker = src / ("escape-marker-" + std::to_string(getpid()));
  fs::remove_all(subs);
  std::map<std::string, std::string> files = {
      {"solution", solution},
      {"skeleton", skeleton},
      // gather to rank 0, add, broadcast back: right numbers, (N-1)·S bytes from the root
      {"naive", replace_body(solution, "void ring_all_reduce(", R"(
  const int N = pg.size();
  if (N == 1 || count == 0) return;
  std::vector<float> tmp(static_cast<size_t>(count));
  if (pg.rank() == 0) {
    for (int r = 1; r < N; r++) {
      pg.recv(tmp.data(), count, r);
      for (int64_t i = 0; i < count; i++) data[i] += tmp[size_t(i)];
    }
    for (int r = 1; r < N; r++) pg.send(data, count, r);
  } else {
    pg.send(data, count, 0);
    pg.recv(data, count, 0);
  })")},
      // the all-gather phase starts one chunk off
      {"off_by_one", replace(solution, "const int sc = ((r + 1 - s) % N + N) % N, rc = ((r - s) % N + N) % N;",
                             "const int sc = ((r - s) % N + N) % N, rc = ((r - s - 1) % N + N) % N;")},
      {"no_compile", replace(solution, "const int N = pg.size(), r = pg.rank();", "const int N = pg.size() r = pg.rank();")},
      {"crash", replace_body(solution, "void ring_all_gather(", "  volatile float* p = nullptr;\n  *p = out[0];")},
      {"hang", replace_body(solution, "void ring_all_gather(", "  for (volatile int i = 0;; i++) {\n  }")},
      {"hog", replace_body(solution, "void ring_all_gather(",
                           "  std::vector<std::vector<char>> v;\n  for (;;) v.emplace_back(size_t(1) << 28, 'x');")},
      {"escape", replace_body(solution, "void ring_all_gather(",
                              "  FILE* f = std::fopen(\"" + marker.string() + "\", \"w\");\n  if (f) std::fputs(\"x\", f);\n"
                              "  throw std::runtime_error(f ? \"wrote outside\" : \"could not write outside\");")},
  };
  for (const auto& [name, text] : files) {
    fs::create_directories(subs / name);
    std::ofstream(subs / name / "ring.cpp") << "#include <unistd.h>\n#include <cstdio>\n#include <stdexcept>\n" << text;
  }
  const fs::path csv = subs / "grades.csv";
  const std::string cmd = "cd "s + DISTLAB_SOURCE_DIR + " && " + DISTLAB_BINARY + " grade 01 --submissions " + subs.string() +
                          " --csv " + csv.string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int st = pclose(p);
  INFO(out);
  REQUIRE(WEXITSTATUS(st) == 0);
  auto rows = parse_csv(read(csv));
  INFO(read(csv));
  CHECK(rows["solution"].total == 10);
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["naive"].points["all_reduce_equals_builtin"] == 3);   // right numbers...
  CHECK(rows["naive"].points["all_reduce_bandwidth_optimal"] == 0);  // ...wrong traffic
  CHECK(rows["naive"].points["all_reduce_modeled_time"] == 0);
  CHECK(rows["off_by_one"].points["all_reduce_equals_builtin"] == 0);
  CHECK(rows["off_by_one"].points["reduce_scatter_equals_builtin"] == 2);
  CHECK(rows["no_compile"].total == 0);
  CHECK_THAT(rows["no_compile"].error, Catch::Contains("build failed"));
  for (const std::string bad : {"crash", "hang", "hog", "escape"}) {
    INFO(bad);
    CHECK(rows[bad].points["all_gather_equals_builtin"] == 0);
    CHECK(rows[bad].points["all_reduce_equals_builtin"] == 3);  // only its own check is lost
    CHECK(rows[bad].total == 8);
  }
  CHECK_THAT(rows["crash"].error, Catch::Contains("crash"));
  CHECK_THAT(rows["hang"].error, Catch::Contains("timeout"));
  CHECK(!fs::exists(marker));  // the sandbox's root is read-only
  fs::remove(marker);
  fs::remove_all(subs);
}

TEST_CASE("grade reports: table, exit codes, JSON and JUnit", "[grader][lab01]") {
  const fs::path dir = fs::temp_directory_path() / ("distlab-grade-" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto run = [&](const std::string& args) {
    FILE* p = popen(("cd "s + DISTLAB_SOURCE_DIR + " && " + DISTLAB_BINARY + " " + args + " 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    int st = pclose(p);
    return std::make_pair(WEXITSTATUS(st), out);
  };
  auto [code, out] = run("grade 01 --solution --json " + (dir / "g.json").string() + " --junit " + (dir / "g.xml").string());
  INFO(out);
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("total                                  10   10"));
  CHECK_THAT(read(dir / "g.json"), Catch::Contains("\"points\": 10"));
  CHECK_THAT(read(dir / "g.xml"), Catch::Contains("<testsuite") && Catch::Contains("failures=\"0\""));
  auto [code2, out2] = run("grade 99");
  CHECK(code2 == 2);
  CHECK_THAT(out2, Catch::Contains("no lab '99'"));
  auto [code3, out3] = run("lab show 01");
  CHECK(code3 == 0);
  CHECK_THAT(out3, Catch::Contains("Ring collectives") && Catch::Contains("all_reduce_bandwidth_optimal (2 points)"));
  auto [code4, out4] = run("lab list");
  CHECK_THAT(out4, Catch::Contains("01-collectives"));
  fs::remove_all(dir);
}

TEST_CASE("lab 02: solution, skeleton and the mutants of the course's pitfalls", "[grader][lab02]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/02-ddp-cifar/ddp.cpp");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs02-" + std::to_string(getpid()));
  fs::remove_all(subs);
  std::map<std::string, std::string> files = {
      {"solution", solution},
      {"skeleton", read(src / "labs/02-ddp-cifar/student/ddp.cpp")},
      // every rank reads all the data (self-test Q6): same curve as one card, no speed-up
      {"no_sampler", replace(solution, "  for (int64_t i = rank; i < total; i += replicas) mine.push_back(order[size_t(i)]);",
                             "  mine.assign(order.begin(), order.begin() + (n + replicas - 1) / replicas * replicas);")},
      {"sum_not_average", replace(solution, "    for (int64_t i = 0; i < n; i++) g[i] /= float(pg.size());\n", "")},
      {"no_set_epoch", replace(solution, "seeded_permutation(n, seed + uint64_t(epoch))", "seeded_permutation(n, seed)")},
      {"forward_buckets", replace(solution, "for (size_t k = params.size(); k-- > 0;) {", "for (size_t k = 0; k < params.size(); k++) {")},
  };
  for (const auto& [name, text] : files) {
    fs::create_directories(subs / name);
    std::ofstream(subs / name / "ddp.cpp") << text;
  }
  const fs::path csv = subs / "grades.csv";
  FILE* p = popen(("cd "s + DISTLAB_SOURCE_DIR + " && " + DISTLAB_BINARY + " grade 02 --submissions " + subs.string() + " --csv " +
                   csv.string() + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  pclose(p);
  INFO(out);
  auto rows = parse_csv(read(csv));
  INFO(read(csv));
  CHECK(rows["solution"].total == 13);
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["no_sampler"].points["modeled_speedup_t4"] == 0);
  CHECK(rows["no_sampler"].points["sampler_disjoint_covering"] == 0);
  CHECK(rows["sum_not_average"].points["curve_matches_one_rank"] == 0);
  CHECK(rows["sum_not_average"].points["sampler_disjoint_covering"] == 2);
  CHECK(rows["no_set_epoch"].points["sampler_set_epoch"] == 0);
  CHECK(rows["no_set_epoch"].points["curve_matches_one_rank"] == 3);
  CHECK(rows["forward_buckets"].points["bucketed_overlap"] == 0);
  CHECK(rows["forward_buckets"].points["curve_matches_one_rank"] == 3);
  fs::remove_all(subs);
}

TEST_CASE("a lab's config runs the student's code, and an unbuilt or unfinished one says what to do", "[grader][lab02]") {
  const std::string plugin = std::string(DISTLAB_SOURCE_DIR) + "/build-missing/none.so";
  auto run = [&](const std::string& args) {
    FILE* p = popen(("cd "s + DISTLAB_SOURCE_DIR + " && timeout 120 " + DISTLAB_BINARY + " " + args + " 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    int st = pclose(p);
    return std::make_pair(WEXITSTATUS(st), out);
  };
  auto [c1, o1] = run("train labs/02-ddp-cifar/lab.toml --set lab.plugin=" + plugin);
  CHECK(c1 == 1);
  CHECK_THAT(o1, Catch::Contains("not built") && Catch::Contains("distlab lab build 02"));
  // the untouched skeleton, built: its stub names the task
  auto [c2, o2] = run("lab build 02");
  REQUIRE(c2 == 0);
  auto [c3, o3] = run("run -n 2 --master-port 0 --grace 2 train labs/02-ddp-cifar/lab.toml --set train.steps=2");
  CHECK(c3 == 1);
  CHECK_THAT(o3, Catch::Contains("02-ddp-cifar: sampler_indices is not implemented yet"));
}
