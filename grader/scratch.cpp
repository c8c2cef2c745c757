// A grading's temporary root and its watcher (grader/scratch.h).
#include "grader/scratch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/util/error.h"
#include "grader/check.h"

namespace distlab::grader {

namespace fs = std::filesystem;

Scratch::Scratch() {
  char tmpl[] = "/tmp/distlab-grade-XXXXXX";
  if (!mkdtemp(tmpl)) throw IoError(fmt::format("cannot create the grading's temporary folder {}: {}", tmpl, std::strerror(errno)), "is /tmp writable?");
  root_ = tmpl;
  ::chmod(root_.c_str(), 0711);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;  // no watcher: the folders are still removed on every ordinary path
  // everything the child needs, made before fork: after it, only async-signal-safe calls. It execs a shell
  // at once (a process of its own name: a `pkill -f "distlab grade"` does not take the cleanup with it) that
  // reads its stdin, the pipe, to its end, then removes the root.
  const char* argv[] = {"sh", "-c", "while read -r _; do :; done; exec rm -rf -- \"$1\"", "distlab-scratch-watcher", root_.c_str(), nullptr};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);  // out of the terminal's foreground group: Ctrl-C stops the grader, not its cleanup
    ::signal(SIGINT, SIG_IGN);  // ignored signals stay ignored across exec
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    ::signal(SIGPIPE, SIG_IGN);
    if (::dup2(fds[0], 0) != 0) ::_exit(127);
    for (int fd = 1; fd < 1024; fd++) ::close(fd);  // the grader's other pipes and sockets must see their own end-of-file
    ::open("/dev/null", O_WRONLY);  // 1
    ::open("/dev/null", O_WRONLY);  // 2
    ::execv("/bin/sh", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(fds[0]);
  if (pid < 0) {
    ::close(fds[1]);
    return;
  }
  pipe_w_ = fds[1];
  watcher_ = pid;
}

Scratch::~Scratch() {
  std::error_code ec;
  fs::remove_all(root_, ec);
  if (pipe_w_ >= 0) ::close(pipe_w_);  // the watcher's end-of-file: it runs rm on a folder that is gone, and exits
  if (watcher_ > 0) ::waitpid(watcher_, nullptr, 0);
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string make_scratch_dir(const Paths& p, const std::string& tag) {
  std::string tmpl = p.scratch.empty() ? "/tmp/distlab-" + tag + "-XXXXXX" : (fs::path(p.scratch) / (tag + "-XXXXXX")).string();
  if (!mkdtemp(tmpl.data()))
    throw IoError(fmt::format("cannot create a temporary folder {}: {}", tmpl, std::strerror(errno)), "is /tmp writable, and not full?");
  return tmpl;
}

}  // namespace distlab::grader
