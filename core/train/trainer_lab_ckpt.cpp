// Lab 07: the student's save_state and load_state in place of the engine's optimizer / RNG / sampler
// checkpoint (labs/07-checkpoint/api.h). The trainer still owns everything around them:
//
//   save (every rank)   model.safetensors (rank 0, the f32 weights, atomically)
//                       .reference/ — the engine's own checkpoint of the same step, which the student's code
//                         cannot name (no name starts with '.'): only to explain what a resume got wrong
//                       save_state(State, Files): the student writes its files through the trainer, which
//                         records how (a write under the final name, a rename before fsync)
//   resume              the newest folder with model.safetensors and every saving rank's state_file(r) is
//                       complete (the student's atomicity decides what appears there); the weights are loaded,
//                       then load_state on every rank — a refusal on any rank ("corrupt") moves every rank on
//                       to the folder before; what load_state set is applied only when all accepted
//
// After a resume the trainer compares the state with .reference/ and records what differs (the optimizer
// moments not restored, the sampler back at the start, ...) in the metrics, for the grader's explanations.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>

#include "core/ckpt/checkpoint.h"
#include "core/ckpt/safetensors.h"
#include "core/tensor/on_host.h"
#include "core/train/trainer.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

namespace fs = std::filesystem;

namespace {

Error lab07_error(const std::string& what, const std::string& hint = "see labs/07-checkpoint/api.h and README.md") {
  return Error("lab 07: " + what, hint);
}

std::string state_file(int rank) { return "rank-" + std::to_string(rank) + ".state"; }

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 200 || n[0] == '.') return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

// load_state's answer, read front to back (a short one is the host's fault: an error, never a crash)
struct Cursor {
  const std::vector<char>& in;
  size_t at;
  void copy(void* dst, size_t n) {
    if (at + n > in.size()) throw lab07_error("load_state: a broken answer from the plugin's host");
    std::memcpy(dst, in.data() + at, n);
    at += n;
  }
  template <class T>
  T take() {
    T v{};
    copy(&v, sizeof(T));
    return v;
  }
};

void put_i64(std::vector<char>& out, int64_t v) { out.insert(out.end(), reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + 8); }
void put_str(std::vector<char>& out, const std::string& s) {
  out.insert(out.end(), s.begin(), s.end());
  out.push_back('\0');
}

// The checkpoint folder's files as the student's code reaches them: one request per call, confined to
// plain names in `dir`, and watched — what a kill in the middle would leave is recorded as a violation.
//
// A quota bounds what one save_state may put on the trainer's disk: at most kMaxFiles files opened and
// `byte_quota` bytes written (a few times the snapshot it was given: the State holds everything worth saving).
// The trainer's own files in the folder (model.safetensors and its .partial) are not the student's to touch.
class FileServer {
 public:
  static constexpr int kMaxFiles = 16;
  FileServer(LabPlugin& plugin, std::string dir, int rank, bool kill_on_write, std::ostream& log, uint64_t byte_quota)
      : plugin_(plugin), dir_(std::move(dir)), rank_(rank), kill_on_write_(kill_on_write), log_(log), quota_(byte_quota) {}
  ~FileServer() {
    for (auto& [h, f] : open_) ::close(f.fd);
  }
  std::vector<std::string> violations;

  void finish() {  // after save_state returned
    for (auto& [h, f] : open_) {
      ::close(f.fd);
      violations.push_back(fmt::format("{} was left open", f.name));
    }
    open_.clear();
  }

  void serve(const wire::Frame& f, std::vector<char>& payload) {
    switch (f.op) {
      case labproto::kFileOpen: {
        const std::string name = checked(std::string(payload.begin(), payload.end()), "open");
        if (++opened_ > kMaxFiles)
          throw lab07_error(fmt::format("open(\"{}\"): more than {} files opened in one save_state", name, kMaxFiles),
                            "a state file and its temporary name are all a checkpoint needs");
        if (name == state_file(rank_))
          violations.push_back(fmt::format("opened {}, the final name, for writing: a kill during the write leaves a torn file that looks complete",
                                           name));
        const int fd = ::open(path(name).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) throw lab07_error(fmt::format("open(\"{}\"): {}", name, std::strerror(errno)));
        const int32_t h = next_++;
        open_[h] = {fd, name, false};
        return answer(&h, 4);
      }
      case labproto::kFileWrite: {
        Open& o = handle(f.arg[0], "write");
        const char* p = payload.data();
        size_t n = payload.size();
        if (n > quota_ - written_)
          throw lab07_error(fmt::format("write({}): {} bytes would take this save_state past its quota of {} bytes ({} written)", o.name, n,
                                        quota_, written_),
                            "a rank's state file holds its State once: a few times the snapshot save_state was given at most");
        written_ += n;
        if (kill_on_write_) {  // DISTLAB_TEST_FAULT: half of this write reaches the disk, then SIGKILL
          n /= 2;
          write_all(o, p, n);
          ::fsync(o.fd);
          const std::string note = fmt::format("DISTLAB_TEST_FAULT: rank {} kills itself with SIGKILL halfway through writing {}\n", rank_, o.name);
          [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, note.data(), note.size());
          log_.flush();
          ::raise(SIGKILL);
        }
        write_all(o, p, n);
        o.dirty = true;
        return answer(nullptr, 0);
      }
      case labproto::kFileSync: {
        Open& o = handle(f.arg[0], "fsync");
        if (::fsync(o.fd) != 0) throw lab07_error(fmt::format("fsync({}): {}", o.name, std::strerror(errno)));
        o.dirty = false;
        return answer(nullptr, 0);
      }
      case labproto::kFileClose: {
        Open& o = handle(f.arg[0], "close");
        if (::close(o.fd) != 0) throw lab07_error(fmt::format("close({}): {}", o.name, std::strerror(errno)));
        closed_dirty_[o.name] = o.dirty;
        open_.erase(int32_t(f.arg[0]));
        return answer(nullptr, 0);
      }
      case labproto::kFileRename: {
        const auto zero = std::find(payload.begin(), payload.end(), '\0');
        if (zero == payload.end()) throw lab07_error("rename: a broken request");
        const std::string from = checked(std::string(payload.begin(), zero), "rename"), to = checked(std::string(zero + 1, payload.end()), "rename");
        for (auto& [h, o] : open_)
          if (o.name == from) violations.push_back(fmt::format("renamed {} to {} while it was open", from, to));
        if (auto it = closed_dirty_.find(from); it != closed_dirty_.end() && it->second)
          violations.push_back(fmt::format("renamed {} to {} before fsync({}): after a crash the new name can hold a file the disk never got", from,
                                           to, from));
        std::error_code ec;
        fs::rename(path(from), path(to), ec);
        if (ec) throw lab07_error(fmt::format("rename(\"{}\", \"{}\"): {}", from, to, ec.message()));
        closed_dirty_.erase(from);
        return answer(nullptr, 0);
      }
      case labproto::kFileExists: {
        const std::string name = checked(std::string(payload.begin(), payload.end()), "exists");
        const int32_t v = fs::is_regular_file(path(name));
        return answer(&v, 4);
      }
      case labproto::kFileRead: {
        const std::string name = checked(std::string(payload.begin(), payload.end()), "read");
        std::error_code ec;
        const auto size = fs::file_size(path(name), ec);
        if (ec) throw lab07_error(fmt::format("read(\"{}\"): {}", name, ec.message()), "check files.exists(name) first");
        if (size > labproto::kMaxPayload) throw lab07_error(fmt::format("read(\"{}\"): {} bytes, more than 256 MiB", name, size));
        std::ifstream in(path(name), std::ios::binary);
        std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return answer(bytes.data(), bytes.size());
      }
      default:
        throw lab07_error(fmt::format("an unexpected request ({}) during save_state/load_state", f.op));
    }
  }

 private:
  struct Open {
    int fd;
    std::string name;
    bool dirty;  // written since its last fsync
  };
  std::string checked(const std::string& name, const char* call) const {
    if (!valid_name(name))
      throw lab07_error(fmt::format("{}(\"{}\"): not a plain file name", call, name.substr(0, 80)),
                        "letters, digits, '.', '_' and '-', not starting with '.', at most 200 characters");
    if (name.rfind("model.safetensors", 0) == 0)
      throw lab07_error(fmt::format("{}(\"{}\"): the trainer's weights file, not the student's", call, name),
                        "your files are state_file(rank) and temporary names of your own");
    return name;
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  Open& handle(int64_t h, const char* call) {
    auto it = open_.find(int32_t(h));
    if (it == open_.end()) throw lab07_error(fmt::format("{}({}): no file is open under that handle", call, h));
    return it->second;
  }
  void write_all(Open& o, const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(o.fd, p, n);
      if (w < 0) throw lab07_error(fmt::format("write({}): {}", o.name, std::strerror(errno)), "is the disk full?");
      p += w;
      n -= size_t(w);
    }
  }
  void answer(const void* data, size_t bytes) { plugin_.reply(labproto::kData, data, bytes, 0, "lab 07's files"); }

  LabPlugin& plugin_;
  std::string dir_;
  int rank_;
  bool kill_on_write_;
  std::ostream& log_;
  std::map<int32_t, Open> open_;
  std::map<std::string, bool> closed_dirty_;
  int32_t next_ = 1;
  uint64_t quota_, written_ = 0;
  int opened_ = 0;
};

}  // namespace

std::vector<char> Trainer::lab_snapshot(int64_t step) {
  std::vector<char> out;
  put_i64(out, pg_ ? pg_->rank() : 0);
  put_i64(out, world());
  put_i64(out, micro_batch_);
  put_i64(out, step);
  const auto names = opt_->state_names();
  put_i64(out, int64_t(opt_->size()));
  put_i64(out, int64_t(names.size()));
  for (const auto& n : names) put_str(out, n);
  for (size_t i = 0; i < opt_->size(); i++) {
    put_i64(out, opt_->param(i).data.numel());
    put_str(out, opt_->param(i).name);
  }
  put_i64(out, opt_->steps());
  for (size_t i = 0; i < opt_->size(); i++)
    for (const auto& n : names) {
      const Tensor* t = opt_->state(rt_, i, n, false);
      put_i64(out, t ? t->numel() : 0);
      if (t) {
        const OnHost h(*t);  // a cuda rank's: down from the device
        out.insert(out.end(), reinterpret_cast<const char*>(h.p), reinterpret_cast<const char*>(h.p + t->numel()));
      }
    }
  const auto streams = model_->rng_streams();
  put_i64(out, int64_t(streams.size()));
  for (uint64_t* s : streams) out.insert(out.end(), reinterpret_cast<const char*>(s), reinterpret_cast<const char*>(s) + 8);
  put_i64(out, loader_ ? loader_->epoch() : 0);
  put_i64(out, loader_ ? loader_->position() : 0);
  return out;
}

void Trainer::lab_save_checkpoint(const std::string& dir, int64_t steps, MetricsWriter& metrics, double t0) {
  if (strategy_->shards_parameters() || !strategy_->replicates_optimizer())
    throw ConfigError("lab 07 runs under DDP (or one rank): the student's State holds whole parameters", "set parallel.strategy = \"ddp\"");
  const int rank = pg_ ? pg_->rank() : 0;
  const bool group = pg_ && pg_->size() > 1;
  if (rank == 0)
    save_model(*model_, (fs::path(dir) / "model.safetensors").string(), DType::f32, opt_.get(),
               {{"step", std::to_string(steps)}, {"world_size", std::to_string(world())}});
  make_step_dir((fs::path(dir) / ".reference").string(), steps);
  write_checkpoint((fs::path(dir) / ".reference").string(), steps, "lab 07's reference", false);

  const std::vector<char> snap = lab_snapshot(steps);
  FileServer files(*lab_, dir, rank, fault_due("save", steps), log_, 4 * uint64_t(snap.size()) + (1 << 20));
  lab_->call(labproto::kSaveState, {}, snap.data(), snap.size(), pg_, &rt_, "save_state",
             [&](const wire::Frame& f, std::vector<char>& payload) { files.serve(f, payload); });
  files.finish();
  if (!fs::exists(fs::path(dir) / state_file(rank)))
    files.violations.push_back(fmt::format("save_state returned, and {} is not there: the checkpoint can never be complete", state_file(rank)));

  // every rank's violations reach rank 0, which records the save
  nlohmann::json all = nlohmann::json::array();
  if (group) {
    const std::string key = fmt::format("lab07/{}/", dir);
    pg_->store().set_string(key + std::to_string(rank), nlohmann::json(files.violations).dump());
    if (rank == 0)
      for (int r = 0; r < pg_->size(); r++)
        for (const auto& v : nlohmann::json::parse(pg_->store().get_string(key + std::to_string(r)))) all.push_back(fmt::format("rank {}: {}", r, v.get<std::string>()));
  } else {
    for (const auto& v : files.violations) all.push_back("rank 0: " + v);
  }
  const double secs = (rt_.trace.now_us() - t0) * 1e-6;
  ckpt_report_["saves"] = ckpt_report_.value("saves", 0) + 1;
  if (rank == 0) {
    log_ << fmt::format("checkpoint {} (lab 07's save_state): {:.2f} s{}\n", dir, secs, all.empty() ? "" : fmt::format(", {} problem(s)", all.size()));
    for (const auto& v : all) log_ << "  " << v.get<std::string>() << "\n";
    metrics.write({{"kind", "checkpoint"}, {"step", steps}, {"dir", dir}, {"save_s", secs}, {"lab07_violations", all}});
    log_.flush();
  }
}

nlohmann::json Trainer::lab_restore_problems(const std::string& dir) {
  nlohmann::json problems = nlohmann::json::array();
  Checkpoint ref((fs::path(dir) / ".reference").string());
  const int rank = pg_ ? pg_->rank() : 0;
  const bool same_world = ref.world_size() == world();
  const nlohmann::json st = ref.rank_state(same_world ? rank : 0);
  for (const std::string& name : opt_->state_names()) {
    int64_t missing = 0, differ = 0, total = 0;
    for (size_t i = 0; i < opt_->size(); i++) {
      const std::string logical = "optim." + name + "." + opt_->param(i).name;
      if (!ref.has(logical)) continue;
      total++;
      const Tensor* t = opt_->state(rt_, i, name, false);
      std::vector<float> want(size_t(opt_->param(i).data.numel()));
      ref.read(logical, 0, int64_t(want.size()), want.data());
      if (!t) missing++;
      else if (std::memcmp(OnHost(*t).p, want.data(), want.size() * 4) != 0) differ++;
    }
    if (missing) problems.push_back(fmt::format("the optimizer's {} was not restored for {} of {} parameters (they start from zero again)", name, missing, total));
    else if (differ) problems.push_back(fmt::format("the optimizer's {} differs from what was saved for {} of {} parameters", name, differ, total));
  }
  if (const int64_t t = st["optimizer"]["steps"].get<int64_t>(); opt_->steps() != t)
    problems.push_back(fmt::format("AdamW's step count is {}, it was {} (its bias correction restarts)", opt_->steps(), t));
  std::vector<uint64_t> now;
  for (uint64_t* c : model_->rng_streams()) now.push_back(*c);
  if (nlohmann::json(now) != st["rng"]["dropout_calls"])
    problems.push_back(fmt::format("the dropout streams are at {}, they were at {} (the resumed run draws masks already used)", nlohmann::json(now).dump(),
                                   st["rng"]["dropout_calls"].dump()));
  int64_t epoch = st["data"]["epoch"], position = st["data"]["position"];
  if (!same_world || st["micro_batch"].get<int64_t>() != micro_batch_)
    position = position * st["micro_batch"].get<int64_t>() * ref.world_size() / (micro_batch_ * world());
  if (loader_ && (loader_->epoch() != epoch || loader_->position() != position))
    problems.push_back(fmt::format("the sampler is at epoch {} batch {}, it should be at epoch {} batch {} (samples {})", loader_->epoch(),
                                   loader_->position(), epoch, position, loader_->position() < position ? "seen twice" : "skipped"));
  return problems;
}

void Trainer::lab_resume(MetricsWriter& metrics) {
  const auto& cc = cfg_.checkpoint;
  const int rank = pg_ ? pg_->rank() : 0;
  const bool group = pg_ && pg_->size() > 1;
  if (cc.resume != "auto") throw ConfigError("lab 07 resumes with checkpoint.resume = \"auto\" only", "leave checkpoint.resume at its default");
  // rank 0 lists the complete folders, newest first: model.safetensors and every saving rank's file there
  nlohmann::json candidates = nlohmann::json::array();
  if (rank == 0) {
    std::error_code ec;
    fs::create_directories(cc.dir, ec);
    for (const std::string& d : list_checkpoints(cc.dir)) {
      std::string missing;
      int saved_world = 0;
      try {
        saved_world = std::stoi(read_safetensors((fs::path(d) / "model.safetensors").string()).metadata.at("world_size"));
        for (int r = 0; r < saved_world; r++)
          if (!fs::exists(fs::path(d) / state_file(r))) missing += (missing.empty() ? "" : ", ") + state_file(r);
      } catch (const std::exception&) {
        missing = "model.safetensors";
      }
      if (missing.empty()) candidates.push_back(d);
      else log_ << fmt::format("skipping {}: incomplete ({} missing)\n", d, missing);
    }
  }
  if (group) {
    if (rank == 0) pg_->store().set_string("lab07/candidates", candidates.dump());
    else candidates = nlohmann::json::parse(pg_->store().get_string("lab07/candidates"));
  }
  if (loader_) loader_->start_epoch(0);  // where a fresh run starts: what load_state does not set stays so
  std::string refusals;
  for (const auto& c : candidates) {
    const std::string dir = c.get<std::string>();
    std::string refusal;
    int64_t step = 0;
    std::vector<char> back;
    int32_t len = 0;
    try {
      StFile weights = read_safetensors((fs::path(dir) / "model.safetensors").string());
      step = std::stoll(weights.metadata.at("step"));
      load_model(*model_, (fs::path(dir) / "model.safetensors").string());
      const std::vector<char> snap = lab_snapshot(step);
      FileServer files(*lab_, dir, rank, false, log_, 4 * uint64_t(snap.size()) + (1 << 20));
      back = lab_->call(labproto::kLoadState, {}, snap.data(), snap.size(), pg_, &rt_, "load_state",
                        [&](const wire::Frame& f, std::vector<char>& payload) { files.serve(f, payload); });
      if (back.size() < 4 || (std::memcpy(&len, back.data(), 4), len < 0) || size_t(len) + 4 > back.size())
        throw lab07_error("load_state: a broken answer");
      refusal = std::string(back.data() + 4, size_t(len));
      if (!refusal.empty()) refusal = "load_state refused it: " + refusal;
    } catch (const DataError& e) {
      refusal = e.what();
    } catch (const std::out_of_range&) {
      refusal = "model.safetensors has no step";
    }
    // every rank must agree before anything is applied
    if (group) {
      const std::string key = fmt::format("lab07/load/{}/", dir);
      pg_->store().set_string(key + std::to_string(rank), refusal);
      for (int r = 0; r < pg_->size(); r++) {
        const std::string theirs = r == rank ? refusal : pg_->store().get_string(key + std::to_string(r));
        if (!theirs.empty() && refusal.empty()) refusal = fmt::format("rank {}: {}", r, theirs);
      }
    }
    if (!refusal.empty()) {
      if (rank == 0) log_ << fmt::format("skipping {}: {}\n", dir, refusal);
      refusals += fmt::format("\n  {}: {}", dir, refusal);
      continue;
    }
    // apply what load_state set
    Cursor r{back, 4 + size_t(len)};
    const auto names = opt_->state_names();
    if (r.take<int64_t>()) {
      const int64_t t = r.take<int64_t>();
      opt_->set_steps(t);
      for (size_t i = 0; i < opt_->size(); i++)
        if (t > 0) opt_->set_param_steps(i, t);
    } else {
      r.take<int64_t>();
    }
    for (size_t i = 0; i < opt_->size(); i++)
      for (const auto& n : names) {
        const int64_t count = r.take<int64_t>();
        if (count < 0) continue;
        Tensor* t = opt_->state(rt_, i, n, true);
        if (count != t->numel()) throw lab07_error("load_state: a broken answer");
        OnHost h(*t, OnHost::out);  // up to a cuda rank's device
        r.copy(h.p, size_t(count) * 4);
        h.store();
      }
    const bool rng = r.take<int64_t>();
    const int64_t ns = r.take<int64_t>();
    const auto streams = model_->rng_streams();
    if (ns != int64_t(streams.size())) throw lab07_error("load_state: a broken answer");
    for (int64_t k = 0; k < ns; k++) {
      const uint64_t v = r.take<uint64_t>();
      if (rng) *streams[size_t(k)] = v;
    }
    const bool sampler = r.take<int64_t>();
    const int64_t epoch = r.take<int64_t>(), position = r.take<int64_t>();
    if (sampler && loader_) {
      epoch_ = epoch;
      loader_->seek(epoch, position);
    }
    start_step_ = saved_step_ = step;
    resumed_from_ = dir;
    // what differs from the engine's own save of the same step: the grader's explanations
    nlohmann::json problems = lab_restore_problems(dir);
    nlohmann::json all = nlohmann::json::array();
    if (group) {
      const std::string key = fmt::format("lab07/problems/{}/", dir);
      pg_->store().set_string(key + std::to_string(rank), problems.dump());
      if (rank == 0)
        for (int q = 0; q < pg_->size(); q++)
          for (const auto& p : nlohmann::json::parse(pg_->store().get_string(key + std::to_string(q)))) all.push_back(fmt::format("rank {}: {}", q, p.get<std::string>()));
    } else {
      for (const auto& p : problems) all.push_back("rank 0: " + p.get<std::string>());
    }
    if (rank == 0) {
      const int64_t kept = metrics.continue_from(step);
      metrics.write({{"kind", "resume"}, {"step", step}, {"from", dir}, {"world_size", world()}, {"records_kept", kept}, {"lab07_problems", all}});
      log_ << fmt::format("resumed from {} (step {}) through load_state\n", dir, step);
      for (const auto& p : all) log_ << "  not as saved: " << p.get<std::string>() << "\n";
      log_.flush();
    }
    return;
  }
  if (!candidates.empty())
    throw lab07_error(fmt::format("every checkpoint in '{}' was refused:{}", cc.dir, refusals), "start afresh in another checkpoint.dir");
}

}  // namespace distlab
