// Lab 07's checks: real training jobs (grader/jobs.h) killed and restarted the way a preempted node is, the
// student's save_state and load_state beside each rank (bridge.cpp, beside this file). The reference is the
// engine's uninterrupted run of the same config: a resume passes when every loss and the final weights are
// its very bits. The trainers also compare what load_state restored with the engine's own save of the same
// step, and record how the student's files were written (a write under the final name, a rename before
// fsync): the explanations come from there, out of the plugin's reach.
// Read next: bridge.cpp beside it (the trainer's side), then host.cpp (the plugin's).
#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "grader/check.h"
#include "grader/jobs.h"
#include "grader/scratch.h"

namespace fs = std::filesystem;

namespace distlab::grader {

namespace checks07 {  // named: a unity build (CMakeLists.txt) puts several labs' checks in one unit

// A checkpoint folder for one check's runs, removed after it.
struct TempDir {
  std::string path;
  explicit TempDir(const CheckContext& ctx) {
    path = make_scratch_dir(ctx.paths, "lab07");
    hand_to_job_user(path);  // the jobs write here (grader/jobs.h)
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string set() const { return "checkpoint.dir=" + path; }
};

// The data and the accumulation, drawn from the batch's seed for the engine's runs and the student's alike: an
// epoch of E micro-batches a rank (E in 12..18 or so, 2 ranks of micro-batch 4, never ending at step 10 or 20)
// and k micro-batches a step (2 or 3).
// The checkpoints of steps 10 and 20 then sit in a later epoch at a position that is not their step, and the
// dropout stream has drawn k masks a step: no field of the state is the step itself, or a function of it
// that a load_state could rebuild instead of reading back what save_state kept.
struct Scenario {
  int64_t k = 0;        // micro-batches a step
  int64_t samples = 0;  // training samples an epoch (2 ranks x 4 x per_epoch)
  int64_t tokens = 0;   // data.synthetic_tokens that make exactly `samples` windows of 32 in the train split
  std::vector<std::string> sets() const {
    return {fmt::format("data.synthetic_tokens={}", tokens), fmt::format("train.accum_steps={}", k)};
  }
  // "3 micro-batches a step, 120 training samples an epoch" (for the reports)
  std::string describe() const { return fmt::format("{} micro-batches a step, {} training samples an epoch", k, samples); }
};

Scenario scenario(const CheckContext& ctx) {
  auto gen = ctx.rng({7, 100});
  int64_t per_epoch = 12 + int64_t(gen() % 7);
  Scenario sc;
  sc.k = 2 + int64_t(gen() % 2);
  while ((10 * sc.k) % per_epoch == 0 || (20 * sc.k) % per_epoch == 0) per_epoch++;  // the checkpoints mid-epoch: position > 0
  sc.samples = 2 * 4 * per_epoch;  // every rank's epoch exactly per_epoch micro-batches of 4
  // the tokens' train split is all but the last tenth (at least 65 tokens): (train - 1) / 32 windows of seq_len 32
  int64_t n = (sc.samples * 32 + 1) * 10 / 9 - 40;
  while ((n - std::max<int64_t>(n / 10, 65) - 1) / 32 < sc.samples) n++;
  sc.tokens = n;
  return sc;
}

std::vector<std::string> plus_scenario(const CheckContext& ctx, std::vector<std::string> sets) {
  for (const std::string& s : scenario(ctx).sets()) sets.push_back(s);
  return sets;
}

// The engine's own uninterrupted run of the lab's config, its final weights: the truth (shared by a batch).
const Job& whole(CheckContext& ctx) {
  const Job& j = ctx.shared.get<Job>("engine:lab07-whole", [&] {
    TempDir d(ctx);
    return run_job(ctx, 2, "none", plus_scenario(ctx, {d.set()}), ctx.seconds_left(), JobOptions{{}, 0, true});
  });
  if (!j.ok) throw CheckAbort(j.status, "the engine's own run failed: " + j.failure);
  return j;
}

// A student's run: a few times the engine's time, and a restart takes two.
Job student(CheckContext& ctx, int ranks, const std::vector<std::string>& sets, const JobOptions& jo) {
  const double limit = std::min(ctx.seconds_left(), 3 * 2 * whole(ctx).seconds + 30);
  return run_job(ctx, ranks, ctx.plugin, plus_scenario(ctx, sets), limit, jo);
}

std::vector<std::string> strings(const nlohmann::json& j) {
  std::vector<std::string> v;
  if (j.is_array())
    for (const auto& e : j)
      if (e.is_string()) v.push_back(e.get<std::string>());
  return v;
}

// The resume a run made (null when it found no checkpoint), and what the trainer saw unlike the save.
nlohmann::json resume_of(const Job& j) {
  for (const auto& r : j.records)
    if (r.value("kind", "") == "resume") return r;
  return nullptr;
}

std::vector<std::string> violations_of(const Job& j) {
  std::vector<std::string> v;
  for (const auto& r : j.records)
    if (r.value("kind", "") == "checkpoint")
      for (const auto& s : strings(r.value("lab07_violations", nlohmann::json::array())))
        if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
  return v;
}

std::string join(const std::vector<std::string>& v, const std::string& sep = "\n") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// The hint for what load_state got wrong, from the trainer's comparison with the engine's save.
std::string hint_for(const std::vector<std::string>& problems) {
  const std::string all = join(problems, " ");
  if (all.find("exp_avg") != std::string::npos || all.find("step count") != std::string::npos)
    return "the loss jumps right after the resume: Adam restarted without its moments (or its step count, which its bias correction "
           "reads). Save exp_avg and exp_avg_sq of every parameter and optimizer_steps(), and set them back";
  if (all.find("dropout") != std::string::npos)
    return "the resumed run draws dropout masks the first run already used: save rng_streams() and set them back";
  if (all.find("sampler") != std::string::npos)
    return "the resumed run starts its epoch over and trains on batches it has seen: save epoch() and position() and set_sampler them";
  return "";
}

// Losses and weights against the uninterrupted run: "" when they are its bits, else what differs.
CheckResult compare(const Job& ref, const Job& mine, const std::string& setup) {
  const auto problems = strings(resume_of(mine).is_null() ? nlohmann::json() : resume_of(mine).value("lab07_problems", nlohmann::json()));
  size_t at = 0;
  while (at < std::min(ref.losses.size(), mine.losses.size()) && ref.losses[at] == mine.losses[at]) at++;
  if (at == ref.losses.size() && mine.losses.size() == ref.losses.size() && mine.saved == ref.saved && !mine.saved.empty())
    return {true, "", "", fmt::format("{}: {} losses and the final weights bit for bit the uninterrupted run's", setup, ref.losses.size())};
  const nlohmann::json res = resume_of(mine);
  const int64_t from = res.is_null() ? -1 : res.value("step", int64_t(-1));
  CheckResult bad{false, setup + ": every loss and the final weights of the uninterrupted run, bit for bit", "", join(problems), hint_for(problems)};
  if (mine.losses.size() != ref.losses.size())
    bad.seen = fmt::format("{} step records for {} steps (a step logged twice, or lost)", mine.losses.size(), ref.losses.size());
  else if (at < ref.losses.size())
    bad.seen = fmt::format("step {}: loss {:.7f}, uninterrupted {:.7f}{}", at + 1, mine.losses[at], ref.losses[at],
                           from >= 0 ? fmt::format(" (resumed at step {})", from) : "");
  else
    bad.seen = "the same losses, other final weights";
  // the first step after the resume computes its loss with the restored weights; the optimizer state shows
  // in the step after it
  if (from >= 0 && at <= size_t(from) + 1 && at < ref.losses.size() && mine.losses[at] > ref.losses[at])
    bad.seen += fmt::format(": a spike of {:+.4f} right after the resume", mine.losses[at] - ref.losses[at]);
  if (bad.hint.empty() && from < 0) bad.hint = "the restarted job found no complete checkpoint: save_state must leave state_file(rank) on every rank";
  return bad;
}

std::string kill_at(int rank, const char* where, int step) { return fmt::format("DISTLAB_TEST_FAULT=kill:{}:{}:{}", rank, where, step); }

Job checked(Job j, const std::string& what) {
  if (!j.ok) throw CheckAbort(j.status, what + ": " + j.failure);
  return j;
}

// ---- the checks ----

// Which rank is killed, and before which step (11..19 or 21..29), drawn from the grading's seed: the job must
// resume from the newest checkpoint before it (10 or 20), so a code that saves (or accepts) one checkpoint it
// expects to be asked for does not pass.
CheckResult resume_bitwise(CheckContext& ctx) {
  const Job& ref = whole(ctx);
  auto gen = ctx.rng({7001});
  const int rank = int(gen() % 2), step = (gen() % 2 ? 11 : 21) + int(gen() % 9), expect = (step - 1) / 10 * 10;
  TempDir d(ctx);
  const std::string what = fmt::format("rank {} killed at step {} and restarted", rank, step);
  const Job mine = checked(student(ctx, 2, {d.set()}, JobOptions{{kill_at(rank, "step", step)}, 1, true}), what);
  const nlohmann::json res = resume_of(mine);
  const int64_t from = res.is_null() ? -1 : res.value("step", int64_t(-1));
  if (from != expect)
    return {false, fmt::format("{}: the job resumes from step {}, the newest checkpoint", what, expect),
            from < 0 ? "it started from step 0" : fmt::format("it resumed from step {}", from), mine.output,
            from < 0 ? "the restarted job found no complete checkpoint: save_state must leave state_file(rank) (and load_state accept it)"
                     : "every checkpoint is complete when every rank saved it: save_state at every save, load_state accepts what it wrote"};
  return compare(ref, mine, fmt::format("{}, resumed from step {} ({})", what, expect, scenario(ctx).describe()));
}

CheckResult atomic_save(CheckContext& ctx) {
  const Job& ref = whole(ctx);
  TempDir d(ctx);
  const Job mine = student(ctx, 2, {d.set()}, JobOptions{{kill_at(1, "save", 20)}, 1, true});
  const auto violations = violations_of(mine);
  const nlohmann::json res = resume_of(mine);
  const int64_t from = res.is_null() ? -1 : res.value("step", int64_t(-1));
  if (from == 20)  // (the run may have failed on it: the replicas diverge)
    return {false, "the checkpoint of step 20, torn by the kill, is not taken for complete: the job resumes from step 10",
            "it resumed from the torn checkpoint of step 20", join(violations),
            "rank 1's file of step 20 was half written under its final name when the kill came: write to a temporary name, fsync, "
            "close, then rename to state_file(rank)"};
  checked(mine, "killed while saving step 20 and restarted");
  if (!violations.empty())
    return {false, "save_state writes so that a kill at any moment leaves a whole file or none under the final name", join(violations, "; "),
            "", violations.front().find("fsync") != std::string::npos
                    ? "fsync the temporary file before renaming it: otherwise the rename can reach the disk before the data"
                    : "write to a temporary name, fsync, close, then rename to state_file(rank): the rename is atomic, the write is not"};
  if (from != 10)
    return {false, "the job resumes from step 10", from < 0 ? "it started from step 0" : fmt::format("it resumed from step {}", from), mine.output,
            "a checkpoint is complete when every rank's state_file is there: rank 0 and rank 1 must both have saved step 10"};
  return compare(ref, mine, "rank 1 killed halfway through its file of step 20, resumed from step 10");
}

// One byte of a rank's state file flipped: the rank and the byte drawn from the grading's seed (in the middle
// third, where the optimizer's moments lie: a flip there breaks no structure, only a checksum sees it).
std::string flip_a_byte(CheckContext& ctx, const fs::path& folder, int64_t salt) {
  auto gen = ctx.rng({salt});
  const int rank = int(gen() % 2);
  const fs::path file = folder / ("rank-" + std::to_string(rank) + ".state");
  const auto size = fs::file_size(file);
  const auto at = size / 3 + gen() % std::max<uintmax_t>(1, size / 3);
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(at));
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ (1 + gen() % 255));
  f.seekp(std::streamoff(at));
  f.write(&c, 1);
  return fmt::format("byte {} of rank-{}.state", at, rank);
}

// Two bytes that differ swapped, at the same places in every rank's file of the folder (drawn from the
// grading's seed, in the middle third): a sum or an xor of the bytes does not change, and the ranks' files
// (alike under DDP) stay alike, so only a checksum that weighs each byte by its place (CRC-32) sees it.
std::string swap_two_bytes(CheckContext& ctx, const fs::path& folder, int64_t salt) {
  auto gen = ctx.rng({salt});
  std::vector<std::vector<char>> files(2);
  for (int r = 0; r < 2; r++) {
    std::ifstream in(folder / ("rank-" + std::to_string(r) + ".state"), std::ios::binary);
    files[size_t(r)].assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t size = std::min(files[0].size(), files[1].size()), third = std::max<size_t>(1, size / 3);
  for (int tries = 0; tries < 1000 && size >= 3; tries++) {
    const size_t i = third + gen() % third, j = third + gen() % third;
    if (i == j || files[0][i] == files[0][j] || files[1][i] == files[1][j]) continue;
    for (int r = 0; r < 2; r++) {
      std::swap(files[size_t(r)][i], files[size_t(r)][j]);
      std::ofstream out(folder / ("rank-" + std::to_string(r) + ".state"), std::ios::binary | std::ios::trunc);
      out.write(files[size_t(r)].data(), std::streamsize(files[size_t(r)].size()));
    }
    return fmt::format("bytes {} and {} of rank-0.state and rank-1.state swapped", std::min(i, j), std::max(i, j));
  }
  throw CheckAbort("error", "the state files of " + folder.string() + " have no two different bytes to swap");
}

// Two resumes from the checkpoints of one run that died after step 20: one where a file of the newest
// checkpoint (step 20) is corrupt, which must be refused (resume from step 10), and one where only the
// older checkpoint (step 10) is, which must not matter (resume from step 20). Neither "no checksum" nor
// "refuse step 20" passes both.
CheckResult corrupt_detected(CheckContext& ctx) {
  const Job& ref = whole(ctx);
  TempDir d(ctx), older(ctx);
  // the first run dies after the checkpoint of step 20 (rank 0 killed at step 21, no restart)
  student(ctx, 2, {d.set()}, JobOptions{{kill_at(0, "step", 21)}, 0, false});
  for (int r = 0; r < 2; r++)
    for (const char* step : {"step-000010", "step-000020"})
      if (!fs::exists(fs::path(d.path) / step / ("rank-" + std::to_string(r) + ".state")))
        return {false, fmt::format("the checkpoints of steps 10 and 20 hold rank-0.state and rank-1.state"), fmt::format("{} has no rank-{}.state", step, r),
                "", "save_state must leave state_file(rank) in the folder"};
  fs::copy(d.path, older.path, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  hand_to_job_user(older.path);
  const std::string newest_flip = swap_two_bytes(ctx, fs::path(d.path) / "step-000020", 20);
  const std::string older_flip = flip_a_byte(ctx, fs::path(older.path) / "step-000010", 10);
  // the first run's steps are in another metrics file: from the resume on, the losses are the uninterrupted run's
  auto tail_from = [&](size_t step) {
    Job tail = ref;
    tail.losses.erase(tail.losses.begin(), tail.losses.begin() + std::min<size_t>(step, tail.losses.size()));
    return tail;
  };
  const Job mine = student(ctx, 2, {d.set()}, JobOptions{{}, 0, true});
  const nlohmann::json res = resume_of(mine);
  const int64_t from = res.is_null() ? -1 : res.value("step", int64_t(-1));
  if (from == 20)  // (the run may have failed on it)
    return {false, "load_state refuses the checkpoint of step 20 (" + newest_flip + ") and the job resumes from step 10",
            "it loaded the corrupt file", join(strings(res.value("lab07_problems", nlohmann::json()))),
            "a corrupt file must not load: keep a checksum (CRC-32) of the bytes in the file and compare it in load_state; return why. A "
            "sum or xor of the bytes misses two bytes swapped: a CRC weighs each byte by its place"};
  checked(mine, "resumed after " + newest_flip + " in step 20");
  if (from != 10)
    return {false, "the job resumes from step 10", from < 0 ? "it started from step 0" : fmt::format("it resumed from step {}", from), mine.output,
            "only the newest checkpoint is corrupt: the one before it must still load"};
  if (CheckResult c = compare(tail_from(10), mine, newest_flip + " in step 20, resumed from step 10"); !c.passed) return c;
  const Job whole_newest = student(ctx, 2, {older.set()}, JobOptions{{}, 0, true});
  const nlohmann::json res2 = resume_of(whole_newest);
  const int64_t from2 = res2.is_null() ? -1 : res2.value("step", int64_t(-1));
  if (from2 != 20)
    return {false, "with only the older checkpoint corrupt (" + older_flip + " of step 10), the job resumes from the whole newest one, step 20",
            from2 < 0 ? "it started from step 0" : fmt::format("it resumed from step {}", from2), whole_newest.output,
            "refuse a checkpoint because its bytes don't match their checksum, never because of its step or the world size"};
  checked(whole_newest, "resumed from step 20 with " + older_flip + " of step 10 flipped");
  return compare(tail_from(20), whole_newest, "step 10 corrupt, resumed from the whole step 20");
}

// Resumed twice on 1 rank, at micro-batches 2 and 4 (the save's: 4 on each of 2 ranks): the samples seen carry
// over as position x micro x world of the save / (micro x world now), 4 and 2 times the position, so that no
// constant factor passes both. The drawn epoch never ends at step 20 (scenario): the position is not 0.
CheckResult reshard_2_to_1(CheckContext& ctx) {
  whole(ctx);
  const int64_t micros[2] = {2, 4};
  // the engine's own 2 -> 1 resumes (shared by a batch): their losses after step 20 are the references
  const auto& refs = ctx.shared.get<std::vector<Job>>("engine:lab07-reshard", [&] {
    TempDir d(ctx), copy(ctx);
    run_job(ctx, 2, "none", plus_scenario(ctx, {d.set()}), ctx.seconds_left(), JobOptions{{kill_at(0, "step", 21)}, 0, false});
    fs::copy(d.path, copy.path, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    hand_to_job_user(copy.path);
    std::vector<Job> v;
    for (int i = 0; i < 2; i++)
      v.push_back(run_job(ctx, 1, "none", plus_scenario(ctx, {(i ? copy : d).set(), fmt::format("train.micro_batch={}", micros[i])}),
                          ctx.seconds_left(), JobOptions{{}, 0, true}));
    return v;
  });
  for (const Job& ref : refs)
    if (!ref.ok) throw CheckAbort(ref.status, "the engine's own 2 -> 1 resume failed: " + ref.failure);
  TempDir d(ctx), copy(ctx);
  student(ctx, 2, {d.set()}, JobOptions{{kill_at(0, "step", 21)}, 0, false});
  if (!fs::exists(fs::path(d.path) / "step-000020" / "rank-0.state"))
    return {false, "the checkpoint of step 20 holds rank-0.state", "it does not", "", "save_state must leave state_file(rank) in the folder"};
  fs::copy(d.path, copy.path, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  hand_to_job_user(copy.path);
  std::string detail;
  for (int i = 0; i < 2; i++) {
    const int64_t micro1 = micros[i];
    const std::string what = fmt::format("the checkpoint of 2 ranks (micro-batch 4) resumed on 1 (micro-batch {})", micro1);
    const Job mine = checked(student(ctx, 1, {(i ? copy : d).set(), fmt::format("train.micro_batch={}", micro1)}, JobOptions{{}, 0, true}), what);
    const nlohmann::json res = resume_of(mine);
    if (res.is_null() || res.value("step", int64_t(-1)) != 20)
      return {false, "1 rank resumes from the checkpoint of step 20 saved by 2", res.is_null() ? "it started from step 0" : "another step", mine.output,
              "with 1 rank, read rank 0's file: state_file(1) belongs to a rank that no longer exists"};
    CheckResult r = compare(refs[size_t(i)], mine, fmt::format("saved on 2 ranks at micro-batch 4, resumed on 1 at micro-batch {}", micro1));
    if (!r.passed) {
      if (r.hint.empty() || r.detail.find("sampler") != std::string::npos)
        r.hint = fmt::format("position counts batches of micro_batch() on world() ranks: a batch of 4 on each of 2 ranks is {} batches of {} on 1. "
                             "Carry the samples seen over: position x the saved micro-batch x the saved world / (micro_batch() x world())",
                             4 * 2 / micro1, micro1);
      return r;
    }
    detail += (detail.empty() ? "" : "; ") + r.detail;
  }
  return {true, "", "", detail};
}

}  // namespace checks07

std::map<std::string, CheckDef> lab07_checks() {
  using namespace checks07;
  return {
      {"resume_bitwise", {resume_bitwise, true}},
      {"atomic_save", {atomic_save, true}},
      {"corrupt_detected", {corrupt_detected, true}},
      {"reshard_2_to_1", {reshard_2_to_1, true}},
  };
}

}  // namespace distlab::grader
