// The launcher's workers (core/launch/worker_process.h): the guard process, and a worker forked and
// exec'd with torchrun's environment.
#include "core/launch/worker_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/util/error.h"

namespace distlab::launch_detail {

Guard::Guard() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error("pipe failed");
  pid_ = fork();
  if (pid_ < 0) throw Error(std::string("fork failed: ") + std::strerror(errno));
  if (pid_ == 0) {
    signal(SIGINT, SIG_IGN);  // Ctrl-C is the launcher's to handle; the guard waits for its verdict
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    if (fds[0] != 3) {
      dup2(fds[0], 3);
    }
    syscall(SYS_close_range, 4U, ~0U, 0U);  // no port, pipe or file of the launcher's stays open in here
    serve(3);
  }
  close(fds[0]);
  fd_ = fds[1];
}

Guard::~Guard() {
  close(fd_);
  waitpid(pid_, nullptr, 0);
}

void Guard::say(char kind, pid_t group) {
  Msg m{kind, int32_t(group)};
  [[maybe_unused]] ssize_t n = write(fd_, &m, sizeof m);  // 8 bytes: atomic on a pipe
}

void Guard::serve(int fd) {
  static pid_t groups[4096];
  int n = 0;
  Msg m;
  for (;;) {
    ssize_t r = read(fd, &m, sizeof m);
    if (r < 0 && errno == EINTR) continue;
    if (r != ssize_t(sizeof m)) break;  // the launcher is done, or gone
    if (m.kind == '+' && n < 4096) groups[n++] = m.group;
    if (m.kind == '-')
      for (int i = 0; i < n; i++)
        if (groups[i] == m.group) groups[i] = groups[--n];
  }
  for (int i = 0; i < n; i++) kill(-groups[i], SIGKILL);
  _exit(0);
}

std::string random_token() {
  unsigned char b[16];
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t n = getrandom(b + got, sizeof b - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(std::string("getrandom failed: ") + std::strerror(errno));
    got += size_t(n);
  }
  std::string t;
  for (unsigned char c : b) t += fmt::format("{:02x}", c);
  return t;
}

int free_port_on(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    return fmt::format("killed by signal {} ({})", s, sigabbrev_np(s) ? std::string("SIG") + sigabbrev_np(s) : "?");
  }
  return "unknown status";
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

pid_t spawn(const LaunchOptions& o, Worker& w, int world, const Rendezvous& rv, int out_write, int out_read, int attempt) {
  const pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid < 0) throw Error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    setsid();                          // its own session and process group: signalled, and killed, as a group
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the worker itself dies with the launcher; the guard takes its children
    if (getppid() != launcher) _exit(1);  // the launcher died before the line above
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    dup2(out_write, STDOUT_FILENO);
    dup2(out_write, STDERR_FILENO);
    close(out_write);
    close(out_read);
    // nothing of the launcher's (the store's sockets, other ranks' pipes and logs) crosses the exec
    constexpr unsigned kCloseRangeCloexec = 1u << 2;  // CLOSE_RANGE_CLOEXEC, Linux 5.11
    syscall(SYS_close_range, 3U, ~0U, kCloseRangeCloexec);
    // --threads-per-rank, else the OMP_NUM_THREADS the launcher was started with (as torchrun keeps it), else
    // the cores shared out between the local ranks
    const char* inherited = std::getenv("OMP_NUM_THREADS");
    const int threads = o.threads_per_rank > 0                   ? o.threads_per_rank
                        : inherited && std::atoi(inherited) > 0 ? std::atoi(inherited)
                                                                : std::max(1, usable_cores() / local_world(o));
    setenv("RANK", std::to_string(w.rank).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(w.local_rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(local_world(o)).c_str(), 1);
    setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
    setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
    setenv("MASTER_PORT", std::to_string(rv.program_port).c_str(), 1);
    setenv("DISTLAB_STORE_PORT", std::to_string(rv.store_port).c_str(), 1);
    setenv("DISTLAB_STORE_TOKEN", rv.token.c_str(), 1);
    setenv("DISTLAB_LAUNCHER_PID", std::to_string(launcher).c_str(), 1);
    setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
    // distlab's own ranks compute with OpenMP and keep OpenBLAS on one thread (core/tensor/runtime.cpp). OpenBLAS
    // reads this variable when it loads, before anything can call it: without it each rank starts a thread per
    // core that spins in sched_yield (12 % of a 1-thread GPT-tiny step's samples, taken from the other ranks)
    if (o.own_workers && !std::getenv("OPENBLAS_NUM_THREADS")) setenv("OPENBLAS_NUM_THREADS", "1", 1);
    // ... and glibc's malloc offers its heap and its large blocks to transparent huge pages (glibc 2.35+; older
    // ones ignore the tunable): a rank's first touch of its memory then faults once per 2 MiB, not per 4 KiB.
    // On the VMs this project is tested on a 4 KiB fault costs ~10 us; lab 04's grading test went 125.6 ->
    // 110.1 s of CPU. A GLIBC_TUNABLES that already says glibc.malloc.hugetlb is the user's and kept.
    if (o.own_workers) {
      const char* tunables = std::getenv("GLIBC_TUNABLES");
      const std::string t = tunables ? tunables : "";
      if (t.find("glibc.malloc.hugetlb") == std::string::npos)
        setenv("GLIBC_TUNABLES", (t.empty() ? std::string("glibc.malloc.hugetlb=1") : t + ":glibc.malloc.hugetlb=1").c_str(), 1);
    }
    setenv("DISTLAB_ERROR_FILE", w.error_file.c_str(), 1);
    setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt).c_str(), 1);  // torchrun's: 0, then 1 after a restart
    std::vector<char*> args;
    for (const auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    fprintf(stderr, "distlab run: cannot start '%s': %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

}  // namespace distlab::launch_detail
