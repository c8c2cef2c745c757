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

// What a plugin's processes held, measured from outside them, where the plugin can't reach: in a memory
// cgroup of their own (PluginLaunch::memory_cgroup: everything they fault in, heap, stacks, files in the
// sandbox's tmpfs, shared memory, children) where the machine gives one; else as the resident sets of the
// host's processes (heap and mappings) and the memfds they hold open (what they wrote into other files is not
// seen: the sandbox's /tmp and /dev/shm are 1 MiB there, and SysV shared memory is refused). The plugin's own bytes are
// peak - before_load, minus what the trainer counts of them already (lab 04's state buffers).
struct PluginMemory {
  std::string method;       // "cgroup" | "rss" | "" (not measured)
  int64_t before_load = 0;  // the host alone, before the student's library was loaded
  int64_t peak = 0;         // the most they held since they started (cgroup: at once; rss: each process's most, summed)
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
  // a memory cgroup folder (v1 or v2) the host joins before it starts, alone, so that its peak can be read;
  // "": none (PluginMemory falls back to resident sets)
  std::string memory_cgroup;
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
  // Its memory so far (after wait_ready: before_load is what the host held before the plugin was loaded).
  PluginMemory memory() const;

 private:
  PluginLaunch launch_;
  pid_t pid_ = -1;
  int sock_ = -1;
  int log_fd_ = -1;  // an unlinked temp file: the plugin's stdout and stderr, bounded by RLIMIT_FSIZE
  bool reaped_ = false;
  int status_ = 0;
  PluginMemory memory_;  // method and before_load, from wait_ready
};

}  // namespace distlab
