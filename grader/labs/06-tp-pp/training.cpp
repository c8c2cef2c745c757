// Lab 06's training checks (grader/jobs.h): the trainers are the engine's, the student's layers and schedule
// run beside each rank (bridge.cpp, beside this file), and the trainers measure the losses, the bytes, the
// bubble and the micro-batches each stage held, where the plugin can't reach; the plugin's own process is
// measured from outside it. References: one rank (the numbers), the engine's own split runs (the bytes),
// (p − 1)/(m + p − 1) (the bubble). The checks that call the plugin directly, and the lab's table of checks,
// are in checks.cpp beside this file.
// Read next: bridge.cpp beside it (the trainer's side of these jobs).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "grader/check.h"
#include "grader/jobs.h"

namespace distlab::grader {

namespace checks06 {  // named: a unity build (CMakeLists.txt) puts several labs' checks in one unit

// ---- training jobs ----

const std::vector<std::string> kBase = {"precision.mode=fp32", "train.steps=8", "train.eval_every=0", "train.eval_batches=1",
                                        "train.log_every=1000", "dist.timeout_s=5"};

std::vector<std::string> plus(std::vector<std::string> a, std::initializer_list<std::string> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `against`: what the reference run is (one rank, unless the check compares with the engine's own split run)
std::string worst(const Job& ref, const Job& mine, double tol, const std::string& setup, CheckResult& out, const std::string& against = "one rank") {
  double w = mine.losses.size() == ref.losses.size() ? 0 : INFINITY;
  size_t at = 0;
  for (size_t i = 0; i < std::min(ref.losses.size(), mine.losses.size()); i++) {
    const double d = std::abs(ref.losses[i] - mine.losses[i]) / std::abs(ref.losses[i]);
    if (!(d <= w)) w = d, at = i;
  }
  if (w <= tol) return fmt::format("{}: {:.1e} at worst", setup, w);
  out = {false, fmt::format("{}: the losses of {} within {:.0e} relative (step {}: {:.6f})", setup, against, tol, at + 1, ref.losses.empty() ? 0.0 : ref.losses[at]),
         at < mine.losses.size() ? fmt::format("{:.6f} ({:.1e} relative)", mine.losses[at], w) : fmt::format("{} steps", mine.losses.size()), ""};
  return "";
}

double bytes_per_step(const Job& j) { return j.steps.empty() ? 0.0 : j.steps.back().value("comm_bytes_sent", 0.0); }

CheckResult tp_equals_tp1(CheckContext& ctx) {
  const Job& ref = job(ctx, "tp1", 1, false, plus(kBase, {"parallel.tp=1"}));
  std::string detail;
  for (int t : {2, 4}) {
    const Job& mine = job(ctx, fmt::format("tp{}", t), t, true, plus(kBase, {fmt::format("parallel.tp={}", t)}));
    CheckResult bad;
    const std::string d = worst(ref, mine, 1e-6, fmt::format("tp {}", t), bad);
    if (d.empty()) return bad;
    detail += (detail.empty() ? "" : "; ") + d;
  }
  return {true, "", "", detail};
}

CheckResult tp_comm_volume(CheckContext& ctx) {
  const auto sets = plus(kBase, {"parallel.tp=2"});
  const Job& ref = job(ctx, "ref:tp2", 2, false, sets);
  const Job& mine = job(ctx, "tp2", 2, true, sets);
  const double want = bytes_per_step(ref), got = bytes_per_step(mine);
  const std::string detail = fmt::format("tp 2: {:.0f} bytes per step, the engine's {:.0f}", got, want);
  if (std::abs(got / want - 1) <= 0.01) return {true, "", "", detail};
  return {false, fmt::format("tp 2: {:.0f} bytes per step, as the engine's tensor-parallel run", want), fmt::format("{:.0f} ({:.2f}x)", got, got / want), detail,
          got > want ? "more all-reduces than Megatron's two per column/row pair and micro-batch (one forward in the row layer, one "
                       "backward in the column layer)"
                     : "fewer bytes than the two all-reduces per layer pair need"};
}

const std::string kSp = "parallel.sequence_parallel=true";

CheckResult sp_equals_tp(CheckContext& ctx) {
  const Job& ref = job(ctx, "tp1", 1, false, plus(kBase, {"parallel.tp=1"}));
  std::string detail;
  for (int t : {2, 4}) {
    const Job& mine = job(ctx, fmt::format("sp{}", t), t, true, plus(kBase, {fmt::format("parallel.tp={}", t), kSp}));
    CheckResult bad;
    const std::string d = worst(ref, mine, 1e-6, fmt::format("tp {} + sequence parallel", t), bad);
    if (d.empty()) {
      bad.hint = "the layers pass alone: are the LayerNorms' gradients (sp_norm_grads) the whole micro-batch's?";
      return bad;
    }
    detail += (detail.empty() ? "" : "; ") + d;
  }
  return {true, "", "", detail};
}

double peak_activations(const Job& j) {
  return j.summary.value("peak_memory", nlohmann::json::object()).value("activations", 0.0);
}

/* The memory sequence parallelism frees: a column layer's gathered input (rows x in, every rank's rows) is
   a temporary of each call, gathered again in backward, never kept between calls. The trainer cannot see
   what the plugin's process keeps, so it is measured from outside it (grader/bridge/plugin_process.h: its
   memory cgroup's peak over what its host held before the plugin was loaded) on two GPTs that differ only in
   depth, 4 and 16 blocks of width 128 with 1024 token rows: each gathered input is 0.5 MiB, and a plugin
   that keeps them from the forward holds 2 more per block, 12 MiB more on the deeper model. A call's own
   buffers (the host's copies of the arguments and results, the gathered input, a gradient to reduce-scatter:
   5.2-5.6 MiB at the peak for the reference and both alternative solutions, however wasteful a correct
   plugin's temporaries) are the same at any depth, so the peaks may differ by kSpDepthSlackBytes at most
   (the heap's own noise). Only this catches a plugin that gathers in backward as it should (the bytes are
   right), then uses a copy kept from the forward wherever its own rows still match it (the numbers are
   right). A cache of a few layers' inputs, whatever the depth, is not caught. */
constexpr int64_t kSpTokens = 1024, kSpWidth = 128;  // micro_batch 4 x seq_len 256; the width
constexpr int kSpShallow = 4, kSpDeep = 16;
constexpr double kSpDepthSlackBytes = 2 << 20;

std::vector<std::string> sp_memory_job(int blocks) {
  return plus(kBase, {"parallel.tp=2", kSp, fmt::format("model.n_layer={}", blocks), fmt::format("model.n_embd={}", kSpWidth), "model.n_head=4",
                      "model.block_size=256", "data.seq_len=256", "train.micro_batch=4", "train.steps=1"});
}

// rank -> the plugin's own bytes at its peak (a rank whose memory could not be measured here is left out)
std::map<int, double> plugin_peaks(const Job& j) {
  if (!j.summary.contains("ranks") || !j.summary["ranks"].is_array()) throw CheckAbort("error", "the memory job's summary has no ranks");
  std::map<int, double> out;
  for (const auto& rank : j.summary["ranks"]) {
    const auto m = rank.value("plugin_memory", nlohmann::json::object());
    if (m.value("method", "").empty()) continue;
    out[rank.value("rank", 0)] = std::max(0.0, m.value("peak", 0.0) - m.value("before_load", 0.0) - m.value("counted_by_trainer", 0.0));
  }
  return out;
}

CheckResult sp_plugin_memory(CheckContext& ctx, std::string detail) {
  std::map<int, std::map<int, double>> peaks;  // blocks -> rank -> bytes
  for (int blocks : {kSpShallow, kSpDeep}) {
    const Job& ref = job(ctx, fmt::format("ref:sp2-memory-{}", blocks), 2, false, sp_memory_job(blocks));
    const Job& mine = job(ctx, fmt::format("sp2-memory-{}", blocks), 2, true, sp_memory_job(blocks));
    // the measured run computes what the engine's does: a plugin that gathers and multiplies nothing holds nothing
    const double want = ref.losses.empty() ? NAN : ref.losses.front(), got = mine.losses.empty() ? NAN : mine.losses.front();
    if (!(std::abs(got - want) <= 1e-6 * std::abs(want)))
      return {false, fmt::format("tp 2 + SP on {} blocks of width {} (a run whose memory is measured): the engine's loss, {:.6f}, within 1e-6", blocks,
                                 kSpWidth, want),
              fmt::format("{:.6f}", got), detail, "memory counts for layers that compute: this run must gather, multiply and reduce-scatter as the smaller ones do"};
    peaks[blocks] = plugin_peaks(mine);
  }
  if (peaks[kSpDeep].empty()) return {true, "", "", detail + "; your plugin's memory: not measured here (no memory cgroup, no /proc)"};
  const double gathered = double(kSpTokens * kSpWidth * 4);
  for (const auto& [r, deep] : peaks[kSpDeep]) {
    const auto it = peaks[kSpShallow].find(r);
    if (it == peaks[kSpShallow].end()) continue;
    const double grew = deep - it->second;
    detail += fmt::format("; rank {}'s plugin process at its peak beyond its host: {:.1f} MiB on {} blocks, {:.1f} MiB on {} ({:+.1f} MiB; at most "
                          "{:+.0f})", r, it->second / (1 << 20), kSpShallow, deep / (1 << 20), kSpDeep, grew / (1 << 20), kSpDepthSlackBytes / (1 << 20));
    if (grew > kSpDepthSlackBytes)
      return {false,
              fmt::format("tp 2 + SP, 1024 token rows of width {}: your plugin's process holds the same at any depth (a call's buffers only): "
                          "{} blocks at most {:.0f} MiB above {} blocks (rank {})", kSpWidth, kSpDeep, kSpDepthSlackBytes / (1 << 20), kSpShallow, r),
              fmt::format("{:+.1f} MiB ({:.1f} MiB against {:.1f}: {:.1f} gathered inputs of {:.1f} MiB more)", grew / (1 << 20), deep / (1 << 20),
                          it->second / (1 << 20), grew / gathered, gathered / (1 << 20)),
              detail,
              "memory that grows with the model's depth is kept between calls: a gathered input kept from the forward (in a static, a member, a "
              "cache keyed by anything) is what sequence parallelism frees. Gather it again in sp_column_backward and let every call's buffers "
              "go when it returns"};
  }
  return {true, "", "", detail};
}

// The bytes: Korthikanti et al.'s all-gather + reduce-scatter for each all-reduce of the stream (the same
// bytes), plus the input gathered again in each column layer's backward — per block 10 halves where plain
// TP has 4 all-reduces (8 halves): 1.25x for the layers. The memory: what the trainer holds between the
// layers is this rank's rows (the residual stream, the LayerNorms' and dropouts' activations).
CheckResult sp_comm_volume(CheckContext& ctx) {
  const auto tp = plus(kBase, {"parallel.tp=2"}), sp = plus(tp, {kSp});
  const Job& ref = job(ctx, "ref:sp2", 2, false, sp);
  const Job& mine = job(ctx, "sp2", 2, true, sp);
  const Job& plain = job(ctx, "ref:tp2", 2, false, tp);  // the engine's plain TP: this check is about SP alone
  const double want = bytes_per_step(ref), got = bytes_per_step(mine), tp_bytes = bytes_per_step(plain);
  const double act_sp = peak_activations(mine), act_tp = peak_activations(plain);
  const std::string detail =
      fmt::format("tp 2 + SP: {:.0f} bytes per step, the engine's {:.0f} ({:.3f}x plain TP's {:.0f}: the layers' 1.25x and the LayerNorms' "
                  "gradient sums); the trainer's activations at the peak {:.0f} bytes against plain TP's {:.0f} ({:.2f}x)",
                  got, want, tp_bytes > 0 ? got / tp_bytes : 0.0, tp_bytes, act_sp, act_tp, act_tp > 0 ? act_sp / act_tp : 0.0);
  if (std::abs(got / want - 1) > 0.01)
    return {false, fmt::format("tp 2 + sequence parallel: {:.0f} bytes per step, as the engine's sequence-parallel run", want),
          fmt::format("{:.0f} ({:.2f}x)", got, got / want), detail,
          got > want ? "an all-reduce where a reduce-scatter does (each rank needs only its rows of the sum) sends twice the bytes"
                     : "fewer bytes than Megatron's: is a gathered input kept between forward and backward? The contract keeps nothing "
                       "between calls (the memory it would hold is what sequence parallelism frees)"};
  return sp_plugin_memory(ctx, detail);
}

CheckResult pp_equals_pp1(CheckContext& ctx) {
  std::string detail;
  for (auto [p, m] : {std::pair{2, 4}, std::pair{4, 8}}) {
    const Job& ref = job(ctx, fmt::format("pp1-m{}", m), 1, false, plus(kBase, {"parallel.tp=1", fmt::format("train.accum_steps={}", m)}));
    const Job& mine = job(ctx, fmt::format("pp{}", p), p, true,
                          plus(kBase, {"parallel.tp=1", fmt::format("parallel.pp={}", p), fmt::format("parallel.micro_batches={}", m)}));
    CheckResult bad;
    const std::string d = worst(ref, mine, 1e-6, fmt::format("pp {}, m {}", p, m), bad);
    if (d.empty()) return bad;
    detail += (detail.empty() ? "" : "; ") + d;
  }
  return {true, "", "", detail};
}

const std::vector<std::string> kBubble = plus(kBase, {"parallel.tp=1", "parallel.pp=4", "parallel.micro_batches=8", "model.n_layer=8",
                                                      "model.n_embd=256", "model.vocab_size=64", "data.vocab=64", "model.block_size=64", "data.seq_len=64",
                                                      "train.micro_batch=4", "train.steps=1",
                                                      "log.profile=cpu", "log.trace_step=1"});

CheckResult bubble_and_memory(CheckContext& ctx) {
  const Job& ref = job(ctx, "ref:bubble", 4, false, kBubble);
  const Job& mine = job(ctx, "bubble", 4, true, kBubble);
  const int p = 4, m = 8;
  const double formula = double(p - 1) / (m + p - 1), got = mine.summary.value("pipeline_bubble", -1.0);
  const nlohmann::json pipe = mine.summary.value("pipeline", nlohmann::json::object());
  const nlohmann::json stage_of = pipe.value("stage_of_rank", nlohmann::json::array()), held = pipe.value("peak_in_flight", nlohmann::json::array());
  std::string held_text;
  for (size_t r = 0; r < held.size(); r++) held_text += fmt::format("{}{}", r ? " " : "", held[r].is_number() ? held[r].get<int>() : -1);
  const std::string detail = fmt::format("p 4, m 8: the modeled bubble {:.1f} % (the engine's 1F1B {:.1f} %, the formula {:.1f} %); micro-batches "
                                         "held at the peak by rank: {} (the engine's 4 3 2 1)",
                                         100 * got, 100 * ref.summary.value("pipeline_bubble", 0.0), 100 * formula, held_text);
  if (!(std::abs(got - formula) <= 0.02))
    return {false, fmt::format("p 4, m 8: a bubble within 2 points of (p - 1)/(m + p - 1) = {:.1f} %", 100 * formula), fmt::format("{:.1f} %", 100 * got),
            detail, got > formula ? "a stage idles more than the pipeline's fill and drain: does a forward wait for a backward it could have done?" : ""};
  if (held.size() != size_t(p) || stage_of.size() != size_t(p)) throw CheckAbort("error", "the bubble job's summary has no pipeline peaks: " + detail);
  for (int r = 0; r < p; r++) {
    const int s = stage_of[size_t(r)].get<int>(), n = held[size_t(r)].get<int>();
    if (n > p - s)
      return {false, fmt::format("stage {} of {} holds at most p - s = {} micro-batches' activations at once (1F1B)", s, p, p - s),
              fmt::format("{} (GPipe would hold all m = {})", n, m), detail,
              n == m ? "all forwards before the first backward is GPipe: 1F1B starts backwards after min(p - s - 1, m) forwards"
                     : "more warm-up forwards than min(p - s - 1, m): each extra one holds another micro-batch's activations"};
  }
  return {true, "", "", detail};
}

CheckResult dp_sync_once(CheckContext& ctx) {
  const auto sets = plus(kBase, {"parallel.tp=1", "parallel.pp=2", "parallel.dp=2", "parallel.micro_batches=4", "parallel.strategy=ddp"});
  const Job& ref = job(ctx, "ref:dp2pp2", 4, false, sets);
  const Job& mine = job(ctx, "dp2pp2", 4, true, sets, true);
  if (!mine.ok)
    return {false, "dp 2 x pp 2: every replica of a stage ends with the same weights", "the replicas diverged", "",
            "dp_sync must say true for one backward of each step on every stage (its last): then the replicas' gradients are averaged"};
  CheckResult bad;
  const std::string d = worst(ref, mine, 1e-6, "dp 2 x pp 2", bad, "the engine's dp 2 x pp 2 run");
  if (d.empty()) {
    bad.hint = "sync in the LAST backward of the step: gradients of later micro-batches would otherwise stay unaveraged";
    return bad;
  }
  const double want = bytes_per_step(ref), got = bytes_per_step(mine);
  const std::string detail = fmt::format("{}; {:.0f} bytes per step, the engine's {:.0f}", d, got, want);
  if (std::abs(got / want - 1) <= 0.01) return {true, "", "", detail};
  return {false, fmt::format("dp 2 x pp 2: {:.0f} bytes per step (one gradient all-reduce per stage and step, the activations, the tied "
                             "embedding)", want),
          fmt::format("{:.0f} ({:.2f}x)", got, got / want), detail,
          "the numbers are right, but each sync sends every gradient: averaging after every micro-batch sends m times the bytes of "
          "once in the last backward"};
}

}  // namespace checks06

}  // namespace distlab::grader
