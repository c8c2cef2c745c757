#include "grader/harness.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "core/ops/cpu/blas_core.h"
#include "core/util/error.h"
#include "core/util/read_file.h"
#include "grader/scratch.h"

namespace fs = std::filesystem;

namespace distlab::grader {

namespace {

constexpr int64_t kMaxTasks = 256;           // processes + threads of one check (lab 02 runs 2-rank jobs)
constexpr uintmax_t kMaxSourceBytes = 1 << 20;  // one student file
// A quick check may take kRefFactor times the reference solution's time on it, plus kRefSlack_s (never
// more than lab.toml's timeout_s): the solution's lab 01 checks take 0.2-1 s each, so a submission that
// hangs in every function loses about a minute, not six times lab.toml's 30 s. Under --jobs N both the
// reference's time and the ceiling are stretched by the load (SharedResults::load), the slack is not.
constexpr double kRefFactor = 4, kRefSlack_s = 10;

// A private folder for one build: removed, whatever happens, when it goes out of scope.
struct TempDir {
  fs::path path;
  explicit TempDir(const fs::path& parent) {
    fs::create_directories(parent);
    std::string tmpl = (parent / "build-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw IoError(fmt::format("cannot create a build folder under {}", parent.string()));
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The first folder or file on the way from a submission's root to one of its files that is a symbolic link
// ("" when none): a case folder linked to the course's solutions, or to a classmate's, is no submission.
std::string link_on_the_way(const fs::path& root, const fs::path& rel) {
  fs::path at = root;
  for (const auto& part : rel) {
    at /= part;
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(at, ec))) return at.string();
  }
  return "";
}

std::string slurp_binary(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

/* Plugins built before, kept by what they were built from: build/labs/<lab>/plugins/<crc>.plugin holds the
   compiler's whole input (its flags, the compiler's identity, api.h and every file, byte for byte), then the
   plugin. A regrading, a student graded again without a change, and the reference's and the solution's
   equal files compile once. The input is compared whole, not by its crc, so no file (crafted or not) can be
   handed a plugin built from other files. Only sandboxed builds are kept: there the compiler sees nothing
   but these files and /usr, while an unboxed one may include any file of the machine. */
constexpr size_t kMaxKeptPlugins = 256;
constexpr uint64_t kMaxKeptPluginBytes = uint64_t(256) << 20;  // a submission's sources (8 MiB at most) and its plugin

std::string compiler_identity() {
  std::error_code ec;
  const fs::path gxx = fs::canonical("/usr/bin/g++", ec);
  struct stat st{};
  if (ec || ::stat(gxx.c_str(), &st) != 0) return "";
  return fmt::format("{} {} {}.{}", gxx.string(), st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

fs::path kept_plugin_file(const Paths& p, const Lab& lab, const std::string& input) {
  return fs::path(p.build_dir) / "labs" / lab.name / "plugins" /
         fmt::format("{:08x}.plugin", crc32(0L, reinterpret_cast<const Bytef*>(input.data()), uInt(input.size())));
}

// The plugin built from exactly `input`, or "" (none kept, another input under the same crc, unreadable).
std::string kept_plugin(const fs::path& file, const std::string& input) {
  const std::string all = read_cache_file(file, kMaxKeptPluginBytes).value_or("");
  const std::string head = fmt::format("distlab plugin {}\n", input.size());
  if (all.size() <= head.size() + input.size() || all.compare(0, head.size(), head) != 0 ||
      all.compare(head.size(), input.size(), input) != 0)
    return "";
  std::error_code ec;
  fs::last_write_time(file, fs::file_time_type::clock::now(), ec);  // recently used: kept longest
  return all.substr(head.size() + input.size());
}

void keep_plugin(const fs::path& file, const std::string& input, const std::string& so) {
  write_cache_file(file, fmt::format("distlab plugin {}\n", input.size()) + input + so);
  keep_most_recent(file.parent_path(), ".plugin", kMaxKeptPlugins);
}

// `out` replaced, whole, by `so`'s bytes (a name of this process's own first: gradings side by side)
bool install_plugin(const std::string& out, const std::string& so, std::string& log) {
  std::error_code ec;
  fs::create_directories(fs::path(out).parent_path(), ec);
  const std::string partial = fmt::format("{}.{}.partial", out, getpid());
  {
    std::ofstream f(partial, std::ios::binary | std::ios::trunc);
    f.write(so.data(), std::streamsize(so.size()));
    if (!f.flush()) {
      f.close();
      fs::remove(partial, ec);
      log = fmt::format("cannot write {}", partial);
      return false;
    }
  }
  fs::permissions(partial, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec, ec);
  fs::rename(partial, out, ec);
  if (ec) {
    fs::remove(partial, ec);
    log = fmt::format("cannot write {}: {}", out, ec.message());
    return false;
  }
  return true;
}

void copy_file_checked(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  if (!fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec))
    throw IoError(fmt::format("cannot copy {} to {}: {}", from.string(), to.string(), ec.message()));
  fs::permissions(to, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read, ec);
}

}  // namespace

uint64_t SharedResults::draw_seed() {
  std::random_device rd;  // /dev/urandom
  return (uint64_t(rd()) << 32) ^ rd();
}

std::mt19937_64 scenario_rng(uint64_t seed, std::initializer_list<int64_t> salt) {
  std::vector<uint64_t> words = {seed, seed >> 32};
  for (int64_t x : salt) words.push_back(uint64_t(x));
  std::vector<uint32_t> w32;
  for (uint64_t x : words) {
    w32.push_back(uint32_t(x));
    w32.push_back(uint32_t(x >> 32));
  }
  std::seed_seq seq(w32.begin(), w32.end());
  return std::mt19937_64(seq);
}

std::string Paths::host_exe() const { return (fs::path(self_exe).parent_path() / "distlab-labhost").string(); }

PluginLaunch CheckContext::launch(const std::string& name) const {
  PluginLaunch l;
  l.host_exe = paths.host_exe();
  l.plugin = plugin;
  l.lab_id = lab.id;
  l.sandbox = sandbox.bwrap;
  l.memory_mb = spec.memory_mb;
  l.cpu_s = limit_s * 2 + 5;
  l.cgroup = &cgroup;
  l.name = name;
  // a memory cgroup of its own under the check's, where the machine gives one: its peak is then everything
  // the plugin held — heap, files in the sandbox's tmpfs, memfds, SysV segments — where resident sets see
  // only what is mapped (lab 10's f32 copies written to memfds passed on them). Removed with the check's
  static std::atomic<int> counter{0};
  if (!cgroup.memory_dir().empty()) {
    const fs::path dir = fs::path(cgroup.memory_dir()) / fmt::format("plugin-{}", counter++);
    std::error_code ec;
    if (fs::create_directory(dir, ec)) l.memory_cgroup = dir.string();
  }
  return l;
}

double CheckContext::seconds_left() const {
  return std::max(0.0, std::chrono::duration<double>(deadline - wire::Clock::now()).count());
}

BuildResult build_plugin(const Paths& p, const Lab& lab, const std::string& src_dir, const std::string& out,
                         const SandboxSupport& sb) {
  BuildResult b;
  b.plugin = out;
  // what the compiler sees: copies of the student's files (regular files only, no links) and the lab's API
  std::vector<fs::path> sources;
  std::vector<std::string> names;
  for (const auto& f : lab.files) {
    const fs::path src = fs::path(src_dir) / f;
    std::error_code ec;
    if (const std::string link = link_on_the_way(src_dir, f); !link.empty()) {
      b.log = fmt::format("{}: refused: {} is a symbolic link (a submission's files and folders must be its own, not links)", src.string(), link);
      return b;
    }
    const auto st = fs::symlink_status(src, ec);
    if ((ec || !fs::exists(st)) && lab.clinic) continue;  // a case not attempted: its check says the file is missing
    if (ec || !fs::exists(st)) {
      b.log = fmt::format("{}: missing (the lab's files: {})", src.string(), fmt::join(lab.files, ", "));
      return b;
    }
    if (fs::is_symlink(st) || !fs::is_regular_file(st)) {
      b.log = fmt::format("{}: refused: a submission's files must be regular files, not links or devices", src.string());
      return b;
    }
    struct stat sst{};
    if (::lstat(src.c_str(), &sst) == 0 && sst.st_nlink > 1) {  // a hard link can name a file the student can't read
      b.log = fmt::format("{}: refused: a file with {} names (a hard link): copy the file instead", src.string(), sst.st_nlink);
      return b;
    }
    if (fs::file_size(src) > kMaxSourceBytes) {
      b.log = fmt::format("{}: refused: larger than {} bytes", src.string(), kMaxSourceBytes);
      return b;
    }
    sources.push_back(src);
    names.push_back(f);
  }
  if (lab.answers) {  // nothing to compile: the files themselves, bundled as {"name": "text"}, are what the checks read
    nlohmann::json bundle = nlohmann::json::object();
    for (size_t i = 0; i < sources.size(); i++) {
      std::ifstream in(sources[i], std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), {});
      bundle[names[i]] = text;
    }
    std::error_code ec;
    fs::create_directories(fs::path(out).parent_path(), ec);
    const std::string partial = fmt::format("{}.{}.partial", out, getpid());  // gradings side by side (array tasks) each their own
    std::ofstream(partial, std::ios::binary) << bundle.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    fs::rename(partial, out, ec);
    b.ok = !ec;
    b.log = ec ? fmt::format("cannot write {}: {}", out, ec.message()) : "answers: " + fmt::format("{}", fmt::join(lab.files, ", "));
    return b;
  }
  TempDir tmp(fs::path(p.build_dir) / "labs" / lab.name);
  const std::string api_rel = fs::path(lab.dir).lexically_relative(p.source_dir).string() + "/api.h";
  copy_file_checked(fs::path(lab.dir) / "api.h", tmp.path / "include" / api_rel);
  for (size_t i = 0; i < sources.size(); i++) copy_file_checked(sources[i], tmp.path / "src" / lab.files[i]);
  fs::create_directories(tmp.path / "out");
  fs::permissions(tmp.path / "out", fs::perms::all);

  const bool boxed = sb.bwrap;
  const std::string inc = boxed ? "/work/include" : (tmp.path / "include").string();
  const std::string srcd = boxed ? "/work/src" : (tmp.path / "src").string();
  const std::string outd = boxed ? "/work/out" : (tmp.path / "out").string();
  // -Wl,--no-undefined: the plugin links against nothing but the C++ runtime, so a declaration of any
  // engine function fails here, with the linker naming it. gold, where binutils has it, links a plugin in
  // 0.07 s of the 0.17 s ld.bfd takes (the same plugin: only the linker's own start-up differs).
  std::vector<std::string> cmd = {"g++", "-std=c++20", "-O2", "-fPIC", "-shared", "-w", "-I" + inc};
  std::error_code gold_ec;
  if (fs::exists("/usr/bin/ld.gold", gold_ec)) cmd.push_back("-fuse-ld=gold");
  for (const auto& f : lab.files) cmd.push_back(srcd + "/" + f);
  for (const auto& a : {std::string("-o"), outd + "/plugin.so", std::string("-Wl,--no-undefined")}) cmd.push_back(a);

  // the compiler's whole input, from the copies it will read: a plugin built from the same is reused
  std::string input;
  if (boxed) {
    if (const std::string gxx = compiler_identity(); !gxx.empty()) {
      input = fmt::format("{}\ncompiler {}\n", fmt::join(cmd, " "), gxx);
      const std::string api = slurp_binary(tmp.path / "include" / api_rel);
      input += fmt::format("{} {}\n", api_rel, api.size()) + api;
      for (const auto& f : names) {
        const std::string text = slurp_binary(tmp.path / "src" / f);
        input += fmt::format("\n{} {}\n", f, text.size()) + text;
      }
    }
  }
  const fs::path kept_file = input.empty() ? fs::path() : kept_plugin_file(p, lab, input);
  if (!input.empty()) {
    if (const std::string so = kept_plugin(kept_file, input); !so.empty()) {
      b.ok = install_plugin(out, so, b.log);
      if (b.ok) b.log = "(built before from these very files, with the same compiler and flags: " + kept_file.string() + ")";
      return b;
    }
  }
  struct Fd {  // the seccomp program, closed here once bwrap has its copy
    int fd;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } filter{boxed ? seccomp_filter() : -1};
  if (boxed) {
    SandboxPolicy pol;
    pol.ro_binds = {{(tmp.path / "include").string(), "/work/include"}, {(tmp.path / "src").string(), "/work/src"}};
    pol.rw_binds = {{(tmp.path / "out").string(), "/work/out"}};
    pol.tmpfs_mb = 512;
    pol.chdir = "/work/src";
    pol.seccomp_fd = filter.fd >= 0 ? 3 : -1;
    cmd = sandbox_command(pol, cmd);
  }
  CheckCgroup cg(4096, 64);
  SpawnOptions o;
  if (filter.fd >= 0) o.fds = {{filter.fd, 3}};
  o.cgroup = &cg;
  o.memory_mb = 4096;
  o.cpu_s = 300;
  o.file_mb = 128;
  o.clean_env = true;
  RunResult r = run_to_end(cmd, o, 300, 12000);
  b.log = r.output;
  if (r.timed_out) {
    b.log += "\n(compilation took longer than 300 s and was stopped)";
    return b;
  }
  b.ok = WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0 && fs::exists(tmp.path / "out" / "plugin.so");
  if (!b.ok) return b;
  // the finished plugin replaces an earlier one only now, whole
  const std::string so = slurp_binary(tmp.path / "out" / "plugin.so");
  std::string why;
  if (so.empty() || !install_plugin(out, so, why)) {
    b.ok = false;
    b.log = so.empty() ? fmt::format("cannot read the plugin the compiler wrote ({})", (tmp.path / "out" / "plugin.so").string()) : why;
    return b;
  }
  if (!input.empty()) keep_plugin(kept_file, input, so);  // best effort: a build folder that can't be written only compiles again
  return b;
}

std::string probe_plugin(const Paths& p, const Lab& lab, const std::string& plugin, const SandboxSupport& sb) {
  if (lab.answers) return "";  // no code to load: the checks read the answers
  CheckCgroup cg(1024, 16);
  PluginLaunch l;
  l.host_exe = p.host_exe();
  l.plugin = plugin;
  l.lab_id = lab.id;
  l.sandbox = sb.bwrap;
  l.memory_mb = 1024;
  l.cpu_s = 30;
  l.cgroup = &cg;
  try {
    PluginProcess proc(l);
    proc.wait_ready(wire::after_seconds(20));
  } catch (const PluginError& e) {
    return e.what();
  }
  return "";
}

// Runs one check of `plugin` with `limit_s` of wall clock and its own cgroup; never throws.
CheckOutcome run_one(const Paths& p, const Lab& lab, const CheckSpec& spec, const CheckDef& def, const std::string& plugin,
                     const SandboxSupport& sb, SharedResults& shared, double limit_s) {
  CheckOutcome o;
  o.spec = spec;
  o.hint = spec.hint;
  o.limit_s = limit_s;
  const auto t0 = wire::Clock::now();
  CheckCgroup cg(spec.memory_mb, kMaxTasks);
  CheckContext ctx{p, lab, spec, plugin, sb, cg, wire::after_seconds(limit_s), limit_s, shared};
  try {
    CheckResult r = def.fn(ctx);
    o.status = r.passed ? "pass" : "fail";
    o.expected = r.expected;
    o.seen = r.seen + (r.detail.empty() || r.seen.empty() ? "" : "\n") + r.detail;
    if (!r.hint.empty()) o.hint = r.hint;
  } catch (const CheckAbort& e) {
    o.status = e.status;
    o.seen = e.what();
  } catch (const PluginError& e) {
    o.status = e.kind == "raised" ? "error" : e.kind == "timeout" ? "timeout" : e.kind == "crash" ? "crash" : "error";
    o.seen = e.what();
  } catch (const Error& e) {
    o.status = "error";
    o.seen = e.full();
  } catch (const std::exception& e) {
    o.status = "error";
    o.seen = e.what();
  }
  if (o.status != "pass" && cg.oom_killed())
    o.seen += fmt::format("\n(the check's processes hit their memory limit of {} MiB)", spec.memory_mb);
  if (o.status == "timeout" && limit_s < spec.timeout_s * shared.load)
    o.seen += fmt::format("\n(the limit, {:.0f} s, is {:.0f} x the reference solution's time on this check{} + {:.0f} s)", limit_s,
                          kRefFactor, shared.load > 1 ? fmt::format(" x {:.3g} (the load of gradings side by side)", shared.load) : "",
                          kRefSlack_s);
  if (o.expected.empty() && o.status != "pass" && o.status != "fail") o.expected = "the check runs to completion";
  o.seconds = std::chrono::duration<double>(wire::Clock::now() - t0).count();
  return o;
}

namespace {

struct ReferenceTimes {
  std::map<std::string, double> seconds;  // check -> the reference solution's time, for the checks it passed
};

// What the reference solution's times depend on: the engine, the reference plugin, the lab's lab.toml and
// the machine (content_key).
std::string reference_key(const Paths& p, const Lab& lab, const std::string& plugin) {
  std::vector<std::string> files = engine_files(p);
  files.push_back(plugin);
  files.push_back((fs::path(lab.dir) / "lab.toml").string());
  return content_key(files, "reference times");
}

bool read_reference_times(const fs::path& file, const std::string& key, ReferenceTimes& t) {
  if (key.empty()) return false;
  try {
    const std::optional<std::string> text = read_cache_file(file, 16 << 20);
    if (!text) return false;
    const nlohmann::json j = nlohmann::json::parse(*text);
    if (j.value("key", "") != key) return false;
    for (const auto& [check, s] : j.at("seconds").items()) t.seconds[check] = s.get<double>();
    return true;
  } catch (const std::exception&) {  // unreadable or stale: measure again
    t.seconds.clear();
    return false;
  }
}

// Best effort: a build folder that can't be written only means the next grading measures again.
void write_reference_times(const fs::path& file, const std::string& key, const ReferenceTimes& t) {
  if (!key.empty()) write_cache_file(file, nlohmann::json{{"key", key}, {"seconds", t.seconds}}.dump(1) + "\n");
}

// The reference solution (solutions/NN-name), built once per batch and run through every check that
// does not time itself. A copy of the course without solutions/ keeps lab.toml's limits.
const ReferenceTimes& reference_times(const Paths& p, const Lab& lab, const SandboxSupport& sb, SharedResults& shared,
                                      const std::map<std::string, CheckDef>& checks) {
  // measured once for the whole batch (lab_cmd.cpp); with --jobs N the other gradings wait for it
  return shared.get<ReferenceTimes>("reference:times", [&] {
    ReferenceTimes times;
    std::error_code ec;
    if (!fs::is_directory(fs::path(p.source_dir) / "solutions" / lab.name, ec)) return times;
    const fs::path src = solution_folder(p.source_dir, p.build_dir, lab);
    const fs::path so = fs::path(p.build_dir) / "labs" / lab.name / "reference.so";
    bool fresh = fs::exists(so, ec);  // built after every file it comes from: reused
    for (const auto& f : lab.files) fresh = fresh && fs::last_write_time(src / f, ec) < fs::last_write_time(so, ec) && !ec;
    fresh = fresh && fs::last_write_time(fs::path(lab.dir) / "api.h", ec) < fs::last_write_time(so, ec) && !ec;
    BuildResult b;
    if (fresh) {
      b.ok = true;
      b.plugin = so.string();
    } else {
      b = build_plugin(p, lab, src.string(), so.string(), sb);
    }
    if (!b.ok || !probe_plugin(p, lab, b.plugin, sb).empty()) return times;
    shared.get<std::string>("reference:plugin", [&] { return b.plugin; });  // built and loaded now: lab 02's measured baseline runs it
    // Measured before, with the same engine, plugin, lab.toml and machine: the times are reused, and a
    // single grading runs the student's checks only (lab 02: half the time).
    const fs::path cache = fs::path(p.build_dir) / "labs" / lab.name / "reference-times.json";
    const std::string key = reference_key(p, lab, b.plugin);
    if (read_reference_times(cache, key, times)) return times;
    // the reference's own results stay its own; its scenarios are the batch's, and so are the engine's jobs
    // (job()'s "engine:" keys), which the students' checks then reuse instead of training them again
    SharedResults own = shared.next_student();
    own.load = 1;  // measured alone: the other gradings of a batch wait for this
    for (const auto& spec : lab.checks) {
      auto it = checks.find(spec.name);
      if (it == checks.end() || it->second.times_itself) continue;
      const CheckOutcome o = run_one(p, lab, spec, it->second, b.plugin, sb, own, spec.timeout_s);
      if (o.status == "pass") times.seconds[spec.name] = o.seconds;
    }
    if (!lab.partial) write_reference_times(cache, key, times);  // --check: some checks' times only, not kept
    return times;
  });
}

}  // namespace

// Each lab's checks are defined in its own folder (grader/labs/NN-name/checks.cpp); the clinic (08) has
// none of its own: its cases are graded by the checks of the labs they come from (clinic_case).
std::map<std::string, CheckDef> checks_for_lab(const std::string& id) {
  if (id == "01") return lab01_checks();
  if (id == "02") return lab02_checks();
  if (id == "03") return lab03_checks();
  if (id == "04") return lab04_checks();
  if (id == "05") return lab05_checks();
  if (id == "06") return lab06_checks();
  if (id == "07") return lab07_checks();
  if (id == "09") return lab09_checks();
  if (id == "10") return lab10_checks();
  return {};
}

std::vector<CheckOutcome> run_checks(const Paths& p, const Lab& lab, const std::string& plugin, const SandboxSupport& sb,
                                     SharedResults& shared) {
  std::vector<CheckOutcome> out;
  auto checks = checks_for_lab(lab.id);
  // a clinic's checks are its cases: each one grades a file of another lab (grader/labs/08-clinic/checks.cpp)
  if (lab.clinic)
    for (const auto& spec : lab.checks) checks[spec.name] = {clinic_case, true};
  const std::string load_failure = probe_plugin(p, lab, plugin, sb);
  const ReferenceTimes& ref = load_failure.empty() ? reference_times(p, lab, sb, shared, checks) : ReferenceTimes{};
  for (const auto& spec : lab.checks) {
    auto it = checks.find(spec.name);
    if (load_failure.empty() && it != checks.end()) {
      double limit = spec.timeout_s;
      auto t = ref.seconds.find(spec.name);
      // the reference's time was measured alone: gradings side by side (--jobs) stretch it by the load
      limit *= shared.load;
      if (t != ref.seconds.end()) limit = std::min(limit, kRefFactor * t->second * shared.load + kRefSlack_s);
      CheckOutcome o = run_one(p, lab, spec, it->second, plugin, sb, shared, limit);
      o.points = o.status == "pass" ? spec.points : 0;
      out.push_back(o);
      continue;
    }
    CheckOutcome o;
    o.spec = spec;
    o.hint = spec.hint;
    if (!load_failure.empty()) {
      o.status = "error";
      o.expected = "the plugin loads";
      o.seen = load_failure;
    } else {
      o.status = "error";
      o.expected = "a check the grader knows";
      o.seen = fmt::format("lab {} has no check '{}' (lab.toml names it)", lab.id, spec.name);
    }
    out.push_back(o);
  }
  return out;
}

void write_cache_file(const std::filesystem::path& file, const std::string& text) {
  // a name of this process's own, then renamed: two gradings of one lab at once never mix their bytes
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  const fs::path part = file.string() + fmt::format(".{}.partial", getpid());
  {
    std::ofstream out(part, std::ios::binary);
    out << text;
    if (!out.flush()) {
      out.close();
      fs::remove(part, ec);
      return;
    }
  }
  fs::rename(part, file, ec);
  if (ec) fs::remove(part, ec);
}

std::optional<std::string> read_cache_file(const std::filesystem::path& file, uint64_t max_bytes) {
  struct stat st{};
  if (::lstat(file.c_str(), &st) != 0) return std::nullopt;  // none yet
  const char* kind = S_ISREG(st.st_mode)    ? nullptr
                     : S_ISLNK(st.st_mode)  ? "a symbolic link"
                     : S_ISDIR(st.st_mode)  ? "a folder"
                     : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "a device";
  std::string why;
  if (kind) {
    why = fmt::format("is {}, not a file the grader wrote", kind);
  } else {
    try {  // no link followed, no wait on what replaced the file since lstat, nothing over max_bytes
      const std::vector<uint8_t> bytes = read_regular_file(file.string(), max_bytes, "a cache file", false);
      return std::string(bytes.begin(), bytes.end());
    } catch (const IoError& e) {
      why = fmt::format("could not be read as a cache file ({})", e.what());
    }
  }
  std::error_code ec;
  if (S_ISDIR(st.st_mode)) fs::remove_all(file, ec);
  else fs::remove(file, ec);  // a link itself, never what it points to
  std::cerr << fmt::format("distlab grade: WARNING: {} {}: {}; what it held is computed again\n", file.string(), why,
                           ec ? "and could not be removed (" + ec.message() + ")" : "removed");
  return std::nullopt;
}

void keep_most_recent(const std::filesystem::path& folder, const std::string& ext, size_t keep) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> all;
  for (const auto& e : fs::directory_iterator(folder, ec))
    if (e.path().extension() == ext) all.emplace_back(e.last_write_time(ec), e.path());
  if (all.size() <= keep) return;
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + keep < all.size(); i++) fs::remove(all[i].second, ec);
}

std::vector<std::string> engine_files(const Paths& p) {
  return {p.self_exe, p.host_exe(), (fs::path(p.build_dir) / "lib" / "libdistlab_core.so").string()};
}

std::string content_key(const std::vector<std::string>& files, const std::string& extra) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return "";
    while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0)
      crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), uInt(in.gcount()));
  }
  crc = crc32(crc, reinterpret_cast<const Bytef*>(extra.data()), uInt(extra.size()));
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model;
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 1);
      break;
    }
  // the kernels too: OpenBLAS's cores sum a product in different orders (core/ops/cpu/blas_core.h)
  return fmt::format("{:08x} on {} cpus,{}, OpenBLAS {}", crc, sysconf(_SC_NPROCESSORS_ONLN), model, blas_core().chosen);
}

void parse_in_own_process(const CheckContext& ctx, const std::string& text, const std::string& name, const std::string& as) {
  if (text.size() > kMaxSourceBytes)
    throw CheckAbort("error", fmt::format("{} is {} bytes: a file of a submission is at most {}", name, text.size(), kMaxSourceBytes));
  const ScratchDir dir(ctx.paths, "parse");
  const std::string file = (fs::path(dir.path()) / "file").string();
  {
    std::ofstream out(file, std::ios::binary);
    out << text;
    if (!out.flush()) throw Error(fmt::format("cannot write {} for its parse", file), "is /tmp full?");
  }
  SpawnOptions o;
  o.cgroup = &ctx.cgroup;
  o.memory_mb = 512;
  o.cpu_s = 20;
  o.clean_env = true;
  const RunResult r = run_to_end({ctx.paths.self_exe, "grade-parse", "--as", as, "--name", name, file}, o, std::max(1.0, std::min(30.0, ctx.seconds_left())), 4000);
  if (r.timed_out) throw CheckAbort("timeout", fmt::format("{}: its parse did not end in time", name));
  if (WIFEXITED(r.status) && (WEXITSTATUS(r.status) == 0 || WEXITSTATUS(r.status) == 1)) return;  // parsed, or a parse error it names
  throw CheckAbort("error", fmt::format("{}: the parser {} on it (in a process of its own)", name, describe_wait_status(r.status)));
}

}  // namespace distlab::grader
