// A worker's watchdog over its launcher. `distlab run` kills its workers' process groups when it exits,
// and a guard process does so when the launcher is killed outright (worker_process.h); this is the third
// line: a thread in each worker that notices the launcher is gone (the worker was reparented, or the pid
// no longer exists) or has been stopped (SIGSTOP, Ctrl-Z) for longer than `stopped_limit`, and ends the
// worker with a message. Without it a worker whose launcher stopped reading its output blocks forever in
// a write to stdout.
#pragma once
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace distlab {

class LauncherWatchdog {
 public:
  // Watches pid `launcher` (0: no launcher, does nothing). `who` names this worker in the message.
  LauncherWatchdog(int launcher, std::chrono::milliseconds stopped_limit, std::string who);
  ~LauncherWatchdog();
  LauncherWatchdog(const LauncherWatchdog&) = delete;
  LauncherWatchdog& operator=(const LauncherWatchdog&) = delete;

 private:
  void loop();
  int launcher_;
  std::chrono::milliseconds stopped_limit_;
  std::string who_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The state letter of /proc/<pid>/stat (R running, S sleeping, T stopped, Z zombie...), or 0 when the
// process does not exist.
char process_state(int pid);

}  // namespace distlab
