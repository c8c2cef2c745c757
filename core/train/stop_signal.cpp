#include "core/train/stop_signal.h"

#include <unistd.h>

#include <csignal>
#include <cstdlib>

namespace distlab {

namespace {
volatile std::sig_atomic_t g_stop = 0;  // 0: none; 1: sent to this process; 2: forwarded by its launcher
pid_t g_launcher = 0;                   // DISTLAB_LAUNCHER_PID, read once before the handler is installed
void on_sigterm(int, siginfo_t* info, void*) {
  if (g_stop == 1) return;  // sent to this rank itself: a later forward from the launcher changes nothing
  g_stop = (g_launcher > 0 && info && info->si_pid == g_launcher) ? 2 : 1;
}
}  // namespace

void install_stop_handler() {
  if (const char* p = std::getenv("DISTLAB_LAUNCHER_PID")) g_launcher = pid_t(std::atol(p));
  struct sigaction sa {};
  sa.sa_sigaction = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  sigaction(SIGTERM, &sa, nullptr);
}

bool stop_requested() { return g_stop != 0; }
bool stop_from_launcher() { return g_stop == 2; }

}  // namespace distlab
