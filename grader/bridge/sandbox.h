// Running code we do not trust: a student's plugin, and the compiler that builds it. Three layers, each
// of which holds without the others:
//  1. bubblewrap, unprivileged: a user namespace where the process is uid 65534 with no capability, its own
//     mount, PID, network, IPC and UTS namespaces, a new session, no further user namespaces, a file system
//     of only /usr (the system's programs and libraries), size-capped tmpfs /tmp and /dev/shm, and the few
//     files bound in by name; started with an environment of PATH and LANG only (SpawnOptions::clean_env);
//     a seccomp filter refuses ptrace and reading another process's memory (seccomp_filter).
//  2. cgroups (v1, as root): one memory limit over every process of a check and its tmpfs pages, and a cap on
//     its tasks (a fork bomb fails its check, not the machine).
//  3. rlimits and a wall clock: address space, CPU seconds, file size, no core dumps; the caller kills the
//     process group at its deadline.
// Read grader/host/main.cpp next: the process a plugin is loaded into.
#pragma once
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace distlab {

// What this machine can do, found by trying (bwrap) and looking (cgroups).
struct SandboxSupport {
  bool bwrap = false;          // bubblewrap runs with a user namespace and no capabilities
  bool memory_cgroup = false;  // /sys/fs/cgroup/memory is writable
  bool pids_cgroup = false;    // /sys/fs/cgroup/pids is writable
  std::string why_not;         // what is missing, with the fix
  bool complete() const { return bwrap && memory_cgroup && pids_cgroup; }
  std::string describe() const;  // one line for reports
};
SandboxSupport probe_sandbox();

// What the sandboxed program may see besides /usr.
struct SandboxPolicy {
  std::vector<std::pair<std::string, std::string>> ro_binds;  // host path -> path inside
  std::vector<std::pair<std::string, std::string>> rw_binds;  // host path -> path inside (a build's output)
  int64_t tmpfs_mb = 64;                                      // /tmp inside
  std::string chdir = "/tmp";
  int seccomp_fd = -1;  // the child's fd holding seccomp_filter()'s program (bwrap --seccomp), -1: none
  // child fd -> path inside: a private executable copy of what the fd holds (bwrap --ro-bind-data), so
  // that no two sandboxes share the file (a flock on a shared binary would be a channel between them)
  std::vector<std::pair<int, std::string>> private_copies;
};
// A memfd holding a copy of the file at `path` (for SandboxPolicy::private_copies); throws on failure.
int copy_to_memfd(const std::string& path);
// A memfd holding a seccomp program for bwrap's --seccomp: ptrace, process_vm_readv/writev and kcmp fail
// with EPERM (a plugin can neither trace nor read the memory of the sandbox's other processes, its pid 1
// among them); every other system call is allowed. -1 where this architecture has no program here.
int seccomp_filter();
// The bwrap command line that runs argv under the policy.
std::vector<std::string> sandbox_command(const SandboxPolicy& policy, const std::vector<std::string>& argv);

// A cgroup (v1 memory + pids) that holds every process of one check; killed and removed on destruction.
class CheckCgroup {
 public:
  CheckCgroup(int64_t memory_mb, int64_t max_tasks);  // silently partial where the machine has no cgroups
  ~CheckCgroup();
  CheckCgroup(const CheckCgroup&) = delete;
  CheckCgroup& operator=(const CheckCgroup&) = delete;
  std::vector<std::string> procs_files() const;  // where a child writes its pid to join
  void kill_all() const;
  bool oom_killed() const;  // the memory limit was hit
  // Its memory cgroup's folder ("" where there is none): cgroups made inside it (a plugin's own, to measure
  // it alone) count against its limit too, and go with it.
  const std::string& memory_dir() const { return memory_dir_; }

 private:
  std::vector<std::string> dirs_;
  std::string memory_dir_;
};

struct SpawnOptions {
  int stdin_fd = -1;                    // -1: /dev/null
  int output_fd = -1;                   // stdout and stderr; -1: inherit
  std::vector<std::pair<int, int>> fds;  // parent fd -> child fd (3, 4, ...)
  const CheckCgroup* cgroup = nullptr;
  int64_t memory_mb = 0;                // RLIMIT_AS per process (0: none)
  double cpu_s = 0;                     // RLIMIT_CPU (0: none)
  int64_t file_mb = 64;                 // RLIMIT_FSIZE; writes past it fail (SIGXFSZ ignored)
  bool new_session = true;              // its own session and process group, killed as one
  bool clean_env = false;               // PATH, LANG and MALLOC_ARENA_MAX only, instead of ours (untrusted code)
  uid_t run_as = 0;                     // root only: the child drops to this uid and gid, no groups (0: stays)
  std::string join_procs;               // one more cgroup.procs to join, after `cgroup`'s (a plugin's own memory cgroup)
};
// The unprivileged user a grader's training jobs run as when the grader is root (nobody).
constexpr uid_t kJobUid = 65534;
// fork + exec with everything above; the child dies with its parent. Returns the pid.
pid_t spawn_process(const std::vector<std::string>& argv, const SpawnOptions& o);

// Runs argv to its end (or its deadline, when the whole process group is killed), its stdout and stderr
// kept in memory up to RLIMIT_FSIZE; returns the wait status and the sanitized last bytes of the output.
struct RunResult {
  int status = 0;
  bool timed_out = false;
  double seconds = 0;
  std::string output;  // sanitized tail
};
RunResult run_to_end(const std::vector<std::string>& argv, SpawnOptions o, double timeout_s, size_t keep_bytes = 16000);

// "exited with code 3", "killed by signal 11 (SEGV: invalid memory access)"
std::string describe_wait_status(int status);

// Text from a process we do not trust, fit for a report: at most max_bytes from the end, invalid UTF-8
// replaced by U+FFFD, control characters other than newline and tab, and the bidirectional overrides
// (U+202A-E, U+2066-9, U+200E-F), shown as '?'.
std::string sanitize_output(const std::string& raw, size_t max_bytes = 4000);

}  // namespace distlab
