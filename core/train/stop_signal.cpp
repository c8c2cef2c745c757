#include "core/train/stop_signal.h"

#include <csignal>

namespace distlab {

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_sigterm(int) { g_stop = 1; }
}  // namespace

void install_stop_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
}

bool stop_requested() { return g_stop != 0; }

}  // namespace distlab
