#include "core/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sstream>

#include "core/perf/chrome_trace.h"
#include "core/perf/cost_model.h"
#include "core/perf/hardware.h"
#include "core/perf/trace_io.h"
#include "core/models/peft.h"
#include "core/models/zoo.h"
#include "core/nn/loss.h"
#include "core/ops/attach.h"
#include "core/ops/cpu/blas_core.h"
#include "core/parallel/tensor_parallel.h"
#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

// How the modeled step's kernels ran, for the log's line: "" (distlab's fused kernels), eager PyTorch's, or
// torch.compile'd blocks; and what log.fused_ops kept fused
static std::string kernels_text(const LogOptions& log) {
  std::string t = log.kernels == ModeledKernels::eager      ? " with eager PyTorch's kernels"
                  : log.kernels == ModeledKernels::compiled ? " with torch.compile'd blocks (the loss and AdamW eager)"
                                                            : "";
  if (!t.empty() && !log.fused_ops.empty()) t += fmt::format(" but a fused {}", fmt::join(log.fused_ops, ", "));
  return t;
}

// Every rank hands its traced step to rank 0 through the store; rank 0 replays them on the profile.
nlohmann::json Trainer::model_time(int64_t step) {
  std::vector<std::vector<TraceEvent>> ranks;
  const bool fake = pg_ && pg_->is_fake();  // one traced rank stands for all of them
  if (pg_ && pg_->size() > 1 && !fake) {
    const std::string key = fmt::format("trace/{}/", step);
    pg_->store().set_string(key + std::to_string(pg_->rank()), events_to_json(rt_.trace.events()).dump());
    if (!is_rank0()) return {};
    for (int r = 0; r < pg_->size(); r++) ranks.push_back(events_from_json(nlohmann::json::parse(pg_->store().get_string(key + std::to_string(r)))));
  } else {
    ranks.push_back(rt_.trace.events());
  }
  nlohmann::json out = {{"traced_step", step + 1}};
  if (!cfg_.log.profile.empty()) {
    HardwareProfile hw = *find_profile(cfg_.log.profile);
    if (!cfg_.log.calibrated) hw = at_peak(hw);
    ReplayOptions ro;
    ro.symmetric = fake;
    ro.ranks_per_node = fake ? int(cfg_.dist.fake_ranks_per_node) : 0;
    ro.kernels = KernelSet{eager_ops_for(cfg_.log.kernels, cfg_.log.fused_ops), int(dtype_size(rt_.dtype))};
    ReplayResult r = replay(ranks, hw, ro);
    // The replay covers the kernels and collectives; the host's own per-step work (the loss read back, the
    // next batch copied in) comes on top, once per optimizer step, on one rank as on N.
    r.step_s += hw.step_overhead_s;
    out["profile"] = hw.name;
    out["modeled_step_s"] = r.step_s;
    out["modeled_step_overhead_s"] = hw.step_overhead_s;
    out["modeled_calibrated"] = cfg_.log.calibrated;
    out["modeled_kernels"] = std::string(name_of(cfg_.log.kernels));
    if (!cfg_.log.fused_ops.empty()) out["modeled_fused_ops"] = cfg_.log.fused_ops;
    out["modeled_compute_s"] = r.compute_s;
    out["modeled_comm_s"] = r.comm_s;
    out["modeled_exposed_comm_s"] = r.exposed_comm_s;
    out["modeled_contention_s"] = r.contention_s;
    out["modeled_single_rank_s"] = single_rank_time_s(ranks[0], world(), hw, false, ro.kernels) + hw.step_overhead_s;
    out["modeled_speedup"] = out["modeled_single_rank_s"].get<double>() / std::max(r.step_s, 1e-30);
    // MFU and HFU (Korthikanti et al. 2022, §5), by one convention (kFlopsConvention, core/models/zoo.h):
    // the FLOPs a step needs by PaLM's formula, and those plus what activation checkpointing recomputed
    // (the kernels' FLOPs marked recompute), each over what the ranks' peaks could do in the modeled step.
    // HFU ≥ MFU always. The peak is the precision's: bf16/fp16 tensor cores under mixed precision, fp32
    // otherwise. An image model has no formula here: its model FLOPs are its kernels' (nothing recomputed).
    const double peak = rt_.dtype == DType::f32 ? hw.fp32_flops_per_s : hw.low_precision_flops_per_s;
    double ran = 0, recomputed = 0;
    for (const auto& rank : ranks)
      for (const TraceEvent& e : rank)
        if (e.kind == EventKind::compute) (e.recompute ? recomputed : ran) += e.flops;
    ran /= double(ranks.size());  // per rank (the fake world's one rank stands for each)
    recomputed /= double(ranks.size());
    const double needed = is_language_model(spec_) ? model_flops_per_rank_step() : ran;
    out["model_flops_per_step"] = needed * double(world());
    out["hardware_flops_per_step"] = (needed + recomputed) * double(world());
    out["flops_convention"] = kFlopsConvention;
    if (is_language_model(spec_)) out["tokens_per_step"] = cfg_.data.seq_len * micro_batch_ * accum_ * dp_world();
    out["modeled_mfu"] = needed / (std::max(r.step_s, 1e-30) * peak);
    out["modeled_hfu"] = (needed + recomputed) / (std::max(r.step_s, 1e-30) * peak);
    if (pipeline_) {  // each stage's idle share of the pipeline's span, against the formula for balanced stages
      const PipelineTimeline t = pipeline_timeline(r);
      const int p = pipeline_->stages(), m = int(accum_);
      out["pipeline_bubble"] = t.bubble_mean;
      out["pipeline_bubble_by_rank"] = t.bubble;
      out["pipeline_bubble_formula"] = double(p - 1) / double(m + p - 1);
      out["pipeline_span_s"] = t.end_s - t.start_s;
    }
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
    b = shard(std::move(b));  // context parallel: this rank's chunks of the sequences
    Tensor logits = pipeline_ ? pipeline_->forward_only(rt_, b) : model_->forward(rt_, b, strategy_->shards_parameters() ? strategy_.get() : nullptr);
    int64_t hits = 0;
    const int64_t rows = int64_t(b.targets.size());
    if (!logits.defined()) {  // a pipeline stage before the last: its part is done
      batches++;
      continue;
    }
    if (ProcessGroup* tp = model_->tp_group())
      loss_sum += VocabParallelCrossEntropy(*tp).forward(rt_, logits, b.targets, model_->vocab_first(), &hits) * double(rows);
    else
      loss_sum += ce.forward(rt_, logits, b.targets, &hits) * double(rows);
    correct += hits;
    counted += rows;
    batches++;
  }
  if (pipeline_) {  // the last stage counted: one of its ranks tells every rank (all joined the stages' forwards)
    // (context parallel: every CP rank of that stage reports its tokens' share, and the sum is the whole)
    const bool reports = pipeline_->last() && mesh_->coord().dp == 0 && mesh_->coord().tp == 0;
    float v[3] = {reports ? float(loss_sum) : 0.0f, reports ? float(correct) : 0.0f, reports ? float(counted) : 0.0f};
    pg_->all_reduce(v, 3);
    loss_sum = v[0];
    correct = int64_t(v[1]);
    counted = int64_t(v[2]);
  } else if (ProcessGroup* cp = cp_group()) {  // each CP rank counted its tokens: the sums over the ring are the sequences'
    float f[3] = {float(loss_sum), float(correct), float(counted)};
    cp->all_reduce(f, 3);
    loss_sum = f[0];
    correct = int64_t(f[1]);
    counted = int64_t(f[2]);
  }
  model_->set_training(true);
  strategy_->release_full_params(rt_, false);  // ZeRO-3: the last units the forward gathered
  return {{"kind", "eval"}, {"loss", loss_sum / double(std::max<int64_t>(counted, 1))},
          {"accuracy", double(correct) / double(std::max<int64_t>(counted, 1))}, {"samples", counted}};
}

// The run's opening lines: device, ranks, strategy, data, model, optimizer and precision.
void Trainer::log_header(int64_t whole_params, int64_t nparams) {
  log_ << fmt::format("distlab train {} | device {} | {} rank(s), strategy {} | {} threads per rank\n", cfg_.source,
                      rt_.attached ? rt_.attached->describe() : device_name(rt_.device), world(), strategy_->describe(), compute_threads());
  if (rt_.device == DeviceKind::cpu) log_ << blas_core().describe() << "\n";  // core/ops/cpu/blas_core.h: the kernels every product runs
  if (device_group_) log_ << "the strategy's collectives on the device: " << device_group_->get()->describe() << "\n";
  if (tp_device_group_) log_ << "the tensor-parallel layers' all-reduces on the device: " << tp_device_group_->get()->describe() << "\n";
  if (mesh_)
    log_ << "mesh " << mesh_->describe() << " (strategy " << name_of(cfg_.parallel.strategy)
         << (ring_ ? " over the dp x cp ranks; ring attention over the cp axis)\n" : " over the dp axis)\n");
  if (pipeline_) {
    const int p = pipeline_->stages(), m = int(accum_), s = pipeline_->stage();
    log_ << fmt::format("pipeline: stage {} of {}, schedule {}, {} micro-batches per step ({} forward(s) before the first backward here); "
                        "bubble (p - 1)/(m + p - 1) = {:.1f} % when the stages are balanced\n",
                        s, p, cfg_.parallel.schedule, m, cfg_.parallel.schedule == PipeSchedule::gpipe ? m : warmup_forwards(p, s, m) + 1,
                        100.0 * (p - 1) / (m + p - 1));
  }
  if (ext_) ext_->describe(log_);
  if (!rt_.is_meta()) log_ << data_.note << "\n";
  log_ << fmt::format("model {}: {} parameters{}\n{}", spec_.name, whole_params,
                      whole_params == nparams ? ""
                      : fmt::format(" ({} on this rank: {}{})", nparams, pipeline_ ? "its stage's layers" : "",
                                    mesh_->shape().tp > 1 ? fmt::format("{}1/{} of the split matrices, all of the rest", pipeline_ ? ", " : "",
                                                                        mesh_->shape().tp)
                                                          : ""),
                      model_->describe());
  if (cfg_.lora.on()) {  // PEFT's print_trainable_parameters
    const ParamCount c = count_parameters(*model_);
    log_ << fmt::format("LoRA r {} alpha {}{} on {} Linear(s) ({}{}) | trainable params: {} || all params: {} || trainable%: {:.4f}\n", cfg_.lora.r,
                        cfg_.lora.alpha, cfg_.lora.use_rslora ? " (rsLoRA)" : "", lora_modules_.size(), lora_modules_.front(),
                        lora_modules_.size() > 1 ? ", ..." : "", c.trainable, c.all, 100.0 * double(c.trainable) / double(std::max<int64_t>(c.all, 1)));
    if (quantized_ > 0)  // bitsandbytes' load_in_4bit
      log_ << fmt::format("QLoRA: {} Linear weight(s) in NF4{} (4 bits + {:.3f} of constants a weight), dequantized to {} for each GEMM\n", quantized_,
                          cfg_.quantization.double_quant ? ", double-quantized" : "", cfg_.quantization.double_quant ? 0.127 : 0.5,
                          dtype_name(rt_.dtype));
  }
  if (spec_.name == "gpt" && !cfg_.lora.on())
    log_ << fmt::format("  closed form 12·L·C² + V·C + T·C = {} ({:+.3f} % from the count; the rest is biases and norms)\n",
                        gpt_params_closed_form(spec_), 100.0 * double(whole_params - gpt_params_closed_form(spec_)) / double(whole_params));
  log_ << fmt::format("optimizer {} | lr {} ({}) | micro_batch {} x {} rank(s) x accum {} = {} per step | {} steps\n",
                      opt_->describe(), cfg_.optim.lr, cfg_.optim.schedule, micro_batch_, dp_world(), accum_,
                      micro_batch_ * dp_world() * accum_, total_steps_);
  log_ << fmt::format("precision {}{} | {}\n", cfg_.precision.mode, rt_.dtype == DType::f32 ? "" : " (f32 master weights in the optimizer)",
                      scaler_.describe());
}

// The summary record: the run's outcome, its memory, FLOPs, communication and modeled time (metrics.jsonl).
nlohmann::json Trainer::summary_record(const RunTotals& t) {
  const double loss = t.loss, steady_samples = t.steady_samples, steady_s = t.steady_s, wall = t.wall_s;
  const int64_t steady_steps = t.steady_steps, whole_params = t.whole_params, nparams = t.nparams;
  const nlohmann::json& last_eval = t.last_eval;
  nlohmann::json summary = {{"kind", "summary"},
                            {"steps", total_steps_},
                            {"final_loss", rt_.is_meta() ? nlohmann::json(nullptr) : nlohmann::json(loss)},
                            {"test_loss", last_eval.value("loss", nlohmann::json(nullptr))},
                            {"test_accuracy", last_eval.value("accuracy", nlohmann::json(nullptr))},
                            {"samples_per_s", steady_samples / std::max(steady_s, 1e-9)},
                            // this machine's step, measured (a GPU's: each step ends with a device synchronize), to set
                            // beside modeled_step_s, the cost model's for the profile (log.profile)
                            {"measured_step_s", steady_steps ? steady_s / double(steady_steps) : 0.0},
                            {"wall_s", wall},
                            {"params", whole_params},
                            {"params_this_rank", nparams},
                            {"device", device_name(rt_.device)},
                            {"synthetic_data", data_.synthetic},
                            {"peak_memory", memory_json(peak_)},
                            {"peak_memory_total", peak_total_},
                            // the same allocations as PyTorch's caching allocator would reserve them (block rounding,
                            // segments, a pool per stream: core/tensor/allocator_model.h): torch.cuda.max_memory_reserved
                            {"peak_memory_reserved", peak_reserved_},
                            // measured beside it on a cuda (or cuda-sim) rank: what the device's own allocator held at
                            // its most (DeviceMemory::held_peak); -1 on cpu and meta
                            {"peak_memory_device_measured", peak_held_},
                            {"peak_memory_breakdown", memory_json(peak_at_)},  // by category at the moment of the peak
                            {"precision", cfg_.precision.mode},
                            {"skipped_steps", skipped_steps_},
                            {"final_loss_scale", loss_scale_},
                            {"flops_per_step", last_step_flops_},
                            {"model_flops_per_step", model_flops_per_rank_step() * double(world())},
                            {"hardware_flops_per_step", (model_flops_per_rank_step() + last_step_recompute_flops_) * double(world())},
                            {"recompute_flops_per_step", last_step_recompute_flops_ * double(world())},
                            {"flops_convention", kFlopsConvention},
                            {"world_size", world()},
                            {"mesh", {{"dp", dp_world()}, {"tp", mesh_ ? mesh_->shape().tp : 1}, {"pp", mesh_ ? mesh_->shape().pp : 1}, {"cp", mesh_ ? mesh_->shape().cp : 1}}},
                            {"samples_per_epoch_per_rank", loader_ ? loader_->batches_per_epoch() * micro_batch_ : 0},
                            {"dataset_size", data_.train ? data_.train->size() : 0},
                            {"steps_per_epoch", loader_ ? loader_->batches_per_epoch() / accum_ : 0},
                            {"params_equal_across_ranks", true},  // run() checked: a run whose replicas differ fails
                            {"strategy", name_of(cfg_.parallel.strategy)},
                            {"resumed_from_step", start_step_},
                            {"checkpoint", ckpt_report_},
                            {"strategy_report", strategy_->report()}};
  if (cfg_.lora.on()) {
    const ParamCount c = count_parameters(*model_);
    summary["lora"] = {{"r", cfg_.lora.r}, {"alpha", cfg_.lora.alpha}, {"scaling", cfg_.lora.scaling()}, {"dropout", cfg_.lora.dropout},
                       {"use_rslora", cfg_.lora.use_rslora}, {"modules", lora_modules_}, {"trainable_params", c.trainable}, {"all_params", c.all}};
    if (quantized_ > 0)
      summary["lora"]["quantization"] = {{"bits", 4}, {"type", "nf4"}, {"double_quant", cfg_.quantization.double_quant}, {"linears", quantized_}};
  }
  if (pipeline_) {  // every rank's peak of micro-batches in flight, through the store (rank 0 writes the summary)
    const std::string key = "pipeline/peak/";
    const nlohmann::json mine{pipe_peak_.peak_in_flight, pipe_peak_.peak_held_bytes, peak_[size_t(Category::activations)]};
    const bool fake = pg_->is_fake();  // the planned job's rank 0 (stage 0) alone
    if (!fake) pg_->store().set_string(key + std::to_string(pg_->rank()), mine.dump());
    if (is_rank0()) {
      nlohmann::json in_flight = nlohmann::json::array(), held = nlohmann::json::array(), act = nlohmann::json::array();
      for (int r = 0; r < (fake ? 1 : pg_->size()); r++) {
        const auto v = fake ? mine : nlohmann::json::parse(pg_->store().get_string(key + std::to_string(r)));
        in_flight.push_back(v[0]);
        held.push_back(v[1]);
        act.push_back(v[2]);
      }
      summary["pipeline"] = {{"stages", pipeline_->stages()}, {"schedule", pipeline_->schedule()}, {"micro_batches", accum_},
                             {"stage_of_rank", nlohmann::json::array()}, {"peak_in_flight", in_flight}, {"peak_held_bytes", held},
                             {"peak_activations", act}};
      for (int r = 0; r < (fake ? 1 : pg_->size()); r++) summary["pipeline"]["stage_of_rank"].push_back(coord_of(r, mesh_->shape()).pp);
    }
  }
  if (pg_ && !pg_->is_fake() && pg_->size() > 1) {  // every rank's own numbers, through the store: a reader (the grader)
    const std::string key = "summary/ranks/";     // checks them all, not rank 0's alone
    nlohmann::json mine = {{"rank", pg_->rank()},
                           {"peak_memory", memory_json(peak_)},
                           {"comm_bytes_sent_last_step", last_step_comm_bytes_},
                           {"strategy_report", strategy_->report()}};
    if (ext_) ext_->report(mine);
    pg_->store().set_string(key + std::to_string(pg_->rank()), mine.dump());
    if (is_rank0()) {
      nlohmann::json ranks = nlohmann::json::array();
      for (int r = 0; r < pg_->size(); r++) ranks.push_back(nlohmann::json::parse(pg_->store().get_string(key + std::to_string(r))));
      summary["ranks"] = ranks;
    }
  }
  if (live_peak_ > 0 && !rt_.is_meta() && steady_steps > 0) {  // measured, over the steady steps (the first one's warm-up left out)
    const auto [mfu, hfu] = live_mfu_hfu(double(steady_steps), steady_s);
    summary["mfu"] = mfu;
    summary["hfu"] = hfu;
    summary["mfu_peak_flops_per_s"] = live_peak_;
    summary["mfu_peak_of"] = live_peak_of_;
  }
  summary["blas_core"] = blas_core().chosen;  // every rank's host products (a cuda rank's too: its host-side math)
  if (!summary["checkpoint"].contains("estimate")) summary["checkpoint"]["estimate"] = checkpoint_estimate();
  for (auto& [k, v] : modeled_.items()) summary[k] = v;
  if (pg_) {
    nlohmann::json comm = nlohmann::json::object();
    for (const auto& [op, c] : comm_by_op())
      comm[op] = {{"calls", c.calls}, {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received}, {"measured_s", c.seconds}};
    summary["comm"] = comm;
  }
  return summary;
}

// The progress: every train.log_every steps (and the last) a line; between them, on a terminal, a bar
// rewritten in place (tqdm's way), cleared before the next line. `el`: seconds since the run started.
double Trainer::model_flops_per_rank_step() const {
  if (!is_language_model(spec_)) return last_step_flops_ - last_step_recompute_flops_;
  double per_token = gpt_model_flops_per_token(spec_, cfg_.data.seq_len);
  if (cfg_.lora.on()) {  // the adapters at 6 a parameter; a frozen parameter at 4 (forward and dX: no weight gradient)
    const ParamCount c = count_parameters(*model_);
    per_token += 6.0 * double(c.trainable) - 2.0 * double(c.all - c.trainable);
  }
  return per_token * double(cfg_.data.seq_len * micro_batch_ * accum_ * dp_world()) / double(world());
}

std::pair<double, double> Trainer::live_mfu_hfu(double steps, double el) const {
  if (live_peak_ <= 0 || el <= 0 || steps <= 0) return {0, 0};
  const double per_s = steps / el / live_peak_;
  return {model_flops_per_rank_step() * per_s, (model_flops_per_rank_step() + last_step_recompute_flops_) * per_s};
}

void Trainer::log_progress(int64_t step, double loss, double samples, double el, bool last) {
  const bool periodic = (step + 1) % cfg_.train.log_every == 0 || last;
  if (bar_shown_ && periodic) {  // the plain line goes where the bar was; the bar comes back below it
    log_ << "\r\033[K";
    bar_shown_ = false;
  }
  if (progress_bar_ && !periodic) {
    const double done = double(step + 1 - start_step_);
    const double frac = double(step + 1) / double(std::max<int64_t>(total_steps_, 1)), eta = double(total_steps_ - step - 1) * el / std::max(done, 1.0);
    const int filled = int(frac * 30);
    log_ << fmt::format("\r{:>3.0f}% [{}{}] step {}/{} | loss {} | {:.0f} {}/s | ETA {:.0f}:{:02.0f}\033[K", 100 * frac,
                        std::string(size_t(filled), '#'), std::string(size_t(30 - filled), '.'), step + 1, total_steps_,
                        rt_.is_meta() ? std::string("n/a") : fmt::format("{:.4f}", loss),
                        samples * (is_language_model(cfg_.model) ? double(cfg_.data.seq_len) : 1.0) / std::max(el, 1e-9),
                        is_language_model(cfg_.model) ? "tokens" : "samples", std::floor(eta / 60), std::fmod(std::floor(eta), 60.0));
    log_.flush();
    bar_shown_ = true;
  }
  if (periodic) {
    // a language model's rate in tokens (a sample is seq_len of them), and the time left at this pace
    const bool lm = is_language_model(cfg_.model);
    const double done = double(step + 1 - start_step_), left = double(total_steps_ - step - 1);
    const double eta = left * el / std::max(done, 1.0);
    const auto [mfu, hfu] = rt_.is_meta() ? std::pair<double, double>{0, 0} : live_mfu_hfu(done, el);
    log_ << fmt::format("step {:>5}/{} | loss {} | lr {:.5f}{} | {:.0f} samples/s{}{} | {:.1f} s{}\n", step + 1, total_steps_,
                        rt_.is_meta() ? std::string("n/a (meta)") : fmt::format("{:.4f}", loss), schedule_.lr_at(step),
                        scaler_.enabled() || (ext_ && ext_->drives_steps()) ? fmt::format(" | loss scale {:g} ({} skipped)", loss_scale_, skipped_steps_) : "",
                        samples / std::max(el, 1e-9),
                        lm ? fmt::format(" | {:.0f} tokens/s", samples * double(cfg_.data.seq_len) / std::max(el, 1e-9)) : "",
                        mfu > 0 ? fmt::format(" | MFU {:.1f}% HFU {:.1f}%", 100 * mfu, 100 * hfu) : "", el,
                        last ? "" : fmt::format(" | ETA {:.0f}:{:02.0f}", std::floor(eta / 60), std::fmod(std::floor(eta), 60.0)));
    log_.flush();
  }
}

// The end-of-run report in the log: memory by category, FLOPs, the last step's communication, modeled time.
void Trainer::log_report(const nlohmann::json& summary, int64_t nparams, double wall) {
  // memory by category, with bytes per parameter (the course's 4 + 4 + 8 = 16 for fp32 AdamW)
  log_ << fmt::format("memory (peak per category{}):\n", rt_.memory.capacity() >= 0 ? ", capacity " + format_bytes(double(rt_.memory.capacity())) : "");
  for (int i = 0; i < kNumCategories; i++)
    if (peak_[size_t(i)] > 0)
      log_ << fmt::format("  {:<13} {:>12}  {:6.2f} bytes/param\n", category_name(Category(i)), format_bytes(double(peak_[size_t(i)])),
                          double(peak_[size_t(i)]) / double(nparams));
  log_ << fmt::format("  {:<13} {:>12}\n", "peak total", format_bytes(double(peak_total_)));
  log_ << fmt::format("  {:<13} {:>12}  (PyTorch's caching allocator, modeled)\n", "reserved", format_bytes(double(peak_reserved_)));
  if (peak_held_ >= 0)  // in a 16-bit run it includes the f32 copies the f32 kernels read (AsF32), which PyTorch does without
    log_ << fmt::format("  {:<13} {:>12}  (measured: the device's allocator at its most, {:.3f}x the peak total, {:.3f}x the modeled reserved)\n",
                        "device", format_bytes(double(peak_held_)), peak_total_ > 0 ? double(peak_held_) / double(peak_total_) : 0.0,
                        peak_reserved_ > 0 ? double(peak_held_) / double(peak_reserved_) : 0.0);
  log_ << fmt::format("FLOPs per step {:.3e} | {} steps in {:.1f} s\n", last_step_flops_, total_steps_, wall);
  if (pg_ && last_step_comm_calls_ > 0)  // what the step put on the wire: the number the course's "14 GB per step" is about
    log_ << fmt::format("communication in the last step (rank 0): {} sent in {} collective call(s){}\n", format_bytes(double(last_step_comm_bytes_)),
                        last_step_comm_calls_,
                        pg_->is_fake() ? " (counted on the fake world)"
                                       : fmt::format(", measured {:.2f} ms in them (start to finish, waits for peers and overlap included)",
                                                     1e3 * last_step_comm_s_));
  if (modeled_.contains("modeled_step_s"))
    log_ << fmt::format("modeled on {}{} (step {}): {:.2f} ms per step, compute {:.2f} ms{}, exposed communication {:.2f} ms, "
                        "speed-up over one rank {:.2f}x, MFU {:.1f} % (HFU {:.1f} %); measured here: {:.2f} ms per step\n",
                        modeled_["profile"].get<std::string>(),
                        std::string(modeled_.value("modeled_calibrated", true) ? "" : " at its peaks") + kernels_text(cfg_.log),
                        modeled_["traced_step"].get<int64_t>(),
                        1e3 * modeled_["modeled_step_s"].get<double>(), 1e3 * modeled_["modeled_compute_s"].get<double>(),
                        modeled_.value("modeled_contention_s", 0.0) > 0
                            ? fmt::format(" ({:.2f} ms of it lost to the SMs of the collectives beside it)", 1e3 * modeled_["modeled_contention_s"].get<double>())
                            : "",
                        1e3 * modeled_["modeled_exposed_comm_s"].get<double>(), modeled_["modeled_speedup"].get<double>(),
                        100 * modeled_["modeled_mfu"].get<double>(), 100 * modeled_["modeled_hfu"].get<double>(),
                        1e3 * summary.value("measured_step_s", 0.0));
}

nlohmann::json run_planned(const RunConfig& cfg, std::vector<TraceEvent>* events) {
  Runtime rt(DeviceKind::meta);
  ProcessGroup pg(ProcessGroup::Fake{}, 0, int(std::max<int64_t>(1, cfg.dist.fake_world_size)), &rt.trace);
  std::ostringstream quiet;
  MetricsWriter metrics("");
  Trainer t(cfg, rt, quiet, &pg);
  nlohmann::json summary = t.run(metrics);
  if (events) *events = rt.trace.events();
  return summary;
}

}  // namespace distlab
