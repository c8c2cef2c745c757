// One grading's temporary folders (plugins, training jobs, checkpoints, clinic cases, report runs), all
// under one root in /tmp, and a watcher process that removes that root once the grader is gone — however it
// goes: an exception, Ctrl-C, SIGKILL, the kernel's out-of-memory killer. Every folder is still removed as
// soon as its user is done (each has its own scope); the watcher is for the paths no destructor reaches.
//
// The watcher is forked before the grading starts and execs a shell at once (its own name in `ps`: a
// `pkill -f "distlab grade"` leaves it be). Its stdin is the read end of a pipe whose write end only the
// grader holds (close-on-exec: no job or plugin keeps it open); it leaves the terminal's process group and
// ignores SIGINT, SIGTERM and SIGHUP (Ctrl-C is the grader's), waits for end-of-file, then runs
// `rm -rf -- ROOT`.
#pragma once
#include <sys/types.h>

#include <string>

namespace distlab::grader {

struct Paths;

class Scratch {
 public:
  Scratch();   // creates /tmp/distlab-grade-XXXXXX (0711: jobs that run as another user reach their own folders)
  ~Scratch();  // removes the root now; the watcher sees the pipe close and exits
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  const std::string& root() const { return root_; }

 private:
  std::string root_;
  int pipe_w_ = -1;
  pid_t watcher_ = -1;
};

// A new private folder for `tag` ("job", "lab07", ...): under the grading's Scratch root when `p` has one,
// else /tmp/distlab-TAG-XXXXXX. Throws IoError naming the folder when it cannot be made.
std::string make_scratch_dir(const Paths& p, const std::string& tag);

// make_scratch_dir's folder, removed with everything in it when this goes out of scope.
class ScratchDir {
 public:
  ScratchDir(const Paths& p, const std::string& tag) : path_(make_scratch_dir(p, tag)) {}
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace distlab::grader
