// Runs a shell command line in the source folder, as the end-to-end tests do: its exit code (-1 if it
// was killed) and everything it printed on stdout and stderr.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

inline std::pair<int, std::string> shell_in_source(const std::string& cmd) {
  FILE* p = popen((std::string("cd ") + DISTLAB_SOURCE_DIR + " && " + cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Whether Debian's python3-torch is there (its module found, not imported: an import costs 2 s of CPU,
// and the test that asks imports it anyway).
inline bool torch_installed() {
  return std::system("/usr/bin/python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"torch\") is None)' >/dev/null 2>&1") == 0;
}
