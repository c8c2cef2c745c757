#include "core/comm/watchdog.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

namespace distlab {

char process_state(int pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!in || !std::getline(in, line)) return 0;
  // "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return 0;
  return line[close + 2];
}

LauncherWatchdog::LauncherWatchdog(int launcher, std::chrono::milliseconds stopped_limit, std::string who)
    : launcher_(launcher), stopped_limit_(stopped_limit), who_(std::move(who)) {
  if (launcher_ > 0) thread_ = std::thread([this] { loop(); });
}

LauncherWatchdog::~LauncherWatchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

namespace {

// The message, then the end: the write must not block, since a stopped launcher no longer reads our pipe.
[[noreturn]] void leave(const std::string& msg) {
  fcntl(STDERR_FILENO, F_SETFL, fcntl(STDERR_FILENO, F_GETFL) | O_NONBLOCK);
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, msg.data(), msg.size());
  _exit(1);
}

}  // namespace

void LauncherWatchdog::loop() {
  using Clock = std::chrono::steady_clock;
  const bool my_parent = getppid() == launcher_;  // a direct child learns of the launcher's death by reparenting
  Clock::time_point stopped_since{};
  bool stopped = false;
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const bool gone = (my_parent && getppid() != launcher_) || (kill(launcher_, 0) != 0 && errno == ESRCH);
    const char state = process_state(launcher_);
    if (gone || state == 'Z' || state == 'X') {
      // write(2), not iostreams: the main thread may hold a stream's lock, blocked on a full pipe
      leave(fmt::format("distlab: {}: the launcher (pid {}) is gone: exiting\n", who_, launcher_));
    }
    if (state == 't' || state == 'T') {
      if (!stopped) stopped_since = Clock::now();
      stopped = true;
      if (Clock::now() - stopped_since > stopped_limit_) {
        leave(fmt::format("distlab: {}: the launcher (pid {}) has been stopped for {:.0f} s (SIGSTOP or Ctrl-Z?): exiting\n", who_,
                          launcher_, std::chrono::duration<double>(Clock::now() - stopped_since).count()));
      }
    } else {
      stopped = false;
    }
  }
}

}  // namespace distlab
