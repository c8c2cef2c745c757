#include "core/train/trainer.h"

#include <fmt/format.h>

#include <cmath>
#include <ostream>
#include <thread>

#include "core/ckpt/safetensors.h"
#include "core/perf/chrome_trace.h"
#include "core/perf/cost_model.h"
#include "core/perf/trace_io.h"
#include "core/train/strategies.h"
#include "core/nn/loss.h"
#include "core/perf/hardware.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

static ModelSpec spec_for(const RunConfig& c, const DataSets& d, bool meta) {
  ModelSpec s = c.model;
  s.dropout_seed = c.train.seed;
  if (c.data.name == "tokens") {
    const int64_t data_vocab = meta ? c.data.vocab : d.vocab;
    if (s.vocab_size == 0) s.vocab_size = data_vocab;
    if (data_vocab > s.vocab_size)
      throw ConfigError(fmt::format("{}: model.vocab_size {} is smaller than the data's vocabulary {}",
                                    c.origin.count("model.vocab_size") ? c.origin.at("model.vocab_size") : "default",
                                    s.vocab_size, data_vocab),
                        "raise model.vocab_size (or set it to 0 to take the data's)");
    if (c.data.seq_len > s.block_size)
      throw ConfigError(fmt::format("data.seq_len {} is longer than model.block_size {}", c.data.seq_len, s.block_size),
                        "lower data.seq_len or raise model.block_size");
    if (s.name != "gpt") throw ConfigError("data.name 'tokens' needs model.name = \"gpt\"", "token data feeds a language model");
    return s;
  }
  if (s.name == "gpt") throw ConfigError("model.name 'gpt' needs data.name = \"tokens\"", "image data feeds mlp or cifar_cnn");
  if (meta) {
    const bool mnist = c.data.name == "fashion-mnist";
    s.in_channels = mnist ? 1 : 3;
    s.height = s.width = mnist ? 28 : 32;
    s.num_classes = 10;
  } else {
    s.in_channels = d.channels;
    s.height = d.height;
    s.width = d.width;
    s.num_classes = d.classes;
  }
  return s;
}

static int default_threads() {
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v && std::atoi(v) > 0) return std::atoi(v);  // set by distlab run
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

Trainer::Trainer(const RunConfig& cfg, Runtime& rt, std::ostream& log, ProcessGroup* pg, LabPlugin* lab)
    : cfg_(cfg), rt_(rt), log_(log), pg_(pg), lab_(lab) {
  check_strategy_fits(cfg, world());
  if (world() > 1 && rt.is_meta())
    throw ConfigError("the meta device runs on one rank", "plan a model with `distlab train ... --device meta` without distlab run");
  const int threads = cfg.train.threads > 0 ? int(cfg.train.threads) : default_threads();
  set_compute_threads(threads);
  if (!cfg.train.device_mem.empty()) rt.memory.set_capacity(parse_device_memory(cfg.train.device_mem, "train.device_mem"));
  if (!rt.is_meta()) data_ = open_datasets(cfg.data);
  spec_ = spec_for(cfg, data_, rt.is_meta());

  // batch sizes: micro × ranks × accum = global (one rank here)
  micro_batch_ = cfg.train.micro_batch;
  if (cfg.train.global_batch > 0) {
    const int64_t world = this->world(), per = world * cfg.train.accum_steps;
    if (cfg.train.global_batch % per != 0)
      throw ConfigError(fmt::format("train.global_batch {} is not divisible by ranks ({}) x train.accum_steps ({})",
                                    cfg.train.global_batch, world, cfg.train.accum_steps),
                        "choose a global batch that is a multiple of ranks x accum_steps");
    micro_batch_ = cfg.train.global_batch / per;
    if (cfg.origin.count("train.micro_batch") && cfg.train.micro_batch != micro_batch_)
      throw ConfigError(fmt::format("{}: train.micro_batch {} contradicts train.global_batch {} = {} ranks x {} accum x {}",
                                    cfg.origin.at("train.micro_batch"), cfg.train.micro_batch, cfg.train.global_batch,
                                    world, cfg.train.accum_steps, micro_batch_),
                        "state only one of train.micro_batch and train.global_batch");
  }

  if (!rt.is_meta()) {
    auto sampler = make_train_sampler(cfg, data_.train->size(), world(), pg_ ? pg_->rank() : 0, lab_);
    loader_ = std::make_unique<DataLoader>(*data_.train, sampler, micro_batch_, cfg.train.drop_last);
    if (loader_->batches_per_epoch() < 1)
      throw ConfigError(fmt::format("the train set has {} samples, fewer than one micro-batch of {}", data_.train->size(), micro_batch_),
                        "lower train.micro_batch");
  }
  if (cfg.train.steps > 0) total_steps_ = cfg.train.steps;
  else {
    const int64_t per_epoch = loader_ ? loader_->batches_per_epoch() / cfg.train.accum_steps : 1;
    if (per_epoch < 1)
      throw ConfigError(fmt::format("an epoch has {} micro-batches, fewer than train.accum_steps {}", loader_->batches_per_epoch(),
                                    cfg.train.accum_steps),
                        "lower train.accum_steps or set train.steps");
    total_steps_ = cfg.train.epochs * per_epoch;
  }

  model_ = build_model(rt, spec_);
  model_->init(cfg.train.seed);
  strategy_ = make_strategy(cfg, pg_, *model_, rt, lab_);
  if (cfg.optim.name == "sgd") {
    opt_ = std::make_unique<SGD>(model_->parameters(),
                                 SGDOptions{float(cfg.optim.momentum), float(cfg.optim.dampening), float(cfg.optim.weight_decay), cfg.optim.nesterov});
  } else {
    opt_ = std::make_unique<AdamW>(model_->parameters(), AdamWOptions{float(cfg.optim.beta1), float(cfg.optim.beta2),
                                                                      float(cfg.optim.eps), float(cfg.optim.weight_decay)});
  }
  schedule_ = Schedule{cfg.optim.schedule, cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.step_size,
                       cfg.optim.gamma, cfg.optim.min_lr, total_steps_};
}

Batch Trainer::meta_batch(int64_t B) {
  Batch b;
  b.B = B;
  if (spec_.name == "gpt") {
    b.T = cfg_.data.seq_len;
    b.tokens.assign(size_t(B * b.T), 0);
    b.targets.assign(size_t(B * b.T), 0);
  } else {
    b.x = rt_.empty({B, spec_.in_channels, spec_.height, spec_.width}, Category::activations, "input images");
    b.targets.assign(size_t(B), 0);
  }
  return b;
}

Batch Trainer::next_batch() {
  if (rt_.is_meta()) return meta_batch(micro_batch_);
  Batch b;
  if (!loader_->next(rt_, b)) {
    loader_->start_epoch(++epoch_);
    loader_->next(rt_, b);
  }
  return b;
}

double Trainer::train_step(int64_t step, MetricsWriter& metrics) {
  rt_.memory.reset_peaks();
  rt_.trace.reset_totals();
  const bool traced = (!cfg_.log.profile.empty() || !cfg_.log.trace.empty()) && step + 1 == std::min(cfg_.log.trace_step, total_steps_);
  rt_.trace.keep_events(traced);
  rt_.trace.clear_events();
  const CommCounters comm_before = pg_ ? pg_->total_counters() : CommCounters{};
  const double t0 = rt_.trace.now_us();
  CrossEntropyLoss ce;
  double loss_sum = 0;
  int64_t samples = 0;
  const int64_t k = cfg_.train.accum_steps;
  for (int64_t micro = 0; micro < k; micro++) {
    Batch b = next_batch();
    Tensor logits = model_->forward(rt_, b, strategy_.get());
    loss_sum += ce.forward(rt_, logits, b.targets);
    Tensor dlogits = ce.backward(rt_, 1.0f / float(k));  // the mean over the big batch: loss / k
    logits = Tensor();
    strategy_->begin_backward(micro == k - 1);  // no_sync on all but the last micro-step
    model_->backward(rt_, dlogits, strategy_.get());
    strategy_->finish_backward(rt_);
    samples += b.samples();
  }
  rt_.trace.keep_events(false);
  const double grad_norm = clip_grad_norm(rt_, model_->parameters(), cfg_.optim.clip_grad_norm);
  const double lr = schedule_.lr_at(step);
  strategy_->step(rt_, *opt_, float(lr));
  model_->zero_grad();
  const double wall_s = (rt_.trace.now_us() - t0) * 1e-6;
  last_step_flops_ = rt_.trace.flops();
  const MemoryStats& m = rt_.memory.stats();
  for (int i = 0; i < kNumCategories; i++) peak_[size_t(i)] = std::max(peak_[size_t(i)], m.peak[size_t(i)]);
  peak_total_ = std::max(peak_total_, m.peak_total);
  double loss = loss_sum / double(k);
  const CommCounters comm = pg_ ? pg_->total_counters() : CommCounters{};
  if (pg_ && pg_->size() > 1 && !rt_.is_meta()) {  // report the global batch's loss, as one device would see it
    float l = float(loss);
    pg_->all_reduce(&l, 1, ReduceOp::avg);
    loss = l;
    samples *= pg_->size();
  }
  if (traced) modeled_ = model_time(step);
  nlohmann::json rec = {{"kind", "step"}, {"step", step + 1}, {"loss", rt_.is_meta() ? nlohmann::json(nullptr) : nlohmann::json(loss)},
                        {"lr", lr}, {"grad_norm", grad_norm}, {"samples", samples}, {"wall_s", wall_s},
                        {"comm_bytes_sent", comm.bytes_sent - comm_before.bytes_sent},
                        {"comm_calls", comm.calls - comm_before.calls},
                        {"flops", last_step_flops_}, {"memory", {{"current", memory_json(m.current)}, {"peak", memory_json(m.peak)},
                                                                  {"peak_total", m.peak_total}}}};
  metrics.write(rec);
  return loss;
}

// FNV-1a over a buffer's bytes: DDP replicas must stay bitwise equal, step after step.
static uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ULL) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; b && i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

// The data a rank trains on, in one number: its size and up to `most` samples spread over it. A rank whose
// data came from another folder (DISTLAB_DATA on one node only), or another seed, differs here.
static uint64_t data_hash(Runtime& rt, const Dataset& d, int64_t most) {
  const int64_t n = d.size(), k_max = std::min<int64_t>(n, most);  // no bigger than a training batch: no new peak
  uint64_t h = fnv1a(&n, sizeof n);
  std::vector<int64_t> at;
  for (int64_t k = 0; k < k_max; k++) at.push_back(k * n / k_max);
  if (at.empty()) return h;
  Batch b = d.make_batch(rt, at);
  if (b.x.defined() && b.x.data()) h = fnv1a(b.x.data(), size_t(b.x.nbytes()), h);
  h = fnv1a(b.tokens.data(), b.tokens.size() * 4, h);
  return fnv1a(b.targets.data(), b.targets.size() * 4, h);
}

void Trainer::check_replicas(const std::string& when, bool with_buffers_and_data) {
  // [[name, hash], ...] of this rank, published for the others
  nlohmann::json mine = nlohmann::json::array();
  for (auto* p : model_->parameters()) mine.push_back({p->name, std::to_string(fnv1a(p->data.data(), size_t(p->data.nbytes())))});
  if (with_buffers_and_data) {
    for (auto* b : model_->buffers()) mine.push_back({b->name, std::to_string(fnv1a(b->data.data(), size_t(b->data.nbytes())))});
    mine.push_back({"the training data", std::to_string(data_.train ? data_hash(rt_, *data_.train, std::min<int64_t>(16, micro_batch_)) : 0)});
  }
  const std::string key = "replicas/" + when + "/";
  pg_->store().set_string(key + std::to_string(pg_->rank()), mine.dump());
  const auto ref = nlohmann::json::parse(pg_->store().get_string(key + "0"));
  for (int r = 1; r < pg_->size(); r++) {
    const auto theirs = r == pg_->rank() ? mine : nlohmann::json::parse(pg_->store().get_string(key + std::to_string(r)));
    for (size_t i = 0; i < ref.size(); i++) {
      if (i < theirs.size() && theirs[i] == ref[i]) continue;
      const std::string name = ref[i][0];
      if (name == "the training data")
        throw Error(fmt::format("rank {} trains on other data than rank 0 ({}): {}", r, when, data_.note),
                    "every rank must read the same data set: check data.path and $DISTLAB_DATA on every node");
      throw Error(fmt::format("rank {}'s {} differs from rank 0's {}: the replicas {}", r, name, when,
                              when == "at the end" ? "diverged during training" : "start from different weights"),
                  when == "at the end"
                      ? "every rank must apply the same averaged gradient to the same weights: is a gradient not averaged, or "
                        "not copied back, on some rank?"
                      : "give every rank the same --init file (or none): weights loaded after DDP's broadcast stay per rank");
    }
  }
}

// Every rank hands its traced step to rank 0 through the store; rank 0 replays them on the profile.
nlohmann::json Trainer::model_time(int64_t step) {
  std::vector<std::vector<TraceEvent>> ranks;
  if (pg_ && pg_->size() > 1) {
    const std::string key = fmt::format("trace/{}/", step);
    pg_->store().set_string(key + std::to_string(pg_->rank()), events_to_json(rt_.trace.events()).dump());
    if (!is_rank0()) return {};
    for (int r = 0; r < pg_->size(); r++) ranks.push_back(events_from_json(nlohmann::json::parse(pg_->store().get_string(key + std::to_string(r)))));
  } else {
    ranks.push_back(rt_.trace.events());
  }
  nlohmann::json out = {{"traced_step", step + 1}};
  if (!cfg_.log.profile.empty()) {
    const HardwareProfile hw = *find_profile(cfg_.log.profile);
    ReplayResult r = replay(ranks, hw);
    out["profile"] = hw.name;
    out["modeled_step_s"] = r.step_s;
    out["modeled_compute_s"] = r.compute_s;
    out["modeled_comm_s"] = r.comm_s;
    out["modeled_exposed_comm_s"] = r.exposed_comm_s;
    out["modeled_single_rank_s"] = single_rank_time_s(ranks[0], int(ranks.size()), hw);
    out["modeled_speedup"] = modeled_speedup(ranks, hw);
    if (!cfg_.log.trace.empty()) write_chrome_trace(cfg_.log.trace, chrome_trace_json(r));
  } else if (!cfg_.log.trace.empty()) {
    write_chrome_trace(cfg_.log.trace, chrome_trace_json(ranks));
  }
  return out;
}

nlohmann::json Trainer::evaluate() {
  if (rt_.is_meta()) return {{"kind", "eval"}, {"loss", nullptr}, {"accuracy", nullptr}, {"samples", 0}};
  model_->set_training(false);
  DataLoader test(*data_.test, std::make_shared<SequentialSampler>(data_.test->size()), micro_batch_, false);
  test.start_epoch(0);
  CrossEntropyLoss ce;
  double loss_sum = 0;
  int64_t correct = 0, counted = 0, batches = 0;
  Batch b;
  while (test.next(rt_, b)) {
    if (cfg_.train.eval_batches > 0 && batches >= cfg_.train.eval_batches) break;
    Tensor logits = model_->forward(rt_, b);
    int64_t hits = 0;
    const int64_t rows = int64_t(b.targets.size());
    loss_sum += ce.forward(rt_, logits, b.targets, &hits) * double(rows);
    correct += hits;
    counted += rows;
    batches++;
  }
  model_->set_training(true);
  return {{"kind", "eval"}, {"loss", loss_sum / double(std::max<int64_t>(counted, 1))},
          {"accuracy", double(correct) / double(std::max<int64_t>(counted, 1))}, {"samples", counted}};
}

nlohmann::json Trainer::run(MetricsWriter& metrics, const TrainOutputs& out) {
  const int64_t nparams = model_->num_parameters();
  log_ << fmt::format("distlab train {} | device {} | {} rank(s), strategy {} | {} threads per rank\n", cfg_.source,
                      device_name(rt_.device), world(), strategy_->describe(), compute_threads());
  if (!rt_.is_meta()) log_ << data_.note << "\n";
  log_ << fmt::format("model {}: {} parameters\n{}", spec_.name, nparams, model_->describe());
  if (spec_.name == "gpt")
    log_ << fmt::format("  closed form 12·L·C² + V·C + T·C = {} ({:+.3f} % from the count; the rest is biases and norms)\n",
                        gpt_params_closed_form(spec_), 100.0 * double(nparams - gpt_params_closed_form(spec_)) / double(nparams));
  log_ << fmt::format("optimizer {} | lr {} ({}) | micro_batch {} x {} rank(s) x accum {} = {} per step | {} steps\n",
                      opt_->describe(), cfg_.optim.lr, cfg_.optim.schedule, micro_batch_, world(), cfg_.train.accum_steps,
                      micro_batch_ * world() * cfg_.train.accum_steps, total_steps_);
  if (!out.init_path.empty()) {
    load_model(*model_, out.init_path);
    log_ << "loaded weights from " << out.init_path << "\n";
  }
  const bool replicas = pg_ && pg_->size() > 1 && !rt_.is_meta();
  if (replicas) check_replicas("at the start", true);
  log_.flush();
  model_->set_training(true);
  if (loader_) loader_->start_epoch(0);
  const double t_start = rt_.trace.now_us();
  double loss = 0, samples = 0;
  double steady_samples = 0, steady_s = 0;  // steps after the first (warm-up), without evaluation
  nlohmann::json last_eval = nlohmann::json::object();
  for (int64_t step = 0; step < total_steps_; step++) {
    const double t_step = rt_.trace.now_us();
    loss = train_step(step, metrics);
    if (step > 0 || total_steps_ == 1) {
      steady_s += (rt_.trace.now_us() - t_step) * 1e-6;
      steady_samples += double(micro_batch_ * cfg_.train.accum_steps * world());
    }
    samples += double(micro_batch_ * cfg_.train.accum_steps * world());
    if (!rt_.is_meta() && !std::isfinite(loss))
      throw Error(fmt::format("loss became {} at step {}", loss, step + 1),
                  "the NaN ladder: lower optim.lr, then clip (optim.clip_grad_norm), then check the input data");
    const bool last = step + 1 == total_steps_;
    if ((step + 1) % cfg_.train.log_every == 0 || last) {
      const double el = (rt_.trace.now_us() - t_start) * 1e-6;
      log_ << fmt::format("step {:>5}/{} | loss {} | lr {:.5f} | {:.0f} samples/s | {:.1f} s\n", step + 1, total_steps_,
                          rt_.is_meta() ? std::string("n/a (meta)") : fmt::format("{:.4f}", loss), schedule_.lr_at(step),
                          samples / std::max(el, 1e-9), el);
      log_.flush();
    }
    if (is_rank0() && ((cfg_.train.eval_every > 0 && (step + 1) % cfg_.train.eval_every == 0) || last)) {
      last_eval = evaluate();
      last_eval["step"] = step + 1;
      metrics.write(last_eval);
      if (!rt_.is_meta())
        log_ << fmt::format("eval  step {} | test loss {:.4f} | test accuracy {:.2f} % ({} samples)\n", step + 1,
                            last_eval["loss"].get<double>(), 100.0 * last_eval["accuracy"].get<double>(),
                            last_eval["samples"].get<int64_t>());
    }
  }
  const double wall = (rt_.trace.now_us() - t_start) * 1e-6;
  if (replicas) check_replicas("at the end", false);  // throws: ranks that differ fail the run
  if (!out.save_path.empty() && is_rank0()) {
    save_model(*model_, out.save_path, parse_dtype(out.save_dtype));
    log_ << "saved weights to " << out.save_path << " (" << out.save_dtype << ")\n";
  }
  nlohmann::json summary = {{"kind", "summary"},
                            {"steps", total_steps_},
                            {"final_loss", rt_.is_meta() ? nlohmann::json(nullptr) : nlohmann::json(loss)},
                            {"test_loss", last_eval.value("loss", nlohmann::json(nullptr))},
                            {"test_accuracy", last_eval.value("accuracy", nlohmann::json(nullptr))},
                            {"samples_per_s", steady_samples / std::max(steady_s, 1e-9)},
                            {"wall_s", wall},
                            {"params", nparams},
                            {"device", device_name(rt_.device)},
                            {"synthetic_data", data_.synthetic},
                            {"peak_memory", memory_json(peak_)},
                            {"peak_memory_total", peak_total_},
                            {"flops_per_step", last_step_flops_},
                            {"world_size", world()},
                            {"samples_per_epoch_per_rank", loader_ ? loader_->batches_per_epoch() * micro_batch_ : 0},
                            {"dataset_size", data_.train ? data_.train->size() : 0},
                            {"steps_per_epoch", loader_ ? loader_->batches_per_epoch() / cfg_.train.accum_steps : 0},
                            {"params_equal_across_ranks", true},  // checked above: a run whose replicas differ fails
                            {"strategy", cfg_.parallel.strategy}};
  for (auto& [k, v] : modeled_.items()) summary[k] = v;
  if (pg_) {
    nlohmann::json comm = nlohmann::json::object();
    for (const auto& [op, c] : pg_->counters())
      comm[op] = {{"calls", c.calls}, {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received}};
    summary["comm"] = comm;
  }
  metrics.write(summary);
  // memory by category, with bytes per parameter (the course's 4 + 4 + 8 = 16 for fp32 AdamW)
  log_ << fmt::format("memory (peak per category{}):\n", rt_.memory.capacity() >= 0 ? ", capacity " + format_bytes(double(rt_.memory.capacity())) : "");
  for (int i = 0; i < kNumCategories; i++)
    if (peak_[size_t(i)] > 0)
      log_ << fmt::format("  {:<13} {:>12}  {:6.2f} bytes/param\n", category_name(Category(i)), format_bytes(double(peak_[size_t(i)])),
                          double(peak_[size_t(i)]) / double(nparams));
  log_ << fmt::format("  {:<13} {:>12}\n", "peak total", format_bytes(double(peak_total_)));
  log_ << fmt::format("FLOPs per step {:.3e} | {} steps in {:.1f} s\n", last_step_flops_, total_steps_, wall);
  if (modeled_.contains("modeled_step_s"))
    log_ << fmt::format("modeled on {} (step {}): {:.2f} ms per step, compute {:.2f} ms, exposed communication {:.2f} ms, "
                        "speed-up over one rank {:.2f}x\n",
                        modeled_["profile"].get<std::string>(), modeled_["traced_step"].get<int64_t>(),
                        1e3 * modeled_["modeled_step_s"].get<double>(), 1e3 * modeled_["modeled_compute_s"].get<double>(),
                        1e3 * modeled_["modeled_exposed_comm_s"].get<double>(), modeled_["modeled_speedup"].get<double>());
  return summary;
}

}  // namespace distlab
