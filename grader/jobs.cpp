#include "grader/jobs.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "core/config/config.h"
#include "core/util/error.h"
#include "grader/bridge/lab_extension.h"
#include "grader/harness.h"
#include "grader/scratch.h"

namespace fs = std::filesystem;

namespace distlab::grader {

namespace {

// The first of `p`'s folders that others may not enter, or `p` itself when others may not read it ("": none).
std::string closed_to_others(const fs::path& p, bool folder) {
  fs::path at;
  for (const auto& part : fs::absolute(p)) {
    at /= part;
    struct stat st{};
    if (::stat(at.c_str(), &st) != 0) return at.string();
    const bool last = at == fs::absolute(p);
    if ((!last || folder) && !(st.st_mode & S_IXOTH)) return at.string();
    if (last && !(st.st_mode & S_IROTH)) return at.string();
  }
  return "";
}

// One record of a job's metrics file into the Job: every record, and the steps' losses and learning rates.
void add_record(Job& j, const nlohmann::json& rec) {
  j.records.push_back(rec);
  if (rec.value("kind", "") == "step") {
    if (j.first_step.is_null()) j.first_step = rec;
    // a meta-device run has no loss (null): 0 stands for it
    j.losses.push_back(rec.contains("loss") && rec["loss"].is_number() ? rec["loss"].get<double>() : 0.0);
    j.lrs.push_back(rec.contains("lr") && rec["lr"].is_number() ? rec["lr"].get<double>() : 0.0);
    j.steps.push_back(rec);
  }
  if (rec.value("kind", "") == "summary") j.summary = rec;
}

/* The engine's own jobs (plugin "none") depend only on the engine's build, the config (the lab's lab.toml or
   the job's own), the job's ranks and --set keys, and the machine: one that trained to the end is kept in
   build/labs/<lab>/engine-jobs/<key>.json and every later grading of the lab reuses it — its records and
   its wall time (which sets the student's job's time limit). A grading of one student then trains only the
   student's jobs. The data sets are the system's (read-only packages) and the scenario's numbers are in the
   --set keys, so nothing else changes an engine job's result. */
std::shared_ptr<Job> read_engine_job(const fs::path& file, const std::string& key) {
  try {
    const std::optional<std::string> text = read_cache_file(file, uint64_t(64) << 20);
    if (!text) return nullptr;
    const nlohmann::json doc = nlohmann::json::parse(*text);
    if (doc.value("key", "") != key) return nullptr;
    auto j = std::make_shared<Job>();
    j->ok = true;
    j->seconds = doc.at("seconds").get<double>();
    j->output = doc.value("output", "");
    for (const auto& rec : doc.at("records")) add_record(*j, rec);
    if (!j->summary.is_object()) return nullptr;
    return j;
  } catch (const std::exception&) {  // unreadable, or another version's: train it again
    return nullptr;
  }
}

// Jobs whose keys hold a scenario drawn from the grading's seed are new at every grading: the folder keeps
// the kMaxEngineJobs used most recently (a hit touches its file) and drops the rest.
constexpr size_t kMaxEngineJobs = 256;

void write_engine_job(const fs::path& file, const std::string& key, const Job& j) {
  write_cache_file(file, nlohmann::json{{"key", key}, {"seconds", j.seconds}, {"output", j.output}, {"records", j.records}}.dump() + "\n");
  keep_most_recent(file.parent_path(), ".json", kMaxEngineJobs);
}

// Threads per rank of a training job: 0 (distlab run's own default, cores / ranks) when one grading has
// the machine; with --jobs N, cores / (N x ranks), at least 1: three 1-rank jobs side by side on 2 cores,
// each with 2 OpenMP threads, ran 3-5x slower than one after the other.
int threads_per_rank(const CheckContext& ctx, int ranks) {
  if (ctx.shared.jobs <= 1) return 0;
  return std::max(1, int(std::thread::hardware_concurrency()) / (ctx.shared.jobs * std::max(1, ranks)));
}

}  // namespace

std::string unreachable_for_job_user(const Paths& p, const Lab& lab) {
  const fs::path bin = fs::path(p.self_exe).parent_path();
  for (const auto& [path, folder] : std::vector<std::pair<fs::path, bool>>{
           {p.self_exe, false}, {p.host_exe(), false}, {bin.parent_path() / "lib", true}, {fs::path(lab.dir) / "lab.toml", false}})
    if (std::string bad = closed_to_others(path, folder); !bad.empty()) return bad;
  return "";
}

void hand_to_job_user(const std::string& path) {
  if (geteuid() != 0) return;
  std::error_code ec;
  [[maybe_unused]] int rc = ::lchown(path.c_str(), kJobUid, kJobUid);
  for (const auto& e : fs::recursive_directory_iterator(path, ec)) rc = ::lchown(e.path().c_str(), kJobUid, kJobUid);
}

JobUser prepare_job_user(const Paths& p, const Lab& lab, const std::string& dir, const std::string& plugin) {
  JobUser u;
  u.plugin = plugin;
  if (geteuid() != 0) return u;
  u.as_root = unreachable_for_job_user(p, lab);
  if (!u.as_root.empty()) return u;
  if (plugin != "none") {
    u.plugin = (fs::path(dir) / "plugin.so").string();
    std::error_code ec;
    fs::copy_file(plugin, u.plugin, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error(fmt::format("cannot copy the plugin for the training job: {}", ec.message()));
  }
  hand_to_job_user(dir);
  u.run_as = kJobUid;
  return u;
}

// The keys that put a job on the grading's device: a GPU (or cuda-sim's) per rank. The collectives stay
// Gloo's, through host buffers: a plugin's own collectives (the student's DDP, ZeRO, FSDP) cross the lab's
// API on the host, so the engine's reference job moves its bytes the same way and the two compare. A job
// whose check or config names its device (the meta device of a planned 1B job, lab 08's OOM story) stays there.
std::vector<std::string> device_sets(const CheckContext& ctx, const std::vector<std::string>& sets, const std::string& config) {
  const std::string& d = ctx.shared.device;
  if (d == "cpu") return {};
  for (const auto& s : sets)
    if (s.rfind("train.device=", 0) == 0) return {};
  const std::string file = config.empty() ? ctx.lab.dir + "/lab.toml" : config;
  const bool named = ctx.shared.get<bool>("note:config-device:" + file, [&] {  // the batch's: one reading per file
    try {
      return load_config(file, {}, {}, lab_config_sections()).origin.count("train.device") > 0;
    } catch (const std::exception&) {
      return false;  // the job itself will say what is wrong with the file
    }
  });
  if (named) return {};
  return {"train.device=" + d};
}

// Every argument is passed as is (no shell): a folder named "John Smith; rm -rf ~" is just a folder.
Job run_job(CheckContext& ctx, int ranks, const std::string& plugin_in, const std::vector<std::string>& sets, double limit_s,
            const JobOptions& jo) {
  const fs::path dir = make_scratch_dir(ctx.paths, "job");
  // root grades: the job runs as kJobUid, in its folder, with its own copy of the plugin
  const JobUser user = prepare_job_user(ctx.paths, ctx.lab, dir.string(), plugin_in);
  const std::string& plugin = user.plugin;
  if (!user.as_root.empty())
    ctx.shared.get<bool>("note:job-as-root", [&] {  // once per batch
      std::cerr << fmt::format("distlab grade: WARNING: training jobs run as root: {} is closed to uid {} (nobody): build in a "
                               "folder others can read to run them unprivileged\n", user.as_root, kJobUid);
      return true;
    });
  const std::string metrics = (dir / "metrics.jsonl").string();
  // --jobs N: the cores shared out between the gradings side by side, never oversubscribed
  const int threads = threads_per_rank(ctx, ranks);
  std::vector<std::string> argv = {ctx.paths.self_exe, "run", "-n", std::to_string(ranks), "--master-port", "0", "--grace", "2",
                                   "--max-restarts", std::to_string(jo.restarts), "--threads-per-rank", std::to_string(threads),
                                   "train", jo.config.empty() ? ctx.lab.dir + "/lab.toml" : jo.config, "--set", "lab.plugin=" + plugin,
                                   "--set", std::string("lab.sandbox=") + (ctx.sandbox.bwrap ? "require" : "off"),
                                   "--set", "train.log_every=1000", "--set", fmt::format("dist.timeout_s={:.0f}", std::max(5.0, limit_s / 2)),
                                   // no check reads the test set's loss; the whole of it is half a 12-step job's time
                                   // (GPT, 19,968 samples). One batch still runs the evaluation through the student's
                                   // code (lab 05's gathers); a check's own sets may ask for more
                                   "--set", "train.eval_batches=1",
                                   "--metrics", metrics};
  // the grading's device first: a check's own sets (the meta device of a planned job) come after and win
  for (const std::string& s : device_sets(ctx, sets, jo.config)) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  for (const auto& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  // each rank's plugin in a memory cgroup of its own, made by the rank in a folder of this job's under the
  // check's cgroup (the job's user may make cgroups there and nowhere else): its peak is what the plugin
  // held, all of it, whatever it kept it in (grader/bridge/plugin_process.h)
  if (plugin != "none" && !ctx.cgroup.memory_dir().empty()) {
    static std::atomic<int> counter{0};
    const fs::path cg = fs::path(ctx.cgroup.memory_dir()) / fmt::format("job-{}", counter++);
    std::error_code ec;
    if (fs::create_directory(cg, ec) && (user.run_as == 0 || ::chown(cg.c_str(), user.run_as, user.run_as) == 0)) {
      argv.push_back("--set");
      argv.push_back("lab.memory_cgroup=" + cg.string());
    }
  }
  const std::string saved = (dir / "final.safetensors").string();
  if (jo.save) {
    argv.push_back("--save");
    argv.push_back(saved);
  }
  if (!jo.env.empty()) {  // env NAME=value ... distlab ...: still no shell
    std::vector<std::string> e = {"/usr/bin/env"};
    e.insert(e.end(), jo.env.begin(), jo.env.end());
    argv.insert(argv.begin(), e.begin(), e.end());
  }
  SpawnOptions o;
  o.cgroup = &ctx.cgroup;
  o.file_mb = 256;
  o.run_as = user.run_as;
  RunResult r = run_to_end(argv, o, limit_s, 3000);
  Job j;
  j.seconds = r.seconds;
  std::ifstream in(fs::exists(metrics) ? metrics : metrics + ".partial");  // a failed run keeps its steps there
  for (std::string line; std::getline(in, line);) {
    auto rec = nlohmann::json::parse(line, nullptr, false);
    if (!rec.is_discarded() && rec.is_object()) add_record(j, rec);
  }
  if (jo.save && fs::exists(saved)) {
    std::ifstream s(saved, std::ios::binary);
    j.saved.assign(std::istreambuf_iterator<char>(s), {});
  }
  j.output = r.output;
  std::error_code ec;
  fs::remove_all(dir, ec);
  j.ok = !r.timed_out && WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0 && j.summary.is_object();
  if (!j.ok) {
    j.status = r.timed_out ? "timeout" : "error";
    j.failure = r.timed_out ? fmt::format("the {}-rank training job was still running after {:.0f} s and was stopped:\n{}", ranks, limit_s, r.output)
                            : fmt::format("the {}-rank training job failed ({}):\n{}", ranks, describe_wait_status(r.status), r.output);
    // from the trainer's own record (core/train/trainer_checks.cpp), never from the output, which the plugin can print into
    j.diverged = !r.timed_out && !j.losses.empty() &&
                 std::any_of(j.records.begin(), j.records.end(), [](const nlohmann::json& rec) { return rec.value("kind", "") == "diverged"; });
  }
  return j;
}

Job engine_job(CheckContext& ctx, int ranks, const std::vector<std::string>& sets, double limit_s, const JobOptions& jo) {
  if (jo.save || !jo.env.empty()) return run_job(ctx, ranks, "none", sets, limit_s, jo);  // its files, its faults: run it
  std::string extra = fmt::format("engine job, {} ranks, {} restarts, {} threads per rank", ranks, jo.restarts, threads_per_rank(ctx, ranks));
  for (const auto& s : device_sets(ctx, sets, jo.config)) extra += "\n--set " + s;
  for (const auto& s : sets) extra += "\n--set " + s;
  // what the job inherits from the grader's environment that can change its numbers or its course
  for (const char* name : {"DISTLAB_DATA", "DISTLAB_TEST_FAULT", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"})
    if (const char* v = std::getenv(name)) extra += fmt::format("\n{}={}", name, v);
  std::vector<std::string> files = engine_files(ctx.paths);
  files.push_back(jo.config.empty() ? ctx.lab.dir + "/lab.toml" : jo.config);
  const std::string key = content_key(files, extra);
  if (key.empty()) return run_job(ctx, ranks, "none", sets, limit_s, jo);
  const fs::path file = fs::path(ctx.paths.build_dir) / "labs" / ctx.lab.name / "engine-jobs" /
                        fmt::format("{:08x}.json", crc32(0L, reinterpret_cast<const Bytef*>(key.data()), uInt(key.size())));
  if (std::shared_ptr<Job> kept = read_engine_job(file, key)) {
    std::error_code ec;
    fs::last_write_time(file, fs::file_time_type::clock::now(), ec);  // recently used: kept longest
    return *kept;
  }
  Job j = run_job(ctx, ranks, "none", sets, limit_s, jo);
  if (j.ok) write_engine_job(file, key, j);
  return j;
}

// A student's job may take kJobFactor times the engine's own run of it, plus kJobSlack_s (its plugin host
// starts, its hooks cross a socket): the solution's 40-step jobs took 1.00-1.05x the engine's 7.7-8.0 s here.
constexpr double kJobFactor = 3, kJobSlack_s = 20;

const Job& job(CheckContext& ctx, const std::string& key, int ranks, bool student, const std::vector<std::string>& sets,
               bool allow_diverged) {
  // references serve a whole batch; a student's job is this grading's own
  const Job& j = ctx.shared.get<Job>(student ? key + ":" + ctx.plugin : "engine:" + key, [&] {
    double limit = ctx.seconds_left();
    if (!student) {
      // the engine's run under this check's clock: one that ran out of it is not kept, or a student who
      // used up their check's time would fail the reference for every student after them
      Job ref = engine_job(ctx, ranks, sets, limit);
      if (!ref.ok && ref.status == "timeout") throw CheckAbort(ref.status, ref.failure);
      return ref;
    }
    // a few times what the engine's own run took on the same job (on an idle machine: x the load), and
    // never past the check's limit
    const Job& ref = job(ctx, "ref:" + key, ranks, false, sets);
    if (ref.ok) limit = std::min(limit, kJobFactor * ref.seconds * ctx.shared.load + kJobSlack_s);
    return run_job(ctx, ranks, ctx.plugin, sets, limit);
  });
  if (!j.ok && !(allow_diverged && j.diverged)) throw CheckAbort(j.status, j.failure);
  return j;
}

}  // namespace distlab::grader
