// A student's plugin, loaded into a process of its own (distlab-labhost, grader/host/) inside the sandbox,
// and spoken to through one socket. Nothing of the engine is in that process, so the plugin can neither
// call the engine's functions nor touch its counters, metrics or verdicts: it can only answer requests.
// Every answer is checked here; a crash, a hang, a lie about a length or a flood of output becomes a
// PluginError that says what happened, during which call, and the plugin's last output.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

#include "grader/bridge/protocol.h"
#include "grader/bridge/sandbox.h"
#include "grader/bridge/wire.h"
#include "core/util/error.h"

namespace distlab {

struct PluginError : Error {
  // crash | timeout | raised (the student's code threw) | protocol (garbage on the socket) | load
  std::string kind;
  PluginError(std::string kind_, const std::string& what, std::string hint = "")
      : Error(what, std::move(hint)), kind(std::move(kind_)) {}
};

struct PluginLaunch {
  std::string host_exe;  // distlab-labhost
  std::string plugin;    // the .so
  std::string lab_id;    // "01"
  bool sandbox = true;   // bubblewrap (SandboxSupport::bwrap must hold)
  int64_t memory_mb = 2048;
  double cpu_s = 0;
  const CheckCgroup* cgroup = nullptr;
  std::string name = "the plugin";  // for messages: "rank 1's plugin"
  int output_fd = -1;  // where its stdout and stderr go; -1: kept in memory for output_tail()
};

class PluginProcess {
 public:
  explicit PluginProcess(const PluginLaunch& launch);  // starts it; the first call waits for its hello
  ~PluginProcess();                                    // kills its process group and reaps it
  PluginProcess(const PluginProcess&) = delete;
  PluginProcess& operator=(const PluginProcess&) = delete;

  // Waits for the host's hello (the plugin loaded): throws PluginError(load|crash|timeout) otherwise.
  void wait_ready(wire::Clock::time_point deadline);

  void send(const wire::Frame& f, const void* payload, uint64_t bytes, wire::Clock::time_point deadline, const char* during);
  // Reads one frame; a closed socket, a timeout or garbage throws PluginError naming `during`. A payload over
  // `max_bytes` (what the caller expects at most: the grader's process is outside every cgroup) is refused
  // before anything is allocated for it.
  void receive(wire::Frame& f, std::vector<char>& payload, wire::Clock::time_point deadline, const char* during, uint64_t max_bytes);

  int fd() const { return sock_; }
  const std::string& name() const { return launch_.name; }
  // The reason it is gone (after EOF): reaps it and describes the status, with its last output.
  std::string gone(const char* during);
  std::string output_tail(size_t max_bytes = 2000) const;  // sanitized
  void kill_now();

 private:
  PluginLaunch launch_;
  pid_t pid_ = -1;
  int sock_ = -1;
  int log_fd_ = -1;  // an unlinked temp file: the plugin's stdout and stderr, bounded by RLIMIT_FSIZE
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace distlab
