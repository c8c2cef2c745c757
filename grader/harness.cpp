#include "grader/harness.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/util/error.h"
#include "grader/check.h"

namespace fs = std::filesystem;

namespace distlab::grader {

namespace {

constexpr int64_t kMaxPids = 256;  // processes + threads of one check (lab 02 runs 2-rank jobs inside one)

struct ProcResult {
  int status = 0;
  bool timed_out = false;
  std::string output;
  double seconds = 0;
};

// Runs argv with stdout+stderr captured, in its own process group, with rlimits; kills the group at the
// wall-clock limit.
// A pids cgroup (v1, as root) that caps the processes and threads of one check: RLIMIT_NPROC means nothing
// to root, and a fork bomb must fail its check, not the machine. Empty path when unavailable.
std::string make_pids_cgroup(int64_t max_pids) {
  static int counter = 0;
  const fs::path root = "/sys/fs/cgroup/pids";
  if (!fs::exists(root / "cgroup.procs")) return "";
  const fs::path cg = root / fmt::format("distlab-check-{}-{}", getpid(), counter++);
  std::error_code ec;
  fs::create_directory(cg, ec);
  if (ec) return "";
  std::ofstream(cg / "pids.max") << max_pids;
  return cg.string();
}

void remove_cgroup(const std::string& cg) {
  if (cg.empty()) return;
  for (int i = 0; i < 100; i++) {  // rmdir succeeds once the last process is gone
    std::ifstream procs(fs::path(cg) / "cgroup.procs");
    pid_t pid;
    bool any = false;
    while (procs >> pid) {
      kill(pid, SIGKILL);
      any = true;
    }
    if (!any && ::rmdir(cg.c_str()) == 0) return;
    usleep(20000);
  }
}

ProcResult run_process(const std::vector<std::string>& argv, double timeout_s, int64_t memory_mb, const std::string& cwd,
                       int64_t max_pids = 0) {
  const std::string cg = max_pids > 0 ? make_pids_cgroup(max_pids) : "";
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error("pipe failed");
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!cg.empty()) std::ofstream(fs::path(cg) / "cgroup.procs") << getpid() << std::flush;
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    rlimit as{rlim_t(memory_mb) << 20, rlim_t(memory_mb) << 20};
    setrlimit(RLIMIT_AS, &as);
    rlimit fsize{rlim_t(256) << 20, rlim_t(256) << 20};
    setrlimit(RLIMIT_FSIZE, &fsize);
    rlimit cpu{rlim_t(timeout_s * 4 + 5), rlim_t(timeout_s * 4 + 10)};
    setrlimit(RLIMIT_CPU, &cpu);
    rlimit core{0, 0};
    setrlimit(RLIMIT_CORE, &core);
    // RLIMIT_AS caps address space, not memory: glibc's per-thread malloc arenas reserve 64 MiB each, so
    // a check with a dozen threads (ranks, Gloo, OpenMP) would hit the cap without using the memory
    setenv("MALLOC_ARENA_MAX", "2", 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  ProcResult r;
  const auto deadline = t0 + std::chrono::duration<double>(timeout_s);
  char buf[65536];
  for (;;) {
    const int ms = int(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count()));
    pollfd p{fds[0], POLLIN, 0};
    int rc = poll(&p, 1, std::min(ms, 200));
    if (rc > 0) {
      ssize_t n = read(fds[0], buf, sizeof buf);
      if (n > 0) {
        if (r.output.size() < (1u << 20)) r.output.append(buf, size_t(n));  // a flood of output is cut
        continue;
      }
      break;  // EOF: the child (and its children) closed their output
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      r.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
  }
  close(fds[0]);
  if (!r.timed_out) {
    // output closed; the process may still linger (or a grandchild kept nothing open): bounded wait
    while (waitpid(pid, &r.status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        r.timed_out = true;
        kill(-pid, SIGKILL);
        break;
      }
      usleep(2000);
    }
  }
  if (r.timed_out) waitpid(pid, &r.status, 0);
  kill(-pid, SIGKILL);  // nothing of it survives (a fork bomb's leftovers included)
  remove_cgroup(cg);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string last_lines(const std::string& s, int n) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < s.size()) {
    size_t e = s.find('\n', start);
    if (e == std::string::npos) e = s.size();
    std::string l = s.substr(start, e - start);
    if (l.rfind("DISTLAB_CHECK_RESULT", 0) != 0 && !l.empty()) lines.push_back(l);
    start = e + 1;
  }
  std::string out;
  for (size_t i = lines.size() > size_t(n) ? lines.size() - size_t(n) : 0; i < lines.size(); i++) out += lines[i] + "\n";
  return out;
}

}  // namespace

BuildResult build_plugin(const Paths& p, const Lab& lab, const std::string& src_dir, const std::string& tag) {
  BuildResult b;
  const fs::path out_dir = fs::path(p.build_dir) / "labs" / lab.name;
  fs::create_directories(out_dir);
  b.plugin = (out_dir / (tag + ".so")).string();
  std::vector<std::string> argv = {"g++", "-std=c++20", "-O2", "-fPIC", "-shared", "-w", "-I" + p.source_dir};
  for (const auto& f : lab.files) {
    const fs::path src = fs::path(src_dir) / f;
    if (!fs::exists(src)) {
      b.log = fmt::format("{}: missing (the lab's files: {})", src.string(), fmt::join(lab.files, ", "));
      return b;
    }
    argv.push_back(src.string());
  }
  const std::string tmp = b.plugin + ".partial";
  for (auto a : {"-o", tmp.c_str()}) argv.push_back(a);
  argv.push_back("-L" + p.lib_dir);
  argv.push_back("-ldistlab_core");
  argv.push_back("-Wl,-rpath," + p.lib_dir);
  ProcResult r = run_process(argv, 300, 8192, "");
  b.log = r.output;
  b.ok = !r.timed_out && WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
  if (b.ok) fs::rename(tmp, b.plugin);
  else fs::remove(tmp);
  if (r.timed_out) b.log += "\n(compilation took longer than 300 s and was stopped)";
  return b;
}

Sandbox detect_sandbox(bool allow) {
  Sandbox s;
  if (allow) {
    ProcResult r = run_process({"bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
                                "--unshare-net", "--unshare-pid", "--die-with-parent", "true"},
                               20, 1024, "");
    s.bubblewrap = WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
  }
  const bool pids = fs::exists("/sys/fs/cgroup/pids/cgroup.procs") && geteuid() == 0;
  s.note = s.bubblewrap ? std::string("sandbox: bubblewrap (read-only root, private /tmp, no network, own PID namespace) + rlimits") +
                              (pids ? " + at most " + std::to_string(kMaxPids) + " tasks (pids cgroup)" : "")
                        : allow ? "sandbox: bubblewrap unavailable (apt-get install bubblewrap); rlimits and a process group only"
                                : "sandbox: off (--no-sandbox); rlimits and a process group only";
  return s;
}

std::vector<CheckOutcome> run_checks(const Paths& p, const Lab& lab, const std::string& plugin, const Sandbox& sb) {
  std::vector<CheckOutcome> out;
  for (const auto& spec : lab.checks) {
    std::vector<std::string> argv;
    if (sb.bubblewrap) {
      argv = {"bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--unshare-net",
              "--unshare-pid", "--die-with-parent"};
      // the private /tmp must not hide the checkout, the build or the plugin when they live under /tmp
      for (const std::string& d : {p.source_dir, p.build_dir, p.lib_dir, fs::path(plugin).parent_path().string(),
                                   fs::path(p.self_exe).parent_path().string()})
        for (const auto& a : {std::string("--ro-bind"), d, d}) argv.push_back(a);
      for (const auto& a : {"--chdir", "/tmp"}) argv.push_back(a);
    }
    for (const auto& a : {p.self_exe, std::string("lab-check"), lab.id, spec.name, plugin}) argv.push_back(a);
    const std::string cwd = sb.bubblewrap ? "" : fs::temp_directory_path().string();
    ProcResult r = run_process(argv, spec.timeout_s, spec.memory_mb, cwd, kMaxPids);
    // Gloo's rendezvous of thread ranks in a fresh process fails now and then ("could not connect process
    // group ... Connection closed by peer", about 1 run in 20 after a crashed check): the submission never
    // ran. That is the harness's failure, not the student's: run the check once more.
    if (r.output.find("could not connect process group") != std::string::npos)
      r = run_process(argv, spec.timeout_s, spec.memory_mb, cwd, kMaxPids);
    CheckOutcome o;
    o.spec = spec;
    o.seconds = r.seconds;
    o.hint = spec.hint;
    const auto pos = r.output.rfind("DISTLAB_CHECK_RESULT ");
    if (r.timed_out) {
      o.status = "timeout";
      o.expected = fmt::format("finished within {:.0f} s", spec.timeout_s);
      o.seen = "still running: stopped (a deadlock? every send needs a matching recv)";
    } else if (pos != std::string::npos) {
      auto j = nlohmann::json::parse(r.output.substr(pos + 21, r.output.find('\n', pos) - pos - 21));
      o.status = j["status"];
      o.expected = j["expected"];
      o.seen = j["seen"];
    } else if (WIFSIGNALED(r.status)) {
      const int s = WTERMSIG(r.status);
      o.status = "crash";
      o.expected = "the check runs to completion";
      o.seen = fmt::format("killed by signal {} ({}){}", s, sigabbrev_np(s) ? sigabbrev_np(s) : "?",
                           s == SIGXCPU ? ": CPU time limit" : s == SIGSEGV ? ": invalid memory access" : "");
    } else {
      o.status = "crash";
      o.expected = "the check runs to completion";
      o.seen = fmt::format("exited with code {}{}", WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1,
                           r.output.find("bad_alloc") != std::string::npos ? " (out of memory: the check's limit is " +
                                                                                 std::to_string(spec.memory_mb) + " MiB)"
                                                                           : "");
    }
    if (o.status != "pass" && o.seen.find('\n') == std::string::npos) {
      std::string tail = last_lines(r.output, 4);
      if (!tail.empty() && o.status != "fail") o.seen += "\n" + tail;
    }
    o.points = o.status == "pass" ? spec.points : 0;
    out.push_back(o);
  }
  return out;
}

int run_check_in_child(const std::string& lab_id, const std::string& check, const std::string& plugin) {
  nlohmann::json j = {{"status", "error"}, {"expected", ""}, {"seen", ""}};
  auto checks = checks_for_lab(lab_id);
  auto it = checks.find(check);
  if (it == checks.end()) {
    j["seen"] = fmt::format("lab {} has no check '{}'", lab_id, check);
  } else if (void* h = dlopen(plugin.c_str(), RTLD_NOW | RTLD_LOCAL); !h) {
    j["seen"] = fmt::format("cannot load the plugin: {}", dlerror());
  } else {
    try {
      CheckResult r = it->second(h);
      j = {{"status", r.passed ? "pass" : "fail"}, {"expected", r.expected}, {"seen", r.seen + (r.detail.empty() ? "" : "\n" + r.detail)}};
    } catch (const Error& e) {
      j = {{"status", "error"}, {"expected", "no exception"}, {"seen", e.full()}};
    } catch (const std::exception& e) {
      j = {{"status", "error"}, {"expected", "no exception"}, {"seen", e.what()}};
    }
  }
  std::cout << "DISTLAB_CHECK_RESULT " << j.dump() << std::endl;
  return 0;
}

}  // namespace distlab::grader
