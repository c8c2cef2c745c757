#include "core/train/trainer.h"

#include <fmt/format.h>

#include <cmath>
#include <ostream>

#include "core/ckpt/checkpoint.h"
#include "core/ops/attach.h"
#include "core/perf/cost_model.h"
#include "core/train/stop_signal.h"
#include "core/train/strategies.h"
#include "core/models/zoo.h"
#include "core/nn/loss.h"
#include "core/parallel/tensor_parallel.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

Batch Trainer::shard(Batch b) const {
  if (!ring_) return b;
  return context_shard(b, ring_->size(), mesh_->coord().cp);  // the same sequences on every CP rank; its chunks of them
}

Batch Trainer::meta_batch(int64_t B) {
  Batch b;
  b.B = B;
  if (is_language_model(spec_)) {
    b.T = cfg_.data.seq_len;
    b.tokens.assign(size_t(B * b.T), 0);
    b.targets.assign(size_t(B * b.T), 0);
    return shard(b);
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
  return shard(std::move(b));
}

// One micro-batch: forward, the loss, backward of loss · loss_factor (gradients add up); returns the loss.
double Trainer::micro_step(float loss_factor, bool sync, int64_t& samples) {
  Batch b = next_batch();
  Tensor logits = model_->forward(rt_, b, strategy_.get());
  Tensor dlogits;
  const double loss = loss_and_grad(logits, b, loss_factor, dlogits);
  logits = Tensor();
  strategy_->begin_backward(sync);  // false: no_sync (gradients stay local until the last micro-step)
  model_->backward(rt_, dlogits, strategy_.get());
  strategy_->finish_backward(rt_);
  samples += b.samples();
  return loss;
}

RunParts Trainer::parts() {
  return RunParts{cfg_, rt_, log_, pg_, *model_, *opt_, *strategy_, loader_.get(), micro_batch_};
}

StepOutcome Trainer::engine_step(int64_t step) {
  StepOutcome o;
  const int64_t k = accum_;
  o.loss_scale = scaler_.scale();
  double loss_sum = 0;  // on a device rank the losses are in step_losses_ (read by train_step) and this stays 0
  step_losses_.reset();
  step_norm_.reset();
  if (rt_.kernels && !rt_.is_meta()) step_losses_ = std::make_unique<DeviceScalars>(rt_, k, "the micro-batches' losses");
  next_loss_slot_ = 0;
  if (pipeline_) {  // the k micro-batches through the stages (core/parallel/pipeline.h); the last stage has the loss
    // a strategy that reduces after the backward (ZeRO-1) does so once here, after the tied copies' sum
    const bool later = strategy_->reduces_after_backward();
    const std::vector<bool> no_sync(size_t(k), false);
    const Pipeline::Executor* executor = ext_ ? ext_->pipeline_executor() : nullptr;  // nullptr: the schedule's
    const Pipeline::StepResult r = pipeline_->train_step(
        rt_, [&] { return next_batch(); },
        [&](Runtime&, const Tensor& logits, const Batch& b, float factor, Tensor& d) { return loss_and_grad(logits, b, factor, d); },
        o.loss_scale / float(k), *strategy_, nullptr, later ? &no_sync : nullptr, executor);
    pipeline_->sync_tied(rt_, tied_);  // the lm_head's copy and wte: one gradient, the same step on both stages
    if (later) {
      strategy_->begin_backward(true);
      strategy_->finish_backward(rt_);
    }
    loss_sum = r.loss_sum;
    o.samples = r.samples;
    pipe_peak_.peak_in_flight = std::max(pipe_peak_.peak_in_flight, r.peak_in_flight);
    pipe_peak_.peak_held_bytes = std::max(pipe_peak_.peak_held_bytes, r.peak_held_bytes);
  } else {
    for (int64_t micro = 0; micro < k; micro++)  // the big batch's mean (loss / k), times the loss scale
      loss_sum += micro_step(o.loss_scale / float(k), micro == k - 1, o.samples);
  }
  o.loss = loss_sum / double(k);
  // Once per optimizer step, on the accumulated (and synchronised) gradients: skip the step if they overflowed
  // (every rank agrees), else unscale and clip — both folded into the factor the optimizer reads them with.
  o.skipped = scaler_.enabled() && strategy_->found_inf(rt_, *model_, pg_);
  o.lr = schedule_.lr_at(step);
  if (!o.skipped) clip_and_step(o);  // the norm, the clip and the optimizer (trainer_step.cpp)
  scaler_.update(o.skipped);
  o.next_loss_scale = scaler_.scale();
  strategy_->zero_grad(*model_);
  sched_steps_ = step + 1;  // the scheduler steps with the optimizer (or with a skipped step, as the lr does)
  return o;
}

double Trainer::train_step(int64_t step, MetricsWriter& metrics) {
  rt_.memory.reset_peaks();
  rt_.trace.reset_totals();
  const bool traced = (!cfg_.log.profile.empty() || !cfg_.log.trace.empty()) && step + 1 == std::min(cfg_.log.trace_step, total_steps_);
  rt_.trace.keep_events(traced);
  rt_.trace.clear_events();
  const CommCounters comm_before = comm_totals();
  const DeviceMemory* device = rt_.memory.device_memory();  // a cuda (or cuda-sim) rank's: it counts the host's waits
  const int64_t waits_before = device ? device->host_waits() : 0;
  const double t0 = rt_.trace.now_us();
  step_losses_.reset();  // a step that threw leaves none behind for an extension's step to write into
  step_norm_.reset();
  StepOutcome o;
  if (ext_ && ext_->drives_steps()) {  // an extension's step, through the same micro-batches and optimizer
    Calls calls(*this);
    RunParts run = parts();
    o = ext_->drive_step(run, calls, step);
  } else {
    o = engine_step(step);
  }
  rt_.trace.keep_events(false);
  skipped_steps_ += o.skipped;
  loss_scale_ = o.next_loss_scale;
  if (rt_.attached) rt_.attached->synchronize();  // a GPU's queued kernels (the optimizer's) belong to the step's time
  const double wall_s = (rt_.trace.now_us() - t0) * 1e-6;
  const int64_t step_waits = device ? device->host_waits() - waits_before : 0;
  read_step_values(o);  // a device rank's losses and norm, left in device memory during the step
  last_step_flops_ = rt_.trace.flops();
  last_step_recompute_flops_ = rt_.trace.recompute_flops();
  const MemoryStats& m = rt_.memory.stats();
  for (int i = 0; i < kNumCategories; i++) peak_[size_t(i)] = std::max(peak_[size_t(i)], m.peak[size_t(i)]);
  if (m.peak_total > peak_total_) peak_at_ = m.at_peak;
  peak_total_ = std::max(peak_total_, m.peak_total);
  peak_reserved_ = std::max(peak_reserved_, m.reserved_peak);
  if (const DeviceMemory* dev = rt_.memory.device_memory()) peak_held_ = std::max(peak_held_, dev->held_peak());
  double loss = o.loss;
  int64_t samples = o.samples;
  const CommCounters comm = comm_totals();
  // a stop request (SIGTERM) on any rank stops every rank after this step: the flag rides on the loss
  stop_agreed_ = stop_requested();
  if (pg_ && pg_->size() > 1 && !rt_.is_meta()) {  // report the global batch's loss, as one device would see it
    // (over the world: a TP group's ranks hold the same loss, so the mean is the data-parallel ranks'; under
    // pipeline parallelism only the last stage's ranks have one)
    const bool has_loss = !pipeline_ || pipeline_->last();
    const int holders = pipeline_ ? pg_->size() / pipeline_->stages() : pg_->size();
    // the stop flag is world + rank on a rank that was sent SIGTERM: the sum says how many were, and which
    // when it was one (exact in f32 to worlds of a few thousand ranks); a SIGTERM the launcher forwarded to
    // every rank counts as 2·world, so it names no rank, however the signals and the all-reduce interleave
    const int world = pg_->size();
    const float flag = !stop_agreed_ ? 0.0f : stop_from_launcher() ? float(2 * world) : float(world + pg_->rank());
    float l[2] = {has_loss ? float(loss) : 0.0f, flag};
    pg_->all_reduce(l, 2, ReduceOp::sum);
    loss = l[0] / float(holders);
    stop_agreed_ = l[1] > 0;
    const int64_t flags = int64_t(std::llround(l[1]));
    stop_rank_ = flags >= world && flags < 2 * world ? int(flags - world) : -1;
    samples *= dp_world();
  } else {
    stop_rank_ = stop_agreed_ && !stop_from_launcher() ? (pg_ ? pg_->rank() : 0) : -1;
  }
  if (traced) modeled_ = model_time(step);
  last_step_comm_bytes_ = comm.bytes_sent - comm_before.bytes_sent;
  last_step_comm_calls_ = comm.calls - comm_before.calls;
  last_step_comm_s_ = comm.seconds - comm_before.seconds;
  nlohmann::json rec = {{"kind", "step"}, {"step", step + 1}, {"loss", rt_.is_meta() ? nlohmann::json(nullptr) : nlohmann::json(loss)},
                        {"lr", o.lr}, {"grad_norm", o.skipped ? nlohmann::json(nullptr) : nlohmann::json(o.grad_norm)},
                        {"loss_scale", o.loss_scale}, {"skipped", o.skipped}, {"samples", samples}, {"wall_s", wall_s},
                        {"comm_bytes_sent", comm.bytes_sent - comm_before.bytes_sent},
                        {"comm_calls", comm.calls - comm_before.calls},
                        {"comm_s", last_step_comm_s_},  // measured: the step's collectives, start to finish, overlapped or not
                        {"flops", last_step_flops_}, {"memory", {{"current", memory_json(m.current)}, {"peak", memory_json(m.peak)},
                                                                  {"peak_total", m.peak_total}}}};
  if (device) rec["host_waits"] = step_waits;  // inside the step: the norm's read, the copies to and from the host
  metrics.write(rec);
  return loss;
}

nlohmann::json Trainer::run(MetricsWriter& metrics, const TrainOutputs& out) {
  const int64_t nparams = model_->num_parameters();  // this rank's (its slices under tensor parallelism)
  int64_t whole_params = nparams;                      // the model's
  if (mesh_) {  // a split model: the whole one's count (a meta copy allocates nothing)
    Runtime meta(DeviceKind::meta);
    whole_params = build_model(meta, spec_)->num_parameters();
  }
  log_header(whole_params, nparams);
  const bool replicas = grad_ && grad_->size() > 1 && !rt_.is_meta();
  const bool sharded = strategy_->shards_parameters();  // ZeRO-3: the model is whole only inside a step
  const bool checkpoints = !cfg_.checkpoint.dir.empty();
  resume(metrics);  // checkpoint.resume: the latest complete checkpoint, if any (trainer_ckpt.cpp)
  if (!out.init_path.empty()) load_init(out.init_path);  // --init (trainer_weights.cpp)
  if (!out.init_adapter.empty()) load_adapter_dir(out.init_adapter);
  // after a resume each rank has its own BatchNorm statistics (DDP does not average them) and the data
  // position; the weights must still agree
  if (replicas) check_replicas("at the start", resumed_from_.empty());
  // a checkpoint past the run's end: saving "the end of the run" would label its later state with an
  // earlier step, over the checkpoint of that step
  if (start_step_ > total_steps_)
    throw CheckpointError(fmt::format("resumed from {} at step {}, past the run's end: train.steps is {}", resumed_from_, start_step_,
                                      total_steps_),
                          fmt::format("to continue, raise train.steps above {}; to start over, use another checkpoint.dir "
                                      "(or checkpoint.resume = never)", start_step_));
  log_.flush();
  model_->set_training(true);
  if (loader_ && resumed_from_.empty()) loader_->start_epoch(0);
  const double t_start = rt_.trace.now_us();
  double loss = 0, samples = 0;
  double steady_samples = 0, steady_s = 0;  // steps after the first (warm-up), without evaluation
  int64_t steady_steps = 0;
  nlohmann::json last_eval = nlohmann::json::object();
  bool interrupted = false;
  for (int64_t step = start_step_; step < total_steps_; step++) {
    const double t_step = rt_.trace.now_us();
    fault_point("step", step + 1);
    try {
      loss = train_step(step, metrics);
    } catch (const OutOfMemoryError& e) {  // what the accountant knows, and the ladder from this strategy
      throw OutOfMemoryError(std::string(e.what()) + fmt::format("\n  at step {} under {}", step + 1, strategy_->describe()),
                             oom_ladder(cfg_, world(), double(nparams), rt_.dtype,
                                        double(rt_.memory.stats().peak[size_t(Category::activations)]), micro_batch_));
    }
    if (step > start_step_ || total_steps_ == 1) {
      steady_s += (rt_.trace.now_us() - t_step) * 1e-6;
      steady_samples += double(micro_batch_ * accum_ * dp_world());
      steady_steps++;
    }
    samples += double(micro_batch_ * accum_ * dp_world());
    if (!rt_.is_meta() && !std::isfinite(loss) && !scaler_.dynamic())  // a dynamic scaler skips it and backs off
      throw Error(fmt::format("loss became {} at step {}", loss, step + 1),
                  std::string("the NaN ladder: lower optim.lr, then clip (optim.clip_grad_norm), then check the input data "
                                  "(data.check_finite = true names a record holding NaN or Inf), then the loss's normalization") +
                      (rt_.dtype == DType::f16 ? "; in fp16 a value past 65504 is inf: try precision.mode = \"bf16\"" : ""));
    const bool last = step + 1 == total_steps_;
    log_progress(step, loss, samples, (rt_.trace.now_us() - t_start) * 1e-6, last);  // trainer_report.cpp
    // rank 0 evaluates; under ZeRO-3 every rank does, since every rank must join the gathers, under
    // tensor parallelism rank 0's TP group does (its forward has collectives), and with pipeline stages every
    // rank (the stages pass the batch along)
    // (context parallel: every rank of the first replica's CP group, whose ring each layer's attention goes round)
    const bool evaluates = is_rank0() || sharded || pipeline_ || ((tp_group() || ring_) && mesh_->coord().dp == 0 && mesh_->coord().pp == 0);
    if (evaluates && ((cfg_.train.eval_every > 0 && (step + 1) % cfg_.train.eval_every == 0) || last)) {
      last_eval = evaluate();
      last_eval["step"] = step + 1;
      if (is_rank0()) metrics.write(last_eval);
      if (is_rank0() && !rt_.is_meta())
        log_ << fmt::format("eval  step {} | test loss {:.4f} | test accuracy {:.2f} % ({} {})\n", step + 1,
                            last_eval["loss"].get<double>(), 100.0 * last_eval["accuracy"].get<double>(),
                            last_eval["samples"].get<int64_t>(), is_language_model(cfg_.model) ? "token positions" : "samples");
    }
    if (checkpoints && cfg_.checkpoint.every > 0 && (step + 1) % cfg_.checkpoint.every == 0)
      save_checkpoint(step + 1, metrics, fmt::format("every {} steps", cfg_.checkpoint.every));
    if (stop_agreed_) {  // SIGTERM: save where we stand and stop; `distlab train` exits 143
      if (checkpoints) save_checkpoint(step + 1, metrics, "SIGTERM");
      log_ << fmt::format("stopped by SIGTERM{} after step {}{}\n", stop_rank_ >= 0 ? fmt::format(" (sent to rank {})", stop_rank_) : "", step + 1,
                          checkpoints ? "; the checkpoint resumes it (checkpoint.resume = auto)" : " (no checkpoint.dir: nothing saved)");
      metrics.write({{"kind", "interrupted"}, {"step", step + 1}, {"signal", "SIGTERM"}});
      interrupted = true;
      break;
    }
  }
  if (interrupted) return {{"kind", "interrupted"}, {"steps", total_steps_}, {"interrupted", true}, {"stop_rank", stop_rank_}};
  if (checkpoints) save_checkpoint(total_steps_, metrics, "the end of the run");
  const double wall = (rt_.trace.now_us() - t_start) * 1e-6;
  if (replicas) check_replicas("at the end", false, &metrics);  // throws: ranks that differ fail the run
  if (!out.save_path.empty()) save_weights(out.save_path, out.save_dtype);  // --save (trainer_weights.cpp)
  if (!out.save_adapter.empty()) save_adapter_dir(out.save_adapter, out.save_dtype);
  nlohmann::json summary = summary_record({loss, steady_samples, steady_s, wall, steady_steps, whole_params, nparams, last_eval});
  metrics.write(summary);
  log_report(summary, nparams, wall);
  return summary;
}

}  // namespace distlab
