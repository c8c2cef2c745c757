#include "grader/bridge/sandbox.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/syscall.h>
#include <fmt/format.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/util/error.h"

namespace fs = std::filesystem;

namespace distlab {

namespace {

// Our own cgroup under a v1 controller ("/process_api/abc" or "/"), from /proc/self/cgroup.
std::string own_cgroup(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::stringstream names(line.substr(a + 1, b - a - 1));
    for (std::string n; std::getline(names, n, ',');)
      if (n == controller) return line.substr(b + 1);
  }
  return "";
}

fs::path controller_root(const std::string& controller) {
  const fs::path root = fs::path("/sys/fs/cgroup") / controller;
  if (!fs::exists(root / "cgroup.procs")) return {};
  const fs::path mine = root / fs::path(own_cgroup(controller)).relative_path();
  return fs::exists(mine / "cgroup.procs") ? mine : root;
}

bool write_text(const fs::path& p, const std::string& s) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, s.data(), s.size()) == ssize_t(s.size());
  ::close(fd);
  return ok;
}

bool writable_controller(const std::string& c) {
  const fs::path root = controller_root(c);
  if (root.empty()) return false;
  const fs::path probe = root / fmt::format("distlab-probe-{}", getpid());
  std::error_code ec;
  if (!fs::create_directory(probe, ec)) return false;
  ::rmdir(probe.c_str());
  return true;
}

// /bin, /lib, /lib64, /sbin: symlinks into /usr on merged-/usr systems (Debian 12), real folders elsewhere.
void add_root_links(std::vector<std::string>& a) {
  for (const char* d : {"/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"}) {
    std::error_code ec;
    const auto st = fs::symlink_status(d, ec);
    if (ec || !fs::exists(st)) continue;
    if (fs::is_symlink(st)) {
      for (const auto& x : {std::string("--symlink"), fs::read_symlink(d).string(), std::string(d)}) a.push_back(x);
    } else {
      for (const auto& x : {std::string("--ro-bind"), std::string(d), std::string(d)}) a.push_back(x);
    }
  }
}

}  // namespace

std::string SandboxSupport::describe() const {
  if (!bwrap) return "sandbox: NONE (" + why_not + "): submissions run with rlimits only and can read this machine's files";
  std::string s = "sandbox: bubblewrap (uid 65534, no capabilities, only /usr and the plugin visible, no network, sized /tmp)";
  s += memory_cgroup ? " + memory cgroup" : " + NO memory cgroup";
  s += pids_cgroup ? " + task cap" : " + NO task cap";
  if (!complete()) s += " (" + why_not + ")";
  return s;
}

SandboxSupport probe_sandbox() {
  SandboxSupport s;
  SandboxPolicy p;
  p.tmpfs_mb = 1;
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  SpawnOptions o;
  o.output_fd = devnull;
  const int filter = seccomp_filter();  // probed as it is used: a kernel that refuses the filter is no sandbox
  if (filter >= 0) {
    p.seccomp_fd = 3;
    o.fds = {{filter, 3}};
  }
  const pid_t pid = spawn_process(sandbox_command(p, {"/usr/bin/true"}), o);
  int st = 0;
  s.bwrap = pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  if (devnull >= 0) ::close(devnull);
  if (filter >= 0) ::close(filter);
  if (!s.bwrap) s.why_not = "bubblewrap with user namespaces does not run here: apt-get install bubblewrap";
  const bool root = geteuid() == 0;
  s.memory_cgroup = root && writable_controller("memory");
  s.pids_cgroup = root && writable_controller("pids");
  if (s.bwrap && (!s.memory_cgroup || !s.pids_cgroup))
    s.why_not = root ? "cgroup v1 memory/pids controllers are not writable here" : "cgroups need root";
  return s;
}

int copy_to_memfd(const std::string& path) {
  const int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw Error(fmt::format("cannot read {}: {}", path, strerror(errno)));
  const int out = memfd_create("private-copy", MFD_CLOEXEC);
  char buf[1 << 16];
  bool ok = out >= 0;
  for (ssize_t n; ok && (n = ::read(in, buf, sizeof buf)) != 0;) ok = n > 0 && ::write(out, buf, size_t(n)) == n;
  ::close(in);
  if (!ok || lseek(out, 0, SEEK_SET) != 0) {
    if (out >= 0) ::close(out);
    throw Error(fmt::format("cannot copy {} for a sandbox: {}", path, strerror(errno)));
  }
  return out;
}

int seccomp_filter() {
#if defined(__x86_64__)
  constexpr uint32_t arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t arch = AUDIT_ARCH_AARCH64;
#else
  return -1;
#endif
  // the architecture first (a 32-bit syscall number means something else), then the refused calls
  const uint32_t deny = SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);
  const sock_filter prog[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, deny),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ptrace, 6, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 5, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 4, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_kcmp, 3, 0),
      // SysV shared memory and message queues hold memory no process maps: a student's bytes kept there
      // would be in no resident set (the fallback where the machine gives no memory cgroup)
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_shmget, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_msgget, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, deny),
  };
  const int fd = memfd_create("seccomp", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (::write(fd, prog, sizeof prog) != ssize_t(sizeof prog) || lseek(fd, 0, SEEK_SET) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::vector<std::string> sandbox_command(const SandboxPolicy& policy, const std::vector<std::string>& argv) {
  std::vector<std::string> a = {"bwrap", "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
                                "--cap-drop", "ALL", "--disable-userns", "--new-session", "--die-with-parent", "--clearenv",
                                "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
                                "--setenv", "MALLOC_ARENA_MAX", "2", "--setenv", "LANG", "C.UTF-8",
                                "--ro-bind", "/usr", "/usr"};
  add_root_links(a);
  // /tmp and /dev/shm are sized tmpfs: --dev's own /dev/shm would be a folder on an unsized tmpfs
  for (const auto& x : {"--proc", "/proc", "--dev", "/dev", "--size"}) a.push_back(x);
  a.push_back(std::to_string(policy.tmpfs_mb << 20));
  for (const auto& x : {"--tmpfs", "/tmp", "--size"}) a.push_back(x);
  a.push_back(std::to_string(policy.tmpfs_mb << 20));
  for (const auto& x : {"--tmpfs", "/dev/shm", "--dir", "/run"}) a.push_back(x);
  for (const auto& [from, to] : policy.ro_binds)
    for (const auto& x : {std::string("--ro-bind"), from, to}) a.push_back(x);
  for (const auto& [from, to] : policy.rw_binds)
    for (const auto& x : {std::string("--bind"), from, to}) a.push_back(x);
  for (const auto& [fd, to] : policy.private_copies)
    for (const auto& x : {std::string("--perms"), std::string("0555"), std::string("--ro-bind-data"), std::to_string(fd), to}) a.push_back(x);
  if (policy.seccomp_fd >= 0)
    for (const auto& x : {std::string("--seccomp"), std::to_string(policy.seccomp_fd)}) a.push_back(x);
  for (const auto& x : {std::string("--chdir"), policy.chdir, std::string("--")}) a.push_back(x);
  a.insert(a.end(), argv.begin(), argv.end());
  return a;
}

CheckCgroup::CheckCgroup(int64_t memory_mb, int64_t max_tasks) {
  if (geteuid() != 0) return;
  static std::atomic<int> counter{0};
  const std::string name = fmt::format("distlab-check-{}-{}", getpid(), counter++);
  auto make = [&](const std::string& controller, const std::string& file, int64_t value) {
    const fs::path root = controller_root(controller);
    if (root.empty()) return;
    const fs::path d = root / name;
    std::error_code ec;
    if (!fs::create_directory(d, ec)) return;
    if (!write_text(d / file, std::to_string(value))) {
      ::rmdir(d.c_str());
      return;
    }
    dirs_.push_back(d.string());
    if (controller == "memory") memory_dir_ = d.string();
  };
  if (memory_mb > 0) make("memory", "memory.limit_in_bytes", memory_mb << 20);
  if (max_tasks > 0) make("pids", "pids.max", max_tasks);
}

CheckCgroup::~CheckCgroup() {
  kill_all();
  for (const auto& d : dirs_) {
    // the cgroups made inside it first (a plugin's own: grader/jobs.cpp), deepest first
    std::vector<fs::path> inner;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(d, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_directory(ec)) inner.push_back(it->path());
    std::sort(inner.begin(), inner.end(), [](const fs::path& a, const fs::path& b) { return a.string().size() > b.string().size(); });
    for (const auto& in : inner)
      for (int i = 0; i < 200 && ::rmdir(in.c_str()) != 0 && errno == EBUSY; i++) usleep(10000);
    for (int i = 0; i < 200 && ::rmdir(d.c_str()) != 0; i++) {  // rmdir succeeds once the last task is gone
      kill_all();
      usleep(10000);
    }
  }
}

std::vector<std::string> CheckCgroup::procs_files() const {
  std::vector<std::string> files;
  for (const auto& d : dirs_) files.push_back((fs::path(d) / "cgroup.procs").string());
  return files;
}

void CheckCgroup::kill_all() const {
  for (const auto& d : dirs_) {
    std::ifstream procs(fs::path(d) / "cgroup.procs");
    for (pid_t pid; procs >> pid;) ::kill(pid, SIGKILL);
  }
}

bool CheckCgroup::oom_killed() const {
  for (const auto& d : dirs_) {
    std::ifstream in(fs::path(d) / "memory.failcnt");
    int64_t n = 0;
    if (in >> n && n > 0) return true;
  }
  return false;
}

pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& o) {
  // everything the child needs is prepared here: between fork and exec only async-signal-safe calls
  std::vector<char*> args;
  for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  if (o.clean_env) {  // nothing of ours: no token, no grader variables (bwrap's /proc/1/environ is this)
    env_strings = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8"};
  } else {
    for (char** e = environ; *e; e++)
      if (strncmp(*e, "MALLOC_ARENA_MAX=", 17) != 0) env_strings.emplace_back(*e);
  }
  env_strings.emplace_back("MALLOC_ARENA_MAX=2");  // RLIMIT_AS counts glibc's 64 MiB per-thread arenas
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> cgroup_files = o.cgroup ? o.cgroup->procs_files() : std::vector<std::string>{};
  if (!o.join_procs.empty()) cgroup_files.push_back(o.join_procs);  // a memory cgroup under the check's: the last joined wins
  std::vector<std::pair<int, int>> fds = o.fds;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw Error(fmt::format("cannot start {}: fork failed: {}", argv.empty() ? "?" : argv[0], strerror(errno)));
  if (pid > 0) return pid;
  // the child: only async-signal-safe calls from here to exec
  if (o.new_session) setsid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent died before PDEATHSIG was armed
  char pid_text[24];
  int len = 0;
  for (pid_t v = getpid(); v > 0; v /= 10) pid_text[len++] = char('0' + v % 10);
  for (int i = 0; i < len / 2; i++) std::swap(pid_text[i], pid_text[len - 1 - i]);
  for (const auto& f : cgroup_files) {
    const int fd = ::open(f.c_str(), O_WRONLY);
    if (fd >= 0 && ::write(fd, pid_text, size_t(len)) < 0) _exit(126);
    if (fd >= 0) ::close(fd);
  }
  if (o.run_as != 0 && geteuid() == 0) {  // after joining the cgroup (root's to write), before anything else
    if (setgroups(0, nullptr) != 0 || setresgid(o.run_as, o.run_as, o.run_as) != 0 || setresuid(o.run_as, o.run_as, o.run_as) != 0)
      _exit(126);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a change of credentials clears it
    if (getppid() != parent) _exit(127);
  }
  const int in = o.stdin_fd >= 0 ? o.stdin_fd : ::open("/dev/null", O_RDONLY);
  // move the passed fds out of the way first, so that dup2 into 3, 4, ... never clobbers a source
  for (auto& [from, to] : fds) from = fcntl(from, F_DUPFD, 100);
  dup2(in, 0);
  if (o.output_fd >= 0) {
    dup2(o.output_fd, 1);
    dup2(o.output_fd, 2);
  }
  int top = 2;
  for (const auto& [from, to] : fds) {
    dup2(from, to);
    top = std::max(top, to);
  }
  close_range(unsigned(top + 1), ~0U, 0);
  auto limit = [](int res, rlim_t v) {
    rlimit r{v, v};
    setrlimit(res, &r);
  };
  if (o.memory_mb > 0) limit(RLIMIT_AS, rlim_t(o.memory_mb) << 20);
  if (o.cpu_s > 0) limit(RLIMIT_CPU, rlim_t(o.cpu_s) + 1);
  if (o.file_mb > 0) limit(RLIMIT_FSIZE, rlim_t(o.file_mb) << 20);
  limit(RLIMIT_CORE, 0);
  signal(SIGXFSZ, SIG_IGN);  // a write past the file limit fails instead of killing the writer
  signal(SIGPIPE, SIG_DFL);
  execvpe(args[0], args.data(), envp.data());
  _exit(127);
}

RunResult run_to_end(const std::vector<std::string>& argv, SpawnOptions o, double timeout_s, size_t keep_bytes) {
  RunResult r;
  const int out = memfd_create("output", MFD_CLOEXEC);
  if (out < 0) throw Error(fmt::format("cannot start {}: memfd_create: {}", argv[0], strerror(errno)));
  o.output_fd = out;
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  pid_t pid;
  try {
    pid = spawn_process(argv, o);
  } catch (...) {
    ::close(out);
    throw;
  }
  for (;;) {
    const pid_t w = waitpid(pid, &r.status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      r.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      waitpid(pid, &r.status, 0);
      break;
    }
    usleep(w == 0 ? 5000 : 1000);
  }
  if (o.new_session) ::kill(-pid, SIGKILL);  // leftovers of its group
  if (o.cgroup) o.cgroup->kill_all();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct stat st{};
  if (fstat(out, &st) == 0 && st.st_size > 0) {
    const off_t from = st.st_size > off_t(keep_bytes) ? st.st_size - off_t(keep_bytes) : 0;
    std::string s(size_t(st.st_size - from), '\0');
    const ssize_t n = pread(out, s.data(), s.size(), from);
    s.resize(n > 0 ? size_t(n) : 0);
    r.output = sanitize_output(from > 0 ? "[... earlier output cut]\n" + s : s, keep_bytes + 32);
  }
  ::close(out);
  return r;
}

std::string describe_wait_status(int st) {
  if (WIFEXITED(st)) return fmt::format("exited with code {}", WEXITSTATUS(st));
  if (WIFSIGNALED(st)) {
    const int s = WTERMSIG(st);
    const char* why = s == SIGSEGV ? ": invalid memory access" : s == SIGXCPU ? ": CPU time limit" : s == SIGKILL ? ": killed" :
                      s == SIGABRT ? ": aborted (an uncaught exception or a failed assert)" : s == SIGFPE ? ": arithmetic error" : "";
    return fmt::format("killed by signal {} ({}{})", s, sigabbrev_np(s) ? sigabbrev_np(s) : "?", why);
  }
  return "stopped";
}

std::string sanitize_output(const std::string& raw, size_t max_bytes) {
  std::string s = raw.size() > max_bytes ? raw.substr(raw.size() - max_bytes) : raw;
  std::string out;
  out.reserve(s.size());
  if (raw.size() > max_bytes) out += "[... " + std::to_string(raw.size() - max_bytes) + " earlier bytes cut]\n";
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += (c >= 0x20 && c != 0x7f) || c == '\n' || c == '\t' ? char(c) : '?';
      i++;
      continue;
    }
    // a well-formed UTF-8 sequence passes whole; anything else becomes U+FFFD
    const size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size() && c >= 0xC2 && c <= 0xF4;
    for (size_t k = 1; ok && k < len; k++) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok && len == 3 && c == 0xE0) ok = static_cast<unsigned char>(s[i + 1]) >= 0xA0;  // overlong
    if (ok && len == 3 && c == 0xED) ok = static_cast<unsigned char>(s[i + 1]) < 0xA0;   // surrogates
    if (ok && len == 4 && c == 0xF0) ok = static_cast<unsigned char>(s[i + 1]) >= 0x90;
    if (ok && len == 4 && c == 0xF4) ok = static_cast<unsigned char>(s[i + 1]) < 0x90;
    if (ok && len == 3) {  // bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069) reorder what a reader sees
      const unsigned c1 = static_cast<unsigned char>(s[i + 1]), c2 = static_cast<unsigned char>(s[i + 2]);
      const unsigned cp = ((c & 0x0Fu) << 12) | ((c1 & 0x3Fu) << 6) | (c2 & 0x3Fu);
      if ((cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200E || cp == 0x200F) {
        out += '?';
        i += len;
        continue;
      }
    }
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      i++;
    }
  }
  return out;
}

}  // namespace distlab
