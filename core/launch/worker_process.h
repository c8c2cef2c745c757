// The launcher's workers (core/launch/launcher.cpp supervises them): one process per rank, started with
// torchrun's environment in a process group of its own, and the guard process that kills every worker's
// group if the launcher itself dies. Read next: core/launch/launcher.cpp.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <string>

#include "core/launch/launcher.h"

namespace distlab::launch_detail {

struct Worker {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  int out_fd = -1;        // the read end of the worker's stdout+stderr
  std::string partial;    // an unfinished line
  std::deque<std::string> tail;
  std::unique_ptr<std::ofstream> log;
  bool running = false;
  int status = 0;         // waitpid status once exited
  int exit_order = -1;    // 0 for the first worker reaped, 1 for the next...
  std::string error_file; // where the worker explains its failure (DISTLAB_ERROR_FILE)
  bool stopped_by_us = false;  // still running when we sent SIGTERM: a victim, not a culprit
  char state_at_failure = 0;   // its /proc state when another rank's failure was seen (T: stopped)
  long long progress_at_failure = -1;  // collectives it had entered then (error_file.h; -1: none published)
};

// Where the workers meet: distlab's store (its port and token) and the port left to the program itself
// (MASTER_PORT: PyTorch's rank 0 binds its own TCPStore there, as under torchrun).
struct Rendezvous {
  int store_port = 0;
  std::string token;
  int program_port = 0;
};

// The guard: a tiny process forked before anything else, which outlives a launcher killed with SIGKILL.
// The launcher tells it every worker's process group over a pipe, and forgets each one it reaped; when
// the pipe closes (the launcher exited, died, or threw), it kills the groups still listed, so no worker
// (nor a worker's children, e.g. the `sleep` of `bash -c 'sleep 300'`) is orphaned holding ports and
// cores. It allocates nothing after fork.
class Guard {
 public:
  Guard();   // forks the guard process
  ~Guard();  // closes the pipe (the guard kills what is still listed) and reaps it
  void watch(pid_t group) { say('+', group); }
  void forget(pid_t group) { say('-', group); }

 private:
  struct Msg {
    char kind;
    int32_t group;
  };
  void say(char kind, pid_t group);
  [[noreturn]] static void serve(int fd);
  pid_t pid_ = -1;
  int fd_ = -1;
};

std::string random_token();  // 16 random bytes as hex: the store's token for one job
// A port nobody listens on right now, on the address the program's rank 0 will bind.
int free_port_on(const std::string& host);
std::string describe_status(int status);  // "exit code 3", "killed by signal 9 (SIGKILL)"
bool failed(int status);
// Forks and execs worker `w` (rank, local rank) of a world of `world`: its output to out_write, torchrun's
// variables set, nothing of the launcher's open across the exec. Returns its pid.
pid_t spawn(const LaunchOptions& o, Worker& w, int world, const Rendezvous& rv, int out_write, int out_read, int attempt);

}  // namespace distlab::launch_detail
