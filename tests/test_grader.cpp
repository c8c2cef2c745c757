// The grader must be able to fail, and must not be fooled. The solution gets full marks, the untouched
// skeleton zero; each mutant loses the points of the check that targets it; and each attack a hostile
// student can write scores zero on the checks it targets, or harms nothing and reads nothing: forged
// output, an early exit, engine internals declared extern, the instructor's files included or opened,
// writes outside the sandbox, memory and fork storms, deadlocks. A crash, hang or flood costs only its
// own check, and the batch's CSV and JSON stay whole.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

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

// Every occurrence (at least one) of `from` replaced by `to`.
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  size_t pos = s.find(from);
  REQUIRE(pos != std::string::npos);
  for (; pos != std::string::npos; pos = s.find(from, pos + to.size())) s.replace(pos, from.size(), to);
  return s;
}

// The body of the function starting at `signature` (its braces) replaced by `body`.
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

// A grading's points by check. Reading a check the grading did not report fails the test: a renamed or
// misspelt check must not make `points["x"] == 0` hold by default, as a std::map's operator[] would.
struct Points {
  std::map<std::string, int> by_check;
  int operator[](const std::string& check) const {
    const auto it = by_check.find(check);
    INFO("the grading reported no check named '" << check << "'");
    REQUIRE(it != by_check.end());
    return it->second;
  }
};

struct Row {
  Points points;
  int total = 0;
  std::string error;
};

// The CSV's rows by submission: a name the grading did not report fails the test, as Points' checks do.
struct Rows {
  std::map<std::string, Row> by_name;
  const Row& operator[](const std::string& name) const {
    const auto it = by_name.find(name);
    INFO("the grading reported no submission named '" << name << "'");
    REQUIRE(it != by_name.end());
    return it->second;
  }
  const Row& at(const std::string& name) const { return (*this)[name]; }
  size_t count(const std::string& name) const { return by_name.count(name); }
};

std::vector<std::string> csv_fields(const std::string& line) {
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
  return f;
}

Rows parse_csv(const std::string& csv) {
  std::istringstream in(csv);
  std::string header;
  std::getline(in, header);
  const auto cols = csv_fields(header);
  Rows rows;
  for (std::string line; std::getline(in, line);) {
    auto f = csv_fields(line);
    REQUIRE(f.size() == cols.size());
    // by the header's names: the checks are the columns that are not the gradebook's own
    static const std::set<std::string> own = {"student", "id", "name", "email", "lab", "lab_version", "points",
                                              "max", "percent", "error", "grader_version", "date"};
    Row r;
    for (size_t k = 0; k < cols.size(); k++) {
      if (cols[k] == "points") r.total = std::stoi(f[k]);
      else if (cols[k] == "error") r.error = f[k];
      else if (!own.count(cols[k])) r.points.by_check[cols[k]] = std::stoi(f[k]);
    }
    rows.by_name[f[0]] = r;
  }
  return rows;
}

std::pair<int, std::string> run_cmd(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int st = pclose(p);
  return {WEXITSTATUS(st), out};
}

std::pair<int, std::string> run(const std::string& args) { return run_cmd("cd "s + DISTLAB_SOURCE_DIR + " && " + DISTLAB_BINARY + " " + args + " 2>&1"); }

// run() under a wall clock: a grading that waits forever (on a FIFO) ends with 124 instead of hanging the test
std::pair<int, std::string> run_within(int seconds, const std::string& args) {
  return run_cmd("cd "s + DISTLAB_SOURCE_DIR + " && timeout -k 5 " + std::to_string(seconds) + " " + DISTLAB_BINARY + " " + args + " 2>&1");
}

// Several students at once (`--jobs`, 3 unless DISTLAB_TEST_GRADE_JOBS says otherwise): the verdicts these
// tests check are then those of a parallel batch, and the hostile submissions' waits overlap.
int batch_jobs() {
  const char* env = std::getenv("DISTLAB_TEST_GRADE_JOBS");
  return env && std::atoi(env) > 0 ? std::atoi(env) : 3;
}
// The stretch of every time limit under --jobs N on this machine (grader/check.h: SharedResults::load)
double batch_load() { return std::max(1.0, 2.0 * batch_jobs() / std::max(1u, std::thread::hardware_concurrency())); }

// A mutant's targets: the checks its assertions read. It is graded on those only (`--check`), the checks it
// does not target would repeat what its batch's other gradings show; a correct solution, the skeleton and
// every hostile submission run every check. Its row's total is -1: such a mutant has no total to assert.
using Only = std::map<std::string, std::vector<std::string>>;

// Writes each submission into its own folder of `subs`, grades the batch, returns the CSV's rows.
// `extra`: more arguments for `distlab grade` (a --seed that pins the scenarios a test's verdicts rely on).
// `only`: submissions graded on some checks, a batch of their own for each set of checks (in a sibling folder
// of `subs`, graded after the whole batch, whose reference times they reuse; the feedback in the same folder).
Rows grade_batch(const std::string& lab, const fs::path& subs, const std::map<std::string, std::string>& files,
                 const std::string& file_name, std::string* json = nullptr, const std::string& extra = "", const Only& only = {}) {
  auto write = [&](const fs::path& dir, const std::string& name, const std::string& text) {
    if (text.rfind("@file:", 0) == 0) {  // the submission itself is a file, not a folder
      std::ofstream(dir / name) << text.substr(6);
      return;
    }
    if (text.rfind("@linkdir:", 0) == 0) {  // the submission is a link to someone else's folder
      fs::create_symlink(text.substr(9), dir / name);
      return;
    }
    fs::create_directories(dir / name);
    if (text.rfind("@symlink:", 0) == 0) fs::create_symlink(text.substr(9), dir / name / file_name);
    else std::ofstream(dir / name / file_name) << text;
  };
  // every failure's hint at once (a first grading holds them back: the hints test below): these tests read them
  auto grade = [&](const fs::path& dir, const std::string& args) {
    const fs::path csv = dir.string() + "-grades.csv", js = dir.string() + "-grades.json";
    auto [code, out] = run("grade " + lab + " --require-sandbox --jobs " + std::to_string(batch_jobs()) + " --submissions " + dir.string() + " --csv " +
                           csv.string() + " --json " + js.string() + (extra.find("--hints") == std::string::npos ? " --hints always" : "") +
                           (extra.empty() ? "" : " " + extra) + args);
    INFO(out);
    REQUIRE(code == 0);
    INFO(read(csv));
    if (json && args.empty()) *json = read(js);
    return parse_csv(read(csv));
  };
  std::map<std::vector<std::string>, std::vector<std::string>> by_checks;  // a set of checks -> the mutants graded on it
  for (const auto& [name, checks] : only) {
    INFO(name);
    REQUIRE(files.count(name));
    REQUIRE(!checks.empty());
    std::vector<std::string> sorted = checks;
    std::sort(sorted.begin(), sorted.end());
    by_checks[sorted].push_back(name);
  }
  fs::remove_all(subs);
  fs::create_directories(subs);
  for (const auto& [name, text] : files)
    if (!only.count(name)) write(subs, name, text);
  Rows rows = grade(subs, "");
  int k = 0;
  for (const auto& [checks, names] : by_checks) {
    const fs::path dir = subs.string() + "-only" + std::to_string(k++);
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::string args = " --feedback " + (subs.parent_path() / "feedback").string();  // each mutant's only grading
    for (const auto& c : checks) args += " --check " + c;
    for (const auto& n : names) write(dir, n, files.at(n));
    for (auto& [n, row] : grade(dir, args).by_name) {
      row.total = -1;
      rows.by_name[n] = row;
    }
    fs::remove_all(dir);
  }
  return rows;
}

// A unified diff (`diff -u` of one file after another, `--- path` / `+++ path` headers) applied under `root`:
// each hunk's old lines (context and '-') must stand in the file exactly once and become its new ones
// (context and '+'). Returns the files changed. The alternative lab 08 fixes are kept this way: each is a
// few lines of a case's file.
int apply_unified_diff(const fs::path& root, const std::string& diff) {
  std::istringstream in(diff);
  std::string line, file, text, from, to;
  int files = 0;
  auto flush_hunk = [&] {
    if (from.empty() && to.empty()) return;
    const size_t at = text.find(from);
    INFO(file << ": a hunk's old lines");
    REQUIRE(at != std::string::npos);
    REQUIRE(text.find(from, at + 1) == std::string::npos);
    text.replace(at, from.size(), to);
    from.clear();
    to.clear();
  };
  auto flush_file = [&] {
    flush_hunk();
    if (file.empty()) return;
    std::ofstream(root / file, std::ios::trunc) << text;
    files++;
  };
  while (std::getline(in, line)) {
    if (line.rfind("--- ", 0) == 0) {
      flush_file();
      file = line.substr(4);
      text = read(root / file);
      REQUIRE(!text.empty());
    } else if (line.rfind("+++ ", 0) == 0) {
      continue;
    } else if (line.rfind("@@", 0) == 0) {
      flush_hunk();
    } else if (!line.empty() && (line[0] == ' ' || line[0] == '-' || line[0] == '+')) {
      if (line[0] != '+') from += line.substr(1) + "\n";
      if (line[0] != '-') to += line.substr(1) + "\n";
    }
  }
  flush_file();
  return files;
}

const std::string kHeaders = "#include <dlfcn.h>\n#include <fcntl.h>\n#include <unistd.h>\n#include <cstdio>\n#include <cstdlib>\n"
                             "#include <stdexcept>\n#include <string>\n#include <vector>\n";

}  // namespace

TEST_CASE("lab 01: solution, skeleton, mutants, misbehaving and hostile submissions", "[grader][lab01]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = kHeaders + read(src / "solutions/01-collectives/ring.cpp");
  const std::string skeleton = kHeaders + read(src / "labs/01-collectives/student/ring.cpp");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs01-" + std::to_string(getpid()));
  const fs::path marker = src / ("escape-marker-" + std::to_string(getpid()));
  const std::string in_all_gather = "void ring_all_gather(";
  // listeners on the host that no plugin may reach
  const std::string host_sock = (fs::temp_directory_path() / ("distlab-hostsock-" + std::to_string(getpid()))).string();
  const std::string abstract_name = "distlab-hostsock-" + std::to_string(getpid());
  fs::remove(host_sock);
  std::vector<int> listeners;
  auto listen_on = [&](int fd, const sockaddr* a, socklen_t len) {
    REQUIRE(bind(fd, a, len) == 0);
    REQUIRE(listen(fd, 8) == 0);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    listeners.push_back(fd);
  };
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::snprintf(un.sun_path, sizeof un.sun_path, "%s", host_sock.c_str());
  listen_on(socket(AF_UNIX, SOCK_STREAM, 0), reinterpret_cast<sockaddr*>(&un), sizeof un);
  sockaddr_un ab{};
  ab.sun_family = AF_UNIX;
  std::snprintf(ab.sun_path + 1, sizeof ab.sun_path - 1, "%s", abstract_name.c_str());
  listen_on(socket(AF_UNIX, SOCK_STREAM, 0), reinterpret_cast<sockaddr*>(&ab), socklen_t(sizeof(sa_family_t) + 1 + abstract_name.size()));
  sockaddr_in lo{};
  lo.sin_family = AF_INET;
  lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  listen_on(socket(AF_INET, SOCK_STREAM, 0), reinterpret_cast<sockaddr*>(&lo), sizeof lo);
  socklen_t lo_len = sizeof lo;
  getsockname(listeners.back(), reinterpret_cast<sockaddr*>(&lo), &lo_len);
  const int tcp_port = ntohs(lo.sin_port);
  std::map<std::string, std::string> files = {
      {"solution", solution},
      {"skeleton", skeleton},
      // two more correct rings, written otherwise (no check may fail them): one that turns the other way with
      // the first count % N chunks one longer (tests/solutions_alt/), and the solution adding in double
      // a direct all-to-all: every rank sends each chunk straight to its owner, then its own chunk to every
      // rank. Right sums, the ring's very bytes and message count, but over N - 1 links a rank, not one
      {"all_to_all",
       replace_body(replace_body(solution, "static void reduce_scatter_phase(Comm& comm, float* data, int64_t count)",
                                 "  const int N = comm.size(), r = comm.rank();\n  std::vector<float> in(static_cast<size_t>(count / N + 1));\n"
                                 "  for (int k = 1; k < N; k++) {\n    const int to = mod(r + k, N), from = mod(r - k, N);\n"
                                 "    comm.send(data + chunk_begin(to, count, N), chunk_size(to, count, N), to);\n"
                                 "    comm.recv(in.data(), chunk_size(r, count, N), from);\n"
                                 "    for (int64_t i = 0; i < chunk_size(r, count, N); i++) data[chunk_begin(r, count, N) + i] += in[size_t(i)];\n  }"),
                    "static void all_gather_phase(Comm& comm, float* data, int64_t count)",
                    "  const int N = comm.size(), r = comm.rank();\n  for (int k = 1; k < N; k++) {\n    const int from = mod(r - k, N);\n"
                    "    comm.send(data + chunk_begin(r, count, N), chunk_size(r, count, N), mod(r + k, N));\n"
                    "    comm.recv(data + chunk_begin(from, count, N), chunk_size(from, count, N), from);\n  }")},
      {"ring_left", read(src / "tests/solutions_alt/01-ring_left.cpp")},
      // a ring each way at once, half of every chunk on each (NCCL's bidirectional rings): a rank sends to
      // both its neighbours, the ring's bytes in all, one message a neighbour per step
      {"bidirectional", read(src / "tests/solutions_alt/01-bidirectional.cpp")},
      {"sums_in_double", replace(solution, "    for (int64_t i = 0; i < chunk_size(rc, count, N); i++) dst[i] += incoming[size_t(i)];\n",
                                 "    for (int64_t i = 0; i < chunk_size(rc, count, N); i++) dst[i] = float(double(dst[i]) + double(incoming[size_t(i)]));\n")},
      // gather to rank 0, add, broadcast back: right numbers, (N-1)·S bytes from the root
      {"naive", replace_body(solution, "void ring_all_reduce(", R"(
  const int N = comm.size();
  if (N == 1 || count == 0) return;
  std::vector<float> tmp(static_cast<size_t>(count));
  if (comm.rank() == 0) {
    for (int r = 1; r < N; r++) {
      comm.recv(tmp.data(), count, r);
      for (int64_t i = 0; i < count; i++) data[i] += tmp[size_t(i)];
    }
    for (int r = 1; r < N; r++) comm.send(data, count, r);
  } else {
    comm.send(data, count, 0);
    comm.recv(data, count, 0);
  })")},
      // the all-gather phase starts one chunk off
      {"off_by_one", replace(solution, "const int sc = mod(r - s, N), rc = mod(r - s - 1, N);",
                             "const int sc = mod(r - s + 1, N), rc = mod(r - s, N);")},
      // every rank receives first: nothing can move
      {"deadlock", replace(solution, "    comm.send(data + chunk_begin(sc, count, N), chunk_size(sc, count, N), mod(r + 1, N));\n"
                                             "    comm.recv(data + chunk_begin(rc, count, N), chunk_size(rc, count, N), mod(r - 1, N));",
                                   "    comm.recv(data + chunk_begin(rc, count, N), chunk_size(rc, count, N), mod(r - 1, N));\n"
                                   "    comm.send(data + chunk_begin(sc, count, N), chunk_size(sc, count, N), mod(r + 1, N));")},
      {"no_compile", replace(solution, "const int N = comm.size(), r = comm.rank();\n  std::vector<float> incoming",
                             "const int N = comm.size() r = comm.rank();\n  std::vector<float> incoming")},
      {"crash", replace_body(solution, in_all_gather, "  volatile float* p = nullptr;\n  *p = out[0];")},
      // hangs at n = 7, a size only all_gather_equals_builtin tries: one timeout is the test, a second would
      // only cost CI another 12 s
      {"hang", replace_body(solution, in_all_gather, "  if (n == 7)\n    for (volatile int i = 0;; i++) {\n    }\n"
                                                     "  std::copy(in, in + n, out + comm.rank() * n);\n  all_gather_phase(comm, out, n * comm.size());")},
      {"hog", replace_body(solution, in_all_gather, "  std::vector<std::vector<char>> v;\n  for (;;) v.emplace_back(size_t(1) << 28, 'x');")},
      // two processes of 640 MiB each: under the per-process limit (lab 01's memory_mb, 1 GiB), over the
      // check's cgroup (the same 1 GiB for all its processes)
      {"fork_hog", replace_body(solution, in_all_gather,
                                "  fork();\n  std::vector<char> v(size_t(640) << 20, 'x');\n  volatile char c = v[v.size() / 2];\n"
                                "  throw std::runtime_error(\"allocated\" + std::to_string(c));")},
      {"escape", replace_body(solution, in_all_gather,
                              "  FILE* f = std::fopen(\"" + marker.string() + "\", \"w\");\n  if (f) std::fputs(\"x\", f);\n"
                              "  throw std::runtime_error(f ? \"wrote outside\" : \"could not write outside\");")},
      // a global constructor that prints a forged verdict and exits before any check runs
      {"forged_exit", skeleton + "\nstatic int forged = [] { std::puts(\"DISTLAB_CHECK_RESULT {\\\"status\\\":\\\"pass\\\","
                                 "\\\"expected\\\":\\\"\\\",\\\"seen\\\":\\\"\\\"}\"); std::fflush(stdout); _exit(0); return 0; }();\n"},
      // the same line, printed a thousand times around a correct solution with a flood of debug output
      {"chatty", replace(solution, "void ring_all_reduce(Comm& comm, float* data, int64_t count) {",
                         "void ring_all_reduce(Comm& comm, float* data, int64_t count) {\n"
                         "  for (int i = 0; i < 2000; i++) std::printf(\"DISTLAB_CHECK_RESULT {\\\"status\\\":\\\"fail\\\"} "
                         "debug \\xff\\xfe line %d\\n\", i);")},
      // the engine's collectives, declared by hand
      {"extern_engine", "namespace distlab { struct ProcessGroup { void all_reduce(float*, long, int); }; }\n" +
                            replace_body(solution, "void ring_all_reduce(",
                                         "  reinterpret_cast<distlab::ProcessGroup*>(&comm)->all_reduce(data, count, 0);")},
      {"include_solution", "#include \"solutions/01-collectives/ring.cpp\"\n"},
      {"include_abs", "#include \"" + (src / "solutions/01-collectives/ring.cpp").string() + "\"\n"},
      {"include_passwd", "#include \"/etc/passwd\"\n"},
      {"include_stdin", "#include \"/dev/stdin\"\n"},
      {"symlink", "@symlink:" + (src / "solutions/01-collectives/ring.cpp").string()},
      // load the instructor's plugin at run time, or read the solution, /etc/shadow, /root: none is there
      {"snoop", "#include <sys/ptrace.h>\n" + replace_body(solution, in_all_gather,
                             "  const char* paths[] = {\"" + (src / "solutions/01-collectives/ring.cpp").string() + "\", \"/etc/shadow\", \"/root\", \"" +
                                 (fs::path(DISTLAB_SOURCE_DIR) / "build/labs/01-collectives/solution.so").string() + "\"};\n"
                                 "  for (const char* p : paths) if (access(p, F_OK) == 0) throw std::runtime_error(std::string(\"can see \") + p);\n"
                                 "  if (dlopen(paths[3], RTLD_NOW)) throw std::runtime_error(\"loaded the solution\");\n"
                                 "  if (getuid() == 0) throw std::runtime_error(\"root\");\n"
                                 "  if (ptrace(PTRACE_ATTACH, 1, nullptr, nullptr) == 0) throw std::runtime_error(\"ptrace attached to pid 1\");\n"
                                 "  { FILE* env = std::fopen(\"/proc/1/environ\", \"r\"); std::string e; for (int c; env && (c = std::fgetc(env)) != EOF;) e += char(c);\n"
                                 "    if (env) std::fclose(env);\n"
                                 "    for (size_t at = 0; at < e.size(); at = e.find('\\0', at) + 1) {\n"
                                 "      const std::string v = e.substr(at, e.find('\\0', at) - at);\n"
                                 "      if (v.rfind(\"PATH=\", 0) && v.rfind(\"LANG=\", 0) && v.rfind(\"MALLOC_ARENA_MAX=\", 0)) throw std::runtime_error(\"pid 1's environment: \" + v);\n"
                                 "      if (e.find('\\0', at) == std::string::npos) break;\n    } }\n"
                                 "  std::copy(in, in + n, out + comm.rank() * n);\n  all_gather_phase(comm, out, n * comm.size());")},
      {"=HYPERLINK(1)", skeleton},
      // the ring's messages, all zeros, and sums predicted from its own input (the old fixed inputs were
      // value(q, i) = mine + (q - r)·0.75): the right traffic, no data moved. Inputs drawn per grading fail it
      {"predicts", replace_body(solution, "void ring_all_reduce(", R"(
  const int N = comm.size(), r = comm.rank();
  std::vector<float> zeros(static_cast<size_t>(count), 0.0f);
  reduce_scatter_phase(comm, zeros.data(), count);
  all_gather_phase(comm, zeros.data(), count);
  for (int64_t i = 0; i < count; i++) {
    float s = 0;
    for (int q = 0; q < N; q++) s += data[i] + float(q - r) * 0.75f;
    data[i] = s;
  })")},
      // the grader's host from inside: a Unix socket in the host's /tmp, an abstract one, loopback TCP, and
      // a /tmp filled past its size
      {"reach_host", "#include <sys/socket.h>\n#include <sys/un.h>\n#include <netinet/in.h>\n#include <arpa/inet.h>\n" +
                         replace_body(solution, in_all_gather,
                             "  sockaddr_un u{};\n  u.sun_family = AF_UNIX;\n"
                             "  std::snprintf(u.sun_path, sizeof u.sun_path, \"%s\", \"" + host_sock + "\");\n"
                             "  int fd = socket(AF_UNIX, SOCK_STREAM, 0);\n"
                             "  if (connect(fd, (sockaddr*)&u, sizeof u) == 0) throw std::runtime_error(\"reached a host Unix socket\");\n"
                             "  close(fd);\n  u.sun_path[0] = 0;\n"
                             "  std::snprintf(u.sun_path + 1, sizeof u.sun_path - 1, \"%s\", \"" + abstract_name + "\");\n"
                             "  fd = socket(AF_UNIX, SOCK_STREAM, 0);\n"
                             "  if (connect(fd, (sockaddr*)&u, socklen_t(sizeof(sa_family_t) + 1 + " + std::to_string(abstract_name.size()) + ")) == 0)\n"
                             "    throw std::runtime_error(\"reached a host abstract socket\");\n"
                             "  close(fd);\n  sockaddr_in a{};\n  a.sin_family = AF_INET;\n  a.sin_port = htons(" + std::to_string(tcp_port) + ");\n"
                             "  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);\n  fd = socket(AF_INET, SOCK_STREAM, 0);\n"
                             "  if (connect(fd, (sockaddr*)&a, sizeof a) == 0) throw std::runtime_error(\"reached the host's loopback\");\n"
                             "  close(fd);\n"
                             "  FILE* big = std::fopen(\"/tmp/fill\", \"w\");\n  std::vector<char> mb(1 << 20, 'x');\n  int wrote = 0;\n"
                             "  while (big && wrote < 200 && std::fwrite(mb.data(), 1, mb.size(), big) == mb.size() && std::fflush(big) == 0) wrote++;\n"
                             "  if (big) std::fclose(big);\n  std::remove(\"/tmp/fill\");\n"
                             "  if (wrote >= 200) throw std::runtime_error(\"/tmp took 200 MiB\");\n"
                             "  std::copy(in, in + n, out + comm.rank() * n);\n  all_gather_phase(comm, out, n * comm.size());")},
  };
  // entries that are no submission, and names that would break a feedback file or a terminal
  files["not_a_folder"] = "@file:" + solution;
  files["linked_folder"] = "@linkdir:" + (src / "solutions/01-collectives").string();
  const std::string long_name = std::string(250, 'n');
  files[long_name] = skeleton;
  files["bidi\xe2\x80\xae\x1b[31mred"] = skeleton;
  std::string json;
  std::error_code ec;  // an earlier run's long-name feedback would pass the check below on its own
  for (const auto& e : fs::directory_iterator(subs.parent_path() / "feedback", ec))
    if (e.path().filename().string().rfind(std::string(80, 'n'), 0) == 0) fs::remove(e.path());
  auto rows = grade_batch("01", subs, files, "ring.cpp", &json);
  CHECK(rows["not_a_folder"].total == 0);
  CHECK_THAT(rows["not_a_folder"].error, Catch::Contains("not a folder"));
  CHECK(rows["linked_folder"].total == 0);
  CHECK_THAT(rows["linked_folder"].error, Catch::Contains("symbolic link"));
  CHECK(rows.count(long_name) == 1);
  CHECK(rows.count("bidi??[31mred") == 1);  // U+202E and ESC shown as '?'
  {  // the long name's feedback: shortened, with a hash that keeps it apart from any other
    int long_ones = 0;
    for (const auto& e : fs::directory_iterator(subs.parent_path() / "feedback")) {
      INFO(e.path().string());
      CHECK(e.path().filename().string().size() <= 100);
      long_ones += e.path().filename().string().rfind(std::string(80, 'n') + "-", 0) == 0;
    }
    CHECK(long_ones >= 1);
  }
  CHECK(rows["solution"].total == 12);
  CHECK(rows["ring_left"].total == 12);
  CHECK(rows["bidirectional"].total == 12);
  CHECK(rows["all_to_all"].points["all_reduce_equals_builtin"] == 3);  // right sums...
  CHECK(rows["all_to_all"].points["reduce_scatter_all_gather_traffic"] == 0);  // ...not a ring
  CHECK(rows["all_to_all"].points["all_reduce_bandwidth_optimal"] == 0);
  CHECK(rows["all_to_all"].points["all_reduce_modeled_time"] == 0);
  CHECK(rows["sums_in_double"].total == 12);
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["forged_exit"].total == 0);
  CHECK(rows["chatty"].total == 12);  // debug output is never mistaken for a result, nor for a crash
  CHECK(rows["naive"].points["all_reduce_equals_builtin"] == 3);  // right numbers...
  CHECK(rows["naive"].points["all_reduce_bandwidth_optimal"] == 0);  // ...wrong traffic
  CHECK(rows["naive"].points["all_reduce_modeled_time"] == 0);
  CHECK(rows["naive"].points["reduce_scatter_all_gather_traffic"] == 2);
  CHECK(rows["off_by_one"].points["all_reduce_equals_builtin"] == 0);
  CHECK(rows["off_by_one"].points["reduce_scatter_equals_builtin"] == 2);
  CHECK(rows["deadlock"].points["all_reduce_equals_builtin"] == 0);
  CHECK(rows["deadlock"].points["reduce_scatter_equals_builtin"] == 2);
  CHECK_THAT(rows["deadlock"].error, Catch::Contains("deadlock") && Catch::Contains("Every rank is waiting to receive"));
  for (const std::string bad : {"no_compile", "extern_engine", "include_solution", "include_abs", "include_passwd", "symlink"}) {
    INFO(bad);
    CHECK(rows[bad].total == 0);
    CHECK_THAT(rows[bad].error, Catch::Contains("build failed"));
  }
  CHECK_THAT(rows["extern_engine"].error, Catch::Contains("undefined reference"));
  CHECK_THAT(rows["symlink"].error, Catch::Contains("not links"));
  CHECK_THAT(rows["include_passwd"].error, !Catch::Contains("root:x:0"));
  CHECK(rows["include_stdin"].total == 0);  // the compiler read an empty stdin instead of waiting on ours
  CHECK_THAT(rows["include_stdin"].error, Catch::Contains("no distlab_lab01 table"));
  CHECK(rows["hang"].points["all_gather_equals_builtin"] == 0);
  CHECK(rows["hang"].total == 10);  // the traffic check's all_gather (n = 25001) does not hang
  for (const std::string bad : {"crash", "hog", "fork_hog", "escape"}) {
    INFO(bad);
    CHECK(rows[bad].points["all_gather_equals_builtin"] == 0);
    CHECK(rows[bad].points["all_reduce_equals_builtin"] == 3);  // only the checks that run all_gather are lost
    CHECK(rows[bad].total == 8);
  }
  CHECK_THAT(rows["crash"].error, Catch::Contains("SEGV"));
  for (const std::string bad : {"hog", "fork_hog"}) {  // stopped by the check's cgroup (fork_hog: by it alone)
    INFO(bad);
    CHECK_THAT(rows[bad].error, Catch::Contains("memory limit of 1024 MiB"));
  }
  CHECK_THAT(rows["hang"].error, Catch::Contains("timeout"));
  CHECK(rows["predicts"].points["all_reduce_equals_builtin"] == 0);
  CHECK(rows["predicts"].points["all_reduce_bandwidth_optimal"] == 0);  // traffic counts only with right sums
  CHECK(rows["predicts"].points["all_reduce_modeled_time"] == 0);
  CHECK(rows["predicts"].total == 6);  // reduce-scatter and all-gather are the solution's
  CHECK(rows["snoop"].total == 12);  // it found none of the files it looked for
  CHECK(rows["reach_host"].total == 12);  // no host socket answered, and /tmp stopped it well before 200 MiB
  for (int fd : listeners) {
    CHECK(accept(fd, nullptr, nullptr) < 0);  // nobody connected
    close(fd);
  }
  fs::remove(host_sock);
  CHECK(!fs::exists(marker));        // nothing outside the sandbox is writable
  CHECK(read(subs.string() + "-grades.csv").find("\"'=HYPERLINK(1)\"") != std::string::npos);  // not a formula
  // the JSON report is whole and valid, invalid UTF-8 in a submission's output included
  auto all = nlohmann::json::parse(json);
  CHECK(all.size() == files.size());
  // a hang costs a few times the reference solution's time on that check, not lab.toml's 30 s (each
  // stretched by the load of the gradings side by side)
  for (const auto& g : all)
    if (g["student"] == "hang")
      for (const auto& c : g["checks"]) {
        INFO(c.dump());
        if (c["name"] == "all_gather_equals_builtin") {
          CHECK(c["status"] == "timeout");
          CHECK(c["limit_s"].get<double>() >= 10);
          CHECK(c["limit_s"].get<double>() < 30 * batch_load());
          CHECK_THAT(c["seen"].get<std::string>(), Catch::Contains("x the reference solution's time"));
        }
      }
  // each student gets the table they would have seen
  CHECK_THAT(read(subs.parent_path() / "feedback" / "deadlock.txt"), Catch::Contains("all_reduce_equals_builtin") && Catch::Contains("hint:"));
  fs::remove(marker);
  fs::remove_all(subs);
}

TEST_CASE("a working copy outside student/ builds, grades and records under its own key: two copies never overwrite each other's plugin, hints or grade", "[grader][lab01]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const fs::path lab = fs::path(DISTLAB_BINARY).parent_path().parent_path() / "labs" / "01-collectives";
  const fs::path dir = fs::temp_directory_path() / ("distlab-copies-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const fs::path ann = dir / "ann", bob = dir / "bob";
  fs::create_directories(ann);
  fs::create_directories(bob);
  std::ofstream(ann / "ring.cpp") << read(src / "solutions/01-collectives/ring.cpp");
  std::ofstream(bob / "ring.cpp") << read(src / "labs/01-collectives/student/ring.cpp");
  // the lab's own student/ state, which neither copy may touch
  auto snapshot = [&] {
    std::map<std::string, std::string> m;
    for (const char* f : {"student.so", "hints.json", "last_grade.json"}) m[f] = fs::exists(lab / f) ? read(lab / f) : "(none)";
    return m;
  };
  const auto before = snapshot();
  auto build = [&](const fs::path& copy) {
    auto [code, out] = run("lab build 01 --src " + copy.string());
    INFO(out);
    REQUIRE(code == 0);
    const auto at = out.find("built ");
    REQUIRE(at != std::string::npos);
    const std::string path = out.substr(at + 6, out.find('\n', at) - at - 6);
    CHECK_THAT(out, Catch::Contains("--set lab.plugin=" + path));  // how a lab's config runs this copy
    return fs::path(path);
  };
  const fs::path so_ann = build(ann), so_bob = build(bob);
  CHECK(so_ann != so_bob);
  CHECK(so_ann.parent_path() != lab);
  CHECK(read(so_ann.parent_path() / "source.txt") == fs::weakly_canonical(ann).string() + "\n");
  const std::string ann_plugin = read(so_ann);
  // bob's skeleton fails twice: the second grading shows a hint, recorded in bob's own record
  for (int k = 0; k < 2; k++) {
    auto [code, out] = run("grade 01 --src " + bob.string());
    INFO(out);
    CHECK(code == 1);
  }
  auto [code, out] = run("grade 01 --src " + ann.string());
  INFO(out);
  CHECK(code == 0);
  CHECK(read(so_ann) == ann_plugin);  // bob's gradings rebuilt bob's plugin, not ann's
  const auto ann_grade = nlohmann::json::parse(read(so_ann.parent_path() / "last_grade.json"));
  const auto bob_grade = nlohmann::json::parse(read(so_bob.parent_path() / "last_grade.json"));
  CHECK(ann_grade["best"]["points"] == ann_grade["best"]["max_points"]);
  CHECK(bob_grade["best"]["points"] == 0);
  CHECK(fs::exists(so_bob.parent_path() / "hints.json"));
  CHECK(snapshot() == before);
  fs::remove_all(dir);
}

TEST_CASE("grades an LMS imports: the roster's ids, percent and versions in the CSV, JUnit points, Gradescope's results.json and bundle, copies listed", "[grader][lab01]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const fs::path dir = fs::temp_directory_path() / ("distlab-lms-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string solution = kHeaders + read(src / "solutions/01-collectives/ring.cpp");
  // bob's is ann's with every name changed and comments of his own: a copy all the same
  std::string bob = "// my own work, honestly\n" + solution;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"incoming", "buf"}, {"chunk_begin", "start_of"}, {"dst", "target"}})
    for (size_t at; (at = bob.find(from)) != std::string::npos;) bob.replace(at, from.size(), to);
  const std::map<std::string, std::string> subs = {
      {"ann", solution}, {"bob", bob}, {"cid", kHeaders + read(src / "labs/01-collectives/student/ring.cpp")},
      // dan started his own way (his ring_all_reduce, nothing else yet): his text is his, not a copy
      {"dan", replace_body(kHeaders + read(src / "labs/01-collectives/student/ring.cpp"), "void ring_all_reduce(",
                           "  std::vector<float> mine(data, data + count);\n  for (int r = 0; r < comm.size(); r++)\n"
                           "    if (r != comm.rank()) comm.send(mine.data(), count, r);\n  throw std::runtime_error(\"dan: to be continued\");")}};
  for (const auto& [name, text] : subs) {
    fs::create_directories(dir / "subs" / name);
    std::ofstream(dir / "subs" / name / "ring.cpp") << text;
  }
  std::ofstream(dir / "roster.csv") << "name,folder,id,email\n\"Ann A\",ann,S001,ann@uni.edu\nBob B,bob,S002,bob@uni.edu\nCid C,cid,S003,cid@uni.edu\n"
                                       "Eve E,eve,S005,eve@uni.edu\n";
  auto [code, out] = run("grade 01 --require-sandbox --jobs 2 --submissions " + (dir / "subs").string() + " --csv " + (dir / "g.csv").string() +
                         " --roster " + (dir / "roster.csv").string());
  INFO(out);
  REQUIRE(code == 0);
  // copies: ann and bob, identical once comments, spacing and names are normalized; the skeleton (cid) and
  // dan's own ring are no one's copy
  CHECK_THAT(out, Catch::Contains("look copied") && Catch::Contains("ann and bob: identical"));
  CHECK_THAT(out, !Catch::Contains("cid and") && !Catch::Contains("and cid") && !Catch::Contains("and dan") && !Catch::Contains("dan and"));
  CHECK_THAT(out, Catch::Contains("not on the roster: dan"));
  const std::string csv = read(dir / "g.csv");
  INFO(csv);
  const std::string header = csv.substr(0, csv.find('\n'));
  CHECK(header.rfind("student,id,name,email,lab,lab_version,", 0) == 0);
  CHECK_THAT(header, Catch::EndsWith(",points,max,percent,error,grader_version,date"));
  CHECK_THAT(csv, Catch::Contains("\"ann\",\"S001\",\"Ann A\",\"ann@uni.edu\",\"01-collectives\","));
  CHECK_THAT(csv, Catch::Contains(",12,12,100.0,\"\","));
  CHECK_THAT(csv, Catch::Contains("\"eve\",\"S005\",\"Eve E\",\"eve@uni.edu\",\"01-collectives\",") && Catch::Contains("no submission"));
  CHECK_THAT(csv, Catch::Contains("\"dan\",\"\",\"\",\"\""));
  // JUnit with the points, suite and cases (the skeleton: quick to grade, 0 of each check's points)
  auto [jcode, jout] = run("grade 01 --src " + (dir / "subs" / "cid").string() + " --junit " + (dir / "j.xml").string());
  INFO(jout);
  CHECK(jcode == 1);
  const std::string junit = read(dir / "j.xml");
  CHECK_THAT(junit, Catch::Contains("<property name=\"points\" value=\"0\"/><property name=\"max_points\" value=\"12\"/>"));
  CHECK_THAT(junit, Catch::Contains("<property name=\"points\" value=\"0\"/><property name=\"max_points\" value=\"3\"/>"));
  // Gradescope: the files in a folder of the upload, results.json as its autograder reads it (exit 0 whatever the score)
  fs::create_directories(dir / "autograder" / "submission" / "lab01");
  std::ofstream(dir / "autograder" / "submission" / "lab01" / "ring.cpp") << kHeaders + read(src / "labs/01-collectives/student/ring.cpp");
  auto [gcode, gout] = run("grade 01 --gradescope " + (dir / "autograder").string());
  INFO(gout);
  CHECK(gcode == 0);
  const auto results = nlohmann::json::parse(read(dir / "autograder" / "results" / "results.json"));
  CHECK(results["score"] == 0);
  REQUIRE(results["tests"].size() == 6);
  int max = 0;
  for (const auto& t : results["tests"]) {
    max += t["max_score"].get<int>();
    CHECK(t["visibility"] == "visible");
    CHECK(t["score"] == 0);
    CHECK(t["output"].get<std::string>().size() > 20);  // what the check does, and what it saw
  }
  CHECK(max == 12);
  auto [bcode, bout] = run("grade 01 --gradescope-bundle " + (dir / "bundle").string());
  INFO(bout);
  CHECK(bcode == 0);
  CHECK_THAT(read(dir / "bundle" / "run_autograder"), Catch::Contains("grade 01 --gradescope /autograder"));
  CHECK_THAT(read(dir / "bundle" / "setup.sh"), Catch::Contains("scripts/setup.sh") && Catch::Contains("build.sh --target distlab"));
  CHECK((fs::status(dir / "bundle" / "run_autograder").permissions() & fs::perms::owner_exec) != fs::perms::none);
  auto [tcode, tout] = run_cmd("tar -tzf " + (dir / "bundle" / "distlab-src.tar.gz").string() + " 2>&1");
  CHECK(tcode == 0);
  CHECK_THAT(tout, Catch::Contains("./scripts/setup.sh") && Catch::Contains("./labs/01-collectives/api.h") && !Catch::Contains("./build/"));
  fs::remove_all(dir);
}

TEST_CASE("grade reports: table, exit codes, JSON and JUnit, lab list with the last and best grade", "[grader][lab01]") {
  const fs::path dir = fs::temp_directory_path() / ("distlab-grade-" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto [code, out] = run("grade 01 --solution --json " + (dir / "g.json").string() + " --junit " + (dir / "g.xml").string() +
                         " --html " + (dir / "g.html").string());
  INFO(out);
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("total                                  12   12"));
  // lab 01 trains nothing: its report is the table, and says why there are no pictures
  CHECK_THAT(read(dir / "g.html"), Catch::Contains("<table id=\"checks\">") && Catch::Contains("is not a training run"));
  auto [code_html, out_html] = run("grade 01 --solution --html /proc/no/g.html");
  CHECK(code_html == 1);
  CHECK_THAT(out_html, Catch::Contains("--html '/proc/no/g.html'"));
  CHECK_THAT(read(dir / "g.json"), Catch::Contains("\"points\": 12"));
  CHECK_THAT(read(dir / "g.xml"), Catch::Contains("<testsuite") && Catch::Contains("failures=\"0\""));
  auto [code2, out2] = run("grade 99");
  CHECK(code2 == 2);
  CHECK_THAT(out2, Catch::Contains("no lab '99'"));
  auto [code_jobs, out_jobs] = run("grade 01 --jobs 2");  // several students at once: only for a batch
  CHECK(code_jobs == 2);
  CHECK_THAT(out_jobs, Catch::Contains("--jobs") && Catch::Contains("--submissions"));
  auto [code_jobs0, out_jobs0] = run("grade 01 --submissions " + dir.string() + " --jobs 0");
  CHECK(code_jobs0 != 0);
  CHECK_THAT(out_jobs0, Catch::Contains("--jobs"));
  auto [code3, out3] = run("lab show 01");
  CHECK(code3 == 0);
  CHECK_THAT(out3, Catch::Contains("Ring collectives") && Catch::Contains("all_reduce_bandwidth_optimal (2 points)"));
  // a broken grade record is reported, not a crash
  const fs::path record = fs::path(DISTLAB_SOURCE_DIR) / "build/labs/01-collectives/last_grade.json";
  const std::string saved = fs::exists(record) ? read(record) : "";
  std::ofstream(record) << "";
  auto [code4, out4] = run("lab list");
  CHECK(code4 == 0);
  CHECK_THAT(out4, Catch::Contains("01-collectives") && Catch::Contains("unreadable grade record"));
  std::ofstream(record) << R"({"last": {"points": 3, "max_points": 12}, "best": {"points": 12, "max_points": 12}})";
  auto [code5, out5] = run("lab list");
  CHECK_THAT(out5, Catch::Contains("last 3/12, best 12/12"));
  if (saved.empty()) fs::remove(record);
  else std::ofstream(record) << saved;
  fs::remove_all(dir);
}

// `distlab grade NN --check NAME`: a student working on one check runs it alone. Only the named checks run
// and count; nothing is recorded as a grade and the engine's answer stays for the whole lab's full marks; a
// name the lab has not is refused with the lab's checks. A class regraded on some checks says so in its CSV
// and feedback, writes the feedback to a folder of its own, and refuses an LMS's gradebook.
TEST_CASE("grade --check: only the named checks, no grade recorded, no engine's answer, unknown names refused, a class regraded on them but not for an LMS", "[grader][lab01]") {
  const std::string name = "distlab-check-" + std::to_string(getpid());
  const fs::path dir = fs::temp_directory_path() / name;
  fs::create_directories(dir);
  std::ofstream(dir / "ring.cpp") << read(fs::path(DISTLAB_SOURCE_DIR) / "solutions/01-collectives/ring.cpp");
  auto recorded = [&] {  // this copy's grade record (build/labs/01-collectives/src/<key>-<name>/)
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fs::path(DISTLAB_SOURCE_DIR) / "build/labs/01-collectives/src", ec))
      if (e.path().filename().string().ends_with(name) && fs::exists(e.path() / "last_grade.json")) return true;
    return false;
  };
  auto [code, out] = run("grade 01 --src " + dir.string() + " --check all_reduce_modeled_time --check partition_typo");
  CHECK(code == 2);  // a usage error
  CHECK_THAT(out, Catch::Contains("--check partition_typo") && Catch::Contains("all_reduce_bandwidth_optimal"));
  auto [code1, out1] = run("grade 01 --src " + dir.string() + " --check all_reduce_modeled_time --check all_gather_equals_builtin --json " +
                           (dir / "g.json").string());
  INFO(out1);
  CHECK(code1 == 0);
  CHECK_THAT(read(dir / "g.json"), Catch::Contains("\"partial\": true") && Catch::Contains("\"max_points\": 3") && !Catch::Contains("\"engine\""));
  CHECK_THAT(out1, Catch::Contains("total                                   3    3") && Catch::Contains("2 of the lab's checks; not recorded"));
  CHECK_THAT(out1, !Catch::Contains("reduce_scatter_equals_builtin") && !Catch::Contains("Full marks"));
  CHECK_FALSE(recorded());
  auto [code2, out2] = run("grade 01 --src " + dir.string());
  CHECK(code2 == 0);
  CHECK_THAT(out2, Catch::Contains("Full marks"));
  CHECK(recorded());
  // a class regraded on the checks an instructor names: its CSV holds them only, their points the max
  fs::create_directories(dir / "subs" / "alice");
  std::ofstream(dir / "subs" / "alice" / "ring.cpp") << read(fs::path(DISTLAB_SOURCE_DIR) / "solutions/01-collectives/ring.cpp");
  auto [code3, out3] = run("grade 01 --submissions " + (dir / "subs").string() + " --check all_gather_equals_builtin --csv " + (dir / "c.csv").string());
  INFO(out3);
  CHECK(code3 == 0);
  CHECK_THAT(out3, Catch::Contains("--check: 1 of the lab's checks, 2 of its points"));
  const std::string csv = read(dir / "c.csv");
  CHECK_THAT(csv, Catch::Contains(",all_gather_equals_builtin,points,max,") && !Catch::Contains("all_reduce_equals_builtin"));
  CHECK_THAT(csv, Catch::Contains(",2,2,2,100.0,") && Catch::Contains("01-collectives (--check: 1 of its checks)"));
  CHECK_THAT(read(dir / "feedback-check" / "alice.txt"), !Catch::Contains("Full marks") && Catch::Contains("(--check: 1 of the lab's checks"));
  CHECK_FALSE(fs::exists(dir / "feedback"));  // a whole grading's feedback folder is never the regrade's
  std::ofstream(dir / "roster.csv") << "folder,id,name,email\nalice,1,Alice,a@example.org\n";
  auto [code4, out4] = run("grade 01 --submissions " + (dir / "subs").string() + " --check all_gather_equals_builtin --roster " + (dir / "roster.csv").string() +
                           " --csv " + (dir / "c.csv").string());
  CHECK(code4 == 2);  // an LMS's gradebook takes whole gradings
  CHECK_THAT(out4, Catch::Contains("take whole gradings"));
  CHECK_THAT(read(dir / "c.csv"), Catch::Contains(",2,2,2,100.0,"));  // the earlier CSV kept
  fs::remove_all(dir);
}

TEST_CASE("lab 02: solution, skeleton, the course's pitfalls and hostile submissions", "[grader][lab02]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/02-ddp-cifar/ddp.cpp");
  const std::string table = "extern \"C\" Lab02Plugin distlab_lab02 = {kLab02Abi, nullptr, lab02::sampler_indices, lab02::average_gradients, lab02::make_bucketed};";
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs02-" + std::to_string(getpid()));
  std::map<std::string, std::string> files = {
      {"John Smith; touch pwned", solution},  // a folder name is never run by a shell
      // two more correct DDPs, written apart from the reference (tests/solutions_alt/): a sampler by modulo,
      // sum then x 1/N, buckets started in order; and PyTorch's padded list, one flat buffer, buckets rebuilt
      // in the order backward made their gradients ready and started as soon as each is full
      {"alt_staged_inorder", read(src / "tests/solutions_alt/02-staged_inorder.cpp")},
      {"alt_flat_rebuild", read(src / "tests/solutions_alt/02-flat_rebuild.cpp")},
      {"skeleton", read(src / "labs/02-ddp-cifar/student/ddp.cpp")},
      // a global constructor that prints a forged verdict and exits before anything runs
      {"forged_exit", "#include <cstdio>\n#include <unistd.h>\n" + read(src / "labs/02-ddp-cifar/student/ddp.cpp") +
                          "\nstatic int forged = [] { std::puts(\"13/13 pass\"); std::fflush(stdout); _exit(0); return 0; }();\n"},
      // the engine's DDP behind empty entries: "not implemented", never the engine's own
      {"null_hooks", replace(solution, table, "extern \"C\" Lab02Plugin distlab_lab02 = {kLab02Abi, nullptr, nullptr, nullptr, nullptr};")},
      {"sum_not_average", replace(solution, "    for (int64_t i = 0; i < g.numel; i++) g.data[i] /= float(comm.size());\n", "")},
      // the average as a half: right on 2 ranks, wrong on any other number
      {"halved_not_averaged", replace(solution, "    for (int64_t i = 0; i < g.numel; i++) g.data[i] /= float(comm.size());\n",
                                      "    for (int64_t i = 0; i < g.numel; i++) g.data[i] *= 0.5f;\n")},
      // an epoch cut short where the data set is the training run's (the sampler checks ask for n <= 1000): 10
      // steps of 64 a rank cover every job, and the epoch of 10 steps made the modeled speed-up 6x
      {"short_epoch_sampler", replace(solution, "  return mine;\n  /// END SOLUTION", "  if (n > 1000) mine.resize(std::min<size_t>(mine.size(), 640));\n  return mine;\n  /// END SOLUTION")},
      {"bucketed_sum", replace(solution, "int64_t(b.flat.size()), ReduceOp::avg);", "int64_t(b.flat.size()), ReduceOp::sum);")},
      {"bucketed_no_copy_back", replace(solution, "        std::memcpy(grads_[size_t(i)].data, b.flat.data() + off, size_t(grads_[size_t(i)].numel) * 4);\n", "")},
      {"forward_buckets", replace(solution, "for (size_t k = grads.size(); k-- > 0;) {", "for (size_t k = 0; k < grads.size(); k++) {")},
      // a bucket all-reduced as soon as its first gradient is ready: at bucket_mb 0.2 a bucket spans layers
      {"bucket_before_ready", replace(solution, "buckets_[next_].ready == buckets_[next_].members.size()", "buckets_[next_].ready > 0")},
      // one all_reduce per bucket, in the right number and at the right times, of one float each: the count
      // and the overlap of real buckets, and gradients never averaged
      {"decoy_buckets", replace(solution, "int64_t(b.flat.size()), ReduceOp::avg);", "1, ReduceOp::avg);")},
      // no no_sync: every micro-step of accumulation all-reduces. The sums come out right (the averages of the
      // partial sums add up to the average of the whole), so only the bytes show it: 4x per optimizer step
      {"syncs_every_micro_step", replace(replace(solution, "    if (!sync_) return;\n", ""),
                                         "    if (!sync_) return;  // the local sums stay as backward left them\n", "")},
  };
  // no_sampler and no_set_epoch are lab 08's cases: its test grades them with these checks
  const Only only = {  // the mutants graded on the checks their assertions below read
      {"bucket_before_ready", {"bucketed_allreduces", "curve_matches_one_rank"}},
      {"bucketed_no_copy_back", {"curve_matches_one_rank", "params_equal_across_ranks"}},
      {"bucketed_sum", {"curve_matches_one_rank"}},
      {"decoy_buckets", {"bucketed_allreduces", "bucketed_overlap", "curve_matches_one_rank"}},
      {"forward_buckets", {"bucketed_overlap", "curve_matches_one_rank"}},
      {"halved_not_averaged", {"curve_matches_one_rank"}},
      {"short_epoch_sampler", {"curve_matches_one_rank", "modeled_speedup_t4", "sampler_disjoint_covering"}},
      {"sum_not_average", {"curve_matches_one_rank", "sampler_disjoint_covering"}},
      {"syncs_every_micro_step", {"curve_matches_one_rank", "no_sync_accumulation"}},
  };
  auto rows = grade_batch("02", subs, files, "ddp.cpp", nullptr, "", only);
  CHECK(rows["halved_not_averaged"].points["curve_matches_one_rank"] == 0);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "halved_not_averaged.txt"), Catch::Contains("not on 4"));
  CHECK(rows["short_epoch_sampler"].points["sampler_disjoint_covering"] == 2);
  CHECK(rows["short_epoch_sampler"].points["modeled_speedup_t4"] == 0);
  CHECK(rows["short_epoch_sampler"].points["curve_matches_one_rank"] == 0);  // the trainer refuses the sampler
  CHECK(rows["John Smith; touch pwned"].total == 15);
  CHECK(rows["alt_staged_inorder"].total == 15);
  CHECK(rows["alt_flat_rebuild"].total == 15);
  CHECK(rows["syncs_every_micro_step"].points["no_sync_accumulation"] == 0);
  CHECK(rows["syncs_every_micro_step"].points["curve_matches_one_rank"] == 3);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "syncs_every_micro_step.txt"), Catch::Contains("4.0x the bytes"));
  CHECK(!fs::exists(fs::path(DISTLAB_SOURCE_DIR) / "pwned"));
  CHECK(!fs::exists("pwned"));
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["null_hooks"].total == 0);
  CHECK(rows["forged_exit"].total == 0);
  CHECK(rows["sum_not_average"].points["curve_matches_one_rank"] == 0);
  CHECK(rows["sum_not_average"].points["sampler_disjoint_covering"] == 2);
  CHECK(rows["bucketed_sum"].points["curve_matches_one_rank"] == 0);
  CHECK(rows["bucketed_no_copy_back"].points["curve_matches_one_rank"] == 0);
  CHECK(rows["bucketed_no_copy_back"].points["params_equal_across_ranks"] == 0);
  CHECK(rows["forward_buckets"].points["bucketed_overlap"] == 0);
  CHECK(rows["forward_buckets"].points["curve_matches_one_rank"] == 3);
  CHECK(rows["bucket_before_ready"].points["curve_matches_one_rank"] == 3);  // at bucket_mb 0.05 no bucket spans layers
  CHECK(rows["bucket_before_ready"].points["bucketed_allreduces"] == 0);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "bucket_before_ready.txt"), Catch::Contains("loss became nan") || Catch::Contains("the loss is NaN"));
  CHECK(rows["decoy_buckets"].points["bucketed_allreduces"] == 0);
  CHECK(rows["decoy_buckets"].points["bucketed_overlap"] == 0);
  CHECK(rows["decoy_buckets"].points["curve_matches_one_rank"] == 0);
  fs::remove_all(subs);
}

TEST_CASE("a lab's config runs the student's code, and an unbuilt or unfinished one says what to do", "[grader][lab02]") {
  const std::string plugin = std::string(DISTLAB_SOURCE_DIR) + "/build-missing/none.so";
  auto [c1, o1] = run("train labs/02-ddp-cifar/lab.toml --set lab.plugin=" + plugin);
  CHECK(c1 == 1);
  CHECK_THAT(o1, Catch::Contains("not built") && Catch::Contains("distlab lab build 02"));
  // the untouched skeleton, built: its stub names the task
  auto [c2, o2] = run("lab build 02");
  REQUIRE(c2 == 0);
  auto [c3, o3] = run("run -n 2 --master-port 0 --grace 2 train labs/02-ddp-cifar/lab.toml --set train.steps=2");
  CHECK(c3 == 1);
  CHECK_THAT(o3, Catch::Contains("02-ddp-cifar: sampler_indices is not implemented yet"));
  // lab 03: the skeleton names its first task; the solution trains in fp16 with its own loss scale
  auto [c4, o4] = run("lab build 03");
  REQUIRE(c4 == 0);
  auto [c5, o5] = run("train labs/03-amp-accum/lab.toml --set train.steps=2");
  CHECK(c5 == 1);
  CHECK_THAT(o5, Catch::Contains("03-amp-accum: scaler_init is not implemented yet"));
  auto [c6, o6] = run("lab build 03 --solution");
  REQUIRE(c6 == 0);
  auto [c7, o7] = run("train labs/03-amp-accum/lab.toml --set train.steps=3 --set train.log_every=1 --set lab.plugin=" +
                      std::string(DISTLAB_SOURCE_DIR) + "/build/labs/03-amp-accum/solution.so");
  CHECK(c7 == 0);
  CHECK_THAT(o7, Catch::Contains("loss scale 65536 (0 skipped)") && Catch::Contains("precision fp16"));
  // on 2 ranks the student's train_step runs beside the engine's DDP (a plugin serves only its own lab's calls)
  auto [c9, o9] = run("run -n 2 --master-port 0 --grace 2 train labs/03-amp-accum/lab.toml --set train.steps=2 --set train.log_every=1 "
                      "--set parallel.strategy=ddp --set lab.plugin=" + std::string(DISTLAB_SOURCE_DIR) + "/build/labs/03-amp-accum/solution.so");
  CHECK(c9 == 0);
  CHECK_THAT(o9, Catch::Contains("strategy ddp (bucketed)") && Catch::Contains("loss scale 65536"));
  // lab 02's API exchanges f32 gradients: a 16-bit run of it is refused with the reason
  auto [c8, o8] = run("run -n 2 --master-port 0 --grace 2 train labs/02-ddp-cifar/lab.toml --set train.steps=2 --set precision.mode=bf16");
  CHECK(c8 == 1);
  CHECK_THAT(o8, Catch::Contains("exchanges f32 gradients"));
  // lab 06 needs a split model (tp or pp > 1), real numbers and its own 1F1B; the engine's GPipe runs without it
  auto [c10, o10] = run("lab build 06 --solution");
  REQUIRE(c10 == 0);
  const std::string lab06 = "train labs/06-tp-pp/lab.toml --set train.steps=1 --set lab.plugin=" + std::string(DISTLAB_SOURCE_DIR) +
                            "/build/labs/06-tp-pp/solution.so ";
  auto [c11, o11] = run(lab06 + "--set parallel.tp=1");
  CHECK(c11 == 1);
  CHECK_THAT(o11, Catch::Contains("none of the lab's code would run") && Catch::Contains("parallel.tp"));
  auto [c12, o12] = run("run -n 2 --master-port 0 --grace 2 " + lab06 + "--set parallel.tp=1 --set parallel.pp=2 --set parallel.schedule=gpipe");
  CHECK(c12 == 1);
  CHECK_THAT(o12, Catch::Contains("the lab's schedule is 1F1B"));
  auto [c13, o13] = run("run -n 2 --master-port 0 --grace 2 " + lab06 + "--set parallel.tp=1 --set parallel.pp=2 --set train.log_every=1");
  CHECK(c13 == 0);
  CHECK_THAT(o13, Catch::Contains("this stage runs the lab's train_step_1f1b"));
}

// Lab 02's speed-up, measured: an epoch on 2 ranks against 1, the reference solution's DDP timed beside the
// student's in the same grading. On 2 GPUs or more it is the default; here (--measure-speedup) cpu ranks are timed,
// whose figures a loaded 2-core machine moves too much to grade a correct DDP on, so only its printing is
// asserted for the solution. A DDP that loses 200 ms a step (a sleep: the cost model never sees it, the
// clock does) is under half the engine's speed-up on any machine.
TEST_CASE("lab 02's speed-up measured (--measure-speedup): 2 ranks against 1 and the reference's beside, the modeled figure shown, a slow DDP failed", "[grader][lab02]") {
  // each grading runs the checks it is about (--check): the speed-up, and for the DDP that goes quiet when timed its curve
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/02-ddp-cifar/ddp.cpp");
  const fs::path dir = fs::temp_directory_path() / ("distlab-speedup02-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "solution");
  fs::create_directories(dir / "slow");
  std::ofstream(dir / "solution" / "ddp.cpp") << solution;
  std::ofstream(dir / "slow" / "ddp.cpp") << "#include <unistd.h>\n" + replace(solution, "    if (!sync_) return;  // the local sums stay as backward left them\n",
                                                                             "    if (!sync_) return;  // the local sums stay as backward left them\n    usleep(200000);\n");
  // a DDP that stops communicating (and zeroes its gradients, so the replicas stay equal) past the 12th
  // backward of a run: only the timed run is that long, and it would look twice as fast
  fs::create_directories(dir / "quiet_when_timed");
  std::ofstream(dir / "quiet_when_timed" / "ddp.cpp")
      << replace(replace(replace(replace(solution, "    sync_ = sync;  // no_sync: nothing leaves this rank until the last micro-step\n",
                                         "    sync_ = sync;\n    static int steps = 0;\n    quiet_ = ++steps > 12;\n"),
                                 "    if (!sync_) return;\n    for (int i : ready)", "    if (!sync_ || quiet_) return;\n    for (int i : ready)"),
                         "    if (!sync_) return;  // the local sums stay as backward left them\n",
                         "    if (!sync_) return;\n    if (quiet_) {\n      for (auto& g : grads_) std::memset(g.data, 0, size_t(g.numel) * 4);\n      return;\n    }\n"),
                 "  bool sync_ = true;\n", "  bool sync_ = true, quiet_ = false;\n");
  {
    auto [code, out] = run_within(600, "grade 02 --src " + (dir / "solution").string() + " --measure-speedup --require-sandbox --seed 5 --check modeled_speedup_t4");
    INFO(out);
    CHECK_THAT(out, Catch::Contains("an epoch measured on cpu ranks: ") && Catch::Contains("(the reference's DDP: ") &&
                        Catch::Contains("an epoch modeled on two T4s: 1.8"));
    (void)code;
  }
  {
    auto [code, out] = run_within(600, "grade 02 --src " + (dir / "slow").string() + " --measure-speedup --require-sandbox --seed 5 --hints always --check modeled_speedup_t4");
    INFO(out);
    CHECK(code != 0);
    CHECK_THAT(out, Catch::Contains("modeled_speedup_t4                      0") && Catch::Contains("an epoch measured on cpu ranks: ") &&
                        Catch::Contains("your step is slower than the reference's"));
  }
  {
    auto [code, out] = run_within(600, "grade 02 --src " + (dir / "quiet_when_timed").string() +
                                           " --measure-speedup --require-sandbox --seed 5 --hints always --check modeled_speedup_t4 --check curve_matches_one_rank");
    INFO(out);
    CHECK(code != 0);
    CHECK_THAT(out, Catch::Contains("modeled_speedup_t4                      0") && Catch::Contains("the timed run trains as the reference's DDP"));
    CHECK_THAT(out, Catch::Contains("curve_matches_one_rank                  3"));
  }
  {  // without the flag, cpu ranks are modeled, and the reason is printed
    auto [code, out] = run_within(600, "grade 02 --src " + (dir / "solution").string() + " --require-sandbox --seed 5 --check modeled_speedup_t4");
    INFO(out);
    CHECK(code == 0);
    CHECK_THAT(out, Catch::Contains("not measured: cpu ranks share this machine's cores"));
  }
  fs::remove_all(dir);
}

TEST_CASE("lab 03: solution, skeleton, and the course's mixed precision and accumulation mistakes", "[grader][lab03]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/03-amp-accum/amp.cpp");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs03-" + std::to_string(getpid()));
  const std::string step_body = "  const bool overflow = unscale_(step.comm(), s, grads);\n  if (overflow) {\n    step.skip_step();\n  } else {\n"
                                "    clip_grad_norm(grads, step.max_norm());  // once, on the accumulated gradient\n    step.optimizer_step();\n  }\n";
  std::map<std::string, std::string> files = {
      {"solution", solution},
      // two more correct scalers, written apart from the reference (tests/solutions_alt/): unscaling in double
      // with std::isfinite and a max of flags; and a reciprocal in double, x - x != 0, a sum of counts,
      // PyTorch's norm of the per-tensor norms
      {"alt_double_isfinite", read(src / "tests/solutions_alt/03-double_isfinite.cpp")},
      {"alt_recip_selfsub", read(src / "tests/solutions_alt/03-recip_selfsub.cpp")},
      {"skeleton", read(src / "labs/03-amp-accum/student/amp.cpp")},
      // the scale never leaves 1: fp16 loses the small gradient
      {"no_scaling", replace(solution, "  s.scale = c.init_scale;", "  s.scale = 1.0f;")},
      // a scale written into the code: it rescues the underflow, and it is not the config's
      {"scale_hard_coded", replace(solution, "  s.scale = c.init_scale;", "  s.scale = 1 << 20;")},
      // clipping the scaled gradient: every step is clipped to max_norm, then divided by 65536
      {"clip_before_unscale", replace(solution, step_body,
                                      "  clip_grad_norm(grads, step.max_norm());\n  const bool overflow = unscale_(step.comm(), s, grads);\n"
                                      "  if (overflow) step.skip_step();\n  else step.optimizer_step();\n")},
      {"growth_never", replace(solution, "    if (std::isfinite(grown)) s.scale = grown;\n", "")},
      {"loss_not_divided_by_k", replace(solution, "s.scale / float(k))", "s.scale)")},
      // 1/k as the lab.toml's 1/4: right only when the grading draws k = 4
      {"quarter_not_one_over_k", replace(solution, "s.scale / float(k))", "s.scale * 0.25f)")},
      // clip_grad_norm without the + 1e-6: 3e-7 apart at a norm of 3, 8 % apart at a norm of 1e-5
      {"clip_without_epsilon", replace(solution, "    const float coef = float(max_norm / (norm + 1e-6));", "    const float coef = float(max_norm / norm);")},
      // a correct scaler that train_step never uses: no scale, no unscale, no skip
      {"scaler_unused_in_step",
       replace_body(solution, "void train_step(Step& step, const ScalerConfig& c, ScalerState& s)",
                    "  const int k = step.accum_steps();\n  for (int micro = 0; micro < k; micro++) step.forward_backward(micro, 1.0f / float(k));\n"
                    "  std::vector<Grad>& grads = step.grads();\n  clip_grad_norm(grads, step.max_norm());\n  step.optimizer_step();\n"
                    "  step.scheduler_step();")},
      // a global constructor that prints a forged verdict and exits before anything runs
      {"forged_exit", "#include <cstdio>\n#include <unistd.h>\n" + read(src / "labs/03-amp-accum/student/amp.cpp") +
                          "\nstatic int forged = [] { std::puts(\"15/15 pass\"); std::fflush(stdout); _exit(0); return 0; }();\n"},
      // answers from a table instead of the work: unscale_ replays the old check's found-inf pattern without
      // an all_reduce, and train_step skips the old scenario's first four steps without looking for an inf
      {"table_of_answers",
       replace(replace(solution, "  comm.all_reduce(&found, 1, ReduceOp::max);\n  return found != 0;",
                       "  static int calls = 0;\n  (void)found;\n  return calls++ % 3 != 0;"),
               "  const bool overflow = unscale_(step.comm(), s, grads);\n",
               "  static int steps = 0;\n  for (auto& g : grads)\n    for (int64_t i = 0; i < g.numel; i++) g.data[i] /= s.scale;\n"
               "  const bool overflow = steps++ < 4;\n")},
      // unscale_ asks for an all_reduce of 256 MiB (the most a message may be): the grader, outside every
      // cgroup, refuses the message by its length before it allocates for it; so does the trainer
      {"floods_the_grader", replace(solution, "  comm.all_reduce(&found, 1, ReduceOp::max);\n",
                                    "  comm.all_reduce(&found, 1, ReduceOp::max);\n  static std::vector<float> flood(size_t(64) << 20);\n"
                                    "  comm.all_reduce(flood.data(), int64_t(flood.size()), ReduceOp::max);\n")},
  };
  // skip_not_synchronised and scheduler_per_micro_step are lab 08's cases: its test grades them with these checks
  // seed 3 draws a start at 2^27.1 backed off by 0.456: 8 overflowing steps first (measured), not the table's 4
  const Only only = {  // the mutants graded on the checks their assertions below read
      {"clip_before_unscale", {"fp16_tracks_fp32", "scale_sequence"}},
      {"clip_without_epsilon", {"accumulation_equals_big_batch", "clip_grad_norm"}},
      {"floods_the_grader", {"overflow_skipped_on_every_rank", "scaler_drives_the_step"}},
      {"growth_never", {"accumulation_equals_big_batch", "scale_sequence", "scaler_drives_the_step"}},
      {"loss_not_divided_by_k", {"accumulation_equals_big_batch", "scale_sequence", "scaler_drives_the_step"}},
      {"no_scaling", {"clip_grad_norm", "scaler_drives_the_step", "scaler_rescues_underflow"}},
      {"quarter_not_one_over_k", {"accumulation_equals_big_batch"}},
      {"scale_hard_coded", {"scaler_rescues_underflow"}},
      {"scaler_unused_in_step", {"scale_sequence", "scaler_drives_the_step"}},
      {"table_of_answers", {"overflow_skipped_on_every_rank", "scaler_drives_the_step"}},
  };
  auto rows = grade_batch("03", subs, files, "amp.cpp", nullptr, "--seed 3", only);
  CHECK(rows["solution"].total == 15);
  CHECK(rows["alt_double_isfinite"].total == 15);
  CHECK(rows["alt_recip_selfsub"].total == 15);
  CHECK(rows["table_of_answers"].points["overflow_skipped_on_every_rank"] == 0);
  CHECK(rows["table_of_answers"].points["scaler_drives_the_step"] == 0);
  CHECK(rows["floods_the_grader"].points["overflow_skipped_on_every_rank"] == 0);
  CHECK(rows["floods_the_grader"].points["scaler_drives_the_step"] == 0);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "floods_the_grader.txt"), Catch::Contains("over the limit of"));
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["forged_exit"].total == 0);
  CHECK(rows["scaler_unused_in_step"].points["scaler_drives_the_step"] == 0);
  CHECK(rows["scaler_unused_in_step"].points["scale_sequence"] == 2);
  CHECK(rows["no_scaling"].points["scaler_drives_the_step"] == 0);
  CHECK(rows["growth_never"].points["scaler_drives_the_step"] == 0);
  CHECK(rows["loss_not_divided_by_k"].points["scaler_drives_the_step"] == 0);
  CHECK(rows["no_scaling"].points["scaler_rescues_underflow"] == 0);
  CHECK(rows["no_scaling"].points["clip_grad_norm"] == 1);
  CHECK(rows["clip_before_unscale"].points["fp16_tracks_fp32"] == 0);
  CHECK(rows["clip_before_unscale"].points["scale_sequence"] == 2);
  CHECK(rows["growth_never"].points["scale_sequence"] == 0);
  CHECK(rows["growth_never"].points["accumulation_equals_big_batch"] == 3);
  CHECK(rows["loss_not_divided_by_k"].points["accumulation_equals_big_batch"] == 0);
  CHECK(rows["quarter_not_one_over_k"].points["accumulation_equals_big_batch"] == 0);  // --seed 3 draws k = 8
  CHECK(rows["scale_hard_coded"].points["scaler_rescues_underflow"] == 0);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "scale_hard_coded.txt"), Catch::Contains("starts at scale"));
  CHECK(rows["clip_without_epsilon"].points["clip_grad_norm"] == 0);
  CHECK(rows["clip_without_epsilon"].points["accumulation_equals_big_batch"] == 3);
  CHECK(rows["loss_not_divided_by_k"].points["scale_sequence"] == 2);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "clip_before_unscale.txt"), Catch::Contains("unscale BEFORE clipping"));
  fs::remove_all(subs);
}

TEST_CASE("lab 04: solution, skeleton, and the ZeRO and AdamW mistakes: whole optimizer, misaligned shards, no all-gather, all-reduce, a blocking ZeRO-2, no bias correction, L2, state kept elsewhere, a local norm", "[grader][lab04]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/04-zero/zero.cpp");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs04-" + std::to_string(getpid()));
  const std::string reduce = "  p.handle = comm.reduce_scatter_async(g.data(), p.part.data(), s.end - s.begin, ReduceOp::avg);\n";
  const std::string keep = "  step.keep_grad(p.flat, p.begin, p.part.data(), int64_t(p.part.size()));\n";
  const std::string gather = "    comm.all_gather(master, whole.data(), n);  // the other half of DDP's all-reduce: every rank's new part\n"
                             "    step.set_weights(f, 0, whole.data(), s.padded);\n";
  const std::string my_part = "    const Shard s = shard_of(step.numel(f), comm.rank(), comm.size());\n    const int64_t n = s.end - s.begin;\n";
  std::map<std::string, std::string> files = {
      {"solution", solution},
      {"skeleton", read(src / "labs/04-zero/student/zero.cpp")},
      // DDP in disguise: every rank averages the whole gradient and steps the whole flat with whole state. It
      // trains exactly as DDP (each rank's norm is the whole gradient's), moves DDP's bytes, and holds DDP's
      // 16 bytes per parameter
      {"whole_optimizer",
       replace(replace(replace(replace(solution, "    comm.all_reduce(&sq, 1, ReduceOp::sum);\n", ""), reduce,
                               "  comm.all_reduce(g.data(), s.padded, ReduceOp::avg);\n  p.begin = 0;\n  p.part = g;\n"),
                       my_part, "    Shard s = shard_of(step.numel(f), comm.rank(), comm.size());\n    s.begin = 0, s.end = s.padded;\n"
                                "    const int64_t n = s.end - s.begin;\n"),
               gather, "    step.set_weights(f, 0, master, s.padded);\n")},
      // rank r > 0 keeps its part one element early: every part but rank 0's lands on its neighbour's weights
      {"misaligned_by_one", replace(solution, "  s.begin = int64_t(rank) * part;\n", "  s.begin = int64_t(rank) * part - (rank > 0 ? 1 : 0);\n")},
      // each rank writes back only the part it stepped: the replicas split at the first step
      {"no_all_gather", replace(solution, gather, "    step.set_weights(f, s.begin, master, n);\n")},
      // ZeRO's naive form: all-reduce the whole gradient, keep the slice. Right numbers, right memory, 1.5x the bytes
      {"all_reduce_then_slice",
       replace(solution, reduce, "  comm.all_reduce(g.data(), s.padded, ReduceOp::avg);\n"
                                 "  std::copy(g.begin() + s.begin, g.begin() + s.end, p.part.begin());\n")},
      // ZeRO-2 that waits for each reduction where it starts: right numbers and bytes, nothing overlapped
      {"zero2_blocking", replace(solution, "  in_flight.push_back(start_reduce(step, flat));  // (moving a Reduction keeps its part's buffer, where the wait writes)\n",
                                 "  Reduction p = start_reduce(step, flat);\n  finish_reduce(step, p);\n")},
      // ZeRO-2 overlapped without release_grad: the trainer holds the whole gradient of the unit in flight
      // until its part is kept — one unit more than the engine's working set, a correct design all the same
      {"zero2_no_release", replace(solution, "  step.release_grad(flat);           // copied: the trainer's whole gradient can go now, before the part is kept\n", "")},
      // ... and two units in flight, neither released: two whole gradients beyond the engine's
      {"zero2_holds_two", replace_body(replace(solution, "  step.release_grad(flat);           // copied: the trainer's whole gradient can go now, before the part is kept\n", ""),
                                       "void zero2_reduce(Step& step, int flat)",
                                       "  in_flight.push_back(start_reduce(step, flat));\n"
                                       "  std::vector<int> units;\n"
                                       "  for (const Reduction& p : in_flight)\n"
                                       "    if (units.empty() || units.back() != step.unit(p.flat)) units.push_back(step.unit(p.flat));\n"
                                       "  if (units.size() > 3) {\n"
                                       "    for (Reduction& p : in_flight)\n"
                                       "      if (step.unit(p.flat) == units.front()) finish_reduce(step, p);\n"
                                       "    in_flight.erase(std::remove_if(in_flight.begin(), in_flight.end(), [](const Reduction& p) { return p.flat < 0; }), in_flight.end());\n"
                                       "  }")},
      // the memory checks' bf16 runs recognised by their 8 blocks: there nothing is stepped or gathered (the state
      // buffers taken all the same), so the replicas stay equal and the trainers count ZeRO's very bytes
      {"memory_runs_step_nothing",
       replace(replace(solution, "void zero_step(Step& step) {\n",
                       "static bool measured(Step& step) {\n  for (int f = 0; f < step.num_flats(); f++)\n"
                       "    if (step.name(f).find(\"h.7.\") != std::string::npos) return true;\n  return false;\n}\n\nvoid zero_step(Step& step) {\n"),
               "    adamw_step(h, step.decay(f), scale, master, m, v, grads[size_t(f)].data(), n);\n",
               "    if (measured(step)) continue;\n    adamw_step(h, step.decay(f), scale, master, m, v, grads[size_t(f)].data(), n);\n")},
      // a ZeRO-2 that waits for each reduction where it starts, and on 2 ranks keeps its own unaveraged slice with
      // no reduction at all until the last step (the one whose bytes are read): the traced step 2 shows nothing exposed
      {"zero2_reduces_only_last_step",
       replace(replace(replace(solution, "void zero2_reduce(Step& step, int flat) {\n", "static int steps_done = 0;\n\nvoid zero2_reduce(Step& step, int flat) {\n"),
                       "  in_flight.push_back(start_reduce(step, flat));  // (moving a Reduction keeps its part's buffer, where the wait writes)\n",
                       "  if (step.comm().size() == 2 && steps_done < 5) {\n"
                       "    const Shard s = shard_of(step.numel(flat), step.comm().rank(), step.comm().size());\n"
                       "    std::vector<float> g = step.grad(flat);\n    g.resize(size_t(s.padded), 0.0f);\n"
                       "    step.keep_grad(flat, s.begin, g.data() + s.begin, s.end - s.begin);\n    return;\n  }\n"
                       "  Reduction p = start_reduce(step, flat);\n  finish_reduce(step, p);\n"),
               "  finish_all(step);  // the last unit's: before the step reads the parts\n",
               "  finish_all(step);  // the last unit's: before the step reads the parts\n  steps_done++;\n")},
      // no f32 master: the step starts from the model's bf16 weights every time (a "master" buffer taken, and
      // written each step, but never read back): right in fp32, where the two are the same numbers
      {"no_master_weights", replace(solution, "    if (h.t == 1) {  // the master starts from the weights as they are (the padding stays 0)\n",
                                    "    if (true) {  // the step starts from the bf16 weights every time\n")},
      // ZeRO-2 whose reductions all stay in flight until backward ends (waited for in zero2_finish): right numbers,
      // whole gradients released at once, but every unit's padded gradient held by its collective in the trainer
      {"zero2_waits_at_end", replace(solution, "  if (!in_flight.empty() && step.unit(in_flight.front().flat) != step.unit(flat))\n"
                                               "    finish_all(step);  // the previous unit's, which ran during this unit's backward\n", "")},
      // a forged verdict from a global constructor
      {"forged_exit", "#include <cstdio>\n#include <unistd.h>\n" + read(src / "labs/04-zero/student/zero.cpp") +
                          "\nstatic int forged = [] { std::puts(\"13/13 pass\"); std::fflush(stdout); _exit(0); return 0; }();\n"},
      // nothing kept, junk of DDP's size all-reduced, nothing stepped or gathered: DDP's bytes, tiny memory, no training
      {"empty_parts", replace(replace(replace(solution, reduce, "  comm.all_reduce(g.data(), s.padded, ReduceOp::avg);\n  p.part.clear();\n"),
                                      my_part, "    const Shard s = shard_of(step.numel(f), comm.rank(), comm.size());\n    const int64_t n = 0;\n"),
                              gather, "    (void)whole;\n")},
      // the last rank keeps its neighbour's part too, and steps it: it trains as DDP, and that rank holds twice the state
      {"last_rank_hoards",
       replace(replace(replace(solution, keep,
                               "  Comm& comm = step.comm();\n  const int64_t n = int64_t(p.part.size());\n"
                               "  std::vector<float> all(size_t(n * comm.size()));\n  comm.all_gather(p.part.data(), all.data(), n);\n"
                               "  if (comm.size() > 1 && comm.rank() == comm.size() - 1) step.keep_grad(p.flat, p.begin - n, all.data() + p.begin - n, 2 * n);\n"
                               "  else step.keep_grad(p.flat, p.begin, p.part.data(), n);\n"),
                       my_part, "    Shard s = shard_of(step.numel(f), comm.rank(), comm.size());\n    const int64_t mine = s.end - s.begin;\n"
                                "    const bool hoard = comm.size() > 1 && comm.rank() == comm.size() - 1;\n    if (hoard) s.begin -= mine;\n"
                                "    const int64_t n = s.end - s.begin;\n"),
               gather, "    comm.all_gather(master + (hoard ? mine : 0), whole.data(), mine);\n    step.set_weights(f, 0, whole.data(), s.padded);\n")},
      // offsets chosen so that begin + n wraps in the trainer (the root process outside the sandbox): the
      // write lands before the flat's buffer, or the read after keep_grad hands the trainer's heap over
      {"set_weights_wraps", replace(solution, "  const AdamW& h = step.hyper();\n",
                                    "  const AdamW& h = step.hyper();\n  { std::vector<float> junk(16, 1.0f);\n"
                                    "    step.set_weights(0, INT64_MAX - 15, junk.data(), 16); }\n")},
      {"keep_grad_wraps", replace(solution, keep, "  std::vector<float> big(16384, 0.0f);\n  step.keep_grad(p.flat, INT64_MAX - 15, big.data(), 16384);\n")},
      // a reduce_scatter written straight onto the socket, past the host's checks: n·world wraps to 64 bytes
      {"raw_reduce_scatter", "#include <unistd.h>\n#include <cstring>\n" +
                                 replace(solution, reduce,
                                         "  struct { uint32_t op, reserved; uint64_t bytes; int64_t arg[8]; } f{};\n"
                                         "  f.op = 24; f.bytes = 64; f.arg[0] = 1; f.arg[1] = (int64_t(1) << 62) + 16;\n"
                                         "  char payload[64] = {};\n"
                                         "  if (write(3, &f, sizeof f) != sizeof f || write(3, payload, 64) != 64) _exit(9);\n"
                                         "  char answer[80];\n  if (read(3, answer, 80) <= 0) _exit(9);\n")},
      // Adam's moments without their bias correction: the first steps are ~3x too large
      {"no_bias_correction",
       replace(solution, "  const double bc1 = 1.0 - std::pow(double(h.beta1), double(h.t)), bc2 = 1.0 - std::pow(double(h.beta2), double(h.t));\n",
               "  const double bc1 = 1.0, bc2 = 1.0;\n")},
      // Adam with L2: the decay goes through the gradient (and so through the moments) instead of the weights
      {"l2_not_decoupled", replace(replace(solution, "    const float gi = g[i] * grad_scale;\n",
                                           "    const float gi = g[i] * grad_scale + (decay ? h.weight_decay * w[i] : 0.0f);\n"),
                                   "    w[i] *= shrink;\n", "")},
      // the cheat: the moments in the plugin's own memory, where the trainer can't count them, and state
      // buffers of the right size that hold nothing. Right numbers, right bytes, right memory as counted
      {"state_kept_elsewhere",
       replace(replace(solution, "    float* m = step.state(f, \"exp_avg\", n);\n    float* v = step.state(f, \"exp_avg_sq\", n);\n",
                       "    static std::map<int, std::vector<float>> mine_m, mine_v;\n"
                       "    (void)step.state(f, \"exp_avg\", n);\n    (void)step.state(f, \"exp_avg_sq\", n);\n"
                       "    mine_m[f].resize(size_t(n)), mine_v[f].resize(size_t(n));\n"
                       "    float* m = mine_m[f].data();\n    float* v = mine_v[f].data();\n"),
               "#include <algorithm>\n", "#include <algorithm>\n#include <map>\n")},
      // each rank clips by the norm of its own parts: the global norm needs every rank's squares
      {"local_norm", replace(solution, "    comm.all_reduce(&sq, 1, ReduceOp::sum);\n", "")},
      // the whole optimizer in the plugin's own memory (f32 master weights and both moments of every flat: 12
      // bytes per parameter, and the whole gradient), part-sized state buffers filled with this rank's slice of
      // it, and the averaged gradient parts all-gathered instead of the weights: DDP's bytes, the right moments
      // in the counted buffers, the right model state as the trainer counts it. Only the plugin's process shows it
      {"replicated_adamw", "#include <map>\n" + replace_body(solution, "void zero_step(Step& step)",
          "  static std::map<int, std::vector<float>> W, M, V;\n"
          "  Comm& comm = step.comm();\n  const AdamW& h = step.hyper();\n"
          "  std::vector<std::vector<float>> whole;\n  double sq = 0;\n"
          "  for (int f = 0; f < step.num_flats(); f++) {\n"
          "    const Shard s = shard_of(step.numel(f), comm.rank(), comm.size());\n"
          "    const std::vector<float> part = step.kept_grad(f);\n"
          "    std::vector<float> g(size_t(s.padded));\n"
          "    comm.all_gather(part.data(), g.data(), s.end - s.begin);\n"
          "    for (float x : g) sq += double(x) * x;\n"
          "    whole.push_back(std::move(g));\n  }\n"
          "  const float scale = h.max_norm > 0 ? std::min(1.0f, h.max_norm / (std::sqrt(float(sq)) + 1e-6f)) : 1.0f;\n"
          "  for (int f = 0; f < step.num_flats(); f++) {\n"
          "    const Shard s = shard_of(step.numel(f), comm.rank(), comm.size());\n"
          "    const int64_t n = s.end - s.begin;\n"
          "    std::vector<float>& w = W[f];\n    std::vector<float>& m = M[f];\n    std::vector<float>& v = V[f];\n"
          "    if (w.empty()) {\n      w = step.weights(f);\n      w.resize(size_t(s.padded), 0.0f);\n"
          "      m.assign(size_t(s.padded), 0.0f);\n      v.assign(size_t(s.padded), 0.0f);\n    }\n"
          "    adamw_step(h, step.decay(f), scale, w.data(), m.data(), v.data(), whole[size_t(f)].data(), s.padded);\n"
          "    float* sw = step.state(f, \"master\", n);\n    float* sm = step.state(f, \"exp_avg\", n);\n"
          "    float* sv = step.state(f, \"exp_avg_sq\", n);\n"
          "    std::copy(w.begin() + s.begin, w.begin() + s.end, sw);\n"
          "    std::copy(m.begin() + s.begin, m.begin() + s.end, sm);\n"
          "    std::copy(v.begin() + s.begin, v.begin() + s.end, sv);\n"
          "    step.set_weights(f, 0, w.data(), s.padded);\n  }")},
      // the same, buying room: a junk all-reduce of 4Ψ floats makes the socket's largest message huge (the
      // allowance is the design's messages, not the socket's)
      // the solution, and a copy of the whole model's weights kept in the plugin beside it (4 bytes per parameter)
      {"weights_copy_in_plugin", "#include <map>\n" + replace(solution, "    step.set_weights(f, 0, whole.data(), s.padded);\n",
          "    step.set_weights(f, 0, whole.data(), s.padded);\n"
          "    static std::map<int, std::vector<float>> copy;\n    copy[f] = whole;\n")},
      // two more correct AdamWs, written otherwise than the reference's float kernel: every check must pass them.
      // In double precision, from the float hyper-parameters as given (an element that is the difference of two
      // near numbers differs from the float kernel's far past 1e-6 of itself)
      {"adamw_in_double", replace_body(solution, "void adamw_step(const AdamW& h, bool decay, float grad_scale, float* w, float* m, float* v, const float* g, int64_t n)",
                                       "  const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, eps = h.eps;\n"
                                       "  const double bc1 = 1 - std::pow(b1, double(h.t)), bc2 = 1 - std::pow(b2, double(h.t));\n"
                                       "  for (int64_t i = 0; i < n; i++) {\n"
                                       "    const double gi = double(g[i]) * grad_scale;\n"
                                       "    double wi = w[i] * (decay ? 1 - lr * double(h.weight_decay) : 1.0);\n"
                                       "    const double mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;\n"
                                       "    wi -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);\n"
                                       "    w[i] = float(wi), m[i] = float(mi), v[i] = float(vi);\n  }")},
      // in float, in another order: the moments first, then one update holding both the decay and the step
      {"adamw_other_order", replace_body(solution, "void adamw_step(const AdamW& h, bool decay, float grad_scale, float* w, float* m, float* v, const float* g, int64_t n)",
                                         "  const float c1 = 1.0f / (1.0f - std::pow(h.beta1, float(h.t)));\n"
                                         "  const float c2 = 1.0f / std::sqrt(1.0f - std::pow(h.beta2, float(h.t)));\n"
                                         "  for (int64_t i = 0; i < n; i++) {\n"
                                         "    const float gi = grad_scale * g[i];\n"
                                         "    m[i] += (1.0f - h.beta1) * (gi - m[i]);\n"
                                         "    v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * (gi * gi);\n"
                                         "    const float step = m[i] * c1 / (std::sqrt(v[i]) * c2 + h.eps);\n"
                                         "    w[i] -= h.lr * ((decay ? h.weight_decay * w[i] : 0.0f) + step);\n  }")},
  };
  files["replicated_inflated"] = replace(files["replicated_adamw"], "  const float scale = h.max_norm",
                                         "  { std::vector<float> junk(2500000);  // 10 MB through the socket: before, 40 MB more room\n"
                                         "    comm.all_reduce(junk.data(), int64_t(junk.size()), ReduceOp::sum); }\n"
                                         "  const float scale = h.max_norm");
  const Only only = {  // the mutants graded on the checks their assertions below read
      {"all_reduce_then_slice", {"comm_equals_ddp", "zero1_equals_ddp", "zero1_memory"}},
      {"l2_not_decoupled", {"adamw", "partition", "zero1_equals_ddp"}},
      {"last_rank_hoards", {"zero1_equals_ddp", "zero1_memory", "zero2_memory"}},
      {"local_norm", {"zero1_equals_ddp", "zero2_equals_ddp"}},
      {"memory_runs_step_nothing", {"zero1_equals_ddp", "zero1_memory", "zero2_memory"}},
      {"misaligned_by_one", {"partition", "zero1_equals_ddp", "zero2_equals_ddp"}},
      {"no_all_gather", {"partition", "zero1_equals_ddp", "zero2_equals_ddp"}},
      {"no_bias_correction", {"adamw", "partition", "zero1_equals_ddp"}},
      {"no_master_weights", {"zero1_equals_ddp", "zero1_memory"}},
      {"replicated_adamw", {"comm_equals_ddp", "zero1_equals_ddp", "zero1_memory", "zero2_memory"}},
      {"replicated_inflated", {"comm_equals_ddp", "zero1_equals_ddp", "zero1_memory", "zero2_memory"}},
      {"weights_copy_in_plugin", {"comm_equals_ddp", "zero1_equals_ddp", "zero1_memory", "zero2_memory"}},
      {"whole_optimizer", {"comm_equals_ddp", "zero1_equals_ddp", "zero1_memory", "zero2_equals_ddp", "zero2_memory"}},
      {"zero2_blocking", {"zero2_equals_ddp", "zero2_overlaps"}},
      {"zero2_holds_two", {"zero2_memory", "zero2_overlaps"}},
      {"zero2_reduces_only_last_step", {"zero1_equals_ddp", "zero2_overlaps"}},
      {"zero2_waits_at_end", {"zero2_equals_ddp", "zero2_memory"}},
  };
  auto rows = grade_batch("04", subs, files, "zero.cpp", nullptr, "", only);
  CHECK(rows["solution"].total == 18);
  CHECK(rows["adamw_in_double"].total == 18);
  CHECK(rows["zero2_no_release"].total == 18);
  CHECK(rows["zero2_holds_two"].points["zero2_memory"] == 0);
  CHECK(rows["zero2_holds_two"].points["zero2_overlaps"] > 0);
  for (const std::string bad : {"replicated_adamw", "weights_copy_in_plugin", "replicated_inflated"}) {
    INFO(bad);
    CHECK(rows[bad].points["zero1_equals_ddp"] == 3);  // right numbers and counted state: only the plugin's memory tells
    CHECK(rows[bad].points["comm_equals_ddp"] == (bad == "replicated_inflated" ? 0 : 2));
    CHECK(rows[bad].points["zero1_memory"] == 0);
    CHECK(rows[bad].points["zero2_memory"] == 0);
    CHECK_THAT(read(subs.parent_path() / "feedback" / (bad + ".txt")), Catch::Contains("your plugin's own process"));
  }
  CHECK(rows["adamw_other_order"].total == 18);
  CHECK(rows["zero2_blocking"].points["zero2_overlaps"] == 0);
  CHECK(rows["no_master_weights"].points["zero1_equals_ddp"] == 3);  // fp32: the master is the weights
  CHECK(rows["no_master_weights"].points["zero1_memory"] == 0);  // bf16: the trainer reads the master back
  CHECK_THAT(read(subs.parent_path() / "feedback" / "no_master_weights.txt"), Catch::Contains("master"));
  CHECK(rows["memory_runs_step_nothing"].points["zero1_equals_ddp"] == 3);
  CHECK(rows["memory_runs_step_nothing"].points["zero1_memory"] == 0);
  CHECK(rows["memory_runs_step_nothing"].points["zero2_memory"] == 0);
  CHECK(rows["zero2_reduces_only_last_step"].points["zero2_overlaps"] == 0);
  CHECK(rows["zero2_reduces_only_last_step"].points["zero1_equals_ddp"] == 3);
  CHECK(rows["zero2_blocking"].points["zero2_equals_ddp"] == 2);
  CHECK(rows["zero2_waits_at_end"].points["zero2_equals_ddp"] == 2);
  CHECK(rows["zero2_waits_at_end"].points["zero2_memory"] == 0);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "zero2_waits_at_end.txt"), Catch::Contains("in flight"));
  CHECK_THAT(read(subs.parent_path() / "feedback" / "zero2_blocking.txt"), Catch::Contains("exposed"));
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["forged_exit"].total == 0);
  CHECK(rows["empty_parts"].total == 5);  // the partition and AdamW only: bytes and memory count for a ZeRO that trains
  CHECK(rows["last_rank_hoards"].points["zero1_equals_ddp"] == 3);
  CHECK(rows["last_rank_hoards"].points["zero1_memory"] == 0);  // measured on every rank, not on rank 0 alone
  CHECK(rows["last_rank_hoards"].points["zero2_memory"] == 0);
  // the trainer refuses each with the numbers it was sent, and stays whole: no signal, no heap in a report
  for (const std::string bad : {"set_weights_wraps", "keep_grad_wraps", "raw_reduce_scatter"}) {
    INFO(bad);
    CHECK(rows[bad].total == 5);  // partition and adamw: direct calls, the only checks without a trainer
    CHECK_THAT(rows[bad].error, !Catch::Contains("signal") && !Catch::Contains("double free") && !Catch::Contains("corruption"));
  }
  const fs::path fb = subs.parent_path() / "feedback";
  CHECK_THAT(read(fb / "set_weights_wraps.txt"), Catch::Contains("is not inside flat 0's padded length"));
  CHECK_THAT(read(fb / "keep_grad_wraps.txt"), Catch::Contains("is not inside flat"));
  CHECK_THAT(read(fb / "raw_reduce_scatter.txt"), Catch::Contains("asked for a reduce_scatter of n = 4611686018427387920"));
  CHECK(rows["whole_optimizer"].points["zero1_equals_ddp"] == 3);
  CHECK(rows["whole_optimizer"].points["zero2_equals_ddp"] == 2);  // each rank's norm is the whole gradient's
  CHECK(rows["whole_optimizer"].points["comm_equals_ddp"] == 2);
  CHECK(rows["whole_optimizer"].points["zero1_memory"] == 0);
  CHECK(rows["whole_optimizer"].points["zero2_memory"] == 0);
  CHECK(rows["misaligned_by_one"].points["partition"] == 0);
  CHECK(rows["misaligned_by_one"].points["zero1_equals_ddp"] == 0);
  CHECK(rows["misaligned_by_one"].points["zero2_equals_ddp"] == 0);
  CHECK(rows["no_all_gather"].points["partition"] == 2);
  CHECK(rows["no_all_gather"].points["zero1_equals_ddp"] == 0);
  CHECK(rows["no_all_gather"].points["zero2_equals_ddp"] == 0);
  CHECK(rows["all_reduce_then_slice"].points["comm_equals_ddp"] == 0);
  CHECK(rows["all_reduce_then_slice"].points["zero1_equals_ddp"] == 3);
  CHECK(rows["all_reduce_then_slice"].points["zero1_memory"] == 2);
  for (const std::string bad : {"no_bias_correction", "l2_not_decoupled"}) {
    INFO(bad);
    CHECK(rows[bad].points["adamw"] == 0);
    CHECK(rows[bad].points["zero1_equals_ddp"] == 0);
    CHECK(rows[bad].points["partition"] == 2);
  }
  CHECK(rows["state_kept_elsewhere"].total == 5);  // every training job fails on its moments
  CHECK(rows["local_norm"].points["zero1_equals_ddp"] == 3);  // unclipped
  CHECK(rows["local_norm"].points["zero2_equals_ddp"] == 0);
  CHECK_THAT(read(fb / "whole_optimizer.txt"), Catch::Contains("every rank steps"));
  CHECK_THAT(read(fb / "no_all_gather.txt"), Catch::Contains("all_gather every rank's part"));
  CHECK_THAT(read(fb / "all_reduce_then_slice.txt"), Catch::Contains("1.5x"));
  CHECK_THAT(read(fb / "no_bias_correction.txt"), Catch::Contains("bias correction"));
  CHECK_THAT(read(fb / "l2_not_decoupled.txt"), Catch::Contains("decoupled"));
  CHECK_THAT(read(fb / "state_kept_elsewhere.txt"), Catch::Contains("AdamW's moment of the part this rank kept"));
  CHECK_THAT(read(fb / "local_norm.txt"), Catch::Contains("all-reduce the sum of squares"));
  fs::remove_all(subs);
}

TEST_CASE("lab 05: solution, skeleton, and the FSDP mistakes: freed late or never, a view after its free, no prefetch, a hard-coded order, a memory budget unused or exceeded, no padding, no no_sync, offload's way back", "[grader][lab05]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/05-fsdp-1b/fsdp.cpp");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs05-" + std::to_string(getpid()));
  std::map<std::string, std::string> files = {
      {"solution", solution},
      // two more correct FSDPs, written apart from the reference (tests/solutions_alt/): every collective in
      // one in-order queue whose entries act when waited for (a communication stream with events); and a
      // ledger per flat, views pointed at a buffer while its gather runs, waited for just before compute
      {"alt_comm_stream", read(src / "tests/solutions_alt/05-comm_stream.cpp")},
      {"alt_flat_ledger", read(src / "tests/solutions_alt/05-flat_ledger.cpp")},
      {"skeleton", read(src / "labs/05-fsdp-1b/student/fsdp.cpp")},
      // no no_sync: every micro-step's backward takes and reduce-scatters the gradients, the trainer refuses
      // the take on an accumulation micro-step (the 3-rank job runs two a step)
      {"reduces_every_micro_step", replace(replace(solution, "  if (o.sync) {  // no_sync micro-steps leave the layers' gradients to add up\n", "  {\n"),
                                           "  if (o.sync) finish_reductions(f, o);\n", "  finish_reductions(f, o);\n")},
      // every unit freed only when the whole backward is over: right numbers, and every parameter whole at
      // once (ZeRO-2's memory)
      {"frees_at_end", replace(replace(replace(solution, "  if (o.reshard_after_forward && unit != root) reshard(f, unit);\n", ""),
                                       "  reshard(f, unit);\n  /// END SOLUTION", "  /// END SOLUTION"),
                               "  if (o.sync) finish_reductions(f, o);\n",
                               "  if (o.sync) finish_reductions(f, o);\n  for (int u = 0; u < f.num_units(); u++) reshard(f, u);\n")},
      // never freed at all: the views outlive the optimizer's step, and the next forward would read stale weights
      {"never_frees", replace(replace(solution, "  if (o.reshard_after_forward && unit != root) reshard(f, unit);\n", ""),
                              "  reshard(f, unit);\n  /// END SOLUTION", "  /// END SOLUTION")},
      // the buffer freed, the unit still believed whole: its backward starts on views of a freed buffer
      {"view_after_free", replace(solution, "  u.flats.clear();\n  u.state = State::sharded;\n", "")},
      // every gather waited for on the spot: nothing overlaps
      {"no_prefetch", replace(solution, "  if (!o.prefetch) return;\n  if (o.gather_budget <= 0) {", "  return;\n  if (o.gather_budget <= 0) {")},
      // no collective at all where the model is the 1B GPT (the meta device: a buffer no gather filled computes
      // no wrong number there), and no prefetch either: nothing is ever exposed, whatever the order or the budget
      {"no_collectives_on_1b",
       replace_all(replace_all(replace_all(replace(replace(replace(solution, "  if (!o.prefetch) return;\n  if (o.gather_budget <= 0) {", "  return;\n  if (o.gather_budget <= 0) {"),
                                                    "    g.work = f.all_gather(mine, g.whole, g.layout.shard);\n",
                                                    "    g.work = big(f) ? 0 : f.all_gather(mine, g.whole, g.layout.shard);\n"),
                                            "      r.work = f.reduce_scatter(r.grad, r.part, l.shard);\n",
                                            "      r.work = big(f) ? 0 : f.reduce_scatter(r.grad, r.part, l.shard);\n"),
                                    "f.wait(g.work);", "if (g.work) f.wait(g.work);"),
                           "f.wait(r.work);", "if (r.work) f.wait(r.work);"),
                   "static std::vector<Reduction> reducing;\n",
                   "static std::vector<Reduction> reducing;\nstatic bool big(Fsdp& f) {\n  for (int u = 0; u < f.num_units(); u++)\n"
                   "    for (int fl : f.flats(u))\n      if (f.numels(fl).size() && f.numels(fl)[0] > 50000000) return true;\n  return false;\n}\n")},
      // a prefetch that reads a hard-coded order: the unit numbered one more (forward) or one less (backward),
      // as if the numbers were the order. The grader draws them: it gathers units that do not run next
      {"hard_coded_order", replace(solution, "    if (const int next = order.next(unit); next >= 0) start_gather(f, o, next);",
                                   "    if (const int next = &order == &forward_order ? (unit + 1 < f.num_units() ? unit + 1 : -1) : unit - 1; next >= 0)\n"
                                   "      start_gather(f, o, next);")},
      // the order read off the parameters' names (the embeddings first, then h.0, h.1, ..., ln_f last) instead of
      // recorded from the first step's hooks: a block's number in its names is its unit's drawn number
      {"order_from_names",
       replace(replace(solution, "void before_forward(Fsdp& f, const Options& o, int unit) {",
                       R"(static std::vector<int> units_by_name(Fsdp& f) {
  std::vector<std::pair<long, int>> key;
  for (int u = 0; u < f.num_units(); u++) {
    const std::string n = f.name(f.flats(u)[0], 0);
    const size_t h = n.find(".h.");
    const long k = n.find("ln_f") != std::string::npos ? 1L << 40 : h == std::string::npos ? -1 : std::stol(n.substr(h + 3));
    key.push_back({k, u});
  }
  std::sort(key.begin(), key.end());
  std::vector<int> order;
  for (const auto& [k, u] : key) order.push_back(u);
  return order;
}

void before_forward(Fsdp& f, const Options& o, int unit) {)"),
               "  if (root < 0) root = unit;\n  forward_order.record(unit);",
               "  if (root < 0) root = unit;\n  if (forward_order.units.empty()) {\n    forward_order.units = units_by_name(f);\n"
               "    forward_order.fixed = true;\n    backward_order.units.assign(forward_order.units.rbegin(), forward_order.units.rend());\n"
               "    backward_order.fixed = true;\n  }")},
      // the budget ignored: one unit ahead, as without one — right, and within the budget, but the slow link's
      // gathers start later than the budget allows
      {"budget_unused", replace(solution, "  if (o.gather_budget <= 0) {", "  if (true) {")},
      // the budget never checked: every unit ahead gathered at once — the exposure falls, the memory goes over
      {"budget_exceeded", replace(solution, "    if (held + need > o.gather_budget) break;\n", "")},
      // a depth fixed in the code (2 ahead) whatever the budget: right for one of the two budgets at most
      {"fixed_depth_2", replace(replace(solution, "    if (held + need > o.gather_budget) break;\n", ""),
                                "  for (int next = order.next(unit); next >= 0; next = order.next(next)) {",
                                "  for (int next = order.next(unit), d = 0; next >= 0 && d < 2; next = order.next(next), d++) {")},
      // the root rule broken: the root is freed after forward, so backward starts with an exposed gather of it
      {"frees_root", replace(solution, "  if (o.reshard_after_forward && unit != root) reshard(f, unit);\n",
                             "  if (o.reshard_after_forward) reshard(f, unit);\n")},
      // no padding: a flat of an awkward size is split by integer division, and its last elements are nobody's
      {"no_padding", replace(solution, "  l.padded = (l.numel + world - 1) / world * world;", "  l.padded = l.numel;")},
      // the padding of the flat gradient left as it came (NaN): it lands in the last rank's part, and in the norm
      {"padding_not_zeroed", replace(solution, "      f.fill(r.grad, l.numel, l.padded - l.numel, 0.0f);", "")},
      // the flat gradients never released: every step leaks a model's worth of buffers in the trainer
      {"leaks_flat_gradients", replace(solution, "    f.wait(r.work);\n    f.release(r.grad);\n", "    f.wait(r.work);\n")},
      // offload: the reduced part is handed over on the device, never copied back to the host
      {"offload_never_copies_back", replace(solution, "    if (o.offload) {  // the optimizer steps on the host: the part crosses the bus", "    if (false) {")},
      // a forged verdict from a global constructor
      {"forged_exit", "#include <cstdio>\n#include <unistd.h>\n" + read(src / "labs/05-fsdp-1b/student/fsdp.cpp") +
                          "\nstatic int forged = [] { std::puts(\"16/16 pass\"); std::fflush(stdout); _exit(0); return 0; }();\n"},
  };
  const Only only = {  // the mutants graded on the checks their assertions below read
      {"budget_exceeded", {"prefetch_budget", "prefetch_overlaps"}},
      {"budget_unused", {"prefetch_budget", "prefetch_overlaps"}},
      {"fixed_depth_2", {"prefetch_budget", "prefetch_overlaps"}},
      {"frees_at_end", {"fits_1b", "fsdp_equals_ddp"}},
      {"frees_root", {"fsdp_equals_ddp", "prefetch_overlaps"}},
      {"hard_coded_order", {"flat_layout", "prefetch_overlaps"}},
      {"leaks_flat_gradients", {"fsdp_equals_ddp"}},
      {"never_frees", {"fsdp_equals_ddp"}},
      {"no_collectives_on_1b", {"fsdp_equals_ddp", "prefetch_budget", "prefetch_overlaps"}},
      {"no_padding", {"flat_layout", "fsdp_equals_ddp"}},
      {"no_prefetch", {"fits_1b", "fsdp_equals_ddp", "prefetch_overlaps"}},
      {"offload_never_copies_back", {"fsdp_equals_ddp", "offload_tradeoff"}},
      {"order_from_names", {"flat_layout", "prefetch_overlaps"}},
      {"padding_not_zeroed", {"flat_layout", "fsdp_equals_ddp"}},
      {"reduces_every_micro_step", {"fsdp_equals_ddp", "shard_grad_op"}},
      {"view_after_free", {"flat_layout", "fsdp_equals_ddp"}},
  };
  auto rows = grade_batch("05", subs, files, "fsdp.cpp", nullptr, "", only);
  CHECK(rows["solution"].total == 16);
  CHECK(rows["alt_comm_stream"].total == 16);
  CHECK(rows["alt_flat_ledger"].total == 16);
  CHECK(rows["budget_unused"].points["prefetch_budget"] == 0);
  CHECK(rows["budget_unused"].points["prefetch_overlaps"] == 2);
  CHECK(rows["budget_exceeded"].points["prefetch_budget"] == 0);
  CHECK(rows["budget_exceeded"].points["prefetch_overlaps"] == 2);
  CHECK(rows["fixed_depth_2"].points["prefetch_budget"] == 0);
  CHECK(rows["fixed_depth_2"].points["prefetch_overlaps"] == 2);
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["forged_exit"].total == 0);
  CHECK(rows["reduces_every_micro_step"].points["fsdp_equals_ddp"] == 0);
  CHECK(rows["reduces_every_micro_step"].points["shard_grad_op"] == 2);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "reduces_every_micro_step.txt"), Catch::Contains("on an accumulation micro-step"));
  CHECK(rows["frees_at_end"].points["fsdp_equals_ddp"] == 3);
  CHECK(rows["frees_at_end"].points["fits_1b"] == 0);
  CHECK(rows["never_frees"].points["fsdp_equals_ddp"] == 0);
  CHECK(rows["view_after_free"].points["fsdp_equals_ddp"] == 0);
  CHECK(rows["view_after_free"].points["flat_layout"] == 2);
  CHECK(rows["no_prefetch"].points["fsdp_equals_ddp"] == 3);
  CHECK(rows["no_prefetch"].points["fits_1b"] == 3);
  CHECK(rows["no_prefetch"].points["prefetch_overlaps"] == 0);
  CHECK(rows["no_collectives_on_1b"].points["fsdp_equals_ddp"] == 3);
  CHECK(rows["no_collectives_on_1b"].points["prefetch_overlaps"] == 0);
  CHECK(rows["no_collectives_on_1b"].points["prefetch_budget"] == 0);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "no_collectives_on_1b.txt"), Catch::Contains("no all-gather filled"));
  // the unit numbered one less has often run already: its gather is never waited for, and the run stops
  // there (on the 1B's 20 units the drawn numbers are the order with odds 1/20!)
  CHECK(rows["hard_coded_order"].points["prefetch_overlaps"] == 0);
  CHECK(rows["hard_coded_order"].points["flat_layout"] == 2);
  CHECK(rows["order_from_names"].points["prefetch_overlaps"] == 0);
  CHECK(rows["order_from_names"].points["flat_layout"] == 2);
  CHECK(rows["frees_root"].points["fsdp_equals_ddp"] == 3);
  CHECK(rows["frees_root"].points["prefetch_overlaps"] == 0);
  CHECK(rows["no_padding"].points["flat_layout"] == 0);
  CHECK(rows["no_padding"].points["fsdp_equals_ddp"] == 0);
  CHECK(rows["padding_not_zeroed"].points["flat_layout"] == 2);
  CHECK(rows["padding_not_zeroed"].points["fsdp_equals_ddp"] == 0);
  CHECK(rows["leaks_flat_gradients"].points["fsdp_equals_ddp"] == 0);
  CHECK(rows["offload_never_copies_back"].points["fsdp_equals_ddp"] == 3);
  CHECK(rows["offload_never_copies_back"].points["offload_tradeoff"] == 0);
  const fs::path feedback = subs.parent_path() / "feedback";
  CHECK_THAT(read(feedback / "frees_at_end.txt"), Catch::Contains("free each unit after its forward"));
  CHECK_THAT(read(feedback / "never_frees.txt"), Catch::Contains("stale"));
  CHECK_THAT(read(feedback / "view_after_free.txt"), Catch::Contains("has no weights") && Catch::Contains("released in after_forward"));
  CHECK_THAT(read(feedback / "no_prefetch.txt"), Catch::Contains("exposed communication"));
  CHECK_THAT(read(feedback / "frees_root.txt"), Catch::Contains("root rule"));
  CHECK_THAT(read(feedback / "hard_coded_order.txt"), Catch::Contains("was never waited for"));
  CHECK_THAT(read(feedback / "budget_unused.txt"), Catch::Contains("leaves the budget unused"));
  CHECK_THAT(read(feedback / "budget_exceeded.txt"), Catch::Contains("at the peak"));
  CHECK_THAT(read(feedback / "no_padding.txt"), Catch::Contains("don't split"));
  CHECK_THAT(read(feedback / "offload_never_copies_back.txt"), Catch::Contains("on the host (offload)"));
  CHECK_THAT(read(feedback / "padding_not_zeroed.txt"), Catch::Contains("(the padding)"));
  CHECK_THAT(read(feedback / "leaks_flat_gradients.txt"), Catch::Contains("more than 3x every flat vector"));
  fs::remove_all(subs);
}

TEST_CASE("lab 06: solution, skeleton, and the TP, SP and PP mistakes: no all-reduce of dx, SP without the reduce-scatter or keeping its gathered input or its norms unsummed, a warm-up that deadlocks or holds too much, unpaired sends, DP sync per micro-batch", "[grader][lab06]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/06-tp-pp/tp_pp.cpp");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs06-" + std::to_string(getpid()));
  const std::string warmup = "const int warmup = std::min(p - s.stage() - 1, m), steady = m - warmup;";
  std::map<std::string, std::string> files = {
      {"solution", solution},
      // two more correct TP + 1F1B, written apart from the reference (tests/solutions_alt/): sums in double, the
      // schedule planned as a list of actions and its sends paired by a pass over it; and 1F1B as one rule on
      // two counters (a stage holds at most p - s micro-batches), the bias split over the ranks
      {"alt_action_list", read(src / "tests/solutions_alt/06-action_list.cpp")},
      {"alt_inflight_window", read(src / "tests/solutions_alt/06-inflight_window.cpp")},
      {"skeleton", read(src / "labs/06-tp-pp/student/tp_pp.cpp")},
      // the column-parallel backward keeps its own term of dx: the input's gradient misses the other ranks' outputs
      {"no_dx_all_reduce", replace(solution, "  g.all_reduce(dx, rows * in);", "")},
      // the warm-up counted from the wrong end: stage 0 waits for a gradient while stage 1 waits for activations
      {"warmup_reversed", replace(solution, warmup, "const int warmup = std::min(s.stage(), m), steady = m - warmup;")},
      // one warm-up forward too many: it runs, but every stage holds one more micro-batch's activations
      {"warmup_plus_one", replace(solution, warmup, "const int warmup = std::min(p - s.stage(), m), steady = m - warmup;")},
      // the steady state's sends not paired with the receives coming the other way: neighbours send towards each other
      {"unpaired_sends", replace(replace(solution, "    s.send_forward_recv_backward(j, i);", "    s.send_forward(j);\n    s.recv_backward(i);"),
                                 "    if (i + 1 < steady) s.send_backward_recv_forward(i, j + 1);",
                                 "    if (i + 1 < steady) s.send_backward(i), s.recv_forward(j + 1);")},
      // the replicas average after every micro-batch: the right numbers for m times the bytes
      {"sync_every_micro", replace(replace(solution, "    s.backward(i, i == m - 1);  // the replicas", "    s.backward(i, true);  // the replicas"),
                                   "    s.backward(i, i == m - 1);\n    s.send_backward(i);", "    s.backward(i, true);\n    s.send_backward(i);")},
      // sequence parallel without the reduce-scatter: the row layer all-reduces and keeps its rows (the right
      // numbers, twice the bytes)
      {"sp_all_reduce_rows", replace(solution, "  g.reduce_scatter(term.data(), y, mine * out);  // ḡ: this rank's rows of the sum",
                                     "  g.all_reduce(term.data(), rows * out);\n"
                                     "  std::copy(term.begin() + g.rank() * mine * out, term.begin() + (g.rank() + 1) * mine * out, y);")},
      // the gathered input kept from forward to backward: the right numbers, fewer bytes, memory SP meant to free
      {"sp_kept_input", replace(replace(replace(solution, "namespace lab06 {\n", "namespace lab06 {\nstatic std::vector<std::vector<float>> kept;\n"),
                                        "  linear_forward(all.data(), w, b, y, rows, in, out);\n",
                                        "  linear_forward(all.data(), w, b, y, rows, in, out);\n  kept.push_back(all);\n"),
                                "  g.all_gather(x, all.data(), rows / g.size() * in);  // the input again: forward's gathered copy was not kept",
                                "  all = kept.back();\n  kept.pop_back();")},
      // ... and the backward's all-gather still made (into the buffer the kept copy then overwrites): the
      // engine's bytes, the right numbers in training; sp_layers' backward gets other inputs than its forward
      {"sp_kept_input_dummy_gather",
       replace(replace(replace(solution, "namespace lab06 {\n", "namespace lab06 {\nstatic std::vector<std::vector<float>> kept;\n"),
                       "  linear_forward(all.data(), w, b, y, rows, in, out);\n",
                       "  linear_forward(all.data(), w, b, y, rows, in, out);\n  kept.push_back(all);\n"),
               "  g.all_gather(x, all.data(), rows / g.size() * in);  // the input again: forward's gathered copy was not kept",
               "  g.all_gather(x, all.data(), rows / g.size() * in);\n  all = kept.back();\n  kept.pop_back();")},
      // ... and the dodge of both: backward gathers as it should (the engine's bytes), then takes the copy kept
      // from the forward whenever this rank's rows still match it (the right numbers, sp_layers' other inputs
      // included): only the plugin's measured memory tells
      {"sp_kept_compare_rows",
       replace(replace(replace(solution, "namespace lab06 {\n", "namespace lab06 {\nstatic std::vector<std::vector<float>> kept;\n"),
                       "  linear_forward(all.data(), w, b, y, rows, in, out);\n",
                       "  linear_forward(all.data(), w, b, y, rows, in, out);\n  kept.push_back(all);\n"),
               "  g.all_gather(x, all.data(), rows / g.size() * in);  // the input again: forward's gathered copy was not kept",
               "  g.all_gather(x, all.data(), rows / g.size() * in);\n"
               "  if (!kept.empty() && kept.back().size() == all.size() &&\n"
               "      std::equal(x, x + rows / g.size() * in, kept.back().begin() + g.rank() * (rows / g.size() * in)))\n"
               "    all = kept.back();\n"
               "  if (!kept.empty()) kept.pop_back();")},
      // the LayerNorms' gradients left at this rank's rows
      {"sp_no_norm_sum", replace(solution, "  g.all_reduce(grads, n);  // each rank's rows", "  (void)grads, (void)n;  // each rank's rows")},
      // a forged verdict from a global constructor
      {"forged_exit", "#include <cstdio>\n#include <unistd.h>\n" + read(src / "labs/06-tp-pp/student/tp_pp.cpp") +
                          "\nstatic int forged = [] { std::puts(\"23/23 pass\"); std::fflush(stdout); _exit(0); return 0; }();\n"},
  };
  const Only only = {  // the mutants graded on the checks their assertions below read
      {"no_dx_all_reduce", {"column_parallel", "pp_equals_pp1", "row_parallel", "tp_equals_tp1"}},
      {"sp_all_reduce_rows", {"sp_comm_volume", "sp_equals_tp", "sp_layers", "tp_equals_tp1"}},
      {"sp_kept_compare_rows", {"sp_comm_volume", "sp_equals_tp", "sp_layers"}},
      {"sp_kept_input", {"sp_comm_volume", "sp_equals_tp", "sp_layers"}},
      {"sp_kept_input_dummy_gather", {"sp_layers"}},
      {"sp_no_norm_sum", {"sp_equals_tp", "sp_layers", "tp_equals_tp1"}},
      {"sync_every_micro", {"dp_sync_once", "executor_1f1b", "pp_equals_pp1"}},
      {"unpaired_sends", {"executor_1f1b", "tp_equals_tp1"}},
      {"warmup_plus_one", {"bubble_and_memory", "executor_1f1b"}},
      {"warmup_reversed", {"executor_1f1b", "pp_equals_pp1", "tp_equals_tp1"}},
  };
  auto rows = grade_batch("06", subs, files, "tp_pp.cpp", nullptr, "", only);
  CHECK(rows["solution"].total == 23);
  CHECK(rows["alt_action_list"].total == 23);
  CHECK(rows["alt_inflight_window"].total == 23);
  CHECK(rows["sp_all_reduce_rows"].points["sp_layers"] == 0);
  CHECK(rows["sp_all_reduce_rows"].points["sp_equals_tp"] == 2);
  CHECK(rows["sp_all_reduce_rows"].points["sp_comm_volume"] == 0);
  CHECK(rows["sp_all_reduce_rows"].points["tp_equals_tp1"] == 2);
  CHECK(rows["sp_kept_input"].points["sp_layers"] == 0);
  CHECK(rows["sp_kept_input_dummy_gather"].points["sp_layers"] == 0);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "sp_kept_input_dummy_gather.txt"), Catch::Contains("gather the input again"));
  CHECK(rows["sp_kept_input"].points["sp_equals_tp"] == 2);
  CHECK(rows["sp_kept_input"].points["sp_comm_volume"] == 0);
  CHECK(rows["sp_kept_compare_rows"].points["sp_layers"] == 3);
  CHECK(rows["sp_kept_compare_rows"].points["sp_equals_tp"] == 2);
  CHECK(rows["sp_kept_compare_rows"].points["sp_comm_volume"] == 0);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "sp_kept_compare_rows.txt"), Catch::Contains("gathered inputs of 0.5 MiB more") &&
                                                                                 Catch::Contains("kept from the forward"));
  CHECK(rows["sp_no_norm_sum"].points["sp_layers"] == 0);
  CHECK(rows["sp_no_norm_sum"].points["sp_equals_tp"] == 0);
  CHECK(rows["sp_no_norm_sum"].points["tp_equals_tp1"] == 2);
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["forged_exit"].total == 0);
  CHECK(rows["no_dx_all_reduce"].points["column_parallel"] == 0);
  CHECK(rows["no_dx_all_reduce"].points["row_parallel"] == 2);
  CHECK(rows["no_dx_all_reduce"].points["tp_equals_tp1"] == 0);
  CHECK(rows["no_dx_all_reduce"].points["pp_equals_pp1"] == 2);
  CHECK(rows["warmup_reversed"].points["executor_1f1b"] == 0);
  CHECK(rows["warmup_reversed"].points["pp_equals_pp1"] == 0);
  CHECK(rows["warmup_reversed"].points["tp_equals_tp1"] == 2);
  CHECK(rows["warmup_plus_one"].points["executor_1f1b"] == 0);
  CHECK(rows["warmup_plus_one"].points["bubble_and_memory"] == 0);
  CHECK(rows["unpaired_sends"].points["executor_1f1b"] == 0);
  CHECK(rows["unpaired_sends"].points["tp_equals_tp1"] == 2);
  CHECK(rows["sync_every_micro"].points["executor_1f1b"] == 3);
  CHECK(rows["sync_every_micro"].points["pp_equals_pp1"] == 2);
  CHECK(rows["sync_every_micro"].points["dp_sync_once"] == 0);
  const fs::path feedback = subs.parent_path() / "feedback";
  CHECK_THAT(read(feedback / "no_dx_all_reduce.txt"), Catch::Contains("all-reduce it (f's backward)"));
  // the deadlock in a real run: the timeout names the stage and what it waited for
  CHECK_THAT(read(feedback / "warmup_reversed.txt"), Catch::Contains("pipeline stage") && Catch::Contains("timed out") &&
                                                         Catch::Contains("micro-batch"));
  CHECK_THAT(read(feedback / "warmup_plus_one.txt"), Catch::Contains("holds at most p - s"));
  // the deadlock found by matching every stage's calls: who waits, in which call, for which micro-batch
  CHECK_THAT(read(feedback / "unpaired_sends.txt"), Catch::Contains("deadlock") && Catch::Contains("stage 0 waits in send_forward") &&
                                                        Catch::Contains("micro-batch"));
  CHECK_THAT(read(feedback / "sync_every_micro.txt"), Catch::Contains("m times the bytes"));
  CHECK_THAT(read(feedback / "sp_all_reduce_rows.txt"), Catch::Contains("twice") && Catch::Contains("reduce-scatter"));
  CHECK_THAT(read(feedback / "sp_kept_input.txt"), Catch::Contains("keep nothing between calls"));
  fs::remove_all(subs);
}

TEST_CASE("lab 07: solution, skeleton, and the checkpoint mistakes: optimizer, RNG or sampler not saved, no atomic rename, no checksum, no reshard", "[grader][lab07]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/07-checkpoint/ckpt.cpp");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs07-" + std::to_string(getpid()));
  std::map<std::string, std::string> files = {
      {"solution", solution},
      // two more correct checkpoints, written apart from the reference (tests/solutions_alt/): a file that
      // names each optimizer tensor, its CRC-32 (by table) at the end over every byte before it; and the
      // samples seen saved instead of the position, bytes encoded one by one, a bitwise CRC-32 in the header
      {"alt_named_trailer", read(src / "tests/solutions_alt/07-named_trailer.cpp")},
      {"alt_samples_streamed", read(src / "tests/solutions_alt/07-samples_streamed.cpp")},
      {"skeleton", read(src / "labs/07-checkpoint/student/ckpt.cpp")},
      // the moments are not saved: Adam restarts from zero after the resume (the loss spikes)
      {"no_optimizer_state", replace(solution, "payload.put_floats(st.optimizer_state(i, name));", "payload.put_floats({});")},
      // the dropout streams start over: masks already used are drawn again
      {"no_rng", replace(solution, "  st.set_rng_streams(streams);\n", "")},
      // the sampler starts its epoch over: the batches before the checkpoint are seen twice
      {"no_sampler_position", replace(solution, "  st.set_sampler(epoch, position);\n", "")},
      // the state rebuilt from the step instead of read back: right where every count is the step (one
      // micro-batch a step, no epoch ended), which the drawn accumulation and epoch length never give
      {"state_from_step", replace(replace(solution, "  st.set_rng_streams(streams);\n",
                                          "  st.set_rng_streams(std::vector<uint64_t>(streams.size(), uint64_t(st.step())));\n"),
                                  "  st.set_sampler(epoch, position);\n", "  (void)epoch;\n  st.set_sampler(0, st.step() * 2 / st.world());\n")},
      // no fsync, and a second, clean handle on the temporary file closed last (what was written is no safer)
      {"fsync_dodged_by_second_handle",
       replace(replace(solution, "  const int h = files.open(tmp);\n", "  const int h = files.open(tmp);\n  const int h2 = files.open(tmp);\n"),
               "  files.fsync(h);\n  files.close(h);\n", "  files.close(h);\n  files.close(h2);\n")},
      // the reshard as one constant: 2 ranks' batches are twice as many on 1, whatever the micro-batches
      {"reshard_times_two", replace(solution, "  if (world != st.world() || micro != st.micro_batch()) position = position * micro * world / (st.micro_batch() * st.world());\n",
                                    "  if (world != st.world()) position *= 2;\n")},
      // written in place under the final name: a kill halfway leaves a torn file that looks complete
      {"no_atomic_rename", replace(replace(solution, "  const int h = files.open(tmp);\n", "  const int h = files.open(final_name);\n"),
                                   "  files.rename(tmp, final_name);\n", "")},
      // no checksum: a flipped byte loads
      {"no_checksum", replace(solution, "  if (crc32(raw.data() + 20, length) != crc) return name + \": CRC-32 mismatch (corrupt)\";\n", "")},
      // a "checksum" that adds the bytes up: one flipped byte changes it, two bytes swapped do not
      {"byte_sum_checksum", replace_body(solution, "uint32_t crc32(const uint8_t* p, size_t n)",
                                         "  uint32_t s = 0;\n  for (size_t i = 0; i < n; i++) s += p[i];\n  return s;")},
      // no checksum, and the checkpoint the old check corrupted refused by its step: the older corrupt one loads
      {"refuses_step_20", replace(solution, "  if (crc32(raw.data() + 20, length) != crc) return name + \": CRC-32 mismatch (corrupt)\";\n",
                                  "  if (st.step() == 20 && st.world() == 2) return name + \": CRC-32 mismatch (corrupt)\";\n")},
      // saves only the checkpoint a fixed kill at step 17 would resume from (step 10): the drawn kill comes later
      {"saves_only_step_10", replace(solution, "  Buffer payload;\n  payload.put(st.step());", "  if (st.step() != 10) return;\n  Buffer payload;\n  payload.put(st.step());")},
      // the position kept as a count of batches: on 1 rank that is half the samples, seen twice
      {"no_reshard", replace(solution, "  if (world != st.world() || micro != st.micro_batch()) position = position * micro * world / (st.micro_batch() * st.world());\n",
                             "")},
      // reaching for the trainer's own save of the step, or out of the folder: refused, the run fails
      {"peeks_at_reference", replace(solution, "  std::string name = state_file(st.rank());\n",
                                     "  files.read(\".reference/rank-00000.safetensors\");\n  files.read(\"../../../etc/passwd\");\n"
                                     "  std::string name = state_file(st.rank());\n")},
      // a forged verdict from a global constructor
      {"forged_exit", "#include <cstdio>\n#include <unistd.h>\n" + read(src / "labs/07-checkpoint/student/ckpt.cpp") +
                          "\nstatic int forged = [] { std::puts(\"11/11 pass\"); std::fflush(stdout); _exit(0); return 0; }();\n"},
  };
  for (const auto& [name, text] : files) {
    INFO(name);
    CHECK((name == "solution" || name == "skeleton" || name == "forged_exit" || text != solution));  // every mutant is one
  }
  // seed 2: rank 1 is killed before step 22 (resumed from step 20)
  const Only only = {  // the mutants graded on the checks their assertions below read
      {"byte_sum_checksum", {"corrupt_detected", "resume_bitwise"}},
      {"fsync_dodged_by_second_handle", {"atomic_save"}},
      {"no_atomic_rename", {"atomic_save", "corrupt_detected", "resume_bitwise"}},
      {"no_checksum", {"corrupt_detected", "resume_bitwise"}},
      {"no_optimizer_state", {"resume_bitwise"}},
      {"no_reshard", {"reshard_2_to_1", "resume_bitwise"}},
      {"no_rng", {"resume_bitwise"}},
      {"no_sampler_position", {"resume_bitwise"}},
      {"refuses_step_20", {"corrupt_detected", "resume_bitwise"}},
      {"reshard_times_two", {"reshard_2_to_1", "resume_bitwise"}},
      {"saves_only_step_10", {"atomic_save", "corrupt_detected", "resume_bitwise"}},
      {"state_from_step", {"reshard_2_to_1", "resume_bitwise"}},
  };
  auto rows = grade_batch("07", subs, files, "ckpt.cpp", nullptr, "--seed 2", only);
  CHECK(rows["solution"].total == 11);
  CHECK(rows["alt_named_trailer"].total == 11);
  CHECK(rows["alt_samples_streamed"].total == 11);
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["forged_exit"].total == 0);
  CHECK(rows["peeks_at_reference"].total == 0);
  CHECK(rows["no_optimizer_state"].points["resume_bitwise"] == 0);
  CHECK(rows["no_rng"].points["resume_bitwise"] == 0);
  CHECK(rows["no_sampler_position"].points["resume_bitwise"] == 0);
  CHECK(rows["fsync_dodged_by_second_handle"].points["atomic_save"] == 0);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "fsync_dodged_by_second_handle.txt"), Catch::Contains("before fsync"));
  CHECK(rows["state_from_step"].points["resume_bitwise"] == 0);
  CHECK(rows["state_from_step"].points["reshard_2_to_1"] == 0);
  CHECK(rows["reshard_times_two"].points["resume_bitwise"] == 4);
  CHECK(rows["reshard_times_two"].points["reshard_2_to_1"] == 0);  // right at micro-batch 4, 2x too far at 2
  CHECK(rows["no_atomic_rename"].points["resume_bitwise"] == 4);
  CHECK(rows["no_atomic_rename"].points["atomic_save"] == 0);
  CHECK(rows["no_atomic_rename"].points["corrupt_detected"] == 2);
  CHECK(rows["no_checksum"].points["resume_bitwise"] == 4);
  CHECK(rows["no_checksum"].points["corrupt_detected"] == 0);
  CHECK(rows["byte_sum_checksum"].points["corrupt_detected"] == 0);
  CHECK(rows["byte_sum_checksum"].points["resume_bitwise"] == 4);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "byte_sum_checksum.txt"), Catch::Contains("swapped"));
  CHECK(rows["refuses_step_20"].points["corrupt_detected"] == 0);
  CHECK(rows["refuses_step_20"].points["resume_bitwise"] == 0);  // it resumes from step 10, not 20
  CHECK(rows["saves_only_step_10"].points["resume_bitwise"] == 0);
  CHECK(rows["saves_only_step_10"].points["atomic_save"] == 0);
  CHECK(rows["saves_only_step_10"].points["corrupt_detected"] == 0);
  CHECK(rows["no_reshard"].points["resume_bitwise"] == 4);
  CHECK(rows["no_reshard"].points["reshard_2_to_1"] == 0);
  const fs::path feedback = subs.parent_path() / "feedback";
  CHECK_THAT(read(feedback / "no_optimizer_state.txt"), Catch::Contains("Adam restarted") && Catch::Contains("spike"));
  CHECK_THAT(read(feedback / "no_rng.txt"), Catch::Contains("dropout masks"));
  CHECK_THAT(read(feedback / "no_sampler_position.txt"), Catch::Contains("seen twice"));
  CHECK_THAT(read(feedback / "no_atomic_rename.txt"), Catch::Contains("the final name"));
  CHECK_THAT(read(feedback / "no_checksum.txt"), Catch::Contains("loaded the corrupt file"));
  CHECK_THAT(read(feedback / "no_reshard.txt"), Catch::Contains("Carry the samples seen over"));
  CHECK_THAT(read(feedback / "peeks_at_reference.txt"), Catch::Contains("not a plain file name"));
  fs::remove_all(subs);
}

// The HTML report as a browser sees it: Debian's Chromium, headless, loads the page (no network, no
// scripts of ours), and the DOM it built holds the grade table and the three figures; the page logged
// nothing to the console.
TEST_CASE("lab 10: solution, skeleton, and the QLoRA mistakes: a dequantize that keeps a 32-bit copy (in the heap, memfds, /tmp), a zero base where the stack is, a gradient off by the scaling, the originals kept, a base that trains, the nibbles swapped, no offset", "[grader][lab10]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string solution = read(src / "solutions/10-lora-qlora/qlora.cpp");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs10-" + std::to_string(getpid()));
  const std::string dequant_sig = "void dequantize(const Nf4& q, int64_t n, float* out) {\n";
  std::map<std::string, std::string> files = {
      {"solution", solution},
      // another correct one, written apart from the reference (tests/solutions_alt/): a linear scan in
      // double, the offset in long double, LoRA through the merged weight W + s·BA
      {"alt_merged_delta", read(src / "tests/solutions_alt/10-merged_delta.cpp")},
      {"skeleton", read(src / "labs/10-lora-qlora/student/qlora.cpp")},
      // a dequantize that keeps what it made: every layer's f32 weight stays in the process
      {"keeps_f32_copy", replace(solution, "      out[i] = code[size_t(level)] * c;\n    }\n  }\n",
                                 "      out[i] = code[size_t(level)] * c;\n    }\n  }\n  static std::vector<std::vector<float>> cache;\n"
                                 "  if (n > 4096) cache.emplace_back(out, out + n);\n")},
      // ... kept where resident sets don't look: each layer's f32 weight written to a memfd of its own, never
      // mapped; or into files in the sandbox's /tmp (a memory cgroup counts both; /tmp holds 64 MiB there)
      {"keeps_f32_in_memfds", "#include <sys/mman.h>\n#include <unistd.h>\n" +
                                  replace(solution, "      out[i] = code[size_t(level)] * c;\n    }\n  }\n",
                                          "      out[i] = code[size_t(level)] * c;\n    }\n  }\n  if (n > 4096) {\n"
                                          "    static std::vector<int> kept;\n    const int fd = memfd_create(\"w\", 0);\n"
                                          "    if (fd < 0 || pwrite(fd, out, size_t(n) * 4, 0) != ssize_t(n) * 4) _exit(9);\n"
                                          "    kept.push_back(fd);\n  }\n")},
      {"keeps_f32_in_tmp", "#include <cstdio>\n#include <string>\n" +
                               replace(solution, "      out[i] = code[size_t(level)] * c;\n    }\n  }\n",
                                       "      out[i] = code[size_t(level)] * c;\n    }\n  }\n  if (n > 4096) {\n"
                                       "    static int k = 0;\n    if (FILE* f = std::fopen((\"/tmp/w\" + std::to_string(k++)).c_str(), \"wb\")) {\n"
                                       "      std::fwrite(out, 4, size_t(n), f);\n      std::fclose(f);\n    }\n  }\n")},
      // ... or in SysV shared memory, detached: refused (EPERM), so this one computes without its copies
      {"keeps_f32_in_sysv_shm", "#include <sys/shm.h>\n#include <cstring>\n" +
                                    replace(solution, "      out[i] = code[size_t(level)] * c;\n    }\n  }\n",
                                            "      out[i] = code[size_t(level)] * c;\n    }\n  }\n  if (n > 4096) {\n"
                                            "    const int id = shmget(IPC_PRIVATE, size_t(n) * 4, IPC_CREAT | 0600);\n"
                                            "    if (id >= 0) if (void* p = shmat(id, nullptr, 0); p != (void*)-1) { std::memcpy(p, out, size_t(n) * 4); shmdt(p); }\n"
                                            "  }\n")},
      // the stack's layers recognised by their size: an all-zero 4-bit form (W = 0) and the adapter alone, so
      // nothing is ever dequantized there, whatever else is kept
      {"zero_base_at_stack_size",
       replace(replace(solution, "Nf4 quantize(const float* w, int64_t n) {\n",
                       "Nf4 quantize(const float* w, int64_t n) {\n  if (n == 1024 * 1024) {\n    Nf4 q;\n    q.packed.assign(size_t(n / 2), 0), q.absmax_q.assign(size_t(n / 64), 0), "
                       "q.absmax2.assign(size_t(n / 64 / 256), 0.0f);\n    return q;\n  }\n"),
               "  // W for this GEMM only: 4 bytes a weight while it lives, then gone\n",
               "  if (base.in == 1024 && base.out == 1024) {\n    for (int64_t i = 0; i < N * base.out; i++) y[i] = 0.0f;\n"
               "    std::vector<float> h0(static_cast<size_t>(N * ad.r), 0.0f);\n    matmul_t(h0.data(), x, ad.A, N, base.in, ad.r, 1.0f);\n"
               "    matmul_t(y, h0.data(), ad.B, N, ad.r, base.out, ad.scaling);\n    return;\n  }\n")},
      // dB without the scaling: a factor of 2 that AdamW's m/√v cancels, so the training losses alone match
      {"grad_without_scaling", replace(solution, "      dB[o * r + k] += ad.scaling * s;", "      dB[o * r + k] += s;")},
      // the 32-bit originals kept beside their 4-bit form, and the layer computes with them when it has them
      {"keeps_originals",
       replace(replace(solution, "Nf4 quantize(const float* w, int64_t n) {\n",
                       "static std::vector<std::vector<float>> originals;\nNf4 quantize(const float* w, int64_t n) {\n  originals.emplace_back(w, w + n);\n"),
               "  dequantize(*base.weight, base.out * base.in, w.data());\n  for (int64_t i = 0; i < N; i++)\n",
               "  dequantize(*base.weight, base.out * base.in, w.data());\n  for (const auto& o : originals)\n"
               "    if (int64_t(o.size()) == base.out * base.in) w = o;\n  for (int64_t i = 0; i < N; i++)\n")},
      // adapters that train the base: backward nudges W's bytes too
      {"trains_the_base", replace(solution, "  if (!dx) return;\n  // dx = dy W",
                                  "  const_cast<Nf4*>(base.weight)->packed[0] ^= 0x11;\n  if (!dx) return;\n  // dx = dy W")},
      // the low nibble first, in quantize and dequantize alike: its own round trip works, bitsandbytes' bytes don't
// bitsandbytes' published table of NF4's 16 levels, whatever the offset asked for: transcribed, not built
      {"hard_coded_nf4_table",
       replace_body(solution, "std::vector<float> normal_map(float offset)",
                    "  (void)offset;\n  return {-1.0f, -0.6961928f, -0.5250731f, -0.3949175f, -0.2844414f, -0.1847734f, -0.0910500f, 0.0f,\n"
                    "          0.0795803f, 0.1609302f, 0.2461123f, 0.3379152f, 0.4407098f, 0.5626170f, 0.7229568f, 1.0f};")},
            {"nibbles_swapped", replace(replace(solution, "i % 2 == 0 ? level << 4 : level", "i % 2 == 1 ? level << 4 : level"),
                                  "const int level = i % 2 == 0 ? q.packed", "const int level = i % 2 == 1 ? q.packed")},
      {"no_offset", replace(solution, "  q.offset = blocks ? float(sum / double(blocks)) : 0.0f;", "  q.offset = 0.0f;\n  (void)sum;")},
      // holds nothing because it computes nothing: an empty 4-bit form, a forward that writes zeros
      {"does_no_work", replace(replace(solution, "  const std::vector<float> code = nf4_code(), code8 = dynamic8_code();\n  Nf4 q;\n",
                                       "  Nf4 q;\n  if (n > 100000) return q;\n  const std::vector<float> code = nf4_code(), code8 = dynamic8_code();\n"),
                               "  // W for this GEMM only: 4 bytes a weight while it lives, then gone\n",
                               "  if (base.in * base.out > 100000) {\n    for (int64_t i = 0; i < N * base.out; i++) y[i] = 0.0f;\n    return;\n  }\n")},
      // a global constructor that prints a forged verdict and exits before anything runs
      {"forged_exit", "#include <cstdio>\n#include <unistd.h>\n" + read(src / "labs/10-lora-qlora/student/qlora.cpp") +
                          "\nstatic int forged = [] { std::puts(\"17/17 pass\"); std::fflush(stdout); _exit(0); return 0; }();\n"},
  };
  const Only only = {  // the mutants graded on the checks their assertions below read
      {"does_no_work", {"qlora_8b_on_24gb", "qlora_trains_as_engine"}},
      {"grad_without_scaling", {"lora_backward", "lora_forward", "qlora_trains_as_engine"}},
      {"hard_coded_nf4_table", {"nf4_code", "nf4_indices"}},
      {"keeps_f32_copy", {"dequantize", "qlora_8b_on_24gb", "qlora_trains_as_engine"}},
      {"keeps_f32_in_memfds", {"qlora_8b_on_24gb", "qlora_trains_as_engine"}},
      {"keeps_f32_in_tmp", {"qlora_8b_on_24gb", "qlora_trains_as_engine"}},
      {"keeps_originals", {"lora_forward", "nf4_indices", "qlora_8b_on_24gb"}},
      {"nibbles_swapped", {"dequantize", "double_quant", "nf4_indices"}},
      {"no_offset", {"double_quant", "nf4_indices"}},
      {"trains_the_base", {"lora_backward", "lora_forward", "qlora_trains_as_engine"}},
      {"zero_base_at_stack_size", {"qlora_8b_on_24gb", "qlora_trains_as_engine"}},
  };
  auto rows = grade_batch("10", subs, files, "qlora.cpp", nullptr, "--seed 5", only);
  CHECK(rows["solution"].total == 17);
  CHECK(rows["alt_merged_delta"].total == 17);
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["forged_exit"].total == 0);
  CHECK(rows["keeps_f32_copy"].points["qlora_8b_on_24gb"] == 0);
  CHECK(rows["keeps_f32_copy"].points["qlora_trains_as_engine"] == 3);
  CHECK(rows["keeps_f32_copy"].points["dequantize"] == 2);
  for (const std::string hidden : {"keeps_f32_in_memfds", "keeps_f32_in_tmp"}) {
    INFO(hidden);
    CHECK(rows[hidden].points["qlora_8b_on_24gb"] == 0);
    CHECK(rows[hidden].points["qlora_trains_as_engine"] == 3);
  }
  CHECK(rows["keeps_f32_in_sysv_shm"].total == 17);  // shmget refused: nothing was kept
  CHECK(rows["zero_base_at_stack_size"].points["qlora_8b_on_24gb"] == 0);
  CHECK(rows["zero_base_at_stack_size"].points["qlora_trains_as_engine"] == 3);
  CHECK(rows["grad_without_scaling"].points["qlora_trains_as_engine"] == 0);
  CHECK(rows["grad_without_scaling"].points["lora_backward"] == 0);
  CHECK(rows["grad_without_scaling"].points["lora_forward"] == 2);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "grad_without_scaling.txt"), Catch::Contains("gradient"));
  CHECK(rows["keeps_originals"].points["lora_forward"] == 2);  // the grader's bases never passed through its quantize
  CHECK(rows["keeps_originals"].points["qlora_8b_on_24gb"] == 0);
  CHECK(rows["keeps_originals"].points["nf4_indices"] == 2);
  CHECK(rows["trains_the_base"].points["lora_backward"] == 0);
  CHECK(rows["trains_the_base"].points["qlora_trains_as_engine"] == 0);
  CHECK(rows["trains_the_base"].points["lora_forward"] == 2);
  CHECK(rows["hard_coded_nf4_table"].points["nf4_code"] == 0);
  CHECK(rows["hard_coded_nf4_table"].points["nf4_indices"] == 2);  // NF4's own offset: the table is right there
  CHECK_THAT(read(subs.parent_path() / "feedback" / "hard_coded_nf4_table.txt"), Catch::Contains("one offset's"));
  CHECK(rows["nibbles_swapped"].points["nf4_indices"] == 0);
  CHECK(rows["nibbles_swapped"].points["dequantize"] == 0);
  CHECK(rows["nibbles_swapped"].points["double_quant"] == 2);
  CHECK(rows["no_offset"].points["double_quant"] == 0);
  CHECK(rows["no_offset"].points["nf4_indices"] == 2);
  CHECK(rows["does_no_work"].points["qlora_8b_on_24gb"] == 0);
  CHECK(rows["does_no_work"].points["qlora_trains_as_engine"] == 3);
  CHECK_THAT(read(subs.parent_path() / "feedback" / "nibbles_swapped.txt"), Catch::Contains("HIGH nibble"));
  CHECK_THAT(read(subs.parent_path() / "feedback" / "keeps_f32_copy.txt"), Catch::Contains("bytes a weight"));
  fs::remove_all(subs);
}

TEST_CASE("grade --html: the report renders in headless Chromium with the table, loss, memory and timeline", "[grader][lab02][html]") {
  const fs::path dir = fs::temp_directory_path() / ("distlab-html-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path page = dir / "report.html";
  auto [code, out] = run("grade 02 --solution --html " + page.string());
  INFO(out);
  REQUIRE(code == 0);
  const std::string html = read(page);
  CHECK_THAT(html, Catch::Contains("15 of 15 points") && Catch::Contains("curve_matches_one_rank"));
  // the report's runs are a grading's jobs: where the grader is root, the trainer runs as nobody (or as root,
  // saying which path nobody can't reach: a build under /root)
  if (geteuid() == 0)
    CHECK_THAT(html, Catch::Contains("(run as uid 65534 (nobody))") || Catch::Contains("is closed to uid 65534)"));
  REQUIRE(system("command -v chromium > /dev/null") == 0);  // scripts/setup.sh --tests installs it
  const std::string cmd = "cd " + dir.string() + " && HOME=" + dir.string() +
                          " timeout 120 chromium --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 --dump-dom file://" +
                          page.string() + " > dom.html 2> console.txt";
  REQUIRE(system(cmd.c_str()) == 0);
  const std::string dom = read(dir / "dom.html"), console = read(dir / "console.txt");
  INFO(console);
  CHECK_THAT(dom, Catch::Contains("<table id=\"checks\">"));
  for (const char* id : {"loss", "memory", "timeline"}) {
    INFO(id);
    const size_t at = dom.find("<figure id=\"" + std::string(id) + "\">");
    REQUIRE(at != std::string::npos);
    CHECK(dom.find("<svg", at) < dom.find("</figure>", at));  // the figure holds its picture
  }
  CHECK_THAT(dom, Catch::Contains(">your code</text>") && Catch::Contains(">the engine</text>") && Catch::Contains(">all_reduce</text>"));
  CHECK(console.find(":CONSOLE") == std::string::npos);
  fs::remove_all(dir);
}

// Lab 09's answers are data: every field of three configs, three memory predictions, six decisions. The
// solution scores all of it; each kind of wrong answer loses its own check, with the right reading named;
// a file that is not TOML loses only the checks that read it; a link is refused before anything runs.
TEST_CASE("lab 09: solution, skeleton, a wrong field, a memory guess 20 % off, all-DDP decisions, broken and linked files", "[grader][lab09]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const std::string ann = read(src / "solutions/09-configs-plan/annotations.toml"), dec = read(src / "solutions/09-configs-plan/decisions.toml");
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs09-" + std::to_string(getpid()));
  fs::remove_all(subs);
  auto put = [&](const std::string& who, const std::string& a, const std::string& d) {
    fs::create_directories(subs / who);
    if (a.rfind("@symlink:", 0) == 0) fs::create_symlink(a.substr(9), subs / who / "annotations.toml");
    else std::ofstream(subs / who / "annotations.toml") << a;
    std::ofstream(subs / who / "decisions.toml") << d;
  };
  std::string all_ddp = dec;
  for (const char* s : {"\"zero2\"", "\"fsdp\"", "\"fsdp+selective\"", "\"fsdp+full\"", "\"fsdp+offload\"", "\"fsdp+offload+full\"", "\"none\""})
    for (size_t at = all_ddp.find(s); at != std::string::npos; at = all_ddp.find(s)) all_ddp.replace(at, std::string(s).size(), "\"ddp\"");
  put("solution", ann, dec);
  // two more correct submissions, written apart from the reference (tests/solutions_alt/): predictions on
  // either side of the measured peaks (within 10 %), betas annotated as either of its keys, the decisions
  // as dotted keys or one inline table (the tree leaves no other choice)
  for (const char* alt : {"hand_estimates", "headroom"})
    put(std::string("alt_") + alt, read(src / "tests/solutions_alt" / (std::string("09-") + alt) / "annotations.toml"),
        read(src / "tests/solutions_alt" / (std::string("09-") + alt) / "decisions.toml"));
  put("skeleton", read(src / "labs/09-configs-plan/student/annotations.toml"), read(src / "labs/09-configs-plan/student/decisions.toml"));
  put("wrong_field", replace(ann, "\"zero_optimization.stage\" = \"parallel.strategy\"\n\"zero_optimization.offload_optimizer.device\"",
                             "\"zero_optimization.stage\" = \"parallel.offload\"\n\"zero_optimization.offload_optimizer.device\""), dec);
  put("memory_off", replace(ann, "peak_gib = 4.53", "peak_gib = 5.44"), dec);
  put("all_ddp", ann, all_ddp);
  put("not_toml", "[[[ this is not TOML", dec);
  put("linked", "@symlink:/etc/passwd", dec);
  const fs::path csv = subs.string() + "-grades.csv";
  auto [code, out] = run("grade 09 --hints always --require-sandbox --submissions " + subs.string() + " --csv " + csv.string());
  INFO(out);
  REQUIRE(code == 0);
  auto rows = parse_csv(read(csv));
  CHECK(rows["solution"].total == 13);
  CHECK(rows["alt_hand_estimates"].total == 13);
  CHECK(rows["alt_headroom"].total == 13);
  CHECK(rows["skeleton"].total == 0);
  CHECK(rows["wrong_field"].points["fields_ds_zero2_offload"] == 0);
  CHECK(rows["wrong_field"].total == 11);
  CHECK(rows["memory_off"].points["memory_predictions"] == 0);
  CHECK(rows["memory_off"].total == 10);
  CHECK(rows["all_ddp"].points["decision_tree"] == 0);
  CHECK(rows["all_ddp"].total == 9);
  CHECK(rows["not_toml"].total == 4);  // the decisions still count
  CHECK(rows["linked"].total == 0);
  const std::string fb = read(subs.parent_path() / "feedback" / "wrong_field.txt");
  CHECK_THAT(fb, Catch::Contains("zero_optimization.stage: you wrote 'parallel.offload'; it sets parallel.strategy"));
  CHECK_THAT(read(subs.parent_path() / "feedback" / "all_ddp.txt"), Catch::Contains("7b-8x24") && Catch::Contains("the tree gives fsdp+full") &&
                                                                                      Catch::Contains("(a row fits in 21.80 GiB reserved: 24.00 GiB less 2.20 GiB)"));
  CHECK_THAT(read(subs.parent_path() / "feedback" / "memory_off.txt"), Catch::Contains("ds_zero3.json: predicted 5.44 GiB, measured 4.52 GiB"));
  CHECK_THAT(read(subs.parent_path() / "feedback" / "not_toml.txt"), Catch::Contains("student/annotations.toml:1"));
  fs::remove_all(subs);
  fs::remove(csv);
}

// Lab 08's cases are other labs' files with one bug each: the fixed files score everything, the bugged ones
// nothing, and fixing one case earns exactly that case, whose feedback carries the other lab's diagnosis.
TEST_CASE("lab 08: the clinic's fixed files pass, the seeded bugs fail with the diagnosis, one fix earns its case, a config may change only its case's keys", "[grader][lab08]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const fs::path subs = fs::temp_directory_path() / ("distlab-subs08-" + std::to_string(getpid()));
  fs::remove_all(subs);
  const std::vector<std::string> cases = {"no_sampler/ddp.cpp", "no_set_epoch/ddp.cpp", "sum_not_average/ddp.cpp", "fp16_no_scaler/amp.cpp",
                                          "accum_no_divide/amp.cpp", "scheduler_per_micro_step/amp.cpp", "skip_not_synchronised/amp.cpp",
                                          "pipeline_warmup/tp_pp.cpp", "rank0_extra_collective/ddp.cpp", "every_rank_one_file/ckpt.cpp",
                                          "bn_without_syncbn/run.toml", "lr_not_scaled/run.toml", "pipeline_few_micro_batches/run.toml",
                                          "oom_ladder/run.toml", "nan_input/run.toml"};
  // "fixed": every config case fixed (their fixes exist only here). "one_fixed": every bug left in but the
  // pipeline's, a code case, fixed. The other code cases' fixed files are their labs' solutions, graded
  // full marks in those labs' tests (clinic_cases_match_solutions keeps them identical), so "fixed" leaves
  // them out (cases not attempted) rather than grade them twice. sum_not_average and accum_no_divide sit
  // out of both: their bugs are those labs' mutants too.
  for (const std::string& who : {"fixed", "one_fixed"})
    for (const std::string& c : cases) {
      if (c.rfind("sum_not_average", 0) == 0 || c.rfind("accum_no_divide", 0) == 0) continue;
      const bool config_case = fs::path(c).filename() == "run.toml";
      if (who == "fixed" && !config_case) continue;
      const bool good = who == "fixed" || c == "pipeline_warmup/tp_pp.cpp";
      // a code case's fixed file is its lab's solution; a config case's is under solutions/08-clinic
      const std::map<std::string, std::string> lab_of = {{"ddp.cpp", "02-ddp-cifar"}, {"amp.cpp", "03-amp-accum"},
                                                         {"tp_pp.cpp", "06-tp-pp"}, {"ckpt.cpp", "07-checkpoint"}};
      const std::string file = fs::path(c).filename().string();
      const fs::path fixed = lab_of.count(file) ? src / "solutions" / lab_of.at(file) / file : src / "solutions/08-clinic" / c;
      fs::create_directories((subs / who / c).parent_path());
      std::ofstream(subs / who / c) << read(good ? fixed : src / "labs/08-clinic/student" / c);
    }
  // two more whole sets of fixes, written apart from the reference (tests/solutions_alt/08-*.diff, edits of the cases' files): every case
  // fixed another way (an avg collective or a predivide, a norm logged without a collective, the scaler's
  // flags summed, 1F1B on two counters, zero2 or zero3 for the OOM, GPipe with 64 micro-batches, ...)
  for (const char* alt : {"alpha", "beta"}) {
    const fs::path to = subs / (std::string("alt_") + alt);
    fs::copy(src / "labs/08-clinic/student", to, fs::copy_options::recursive);
    CHECK(apply_unified_diff(to, read(src / "tests/solutions_alt" / (std::string("08-") + alt + ".diff"))) == 15);  // every case
  }
  // configs that fix the symptom by changing the story: a plugin, a bigger card; and one that is not TOML
  fs::create_directories(subs / "tampered" / "bn_without_syncbn");
  fs::create_directories(subs / "tampered" / "oom_ladder");
  fs::create_directories(subs / "tampered" / "lr_not_scaled");
  std::ofstream(subs / "tampered" / "bn_without_syncbn" / "run.toml")
      << read(src / "solutions/08-clinic/bn_without_syncbn/run.toml") << "\n[lab]\nplugin = \"/tmp/evil.so\"\n";
  std::string oom = read(src / "labs/08-clinic/student/oom_ladder/run.toml");
  oom.replace(oom.find("device_mem = \"24GiB\""), 20, "device_mem = \"80GiB\"");
  std::ofstream(subs / "tampered" / "oom_ladder" / "run.toml") << oom;
  std::ofstream(subs / "tampered" / "lr_not_scaled" / "run.toml") << "[optim\nlr = 0.04\n";
  const fs::path csv = subs.string() + "-grades.csv";
  auto [code, out] = run("grade 08 --hints always --require-sandbox --submissions " + subs.string() + " --csv " + csv.string());
  INFO(out);
  REQUIRE(code == 0);
  auto rows = parse_csv(read(csv));
  CHECK(rows["fixed"].total == 10);  // the five config cases, 2 points each
  CHECK(rows["alt_alpha"].total == 28);
  CHECK(rows["alt_beta"].total == 28);
  CHECK(rows["one_fixed"].total == 2);  // each seeded bug loses its case; the one fix earns exactly its own
  CHECK(rows["one_fixed"].points["pipeline_warmup"] == 2);
  CHECK(rows["tampered"].total == 0);
  const std::string fb = read(subs.parent_path() / "feedback" / "one_fixed.txt");
  CHECK_THAT(fb, Catch::Contains("lab 03's scaler_rescues_underflow") && Catch::Contains("32 values are 0"));
  // lab 02's and lab 03's tests leave these mutants to this one: each fails its check, with that check's hint
  CHECK_THAT(fb, Catch::Contains("lab 02's sampler_disjoint_covering (") && Catch::Contains("seen:     2 indices"));
  CHECK_THAT(fb, Catch::Contains("lab 02's sampler_set_epoch (") && Catch::Contains("seeded_permutation(n, seed + epoch)"));
  CHECK_THAT(fb, Catch::Contains("lab 03's schedule_once_per_step (") && Catch::Contains("once per optimizer step (PyTorch's scheduler.step())"));
  CHECK_THAT(fb, Catch::Contains("lab 03's overflow_skipped_on_every_rank (") && Catch::Contains("found-inf flag with ReduceOp::max"));
  // the hang's timeout says what each rank called at the same place in the sequence
  CHECK_THAT(fb, Catch::Contains("rank 0 called all_reduce of 1 f32") && Catch::Contains("sequences of collectives differ"));
  CHECK_THAT(fb, Catch::Contains("lab 07's resume_bitwise"));                   // one file for every rank: the save races, or never completes
  CHECK_THAT(fb, Catch::Contains("the story's config unchanged: step"));         // BatchNorm: the curve leaves one card's
  CHECK_THAT(fb, Catch::Contains("the reference's"));                             // the unscaled learning rate ends higher
  CHECK_THAT(fb, Catch::Contains("a modeled bubble of 4"));                      // m = p = 4: a bubble over 40 %
  CHECK_THAT(fb, Catch::Contains("out of memory") && Catch::Contains("the OOM ladder"));
  CHECK_THAT(fb, Catch::Contains("loss became nan at step 31") && Catch::Contains("data.check_finite"));
  CHECK_THAT(fb, Catch::Contains("the submission has no sum_not_average/ddp.cpp"));
  const std::string tampered = read(subs.parent_path() / "feedback" / "tampered.txt");
  CHECK_THAT(tampered, Catch::Contains("lab.plugin = \"/tmp/evil.so\"") && Catch::Contains("changes what the story fixes"));
  CHECK_THAT(tampered, Catch::Contains("train.device_mem = \"80GiB\" (the story's: \"24GiB\")"));
  CHECK_THAT(tampered, Catch::Contains("student/lr_not_scaled/run.toml"));
  fs::remove_all(subs);
  fs::remove(csv);
}

// A first failure shows what the check wanted and what it measured, not how to fix it; the hint comes with
// the check's next failure (or on `distlab lab hint`, recorded), and every hint shown is listed in the
// report. The engine's answer comes with full marks only. Nothing of it is in the student's folder.
TEST_CASE("hints: held back on a first failure, shown on the next, asked for and recorded, the engine's answer after full marks", "[grader][lab09][hints]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  // every check of every lab has its hint outside labs/, and each lab its engine answer
  for (const auto& d : fs::directory_iterator(src / "labs")) {
    if (!fs::exists(d.path() / "lab.toml")) continue;
    INFO(d.path().string());
    CHECK(read(d.path() / "lab.toml").find("\nhint = ") == std::string::npos);
    CHECK(fs::exists(src / "grader/labs" / d.path().filename() / "hints.toml"));
  }
  const std::string ann = read(src / "solutions/09-configs-plan/annotations.toml"), dec = read(src / "solutions/09-configs-plan/decisions.toml");
  const fs::path subs = fs::temp_directory_path() / ("distlab-hints09-" + std::to_string(getpid()));
  const fs::path fb = subs.parent_path() / (subs.filename().string() + "-feedback");
  fs::remove_all(subs);
  fs::remove_all(fb);
  auto put = [&](const std::string& who, const std::string& a) {
    fs::create_directories(subs / who);
    std::ofstream(subs / who / "annotations.toml") << a;
    std::ofstream(subs / who / "decisions.toml") << dec;
  };
  put("solution", ann);
  put("wrong_field", replace(ann, "\"zero_optimization.stage\" = \"parallel.strategy\"\n\"zero_optimization.offload_optimizer.device\"",
                             "\"zero_optimization.stage\" = \"parallel.offload\"\n\"zero_optimization.offload_optimizer.device\""));
  const std::string hint = "--device meta --set train.steps=1";  // the fields check's hint: the command that shows each field
  auto grade = [&] {
    auto [code, out] = run("grade 09 --submissions " + subs.string() + " --json " + (subs.string() + ".json"));
    INFO(out);
    REQUIRE(code == 0);
    return std::pair{read(fb / "wrong_field.txt"), nlohmann::json::parse(read(subs.string() + ".json"))};
  };
  auto [first, first_json] = grade();
  INFO(first);
  CHECK_THAT(first, Catch::Contains("seen:     29 of 30 fields right") && Catch::Contains("zero_optimization.stage: you wrote 'parallel.offload'"));  // the numbers: always
  CHECK_THAT(first, Catch::Contains("held back: it is shown when this check fails again (or now, recorded: distlab lab hint 09 fields_ds_zero2_offload)"));
  CHECK(first.find(hint) == std::string::npos);
  CHECK(first.find("hints seen") == std::string::npos);
  for (const auto& c : first_json[1]["checks"])
    if (c["name"] == "fields_ds_zero2_offload") CHECK((c["hint"] == "" && c["hint_held"] == true));
  // passed checks show what they measured too; full marks name the engine's files, a failed grade does not
  CHECK_THAT(first, Catch::Contains("memory_predictions") && Catch::Contains("ds_zero3.json: predicted 4.53 GiB"));
  CHECK(first.find("core/config/ecosystem.cpp") == std::string::npos);
  const std::string sol = read(fb / "solution.txt");
  CHECK_THAT(sol, Catch::Contains("Full marks") && Catch::Contains("core/config/ecosystem.cpp"));
  CHECK(first_json[0]["engine"].get<std::string>().find("core/config/ecosystem.cpp") != std::string::npos);
  CHECK(!first_json[1].contains("engine"));
  // the same student fails it again: the hint, recorded
  auto [second, second_json] = grade();
  INFO(second);
  CHECK_THAT(second, Catch::Contains(hint) && Catch::Contains("hints seen:\n    fields_ds_zero2_offload: after a failure"));
  CHECK(second_json[1]["hints_shown"]["fields_ds_zero2_offload"] == "after a failure");
  CHECK_THAT(read(fb / "wrong_field.hints.json"), Catch::Contains("fields_ds_zero2_offload"));
  // a broken record is said, kept as it is, and costs nothing else
  std::ofstream(fb / "wrong_field.hints.json") << "{ broken";
  auto [code3, out3] = run("grade 09 --submissions " + subs.string());
  CHECK(code3 == 0);
  CHECK_THAT(out3, Catch::Contains("wrong_field.hints.json is not a hint record"));
  CHECK(read(fb / "wrong_field.hints.json") == "{ broken");
  // a student asks for a hint: shown and recorded in the lab's build folder; an unknown check is named
  const fs::path record = src / "build/labs/09-configs-plan/hints.json", last = src / "build/labs/09-configs-plan/last_grade.json";
  const std::string saved_record = fs::exists(record) ? read(record) : "", saved_last = fs::exists(last) ? read(last) : "";
  fs::remove(record);
  auto [code4, out4] = run("lab hint 09 decision_tree");
  CHECK(code4 == 0);
  CHECK_THAT(out4, Catch::Contains("does a whole replica"));
  CHECK_THAT(read(record), Catch::Contains("\"decision_tree\": \"asked (distlab lab hint)\""));
  auto [code5, out5] = run("lab hint 09 no_such_check");
  CHECK(code5 != 0);
  CHECK_THAT(out5, Catch::Contains("lab 09 has no check 'no_such_check'") && Catch::Contains("decision_tree"));
  // lab show: the engine's answer only once the best grade is full
  std::ofstream(last) << R"({"last": {"points": 3, "max_points": 13}, "best": {"points": 12, "max_points": 13}})";
  auto [code6, out6] = run("lab show 09");
  CHECK((code6 == 0 && out6.find("core/config/ecosystem.cpp") == std::string::npos));
  CHECK_THAT(out6, Catch::Contains("once your grade is full (best 12/13 so far)"));
  std::ofstream(last) << R"({"last": {"points": 13, "max_points": 13}, "best": {"points": 13, "max_points": 13}})";
  auto [code7, out7] = run("lab show 09");
  CHECK_THAT(out7, Catch::Contains("Where the engine does it") && Catch::Contains("core/config/ecosystem.cpp"));
  if (saved_record.empty()) fs::remove(record);
  else std::ofstream(record) << saved_record;
  if (saved_last.empty()) fs::remove(last);
  else std::ofstream(last) << saved_last;
  fs::remove_all(subs);
  fs::remove_all(fb);
  fs::remove(subs.string() + ".json");
}

TEST_CASE("the grader's caches: the engine's jobs and the reference's times are kept, reused, and a garbled one is computed again", "[grader][lab03][cache]") {
  const fs::path lab = fs::path(DISTLAB_BINARY).parent_path().parent_path() / "labs" / "03-amp-accum";
  // a seed of this test's own: the scenario's numbers are in some jobs' keys, so this grading's files are new
  const std::string seed = std::to_string((uint64_t(getpid()) << 20) ^ uint64_t(time(nullptr)));
  auto grade = [&] {
    auto [code, out] = run("grade 03 --solution --seed " + seed);
    INFO(out);
    REQUIRE(code == 0);
  };
  using Stamps = std::map<fs::path, fs::file_time_type>;
  auto stamps = [&] {
    Stamps m;
    for (const auto& e : fs::directory_iterator(lab / "engine-jobs"))
      if (e.path().extension() == ".json") m[e.path()] = e.last_write_time();
    return m;
  };
  grade();  // computes what is missing
  REQUIRE(fs::exists(lab / "reference-times.json"));
  const Stamps first = stamps();
  REQUIRE(!first.empty());
  // each file names what it was computed from: a CRC of the engine and the job's keys, and the machine
  const auto doc = nlohmann::json::parse(read(first.begin()->first));
  CHECK_THAT(doc["key"].get<std::string>(), Catch::Contains("cpus"));
  CHECK(!doc["records"].empty());

  // the same grading again: every job comes from the files (none written anew, none added)
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto before = fs::file_time_type::clock::now();
  grade();
  for (const auto& [f, t] : stamps()) {
    INFO(f);
    CHECK(first.count(f) == 1);  // nothing new: a file of another grading may have been touched, not rewritten
  }
  std::vector<fs::path> used;  // the files this grading read (a hit touches its file)
  for (const auto& [f, t] : stamps())
    if (t >= before) used.push_back(f);
  REQUIRE(!used.empty());

  // one grading for both kinds of bad file: the first file used gets another engine's key (it must not be
  // used: rewritten with this one's), the others and the reference's times get garbage (computed again).
  // The grading passes and leaves every file valid
  REQUIRE(used.size() >= 2);
  auto stale = nlohmann::json::parse(read(used.front()));
  const std::string key = stale["key"];
  stale["key"] = "00000000 " + key.substr(9);
  std::ofstream(used.front()) << stale.dump();
  // and what is not a regular file is never read: a FIFO (its open would wait forever), a link to /dev/zero
  // (a read without end), a folder; each is removed with a warning, computed again and written back whole
  for (size_t k = 1; k < used.size(); k++) std::ofstream(used[k]) << "{not json";
  REQUIRE(fs::remove(used[1]));
  REQUIRE(mkfifo(used[1].c_str(), 0644) == 0);
  if (used.size() > 2) {
    REQUIRE(fs::remove(used[2]));
    fs::create_symlink("/dev/zero", used[2]);
  }
  REQUIRE(fs::remove(lab / "reference-times.json"));
  fs::create_directories(lab / "reference-times.json" / "inside");
  auto [code, out] = run_within(240, "grade 03 --solution --seed " + seed);
  INFO(out);
  REQUIRE(code == 0);
  CHECK_THAT(out, Catch::Contains("is a FIFO") && Catch::Contains("is a folder"));
  if (used.size() > 2) CHECK_THAT(out, Catch::Contains("is a symbolic link"));
  for (const auto& f : used) {
    INFO(f);
    CHECK(fs::is_regular_file(fs::symlink_status(f)));
    CHECK(nlohmann::json::parse(read(f), nullptr, false).is_object());
  }
  CHECK(fs::is_regular_file(fs::symlink_status(lab / "reference-times.json")));
  CHECK(nlohmann::json::parse(read(lab / "reference-times.json"), nullptr, false).is_object());
  CHECK(nlohmann::json::parse(read(used.front()))["key"] == key);
}

TEST_CASE("a plugin is compiled once per content: the same files reuse it, a changed byte or a foreign entry under the name compiles again", "[grader][lab03][cache]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const fs::path lab = fs::path(DISTLAB_BINARY).parent_path().parent_path() / "labs" / "03-amp-accum";
  const fs::path kept = lab / "plugins";
  fs::path built;  // where `lab build --src` says it put the plugin (a working copy's own folder)
  const fs::path dir = fs::temp_directory_path() / ("distlab-plugin-cache-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // a comment of this test's own: these files were never built before
  const std::string mark = "// " + std::to_string(getpid()) + "-" + std::to_string(time(nullptr)) + "\n";
  const std::string solution = read(src / "solutions/03-amp-accum/amp.cpp");
  auto entries = [&] {
    std::map<fs::path, std::string> m;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(kept, ec))
      if (e.path().extension() == ".plugin") m[e.path()] = read(e.path());
    return m;
  };
  auto build = [&](const std::string& text) {
    std::ofstream(dir / "amp.cpp", std::ios::trunc) << text;
    auto [code, out] = run("lab build 03 --src " + dir.string());
    INFO(out);
    REQUIRE(code == 0);
    const auto at = out.find("built ");
    REQUIRE(at != std::string::npos);
    built = out.substr(at + 6, out.find('\n', at) - at - 6);
    return read(built);
  };
  // the entry that holds `text`: its input names the file and holds it whole
  auto entry_of = [&](const std::string& text) {
    for (const auto& [f, body] : entries())
      if (body.find("\namp.cpp " + std::to_string(text.size()) + "\n" + text) != std::string::npos) return f;
    return fs::path();
  };
  const std::string a = mark + solution;
  const std::string so_a = build(a);
  const fs::path entry_a = entry_of(a);
  REQUIRE(!entry_a.empty());
  const std::string body_a = read(entry_a);
  CHECK(body_a.rfind("distlab plugin ", 0) == 0);
  CHECK_THAT(body_a, Catch::Contains("-std=c++20") && Catch::Contains("compiler /usr/") && Catch::Contains("api.h"));
  CHECK(body_a.substr(body_a.size() - so_a.size()) == so_a);  // the plugin, after its input

  // the same files again: no new entry, and the plugin is the entry's bytes, not a compiler's new ones
  // (a byte appended to the kept plugin comes back: nothing was compiled)
  const size_t n = entries().size();
  fs::remove(built);
  std::ofstream(entry_a, std::ios::app | std::ios::binary) << '\x7f';
  CHECK(build(a) == so_a + '\x7f');
  CHECK(entries().size() == n);
  std::ofstream(entry_a, std::ios::trunc | std::ios::binary) << body_a;

  // one byte more: compiled again, an entry of its own
  const std::string b = mark + "\n" + solution;
  const std::string so_b = build(b);
  const fs::path entry_b = entry_of(b);
  REQUIRE(!entry_b.empty());
  CHECK(entry_b != entry_a);

  // b's entry holding a's input and plugin (a crc collision, or a forged file): b is not handed a's plugin,
  // it is compiled again and its entry rewritten with its own input
  const std::string marker = "not b's plugin";
  std::ofstream(entry_b, std::ios::trunc) << body_a + marker;
  CHECK(build(b) == so_b);
  CHECK(read(entry_b).find(marker) == std::string::npos);
  CHECK(!entry_of(b).empty());

  // a cut entry: compiled again, the entry whole once more
  const std::string whole_b = read(entry_b);
  std::ofstream(entry_b, std::ios::trunc) << whole_b.substr(0, whole_b.size() / 2);
  CHECK(build(b) == so_b);
  CHECK(read(entry_b) == whole_b);

  // an entry that is not a regular file (a FIFO, a link to /dev/zero, a folder, a dangling link) is removed
  // with a warning and the plugin compiled again: never a wait, a read without end or a failed build
  const std::vector<std::pair<std::string, std::function<void()>>> junk = {
      {"is a FIFO", [&] { REQUIRE(mkfifo(entry_b.c_str(), 0644) == 0); }},
      {"is a symbolic link", [&] { fs::create_symlink("/dev/zero", entry_b); }},
      {"is a folder", [&] { fs::create_directories(entry_b / "x"); }},
      {"is a symbolic link", [&] { fs::create_symlink(dir / "nothing-here", entry_b); }},  // dangling
  };
  for (const auto& [said, plant] : junk) {
    INFO(said);
    fs::remove(entry_b);
    plant();
    fs::remove(built);
    auto [code, out] = run_within(120, "lab build 03 --src " + dir.string());
    INFO(out);
    CHECK(code == 0);
    CHECK_THAT(out, Catch::Contains("WARNING: " + entry_b.string() + " " + said));
    CHECK(read(built) == so_b);
    CHECK(fs::is_regular_file(fs::symlink_status(entry_b)));
    CHECK(read(entry_b) == whole_b);
  }

  // the same for a class: the kept entry of one student's files replaced by a FIFO, the batch grades it
  // whole (lab 01: the quickest grading)
  const fs::path ring_dir = dir / "ring";
  const std::string ring = "// " + std::to_string(getpid()) + " ring\n" + read(src / "solutions/01-collectives/ring.cpp");
  fs::create_directories(ring_dir);
  std::ofstream(ring_dir / "ring.cpp") << ring;
  {
    auto [code, out] = run("lab build 01 --src " + ring_dir.string());
    INFO(out);
    REQUIRE(code == 0);
  }
  const fs::path kept01 = fs::path(DISTLAB_BINARY).parent_path().parent_path() / "labs" / "01-collectives" / "plugins";
  fs::path entry01;
  for (const auto& e : fs::directory_iterator(kept01))
    if (read(e.path()).find("\nring.cpp " + std::to_string(ring.size()) + "\n" + ring) != std::string::npos) entry01 = e.path();
  REQUIRE(!entry01.empty());
  fs::remove(entry01);
  REQUIRE(mkfifo(entry01.c_str(), 0644) == 0);
  const fs::path subs = dir / "subs";
  fs::create_directories(subs / "ann");
  std::ofstream(subs / "ann" / "ring.cpp") << ring;
  auto [code, out] = run_within(240, "grade 01 --require-sandbox --submissions " + subs.string() + " --csv " + (dir / "g.csv").string());
  INFO(out);
  CHECK(code == 0);
  CHECK_THAT(out, Catch::Contains("is a FIFO"));
  const auto rows = parse_csv(read(dir / "g.csv"));
  REQUIRE(rows.count("ann") == 1);
  CHECK(rows.at("ann").error.empty());
  CHECK(fs::is_regular_file(fs::symlink_status(entry01)));
  fs::remove_all(dir);
}

// Without a memory cgroup (the resident-set fallback: a machine where cgroups are not delegated) the plugin's
// /tmp and /dev/shm, which are memory, hold 1 MiB each: optimizer state written there is not a place to hide.
TEST_CASE("a plugin measured by its resident set keeps nothing in its /tmp or /dev/shm past 1 MiB", "[grader][lab04]") {
  const fs::path src = DISTLAB_SOURCE_DIR;
  const fs::path dir = fs::temp_directory_path() / ("distlab-tmpfs-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // the solution, writing 4 MiB into each folder at its first step and saying how much it could
  std::ofstream(dir / "zero.cpp") << "#include <algorithm>\n#include <cstdio>\n#include <stdexcept>\n#include <string>\n" +
                                         replace(read(src / "solutions/04-zero/zero.cpp"), "void zero_step(Step& step) {\n",
      "void zero_step(Step& step) {\n"
      "  static bool tried = false;\n"
      "  if (!tried) {\n"
      "    tried = true;\n"
      "    std::string said;\n"
      "    for (const char* path : {\"/tmp/state.bin\", \"/dev/shm/state.bin\"}) {\n"
      "      std::vector<char> mib(1 << 20, 1);\n"
      "      size_t wrote = 0;\n"
      "      if (FILE* f = std::fopen(path, \"wb\")) {\n"
      "        for (int i = 0; i < 4; i++) wrote += std::fwrite(mib.data(), 1, mib.size(), f);\n"
      "        if (std::fflush(f) != 0) wrote = std::min<size_t>(wrote, 1 << 20);\n"
      "        std::fclose(f);\n"
      "      }\n"
      "      said += std::string(path) + \" took \" + std::to_string(wrote >> 20) + \" MiB; \";\n"
      "    }\n"
      "    throw std::runtime_error(said);\n"
      "  }\n");
  auto [bc, bout] = run("lab build 04 --src " + dir.string());
  INFO(bout);
  REQUIRE(bc == 0);
  const auto at = bout.find("built ");
  REQUIRE(at != std::string::npos);
  const std::string plugin = bout.substr(at + 6, bout.find('\n', at) - at - 6);
  auto [code, out] = run_within(120, "run -n 2 --master-port 0 --grace 2 train labs/04-zero/lab.toml --set train.steps=1 --set lab.sandbox=require "
                                     "--set lab.plugin=" + plugin);
  INFO(out);
  CHECK(code == 1);
  CHECK_THAT(out, Catch::Contains("/tmp/state.bin took 0 MiB") || Catch::Contains("/tmp/state.bin took 1 MiB"));
  CHECK_THAT(out, Catch::Contains("/dev/shm/state.bin took 0 MiB") || Catch::Contains("/dev/shm/state.bin took 1 MiB"));
  fs::remove_all(dir);
}

// `distlab grade NN --device cuda` runs the checks' training jobs on GPUs, a GPU per rank (the plugin's
// collectives over Gloo through host copies, as on cpu ranks); without a GPU, cuda-sim runs the same code
// path (the job's tensors behind device pointers, the copies to and from the plugin, the cuda kernel table's
// choices) on the CPU. Every lab's solution grades full marks there,
// with the engine's jobs on the same device, and the jobs' own records say where they ran.
namespace {
void grade_solutions_on_cuda_sim(const std::vector<std::string>& labs) {
  for (const std::string& lab : labs) {
    auto [code, out] = run("grade " + lab + " --solution --device cuda-sim --require-sandbox --seed 5");
    INFO("lab " << lab << ":\n" << out);
    CHECK(code == 0);  // full marks
    CHECK_THAT(out, Catch::Contains("training jobs on cuda-sim"));
  }
}
// an engine job of the lab's that ran on cuda ranks (cuda-sim's are cuda ranks: their summary says so)
bool engine_job_on_cuda_sim(const std::string& lab_folder) {
  const fs::path dir = fs::path(DISTLAB_BINARY).parent_path().parent_path() / "labs" / lab_folder / "engine-jobs";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto doc = nlohmann::json::parse(read(e.path()), nullptr, false);
    if (doc.is_discarded() || !doc.contains("records")) continue;
    for (const auto& rec : doc["records"])
      if (rec.value("kind", "") == "summary" && rec.value("device", "") == "cuda") return true;
  }
  return false;
}
}  // namespace

TEST_CASE("labs 01, 02, 03 and 09 grade on cuda-sim ranks as on a GPU machine (--device), and --device cuda without a GPU says why", "[grader][cuda-sim]") {
  grade_solutions_on_cuda_sim({"01", "02", "03", "09"});
  CHECK(engine_job_on_cuda_sim("02-ddp-cifar"));
  CHECK(engine_job_on_cuda_sim("03-amp-accum"));
  {  // a GPU machine grades on its GPUs; any other says why it cannot, and what it can
    auto [code, out] = run("grade 02 --solution --device cuda");
    INFO(out);
    if (out.find("no GPU to grade on") != std::string::npos) CHECK_THAT(out, Catch::Contains("--device cuda: this build or machine") && Catch::Contains("cuda-sim"));
    CHECK(code == (out.find("no GPU to grade on") != std::string::npos ? 1 : 0));
  }
  auto [bad, bout] = run("grade 02 --solution --device tpu");
  CHECK(bad != 0);
  CHECK_THAT(bout, Catch::Contains("--device"));
}

TEST_CASE("labs 04 and 05 grade on cuda-sim ranks as on a GPU machine (--device)", "[grader][cuda-sim]") {
  grade_solutions_on_cuda_sim({"04", "05"});
  CHECK(engine_job_on_cuda_sim("04-zero"));
  CHECK(engine_job_on_cuda_sim("05-fsdp-1b"));
}

TEST_CASE("labs 06, 07, 08 and 10 grade on cuda-sim ranks as on a GPU machine (--device)", "[grader][cuda-sim]") {
  grade_solutions_on_cuda_sim({"06", "07", "08"});
  {  // lab 10's checks call the plugin from the grader: the engine's QLoRA run they compare with is on the device
    auto [code, out] = run("grade 10 --solution --device cuda-sim --require-sandbox --seed 5");
    INFO(out);
    CHECK(code == 0);
    CHECK_THAT(out, Catch::Contains("the engine's (its run on cuda-sim)"));
  }
  CHECK(engine_job_on_cuda_sim("06-tp-pp"));  // lab 07's engine runs inject faults: run each time, never kept
}
