// The grading harness: builds a folder of student code into a plugin inside the sandbox (only the lab's
// API header and the student's own files visible to the compiler), probes that it loads, runs each check
// of the lab (grader/check.h) with its own wall clock and cgroup, and turns the outcomes into points. A
// crash, hang, deadlock, exception or allocation storm fails that check only, never the batch.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "grader/check.h"
#include "grader/lab.h"

namespace distlab::grader {

struct BuildResult {
  bool ok = false;
  std::string plugin;  // the .so
  std::string log;     // the compiler's output (sanitized), or why the build was refused
};
// Compiles lab.files from src_dir into `out` (the .so), in a private folder removed afterwards.
BuildResult build_plugin(const Paths& p, const Lab& lab, const std::string& src_dir, const std::string& out,
                         const SandboxSupport& sb);

struct CheckOutcome {
  CheckSpec spec;
  std::string status;  // pass | fail | error | crash | timeout | deadlock
  int points = 0;
  std::string expected, seen, hint;
  bool hint_held = false;  // it failed for the first time: the hint waits for the next failure (grader/hints.h)
  double seconds = 0;
  double limit_s = 0;  // the wall clock it was given
};

// Loads the plugin once in its host, with a short limit: a plugin that hangs, crashes or fails to load
// while loading fails every check at once, with that reason (empty string: it loads).
std::string probe_plugin(const Paths& p, const Lab& lab, const std::string& plugin, const SandboxSupport& sb);

// One check of `plugin` with `limit_s` of wall clock and its own cgroup; never throws.
CheckOutcome run_one(const Paths& p, const Lab& lab, const CheckSpec& spec, const CheckDef& def, const std::string& plugin,
                     const SandboxSupport& sb, SharedResults& shared, double limit_s);

// `shared` carries results between checks, and the references (the engine's own runs) between the
// submissions of a batch.
std::vector<CheckOutcome> run_checks(const Paths& p, const Lab& lab, const std::string& plugin, const SandboxSupport& sb,
                                     SharedResults& shared);

// A submission's text file (a run config, an answers file) parsed first in a process of its own
// (`distlab grade-parse`, with the check's cgroup, 512 MiB of address space, 20 s of CPU): a parser that
// crashes, loops or runs out of memory on it costs this student the check (a CheckAbort naming the file),
// never the grader its process. Only a text that parser survived is parsed again in the grader's process.
// `as`: "toml" or "config" (a whole run config, as `distlab train` reads it).
// What a cached result of the grader depends on, as one string: a CRC-32 of the files' bytes (all of them:
// "" when one can't be read, and then nothing is cached), `extra`, and the machine (cores, CPU model).
// Caches live under build/, which submissions never write: this guards against staleness, not forgery.
std::string content_key(const std::vector<std::string>& files, const std::string& extra);
// Writes a cache file best effort (under a name of this process's own, then renamed): a folder that can't
// be written only means the next grading computes the result again.
void write_cache_file(const std::filesystem::path& file, const std::string& text);
// A cache file's bytes, or nothing when there is none. Only a regular file the grader wrote is read: a
// FIFO (whose open would wait forever), a link (to /dev/zero, to a folder, to nothing), a folder or a file
// over `max_bytes` is removed with one warning on stderr, and the result is computed again and rewritten.
std::optional<std::string> read_cache_file(const std::filesystem::path& file, uint64_t max_bytes);
// Keeps the `keep` files of `folder` ending in `ext` that were written or touched most recently (a cache's
// hit touches its file) and removes the others, best effort.
void keep_most_recent(const std::filesystem::path& folder, const std::string& ext, size_t keep);
// The engine a grading runs: this distlab, the lab host and the engine's library.
std::vector<std::string> engine_files(const Paths& p);

void parse_in_own_process(const CheckContext& ctx, const std::string& text, const std::string& name, const std::string& as);

}  // namespace distlab::grader
