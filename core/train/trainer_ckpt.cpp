// Checkpoint and resume: what the trainer saves, and how a resumed run continues exactly where the saved
// one stood (the format of the files: core/ckpt/checkpoint.h). The course's list — model, optimizer,
// scheduler, RNG — made concrete:
//
//   state                         lives in                                 saved as
//   weights, f32                  what the optimizer steps (the master      pieces of "conv1.weight"
//                                 copy under bf16/fp16; a rank's part
//                                 under ZeRO/FSDP)
//   Adam's moments, SGD momentum  the optimizer, per parameter (or part)   pieces of "optim.exp_avg.conv1.weight"
//   BatchNorm statistics          each rank's model                        pieces, from every rank
//   step counts                   Optimizer::steps, AdamW's t per param    the rank's state (JSON)
//   learning-rate schedule        a function of the step                   the step
//   loss scale                    GradScaler (scale, clean steps, hysteresis)
//   RNG streams                   init: the seed; dropout: each Dropout's draws so far
//   data order                    the sampler's order is f(seed, epoch): the epoch and the batches taken
//   lr scheduler                  its position (the steps taken, or a      the rank's state: scheduler.steps
//                                 driven step's scheduler_step calls)
//   trainer counters              skipped steps
//
// With all of it back, step S+1 of a resumed run reads the same weights, moments, masks and batch as the
// uninterrupted run's step S+1, and computes the same bits. The tests kill a rank with SIGKILL at a random
// step and compare (tests/test_ckpt.cpp).
// Read next: core/ckpt/checkpoint.h (the files).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <ostream>
#include <set>

#include "core/ckpt/checkpoint.h"
#include "core/nn/qlora.h"
#include "core/tensor/on_host.h"
#include "core/parallel/tensor_parallel.h"
#include "core/train/trainer.h"

#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

namespace fs = std::filesystem;

namespace {

// Optimizer parameter i's weights as f32, without making anything: the parameter itself (f32), its
// master (16-bit, after the first step), or a widened copy of it (before).
// Where a slice of what this rank steps lies in the checkpoint's logical tensors. Split models (parallel.tp,
// parallel.pp): a tensor-parallel slice is runs of the whole tensor's elements (a row-split matrix one run
// per row), and the last stage's copy of the tied embedding is the first stage's "transformer.wte.weight".
struct Piece {
  std::string name;
  Shape shape;
  int64_t whole_offset, local_offset, numel;
};

std::vector<Piece> pieces_of(const Strategy::Slice& s, ProcessGroup* tp) {
  const Parameter& p = *s.param;
  const std::string& name = p.tied.empty() ? p.name : p.tied;
  const int t = tp ? tp->size() : 1;
  if (p.split_dim < 0 || t == 1) return {Piece{name, whole_shape(p, t), s.param_offset, s.local_offset, s.numel}};
  // the runs of this rank's TP slice that fall in [param_offset, +numel) of it (ZeRO-1 steps a part)
  std::vector<Piece> v;
  for (const SliceRun& r : split_runs(whole_shape(p, t), p.split_dim, p.split_parts, tp->rank(), t)) {
    const int64_t lo = std::max(r.local_offset, s.param_offset), hi = std::min(r.local_offset + r.numel, s.param_offset + s.numel);
    if (lo < hi) v.push_back(Piece{name, whole_shape(p, t), r.whole_offset + (lo - r.local_offset), s.local_offset + (lo - s.param_offset), hi - lo});
  }
  return v;
}

// The f32 weights of parameter i on the host: the parameter itself, its f32 master, or (no master yet) its
// 16-bit values widened; a GPU's copied down into tmp.
const float* f32_view(Optimizer& opt, size_t i, std::vector<float>& tmp) {
  Parameter& p = opt.param(i);
  const Tensor* t = p.data.dtype() == DType::f32 ? &p.data : opt.master(&p);
  if (t && t->device() != DeviceKind::cuda) return t->f32();
  tmp.resize(size_t(p.data.numel()));
  OnHost h(t ? *t : p.data);
  std::copy(h.p, h.p + p.data.numel(), tmp.data());
  return tmp.data();
}

// The keys a checkpoint must agree on to be loaded: the model and its data, and the optimizer's kind.
bool must_match(const std::string& k) {
  return ((k.rfind("model.", 0) == 0 || k.rfind("data.", 0) == 0) && k != "data.path" && k != "data.fallback") || k == "optim.name";
}

// Keys that may change between a run and its resume without a note: where things go, how long, how many
// (and a caller's own sections, RunConfig::extra: not the engine's to judge).
bool may_change(const std::string& k, const RunConfig& c) {
  return c.extra.count(k) || k.rfind("checkpoint.", 0) == 0 || k.rfind("log.", 0) == 0 || k.rfind("dist.", 0) == 0 ||
         k == "train.threads" || k == "train.steps" || k == "train.epochs" || k == "train.log_every" || k == "train.eval_every" ||
         k == "train.eval_batches";
}

}  // namespace

bool Trainer::fault_due(const char* where, int64_t step, const char* action) const {
  // "kill:RANK:step:S" / "kill:RANK:save:S": the resume tests' kill -9 before step S or during the save of S;
  // "skew:RANK:step:S": before step S, rank RANK's first weight moves by 1e-3 (a replica that diverged)
  const char* spec = std::getenv("DISTLAB_TEST_FAULT");
  if (!spec || !*spec) return false;
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (attempt && std::string(attempt) != "0") return false;  // a restarted group runs clean
  int rank = -1;
  char what[8] = {}, kind[8] = {};
  long long at = -1;
  const bool ok = std::sscanf(spec, "%7[a-z]:%d:%7[a-z]:%lld", what, &rank, kind, &at) == 4 &&
                  ((std::string(what) == "kill" && (std::string(kind) == "step" || std::string(kind) == "save")) ||
                   (std::string(what) == "skew" && std::string(kind) == "step"));
  if (!ok)
    throw ConfigError(fmt::format("DISTLAB_TEST_FAULT='{}' is not kill:RANK:step:S, kill:RANK:save:S or skew:RANK:step:S", spec),
                      "it is the tests' fault injection; unset it");
  return what == std::string(action) && rank == (pg_ ? pg_->rank() : 0) && kind == std::string(where) && at == step;
}

void Trainer::fault_point(const char* where, int64_t step) {
  const int rank = pg_ ? pg_->rank() : 0;
  if (fault_due(where, step, "skew")) {
    Parameter* p = model_->parameters().at(0);
    OnHost h(p->data, OnHost::inout);
    h.p[0] += 1e-3f;
    h.store();
    const std::string note = fmt::format("DISTLAB_TEST_FAULT: rank {} moves its {} by 1e-3 before step {}\n", rank, p->name, step);
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, note.data(), note.size());
    return;
  }
  if (!fault_due(where, step)) return;
  log_.flush();
  std::fflush(nullptr);
  const std::string note = fmt::format("DISTLAB_TEST_FAULT: rank {} kills itself with SIGKILL at {} {}\n", rank, where, step);
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, note.data(), note.size());  // every rank's stderr reaches the launcher
  ::raise(SIGKILL);
}

nlohmann::json Trainer::rank_state(int64_t steps) {
  nlohmann::json param_steps = nlohmann::json::object();
  const auto slices = strategy_->optimizer_slices(*model_);
  for (size_t i = 0; i < slices.size(); i++)
    for (const auto& s : slices[i]) param_steps[s.param->name] = opt_->param_steps(i);
  nlohmann::json dropout = nlohmann::json::array();
  for (uint64_t* c : model_->rng_streams()) dropout.push_back(*c);
  return {{"rank", pg_ ? pg_->rank() : 0},
          {"world_size", world()},
          {"dp_world", dp_world()},
          {"mesh", {{"dp", dp_world()}, {"tp", mesh_ ? mesh_->shape().tp : 1}, {"pp", mesh_ ? mesh_->shape().pp : 1}, {"cp", mesh_ ? mesh_->shape().cp : 1}}},
          {"step", steps},
          {"micro_batch", micro_batch_},
          {"accum_steps", cfg_.train.accum_steps},
          {"data", {{"epoch", loader_ ? loader_->epoch() : 0}, {"position", loader_ ? loader_->position() : 0}}},
          {"rng", {{"seed", cfg_.train.seed}, {"dropout_calls", dropout}}},
          {"optimizer", {{"name", name_of(cfg_.optim.name)}, {"steps", opt_->steps()}, {"param_steps", param_steps}}},
          {"scaler", {{"scale", scaler_.scale()}, {"growth_tracker", scaler_.growth_tracker()}, {"hysteresis_left", scaler_.hysteresis_left()}}},
          {"scheduler", {{"steps", sched_steps_}}},
          {"trainer", {{"skipped_steps", skipped_steps_}, {"epoch", epoch_}}}};
}

nlohmann::json Trainer::checkpoint_estimate() {
  const auto slices = strategy_->optimizer_slices(*model_);
  const bool writes = mesh_ ? (mesh_->coord().first_replica() || !strategy_->replicates_optimizer()) : (!strategy_->replicates_optimizer() || is_rank0());
  int64_t weights = 0;
  for (const auto& v : slices)
    for (const auto& s : v) weights += 4 * s.numel;
  if (!writes) weights = 0;
  const int64_t optim = weights * int64_t(opt_->state_names().size());
  int64_t buffers = 0;
  for (auto* b : model_->buffers()) buffers += 4 * b->data.numel();
  int64_t frozen = 0;  // LoRA's frozen base: written whole, f32, by the first replica (write_checkpoint)
  if (mesh_ ? mesh_->coord().first_replica() : is_rank0())
    for (Parameter* p : model_->parameters())
      if (!p->requires_grad && (!mesh_ || p->split_dim >= 0 || mesh_->coord().tp == 0)) frozen += 4 * p->data.numel();  // a 4-bit weight: its bytes as f32 values, 2 bytes a weight
  const int64_t rank_bytes = weights + optim + buffers;
  const int n = world();
  // what one node writes: every rank's part under ZeRO/FSDP; rank 0's whole copy under DDP (and the frozen base, once)
  const int per_node = pg_ && pg_->is_fake() && cfg_.dist.fake_ranks_per_node > 0 ? int(cfg_.dist.fake_ranks_per_node) : n;
  const double node_bytes =
      double(frozen) + (strategy_->replicates_optimizer() ? double(weights + optim + buffers * per_node) : double(rank_bytes) * per_node);
  const double total = double(frozen) + (strategy_->replicates_optimizer() ? double(weights + optim + buffers * n) : double(rank_bytes) * n);
  return {{"bytes_per_rank", {{"weights", weights + frozen}, {"optim_state", optim}, {"buffers", buffers}, {"total", rank_bytes + frozen}}},
          {"bytes_total", total},
          {"disk_gbps", cfg_.checkpoint.disk_gbps},
          {"modeled_write_s", node_bytes / (cfg_.checkpoint.disk_gbps * 1e9)}};
}

void Trainer::save_checkpoint(int64_t steps, MetricsWriter& metrics, const std::string& why) {
  if (steps == saved_step_) return;
  saved_step_ = steps;
  const nlohmann::json est = checkpoint_estimate();
  ckpt_report_["estimate"] = est;
  if (rt_.is_meta()) {  // nothing to write: what it would weigh, and take
    if (!ckpt_report_.contains("saves"))
      log_ << fmt::format("checkpoint (meta: not written): {} per rank ({} weights, {} optimizer state), {} in all; "
                          "{:.2f} s to write at {} GB/s per node\n",
                          format_bytes(est["bytes_per_rank"]["total"].get<double>()), format_bytes(est["bytes_per_rank"]["weights"].get<double>()),
                          format_bytes(est["bytes_per_rank"]["optim_state"].get<double>()), format_bytes(est["bytes_total"].get<double>()),
                          est["modeled_write_s"].get<double>(), cfg_.checkpoint.disk_gbps);
    ckpt_report_["saves"] = ckpt_report_.value("saves", 0) + 1;
    return;
  }
  const double t0 = rt_.trace.now_us();
  const std::string dir = (fs::path(cfg_.checkpoint.dir) / step_dir_name(steps)).string();
  metrics.sync();  // the records up to this step are on disk before the checkpoint that a resume continues them from
  make_step_dir(dir, steps);
  if (ext_ && ext_->owns_checkpoints()) {  // an extension's own state in the folder, in place of the engine's files
    Calls calls(*this);
    RunParts run = parts();
    ext_->save(run, calls, dir, steps, metrics);
    ckpt_report_["saves"] = ckpt_report_.value("saves", 0) + 1;
    return;
  }
  const int64_t bytes = write_checkpoint(dir, steps, why);
  const double secs = (rt_.trace.now_us() - t0) * 1e-6;
  std::vector<std::string> removed;
  if (is_rank0()) removed = prune_checkpoints(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
  ckpt_report_["saves"] = ckpt_report_.value("saves", 0) + 1;
  ckpt_report_["last"] = {{"step", steps}, {"dir", dir}, {"bytes", bytes}, {"save_s", secs}};
  ckpt_report_["save_s_total"] = ckpt_report_.value("save_s_total", 0.0) + secs;
  if (is_rank0()) {
    log_ << fmt::format("checkpoint {} ({}): {} in {:.2f} s{}\n", dir, why, format_bytes(double(bytes)), secs,
                        removed.empty() ? "" : fmt::format(", removed {} older", removed.size()));
    metrics.write({{"kind", "checkpoint"}, {"step", steps}, {"dir", dir}, {"bytes", bytes}, {"save_s", secs}, {"reason", why}});
    log_.flush();
  }
}

void Trainer::make_step_dir(const std::string& dir, int64_t steps) {
  std::string setup_error;
  const bool group = pg_ && pg_->size() > 1;
  if (is_rank0()) {
    std::error_code ec;
    if (fs::exists(fs::path(dir) / "COMPLETE", ec)) {
      // a complete checkpoint of this step that the resume refused (corrupt, edited) or passed over: moved
      // aside, never deleted (what a user wrote is theirs to remove)
      const std::string aside = fmt::format("{}.replaced-{}", dir, std::time(nullptr));
      fs::rename(dir, aside, ec);
      if (!ec) log_ << fmt::format("checkpoint: {} was complete but not resumed from: kept as {}\n", dir, aside);
    } else if (fs::exists(dir, ec)) {
      fs::remove_all(dir, ec);  // a save of this step that never completed
    }
    if (!ec) fs::create_directories(dir, ec);
    if (ec) setup_error = fmt::format("checkpoint: cannot create '{}': {}", dir, ec.message());
    if (group) pg_->store().set_string(fmt::format("ckpt/{}/{}/dir", dir, steps), setup_error);
  } else if (group) {
    setup_error = pg_->store().get_string(fmt::format("ckpt/{}/{}/dir", dir, steps));
  }
  if (!setup_error.empty()) throw IoError(setup_error, "is checkpoint.dir writable, and is there space? the earlier checkpoints are kept");
}

int64_t Trainer::write_checkpoint(const std::string& dir, int64_t steps, const std::string& why, bool fault) {
  const int rank = pg_ ? pg_->rank() : 0;
  const bool group = pg_ && pg_->size() > 1;
  // this rank's pieces: the weights and optimizer state it steps (rank 0 alone where every rank holds the
  // same), and its own buffers
  CheckpointWriter w;
  const auto slices = strategy_->optimizer_slices(*model_);
  DL_ASSERT(slices.size() == opt_->size(), "the strategy's slices and the optimizer's parameters disagree");
  // split models: the first data-parallel replica writes, each rank its slices of its stage; a tensor that
  // every TP rank holds whole, its TP rank 0; the tied embedding's copy, nobody (it is wte)
  const bool writes = mesh_ ? (mesh_->coord().first_replica() || !strategy_->replicates_optimizer()) : (!strategy_->replicates_optimizer() || rank == 0);
  if (writes) {
    std::vector<float> tmp;
    for (size_t i = 0; i < slices.size(); i++) {
      std::vector<Piece> pieces;
      for (const auto& s : slices[i]) {
        if (mesh_ && (!s.param->tied.empty() || (s.param->split_dim < 0 && mesh_->coord().tp != 0))) continue;
        for (Piece& p : pieces_of(s, tp_group())) pieces.push_back(std::move(p));
      }
      if (pieces.empty()) continue;
      const float* wts = f32_view(*opt_, i, tmp);
      for (const Piece& p : pieces) w.add(p.name, p.shape, p.whole_offset, wts + p.local_offset, p.numel, "weights");
      for (const std::string& name : opt_->state_names())
        if (Tensor* t = opt_->state(rt_, i, name, false)) {
          OnHost h(*t);
          for (const Piece& p : pieces) w.add("optim." + name + "." + p.name, p.shape, p.whole_offset, h.p + p.local_offset, p.numel, "optim_state");
        }
    }
  }
  // frozen parameters (LoRA's base) are in no optimizer slice: the first replica writes them whole, f32.
  // Sharded with the rest (ZeRO-3, FSDP), they are gathered a unit at a time for it: every rank takes part.
  // Split by tensor parallelism, each TP rank writes its slices of them (TP rank 0 the whole ones).
  const bool writes_frozen = mesh_ ? mesh_->coord().first_replica() : rank == 0;
  strategy_->visit_full_params(rt_, *model_, [&](const std::vector<Parameter*>& ps) {
    for (Parameter* p : ps) {
      if (p->requires_grad || !writes_frozen || (mesh_ && p->split_dim < 0 && mesh_->coord().tp != 0)) continue;
      OnHost h(p->data);
      for (const Piece& piece : pieces_of(Strategy::Slice{p, 0, 0, p->data.numel()}, tp_group()))
        w.add(piece.name, piece.shape, piece.whole_offset, h.p + piece.local_offset, piece.numel, "weights");
    }
  });
  for (auto* b : model_->buffers()) {
    OnHost h(b->data);
    w.add(b->name, b->data.shape(), 0, h.p, b->data.numel(), "buffers");
  }
  w.set_state(rank_state(steps));

  nlohmann::json record;
  std::string error;
  try {
    record = w.write(dir, rank, [&] {
      if (fault) fault_point("save", steps);
    });
  } catch (const Error& e) {
    error = e.what();
  }
  std::vector<nlohmann::json> records{record};
  if (group) {  // rank 0 writes the manifest once every rank's file is in place; everyone learns the outcome
    const std::string key = fmt::format("ckpt/{}/{}/", dir, steps);
    pg_->store().set_string(key + std::to_string(rank), error.empty() ? record.dump() : nlohmann::json{{"error", error}}.dump());
    if (rank == 0) {
      records.clear();
      for (int r = 0; r < pg_->size(); r++) {
        auto j = nlohmann::json::parse(pg_->store().get_string(key + std::to_string(r)));
        if (j.contains("error") && error.empty()) error = fmt::format("rank {}: {}", r, j["error"].get<std::string>());
        records.push_back(j);
      }
    }
  }
  if (rank == 0 && error.empty()) {
    nlohmann::json m = {{"step", steps},
                        {"strategy", name_of(cfg_.parallel.strategy)},
                        {"strategy_detail", strategy_->describe()},
                        {"world_size", world()},
                        {"precision", cfg_.precision.mode},
                        {"optimizer", name_of(cfg_.optim.name)},
                        {"reason", why},
                        {"config_hash", crc32_hex(crc32(config_fingerprint(cfg_).data(), config_fingerprint(cfg_).size()))},
                        {"config", config_values(cfg_)}};
    try {
      write_manifest(dir, m, records);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (group) {
    if (rank == 0) pg_->store().set_string(fmt::format("ckpt/{}/{}/done", dir, steps), error);
    else if (std::string r0 = pg_->store().get_string(fmt::format("ckpt/{}/{}/done", dir, steps)); !r0.empty() && error.empty()) error = r0;
  }
  if (!error.empty())
    throw IoError(fmt::format("checkpoint at step {} failed: {}", steps, error),
                  fmt::format("'{}' stays incomplete and is never loaded; the earlier checkpoints are kept", dir));
  int64_t bytes = 0;
  if (rank == 0)
    for (const auto& r : records) bytes += r.value("bytes", int64_t(0));
  return bytes;
}

void Trainer::load_checkpoint(const std::string& step_dir) {
  Checkpoint c(step_dir);
  const int rank = pg_ ? pg_->rank() : 0;
  const bool same_world = c.world_size() == world();
  const int mine = same_world ? rank : 0;  // whose buffers and counters this rank takes

  // what this rank's optimizer steps: its weights (f32: the master under 16-bit), then the moments
  const auto slices = strategy_->optimizer_slices(*model_);
  DL_ASSERT(slices.size() == opt_->size(), "the strategy's slices and the optimizer's parameters disagree");
  for (size_t i = 0; i < slices.size(); i++) {
    std::vector<Piece> pieces;
    for (const auto& s : slices[i])
      for (Piece& p : pieces_of(s, tp_group())) pieces.push_back(std::move(p));
    OnHost w(opt_->f32_weights(rt_, i), OnHost::inout);
    for (const Piece& p : pieces) c.read(p.name, p.whole_offset, p.numel, w.p + p.local_offset);
    w.store();
    opt_->sync_param(i);  // 16-bit: the rounded master, as a step leaves it
    for (const std::string& name : opt_->state_names()) {
      bool saved = false;
      for (const Piece& p : pieces) saved = saved || c.has("optim." + name + "." + p.name);
      if (!saved) continue;  // the saved run had not stepped it yet
      OnHost t(*opt_->state(rt_, i, name, true), OnHost::inout);
      for (const Piece& p : pieces) c.read("optim." + name + "." + p.name, p.whole_offset, p.numel, t.p + p.local_offset);
      t.store();
    }
  }
  // the model, where every rank holds it whole (none, DDP, ZeRO-1 and 2; a split model's slices): from the
  // f32 weights
  if (!strategy_->shards_parameters())
    for (auto* p : model_->parameters()) {
      std::vector<float> v(size_t(p->data.numel()));
      for (const Piece& piece : pieces_of(Strategy::Slice{p, 0, 0, p->data.numel()}, tp_group()))
        c.read(piece.name, piece.whole_offset, piece.numel, v.data() + piece.local_offset);
      OnHost h(p->data, OnHost::out);
      if (h.p) std::copy(v.begin(), v.end(), h.p);
      h.store();
    }
  for (auto* b : model_->buffers()) {
    OnHost h(b->data, OnHost::inout);
    c.read(b->name, 0, b->data.numel(), h.p, mine);
    h.store();
  }
  for (Parameter* p : model_->parameters())  // QLoRA: the 4-bit weights' state read back from its constants
    if (p->quant) quant_state_loaded(*p, step_dir);
  // ZeRO-3, FSDP: LoRA's frozen base is sharded with the rest: whole for the read, then each rank keeps its part
  const std::vector<Parameter*> params = model_->parameters();
  if (strategy_->shards_parameters() && trainable(params).size() < params.size()) {
    strategy_->gather_full_params(rt_, nullptr);
    for (Parameter* p : params)
      if (!p->requires_grad) {
        std::vector<float> v(size_t(p->data.numel()));
        for (const Piece& piece : pieces_of(Strategy::Slice{p, 0, 0, p->data.numel()}, tp_group()))
          c.read(piece.name, piece.whole_offset, piece.numel, v.data() + piece.local_offset);
        OnHost h(p->data, OnHost::out);
        if (h.p) std::copy(v.begin(), v.end(), h.p);
        h.store();
      }
    strategy_->release_full_params(rt_, true);
  }
  strategy_->checkpoint_loaded();

  // counters: this rank's own (or rank 0's on another world); AdamW's t per parameter from whichever
  // rank stepped it
  const nlohmann::json st = c.rank_state(mine);
  try {
    nlohmann::json param_steps = st.at("optimizer").at("param_steps");
    if (!same_world || !strategy_->replicates_optimizer())
      for (int r = 0; r < c.world_size(); r++)
        for (const nlohmann::json theirs = c.rank_state(r); auto& [k, v] : theirs.at("optimizer").at("param_steps").items()) param_steps[k] = v;
    opt_->set_steps(st.at("optimizer").at("steps").get<int64_t>());
    for (size_t i = 0; i < slices.size(); i++) {
      int64_t t = opt_->steps();
      if (!slices[i].empty() && param_steps.contains(slices[i][0].param->name)) t = param_steps[slices[i][0].param->name].get<int64_t>();
      if (t > 0 || opt_->param_steps(i) > 0) opt_->set_param_steps(i, t);
    }
    const auto& sc = st.at("scaler");
    scaler_.restore(sc.at("scale").get<float>(), sc.at("growth_tracker").get<int64_t>(), sc.at("hysteresis_left").get<int64_t>());
    loss_scale_ = scaler_.scale();
    skipped_steps_ = st.at("trainer").at("skipped_steps").get<int64_t>();
    // the scheduler's position (a checkpoint without it: the engine's own steps drove it)
    sched_steps_ = st.contains("scheduler") ? st.at("scheduler").at("steps").get<int64_t>() : c.step();
    const auto streams = model_->rng_streams();
    const auto& calls = st.at("rng").at("dropout_calls");
    if (calls.size() == streams.size()) {
      for (size_t i = 0; i < streams.size(); i++) *streams[i] = calls[i].get<uint64_t>();
    } else {
      // another split into pipeline stages: each stage saved its own Dropouts' draws. Every Dropout draws
      // once per forward, so in a model whose streams all stand at one count that count is every stream's.
      std::set<uint64_t> seen;
      for (int r = 0; r < c.world_size(); r++) {
        const nlohmann::json theirs = c.rank_state(r);  // (a local: ranging over a temporary's member would dangle)
        for (const auto& v : theirs.at("rng").at("dropout_calls")) seen.insert(v.get<uint64_t>());
      }
      if (seen.size() > 1)
        throw CheckpointError(fmt::format("{}: {} dropout streams saved on rank {}, this rank's part of the model has {}, and the saved "
                                          "streams stand at different counts", step_dir, calls.size(), mine, streams.size()),
                              "resume with the parallel.pp (and stage split) the checkpoint was saved with");
      for (uint64_t* s : streams) *s = seen.empty() ? 0 : *seen.begin();
    }
    int64_t epoch = st.at("data").at("epoch").get<int64_t>(), position = st.at("data").at("position").get<int64_t>();
    const int64_t saved_dp = st.value("dp_world", int64_t(c.world_size()));  // the data-parallel ranks that read the data
    if (saved_dp != dp_world() || st.at("micro_batch").get<int64_t>() != micro_batch_) {
      // another world (or micro-batch): the same number of samples of this epoch counts as seen
      const int64_t seen = position * st.at("micro_batch").get<int64_t>() * saved_dp;
      const int64_t per = micro_batch_ * dp_world();
      if (seen % per != 0 && is_rank0())
        log_ << fmt::format("note: {} samples of epoch {} were seen on {} data-parallel rank(s); on {} the position rounds down to {} batches of {}\n",
                            seen, epoch, saved_dp, dp_world(), seen / per, per);
      position = seen / per;
    }
    epoch_ = std::max<int64_t>(epoch, 0);
    if (loader_) loader_->seek(epoch_, position);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: rank {}'s state is malformed ({})", step_dir, mine, e.what()));
  }
  start_step_ = c.step();
  resumed_from_ = c.dir();
  // resumed from checkpoint.dir itself: that step is saved already (from elsewhere, it is saved again here)
  std::error_code ec;
  if (!cfg_.checkpoint.dir.empty() && fs::equivalent(fs::path(step_dir).parent_path(), cfg_.checkpoint.dir, ec)) saved_step_ = start_step_;
}

void Trainer::resume(MetricsWriter& metrics) {
  const auto& cc = cfg_.checkpoint;
  const bool explicit_path = cc.resume != "auto" && cc.resume != "never";
  if (cc.dir.empty() && !explicit_path) return;
  if (const std::string why = strategy_->checkpoint_refusal(); !why.empty())
    throw ConfigError(fmt::format("checkpoint.dir is set, but {}", why), "run without checkpoint.dir");
  if (rt_.is_meta()) return;  // nothing to load or save: the meta run reports what a save would weigh
  if (ext_ && ext_->owns_checkpoints()) {  // the extension finds, checks and loads its own
    Calls calls(*this);
    RunParts run = parts();
    if (const std::optional<ResumePoint> p = ext_->resume(run, calls, metrics)) {
      start_step_ = saved_step_ = p->step;
      resumed_from_ = p->dir;
      if (loader_) epoch_ = loader_->epoch();
    }
    return;
  }
  const bool group = pg_ && pg_->size() > 1;
  // rank 0 chooses (every file checksummed), the others take its word: they all load the same one
  nlohmann::json choice = {{"dir", ""}, {"error", ""}, {"hint", ""}};
  if (is_rank0()) {
    auto accept = [&](Checkpoint& c) {
      const nlohmann::json saved = c.manifest().at("config");
      std::string bad, changed;
      for (const auto& [k, v] : config_values(cfg_)) {
        const std::string was = saved.contains(k) ? saved[k].get<std::string>() : "(absent)";
        if (was == v) continue;
        if (must_match(k)) bad += fmt::format("\n    {}: {} in the checkpoint, {} now", k, was, v);
        else if (!may_change(k, cfg_)) changed += fmt::format("{}{} {} -> {}", changed.empty() ? "" : ", ", k, was, v);
      }
      if (!bad.empty()) throw CheckpointError(fmt::format("{}: saved by a run of another model, data or optimizer:{}", c.dir(), bad));
      if (!changed.empty()) log_ << fmt::format("note: resuming with changed settings: {}\n", changed);
    };
    try {
      std::error_code ec;
      if (!cc.dir.empty()) {
        fs::create_directories(cc.dir, ec);
        if (ec || ::access(cc.dir.c_str(), W_OK) != 0)
          throw IoError(fmt::format("checkpoint.dir '{}' cannot be created or written{}", cc.dir, ec ? ": " + ec.message() : ""),
                        "choose a folder you can write");
      }
      if (cc.resume == "never") {
        std::vector<Skipped> skipped;
        if (const std::string found = find_checkpoint(cc.dir, skipped); !found.empty())
          throw ConfigError(fmt::format("checkpoint.resume = never, but '{}' already holds checkpoints ({})", cc.dir, found),
                            "resume them (checkpoint.resume = auto), or give another checkpoint.dir: a new run would overwrite them");
      } else if (cc.resume == "auto") {
        std::vector<Skipped> skipped;
        const std::string found = find_checkpoint(cc.dir, skipped, accept);
        std::string faults;
        for (const auto& s : skipped) {
          log_ << "skipping " << s.reason << "\n";
          if (!s.incomplete) faults += "\n  " + s.reason;
        }
        if (found.empty() && !faults.empty())
          throw CheckpointError(fmt::format("no usable checkpoint in '{}':{}", cc.dir, faults),
                                "remove or move the bad folders to start afresh, or name one with checkpoint.resume");
        choice["dir"] = found;
      } else {
        Checkpoint c(resolve_checkpoint_path(cc.resume));
        c.verify_files();
        accept(c);
        choice["dir"] = c.dir();
      }
    } catch (const Error& e) {
      choice["error"] = e.what();
      choice["hint"] = e.hint();
    }
    if (group) pg_->store().set_string("ckpt/resume", choice.dump());
  } else if (group) {
    choice = nlohmann::json::parse(pg_->store().get_string("ckpt/resume"));
  }
  if (!choice["error"].get<std::string>().empty()) {
    const std::string msg = choice["error"].get<std::string>();
    if (is_rank0()) throw CheckpointError(msg, choice["hint"].get<std::string>());
    throw CheckpointError(fmt::format("rank 0 could not resume: {}", msg), choice["hint"].get<std::string>());
  }
  const std::string dir = choice["dir"];
  if (dir.empty()) return;
  load_checkpoint(dir);
  if (is_rank0()) {
    const int64_t kept = metrics.continue_from(start_step_);
    metrics.write({{"kind", "resume"}, {"step", start_step_}, {"from", dir}, {"world_size", world()}, {"records_kept", kept}});
    log_ << fmt::format("resumed from {} (step {}): optimizer, loss scale, RNG streams and data position restored\n", dir, start_step_);
    log_.flush();
  }
}

}  // namespace distlab
