#include "core/launch/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <tuple>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "core/comm/error_file.h"
#include "core/comm/errors.h"
#include "core/comm/tcp_store.h"
#include "core/comm/watchdog.h"
#include "core/launch/slurm_launch.h"
#include "core/launch/worker_process.h"

namespace distlab {

using namespace launch_detail;

namespace {

// Signal handlers can only reach globals: the interrupt flag, and a self-pipe that wakes poll() the moment a
// worker exits, so the first rank to fail is reaped (and blamed) before the ranks that fail because of it.
std::atomic<int> g_interrupted{0};
int g_sigchld_pipe[2] = {-1, -1};
void on_signal(int sig) { g_interrupted = sig; }
void on_sigchld(int) {
  const char c = 1;
  [[maybe_unused]] ssize_t n = write(g_sigchld_pipe[1], &c, 1);
}

class Group {
 public:
  Group(const LaunchOptions& o, int attempt, Guard& guard) : o_(o), attempt_(attempt), guard_(guard) {}
  ~Group() {  // the workers' progress pages (their error files stay: a failure's record)
    std::error_code ec;
    for (const auto& w : workers_) std::filesystem::remove(w.error_file + ".progress", ec);
  }

  bool log_failed() const { return log_failed_; }

  // Runs one attempt; returns 0 on success, 1 on a rank's failure, 128 + the signal on an interrupt (130, 143).
  int run(const Rendezvous& rv) {
    const int world = o_.nnodes * o_.nproc_per_node;
    for (int l = 0; l < o_.nproc_per_node; l++) {
      Worker w;
      w.local_rank = o_.local_rank_base + l;
      w.rank = o_.node_rank * o_.nproc_per_node + l;
      w.error_file = fmt::format("/tmp/distlab-error-{}-{}-{}.json", getpid(), attempt_, w.rank);
      std::filesystem::remove(w.error_file);
      std::filesystem::remove(w.error_file + ".progress");
      if (!o_.log_dir.empty()) {  // opened before any worker starts: a bad --log-dir starts nothing
        std::string name = attempt_ ? fmt::format("rank_{}.attempt{}.log", w.rank, attempt_) : fmt::format("rank_{}.log", w.rank);
        w.log = std::make_unique<std::ofstream>(std::filesystem::path(o_.log_dir) / name);
        if (!*w.log) throw IoError(fmt::format("cannot write {}", (std::filesystem::path(o_.log_dir) / name).string()),
                                   "--log-dir must be a folder you can write");
      }
      workers_.push_back(std::move(w));
    }
    for (auto& w : workers_) {
      int fds[2];
      if (pipe2(fds, O_CLOEXEC) != 0) throw Error("pipe failed");
      w.pid = spawn(o_, w, world, rv, fds[1], fds[0], attempt_);
      guard_.watch(w.pid);
      close(fds[1]);
      fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);  // never blocked by a writer that outlives the worker
      w.out_fd = fds[0];
      w.running = true;
    }
    return supervise();
  }

 private:
  void on_line(Worker& w, const std::string& line) {
    if (w.rank == 0) {
      std::cout << line << "\n";
      std::cout.flush();
    }
    if (w.log && !log_failed_) {
      *w.log << line << "\n" << std::flush;
      if (!*w.log) {  // a full disk: say so once; the job goes on, and its exit code says the logs are incomplete
        log_failed_ = true;
        std::cerr << fmt::format("distlab run: writing {}/rank_{}.log failed (is the disk full?): the logs from here on are lost\n",
                                 o_.log_dir, w.rank);
      }
    }
    w.tail.push_back(line);
    if (int(w.tail.size()) > o_.tail_lines) w.tail.pop_front();
  }

  // What the pipe holds now (non-blocking): one read, or all of it with `until_eof`. At its end (or when
  // `flush`), the last line without a newline too.
  void drain(Worker& w, bool until_eof, bool flush = false) {
    char buf[65536];
    for (;;) {
      ssize_t n = read(w.out_fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if ((n == 0 || flush) && !w.partial.empty()) {
          on_line(w, w.partial);
          w.partial.clear();
        }
        return;
      }
      w.partial.append(buf, size_t(n));
      size_t pos;
      while ((pos = w.partial.find('\n')) != std::string::npos) {
        on_line(w, w.partial.substr(0, pos));
        w.partial.erase(0, pos + 1);
      }
      if (!until_eof) return;
    }
  }

  void poll_output(int timeout_ms) {
    std::vector<pollfd> fds;
    std::vector<Worker*> owners;
    for (auto& w : workers_)
      if (w.out_fd >= 0) {
        fds.push_back({w.out_fd, POLLIN, 0});
        owners.push_back(&w);
      }
    fds.push_back({g_sigchld_pipe[0], POLLIN, 0});
    if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    if (fds.back().revents & POLLIN) {
      char buf[64];
      while (read(g_sigchld_pipe[0], buf, sizeof buf) > 0) {
      }
      reap();
    }
    fds.pop_back();
    for (size_t i = 0; i < fds.size(); i++) {
      if (fds[i].revents & POLLIN) drain(*owners[i], false);
      else if (fds[i].revents & (POLLHUP | POLLERR)) {
        drain(*owners[i], true);
        close(owners[i]->out_fd);
        owners[i]->out_fd = -1;
      }
    }
  }

  bool reap() {  // true when some worker exited since the last call
    bool any = false;
    for (auto& w : workers_) {
      if (!w.running) continue;
      int st;
      if (waitpid(w.pid, &st, WNOHANG) == w.pid) {
        kill(-w.pid, SIGKILL);  // whatever it started and left behind in its group
        guard_.forget(w.pid);
        w.running = false;
        w.status = st;
        w.exit_order = exits_++;
        any = true;
      }
    }
    return any;
  }

  void signal_all(int sig) {
    for (auto& w : workers_)
      if (w.running) kill(-w.pid, sig);
  }

  void stop_all() {
    reap();  // whoever already exited did so on its own
    for (auto& w : workers_) w.stopped_by_us = w.running;
    signal_all(SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o_.grace_s);
    while (std::chrono::steady_clock::now() < deadline) {
      reap();
      bool alive = false;
      for (auto& w : workers_) alive = alive || w.running;
      if (!alive) break;
      poll_output(50);
    }
    signal_all(SIGKILL);
    for (auto& w : workers_)
      if (w.running) {
        waitpid(w.pid, &w.status, 0);
        kill(-w.pid, SIGKILL);
        guard_.forget(w.pid);
        w.running = false;
      }
    finish_output();
  }

  // After every worker exited: their output to its end, for at most the grace. A descendant that left the
  // worker's process group (setsid) and kept the pipe open must not hold the launcher: whoever still holds
  // a pipe's write end then is killed (found through /proc/*/fd: what the launcher can reach), and the
  // pipe closed.
  void finish_output() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::min(o_.grace_s, 5.0));
    for (;;) {
      bool open = false;
      for (auto& w : workers_) open = open || w.out_fd >= 0;
      if (!open || std::chrono::steady_clock::now() >= until) break;
      poll_output(20);
    }
    for (auto& w : workers_)
      if (w.out_fd >= 0) {
        const int killed = kill_pipe_writers(w.out_fd);
        drain(w, true, true);
        close(w.out_fd);
        w.out_fd = -1;
        if (killed > 0)
          std::cerr << fmt::format("distlab run: rank {} exited, but {} process(es) it started kept its output open (they left its "
                                   "process group: setsid?): killed\n", w.rank, killed);
      }
  }

  // Every process that holds the pipe `read_fd` reads from (its other end), other than this one: SIGKILL.
  static int kill_pipe_writers(int read_fd) {
    struct stat me {};
    if (fstat(read_fd, &me) != 0) return 0;
    const std::string want = fmt::format("pipe:[{}]", me.st_ino);
    int killed = 0;
    std::error_code ec;
    for (const auto& p : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string name = p.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      const pid_t pid = pid_t(std::stol(name));
      if (pid == getpid()) continue;
      std::error_code e2;
      for (const auto& f : std::filesystem::directory_iterator(p.path() / "fd", e2)) {
        std::error_code e3;
        if (std::filesystem::read_symlink(f.path(), e3).string() == want) {
          if (kill(pid, SIGKILL) == 0) killed++;
          break;
        }
      }
    }
    return killed;
  }

  int supervise() {
    for (;;) {
      poll_output(100);
      reap();
      if (g_interrupted) {
        std::cerr << fmt::format("distlab run: interrupted (signal {}): stopping {} worker(s)\n", int(g_interrupted),
                                 workers_.size());
        stop_all();
        return 128 + int(g_interrupted);  // a shell's convention: 130 for SIGINT (Ctrl-C), 143 for SIGTERM
      }
      const Worker* first_failure = nullptr;
      bool all_done = true;
      for (auto& w : workers_) {
        if (w.running) all_done = false;
        else if (failed(w.status) && (!first_failure || w.exit_order < first_failure->exit_order)) first_failure = &w;
      }
      if (first_failure) {
        // a rank that failed because a peer vanished: give the peer a moment to finish exiting, so its own
        // exit status (the real cause) is what we report
        if (read_worker_error(first_failure->error_file).secondary) {
          auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
          while (std::chrono::steady_clock::now() < until && !primary_failure_seen()) poll_output(20);
        }
        for (auto& w : workers_) {
          if (w.running) w.state_at_failure = process_state(w.pid);
          w.progress_at_failure = read_worker_progress(w.error_file);  // how many collectives it had entered
        }
        stop_all();
        const Worker& culprit = blame();
        report_failure(culprit, root_cause(culprit));
        return 1;
      }
      if (all_done) {
        finish_output();
        return 0;
      }
    }
  }

  bool primary_failure_seen() {
    reap();
    for (auto& w : workers_)
      if (!w.running && failed(w.status) && !read_worker_error(w.error_file).secondary) return true;
    return false;
  }

  // The rank that failed first: workers we stopped are victims; an error marked secondary (a peer's
  // connection dropped) came after someone else's; then the earliest recorded time, then reap order.
  const Worker& blame() {
    const Worker* best = nullptr;
    auto key = [](const Worker& w) {
      WorkerError e = read_worker_error(w.error_file);
      const bool victim = w.stopped_by_us && WIFSIGNALED(w.status) &&
                          (WTERMSIG(w.status) == SIGTERM || WTERMSIG(w.status) == SIGKILL);
      return std::make_tuple(e.secondary, victim, e.present ? e.time_ns : LLONG_MAX, w.exit_order);
    };
    for (auto& w : workers_)
      if (failed(w.status) && (!best || key(w) < key(*best))) best = &w;
    return *best;
  }

  // A rank whose collective timed out waiting for ranks that were still alive (stopped, or stuck before
  // the collective) did not cause the failure: the first of those did. nullptr: the culprit is the cause.
  // A rank the failed collective did not wait for can still be the cause: one stopped inside the collective
  // (it arrived, then SIGSTOP) or in another group's (a pipeline stage's, a tensor slice's). A rank that was
  // stopped (state T) when the failure was seen is named then: a healthy rank that timed out is not blamed.
  //
  // The decision rests on evidence, never on which rank's timeout fired first (under load that is any of
  // the waiting ones): 1. a rank that was stopped (state T) when the failure was seen; 2. of the ranks the
  // failed collective waited for and that were still alive, the one alone with the fewest collectives
  // entered (each rank publishes its count: error_file.h), or the only one; 3. otherwise it is undetermined
  // (undetermined_ names the candidates), and the report says so instead of guessing.
  const Worker* root_cause(const Worker& culprit) {
    undetermined_.clear();
    for (const auto& w : workers_)
      if (&w != &culprit && w.stopped_by_us && (w.state_at_failure == 'T' || w.state_at_failure == 't')) return &w;
    std::vector<const Worker*> waited;
    for (int r : read_worker_error(culprit.error_file).waiting_for)
      for (const auto& w : workers_)
        if (w.rank == r && w.stopped_by_us && &w != &culprit) waited.push_back(&w);
    if (waited.empty()) return nullptr;
    if (waited.size() == 1) return waited[0];
    const Worker* behind = nullptr;
    bool alone = true, known = true;
    for (const Worker* w : waited) {
      known = known && w->progress_at_failure >= 0;
      if (!behind || w->progress_at_failure < behind->progress_at_failure) behind = w, alone = true;
      else if (w->progress_at_failure == behind->progress_at_failure) alone = false;
    }
    if (known && alone) return behind;
    undetermined_ = waited;
    return nullptr;
  }

  static std::string describe_state(char state) {
    if (state == 'T' || state == 't') return "it was stopped (SIGSTOP, Ctrl-Z or a debugger)";
    if (state == 'D') return "it was blocked in the kernel (disk or network I/O)";
    return "it was alive but never reached the collective (stuck in a loop, or waiting on something else)";
  }

  void report_failure(const Worker& culprit, const Worker* cause) {
    const Worker* f = &culprit;
    const int rank = f->rank;
    std::string msg;
    if (cause) {
      msg = fmt::format("distlab run: rank {} (local rank {}, pid {}) stopped answering: {}; rank {} failed waiting for it ({})",
                        cause->rank, cause->local_rank, cause->pid, describe_state(cause->state_at_failure), rank,
                        describe_status(f->status));
    } else {
      msg = fmt::format("distlab run: rank {} (local rank {}, pid {}) failed: {}", rank, f->local_rank, f->pid, describe_status(f->status));
      if (!undetermined_.empty()) {
        std::string who;
        for (const Worker* w : undetermined_)
          who += fmt::format("{}rank {} ({} collectives entered, {})", who.empty() ? "" : ", ", w->rank, w->progress_at_failure,
                             w->state_at_failure ? std::string("state ") + w->state_at_failure : "state unknown");
        msg += fmt::format("; it waited for {}: which of them held the job up is undetermined (none was stopped, none was behind the "
                           "others)", who);
      }
    }
    msg += fmt::format("; stopped the other {} worker(s)\n", workers_.size() - 1);
    // what the rank's error file says, when its output does not (a rank other than 0 prints little)
    const WorkerError why = read_worker_error(f->error_file);
    const std::string first_line = why.message.substr(0, why.message.find('\n')).substr(0, 400);
    bool in_tail = first_line.empty();
    for (const auto& l : f->tail) in_tail = in_tail || l.find(first_line) != std::string::npos;
    if (!in_tail) msg += fmt::format("  rank {}: {}\n", rank, first_line);
    msg += fmt::format("---- last {} lines of rank {} ----\n", f->tail.size(), rank);
    for (const auto& l : f->tail) msg += "  " + l + "\n";
    if (cause) {
      msg += fmt::format("---- last {} lines of rank {} ----\n", cause->tail.size(), cause->rank);
      for (const auto& l : cause->tail) msg += "  " + l + "\n";
    }
    for (const auto& w : workers_)
      if (w.rank != rank && failed(w.status) && !(WIFSIGNALED(w.status) && (WTERMSIG(w.status) == SIGTERM || WTERMSIG(w.status) == SIGKILL)))
        msg += fmt::format("  (rank {} also ended: {})\n", w.rank, describe_status(w.status));
    if (!o_.log_dir.empty()) msg += fmt::format("every rank's output is in {}\n", o_.log_dir);
    else msg += "keep every rank's output with --log-dir DIR\n";
    std::cerr << msg;
    std::cerr.flush();
  }

  const LaunchOptions& o_;
  int attempt_;
  std::vector<const Worker*> undetermined_;  // root_cause's candidates when the evidence names none of them
  Guard& guard_;
  bool log_failed_ = false;
  std::vector<Worker> workers_;
  int exits_ = 0;
};

}  // namespace

int usable_cores() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? std::max(1, CPU_COUNT(&set)) : std::max(1, int(std::thread::hardware_concurrency()));
}

int launch(const LaunchOptions& o) {
  if (o.nproc_per_node < 1) throw ConfigError("--nproc-per-node must be at least 1");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw ConfigError(fmt::format("--node-rank {} is not in 0..{} (--nnodes {})", o.node_rank, o.nnodes - 1, o.nnodes));
  if (o.argv.empty()) throw ConfigError("distlab run: nothing to run", "give a subcommand (train CONFIG) or -- PROGRAM ARGS");
  if (o.nnodes > 1 && o.master_port == 0)
    throw ConfigError("--master-port 0 works on one node only", "the other nodes must know the port: pick one, e.g. --master-port 29500");
  if (o.master_port < 0 || o.master_port > (o.nnodes > 1 ? 65534 : 65535))
    throw ConfigError(fmt::format("--master-port {} is not a port (0..65535; with several nodes the program gets the next one too)", o.master_port));
  if (!o.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.log_dir, ec);
    if (ec || !std::filesystem::is_directory(o.log_dir))
      throw ConfigError(fmt::format("--log-dir {}: cannot make it a folder ({})", o.log_dir, ec ? ec.message() : "a file is in the way"),
                        "give a folder you can write, e.g. --log-dir logs");
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (g_sigchld_pipe[0] < 0 && pipe2(g_sigchld_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("pipe failed");
  struct sigaction sc {};
  sc.sa_handler = on_sigchld;
  sc.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sc, nullptr);
  Guard guard;  // first, so that it holds nothing but its pipe
  // One job's token: a worker of another job, or anything else that reaches the port, is refused. With
  // several nodes every node's launcher must hand its workers the same one: DISTLAB_STORE_TOKEN.
  std::string token;
  if (!o.store_token.empty()) token = o.store_token;
  else if (const char* t = std::getenv("DISTLAB_STORE_TOKEN"); t && *t) token = t;
  else if (o.nnodes == 1) token = random_token();
  else if (o.node_rank == 0)
    std::cerr << "distlab run: warning: the rendezvous store accepts any client on " << o.master_addr << ":" << o.master_port
              << " (export the same DISTLAB_STORE_TOKEN=<random string> on every node to require it)\n";
  for (int attempt = 0;; attempt++) {
    // node 0 hosts the store, on the master address only; a fresh one per attempt, so a restarted group
    // starts from clean keys
    std::unique_ptr<TcpStoreServer> server;
    Rendezvous rv;
    rv.store_port = o.master_port;
    rv.token = token;
    if (o.node_rank == 0) {
      server = serve_node0_store(o, token);
      rv.store_port = server->port();
    } else if (o.master_ports.size() > 1) {  // which of the step's ports node 0 took: the one that takes our token
      rv.store_port = TcpStore(o.master_addr, o.master_ports, Millis(300000), token).port();
    }
    rv.program_port = o.nnodes > 1 ? rv.store_port + 1 : free_port_on(o.master_addr);
    Group g(o, attempt, guard);
    int rc = g.run(rv);
    if (rc == 0 && g.log_failed()) rc = 1;  // the job ran, but what --log-dir was to keep is incomplete
    for (int r = 0; r < o.nproc_per_node; r++)
      std::filesystem::remove(fmt::format("/tmp/distlab-error-{}-{}-{}.json", getpid(), attempt, o.node_rank * o.nproc_per_node + r));
    if (rc != 1 || attempt >= o.max_restarts) return rc;
    std::cerr << fmt::format("distlab run: restarting the group (attempt {} of {})\n", attempt + 2, o.max_restarts + 1);
  }
}

}  // namespace distlab
