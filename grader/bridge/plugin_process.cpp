#include "grader/bridge/plugin_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string_view>
#include <thread>

namespace distlab {

using wire::Clock;
using wire::Io;

PluginProcess::PluginProcess(const PluginLaunch& launch) : launch_(launch) {
  const int host_copy = launch.sandbox ? copy_to_memfd(launch.host_exe) : -1;  // this sandbox's own copy (throws first)
  const int filter = launch.sandbox ? seccomp_filter() : -1;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    for (int fd : {filter, host_copy})
      if (fd >= 0) ::close(fd);
    throw Error(fmt::format("cannot start {}: socketpair: {}", launch.name, strerror(errno)));
  }
  if (launch.output_fd < 0) {
    log_fd_ = memfd_create("plugin-output", MFD_CLOEXEC);
    if (log_fd_ < 0) log_fd_ = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  }
  std::vector<std::string> argv = {launch.host_exe, launch.lab_id, launch.plugin};
  if (launch.sandbox) {
    SandboxPolicy p;
    p.ro_binds = {{launch.plugin, "/run/plugin.so"}};
    p.private_copies = {{5, "/run/distlab-labhost"}};
    // /tmp and /dev/shm are memory too: a memory cgroup counts what is written there (shmem is charged to
    // the writer's cgroup); the resident-set fallback does not see it, so there they hold 1 MiB each
    p.tmpfs_mb = launch.memory_cgroup.empty() ? 1 : 64;
    p.seccomp_fd = filter >= 0 ? 4 : -1;
    argv = sandbox_command(p, {"/run/distlab-labhost", launch.lab_id, "/run/plugin.so"});
  }
  SpawnOptions o;
  o.output_fd = launch.output_fd >= 0 ? launch.output_fd : log_fd_;
  o.fds = {{sv[1], 3}};
  if (filter >= 0) o.fds.push_back({filter, 4});  // bwrap reads the program and closes it
  if (host_copy >= 0) o.fds.push_back({host_copy, 5});
  o.cgroup = launch.cgroup;
  o.memory_mb = launch.memory_mb;
  o.cpu_s = launch.cpu_s;
  o.file_mb = 8;
  o.clean_env = true;  // a trainer's environment holds the job's store token: none of it reaches the plugin
  if (!launch.memory_cgroup.empty()) o.join_procs = launch.memory_cgroup + "/cgroup.procs";
  try {
    pid_ = spawn_process(argv, o);
  } catch (...) {
    ::close(sv[0]);
    ::close(sv[1]);
    for (int fd : {filter, host_copy})
      if (fd >= 0) ::close(fd);
    throw;
  }
  ::close(sv[1]);
  for (int fd : {filter, host_copy})
    if (fd >= 0) ::close(fd);
  sock_ = sv[0];
}

PluginProcess::~PluginProcess() {
  kill_now();
  if (sock_ >= 0) ::close(sock_);
  if (log_fd_ >= 0) ::close(log_fd_);
}

void PluginProcess::kill_now() {
  if (pid_ > 0 && !reaped_) {
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    if (waitpid(pid_, &status_, 0) == pid_) reaped_ = true;
  }
}

std::string PluginProcess::output_tail(size_t max_bytes) const {
  struct stat st{};
  if (log_fd_ < 0 || fstat(log_fd_, &st) != 0 || st.st_size <= 0) return "";
  const off_t from = st.st_size > off_t(max_bytes) ? st.st_size - off_t(max_bytes) : 0;
  std::string s(size_t(st.st_size - from), '\0');
  const ssize_t n = pread(log_fd_, s.data(), s.size(), from);
  s.resize(n > 0 ? size_t(n) : 0);
  return sanitize_output(from > 0 ? "[...]" + s : s, max_bytes + 8);
}

std::string PluginProcess::gone(const char* during) {
  if (!reaped_) {
    // the socket closed: the process exits now (or was killed); give it a moment, then make sure
    for (int i = 0; i < 200 && !reaped_; i++) {
      if (waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
      else std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill_now();
  }
  // under bubblewrap the plugin's host is not our child: bwrap reports its death by signal N as exit 128 + N
  int st = status_;
  if (launch_.sandbox && WIFEXITED(st) && WEXITSTATUS(st) > 128) st = WEXITSTATUS(st) - 128;
  std::string s = fmt::format("{} {} during {}", launch_.name, describe_wait_status(st), during);
  const std::string tail = output_tail(1200);
  if (!tail.empty()) s += "; its last output:\n" + tail;
  return s;
}

namespace {

// A number from a cgroup file ("" or unreadable: -1).
int64_t read_number(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  char buf[64];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char* end = nullptr;
  const long long v = std::strtoll(buf, &end, 10);
  return end == buf ? -1 : int64_t(v);
}

// Every process under `root` (its children, theirs, ...), root included: the host's bwrap, bwrap's init,
// the host, and whatever the plugin started.
std::vector<pid_t> process_tree(pid_t root) {
  std::vector<pid_t> all = {root};
  for (size_t i = 0; i < all.size() && all.size() < 4096; i++) {
    const std::string task_dir = fmt::format("/proc/{}/task", all[i]);
    std::error_code ec;
    for (const auto& t : std::filesystem::directory_iterator(task_dir, ec)) {
      std::ifstream in(t.path() / "children");
      for (pid_t c; in >> c;) all.push_back(c);
    }
  }
  return all;
}

// A "VmRSS:" or "VmHWM:" line of /proc/PID/status, in bytes (0 when gone).
int64_t status_kib(pid_t pid, const char* field) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  const size_t len = std::strlen(field);
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, len, field) == 0) return std::atoll(line.c_str() + len) * 1024;
  return 0;
}

// The pages of every memfd the tree holds open (each file once): written with write(), never mapped, they
// are in no resident set, and a memfd is no file in the sandbox's sized tmpfs either
int64_t memfd_bytes(pid_t root) {
  std::set<std::pair<dev_t, ino_t>> seen;
  int64_t sum = 0;
  for (pid_t p : process_tree(root)) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", p), ec)) {
      char target[256];
      const ssize_t n = ::readlink(e.path().c_str(), target, sizeof target - 1);
      if (n <= 0 || std::string_view(target, size_t(n)).rfind("/memfd:", 0) != 0) continue;
      struct stat st{};
      if (::stat(e.path().c_str(), &st) == 0 && seen.insert({st.st_dev, st.st_ino}).second) sum += int64_t(st.st_blocks) * 512;
    }
  }
  return sum;
}

int64_t tree_bytes(pid_t root, const char* field) {
  int64_t sum = memfd_bytes(root);
  for (pid_t p : process_tree(root)) sum += status_kib(p, field);
  return sum;
}

// The cgroup's usage now and its peak (v1: memory.usage_in_bytes, memory.max_usage_in_bytes; v2:
// memory.current, memory.peak); -1 where neither is there.
int64_t cgroup_bytes(const std::string& dir, bool peak) {
  const int64_t v1 = read_number(dir + (peak ? "/memory.max_usage_in_bytes" : "/memory.usage_in_bytes"));
  return v1 >= 0 ? v1 : read_number(dir + (peak ? "/memory.peak" : "/memory.current"));
}

}  // namespace

PluginMemory PluginProcess::memory() const {
  PluginMemory m = memory_;
  if (m.method == "cgroup") m.peak = std::max<int64_t>(0, cgroup_bytes(launch_.memory_cgroup, true));
  else if (m.method == "rss" && !reaped_) m.peak = tree_bytes(pid_, "VmHWM:");
  return m;
}

void PluginProcess::wait_ready(Clock::time_point deadline) {
  wire::Frame f;
  std::vector<char> payload;
  Io r = wire::read_frame(sock_, f, payload, 64 << 10, deadline);
  if (r == Io::ok && f.op == labproto::kBeforeLoad) {
    // the host alone, nothing of the student's loaded: its baseline. In its own cgroup when it joined one
    // (a process is in it), else the resident sets of its process tree
    std::ifstream procs(launch_.memory_cgroup + "/cgroup.procs");
    pid_t any = 0;
    if (!launch_.memory_cgroup.empty() && (procs >> any) && cgroup_bytes(launch_.memory_cgroup, false) > 0) {
      memory_.method = "cgroup";
      memory_.before_load = cgroup_bytes(launch_.memory_cgroup, false);
    } else {
      memory_.method = "rss";
      memory_.before_load = tree_bytes(pid_, "VmRSS:");
    }
    wire::Frame go;
    go.op = labproto::kLoad;
    send(go, nullptr, 0, deadline, "loading");
    r = wire::read_frame(sock_, f, payload, 64 << 10, deadline);
  }
  if (r == Io::timeout) {
    kill_now();
    throw PluginError("timeout", fmt::format("{} did not finish loading in time (a global constructor that never returns?)", launch_.name),
                      "code at namespace scope runs when the plugin loads: keep it out of static initializers");
  }
  if (r != Io::ok) throw PluginError("crash", gone("loading"));
  if (f.op == labproto::kLoadFailed)
    throw PluginError("load", fmt::format("{} could not be loaded: {}", launch_.name,
                                          sanitize_output(std::string(payload.begin(), payload.end()), 2000)));
  if (f.op != labproto::kHello)
    throw PluginError("protocol", fmt::format("{} sent opcode {} instead of its hello", launch_.name, f.op));
}

void PluginProcess::send(const wire::Frame& f, const void* payload, uint64_t bytes, Clock::time_point deadline, const char* during) {
  const Io r = wire::write_frame(sock_, f, payload, bytes, deadline);
  if (r == Io::timeout) {
    kill_now();
    throw PluginError("timeout", fmt::format("{} stopped reading its requests during {}", launch_.name, during));
  }
  if (r != Io::ok) throw PluginError("crash", gone(during));
}

void PluginProcess::receive(wire::Frame& f, std::vector<char>& payload, Clock::time_point deadline, const char* during,
                            uint64_t max_bytes) {
  const Io r = wire::read_frame(sock_, f, payload, max_bytes, deadline);
  if (r == Io::ok) return;
  if (r == Io::timeout) {
    kill_now();
    std::string s = fmt::format("{} did not answer in time during {} (an endless loop, or a wait that never ends?)", launch_.name, during);
    const std::string tail = output_tail(800);
    throw PluginError("timeout", tail.empty() ? s : s + "; its last output:\n" + tail);
  }
  if (r == Io::too_big) {
    kill_now();
    throw PluginError("protocol", fmt::format("{} sent a message of {} bytes during {}, over the limit of {}", launch_.name,
                                              f.bytes, during, max_bytes));
  }
  throw PluginError("crash", gone(during));
}

}  // namespace distlab
