// Runs a shell command line in the source folder, as the end-to-end tests do: its exit code (-1 if it
// was killed) and everything it printed on stdout and stderr.
#pragma once
#include <sys/wait.h>

#include <cstdio>
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
