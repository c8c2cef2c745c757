// Lab 04's checks. The partition is asked of the student's plugin directly (in its sandboxed host). The
// stages are checked in real training jobs (grader/jobs.h): the trainers are the engine's, the student's
// ZeRO runs beside each rank (bridge.cpp, beside this file), and the trainers measure what the checks need
// — losses, whether the replicas agree, bytes sent per step, and the memory each category held at its peak
// — where the plugin can't reach. References are the engine's own DDP (the numbers) and the ZeRO paper's
// formulas (the memory).
// Read next: bridge.cpp beside it (the trainer's side), then host.cpp (the plugin's).
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/optim/optimizer.h"
#include "grader/check.h"
#include "grader/jobs.h"

namespace distlab::grader {

namespace checks04 {  // named: a unity build (CMakeLists.txt) puts several labs' checks in one unit

// ---- 1. the partition, asked directly ----

struct Shard {
  int64_t padded = 0, begin = 0, end = 0;
};

Shard ask_shard(CheckContext& ctx, PluginProcess& p, int64_t numel, int rank, int world) {
  wire::Frame f;
  f.op = labproto::kCall;
  const int64_t args[] = {labproto::kShardOf, numel, rank, world};
  for (int k = 0; k < 4; k++) f.arg[k] = args[k];
  const std::string during = fmt::format("shard_of(numel {}, rank {}, world {})", numel, rank, world);
  p.send(f, nullptr, 0, ctx.deadline, during.c_str());
  std::vector<char> out;
  p.receive(f, out, ctx.deadline, during.c_str(), 1024);
  if (f.op == labproto::kRaised)
    throw CheckAbort("error", fmt::format("{} threw: {}", during, sanitize_output(std::string(out.begin(), out.end()), 1500)));
  if (f.op != labproto::kReturn || out.size() != 24) throw CheckAbort("error", during + " sent a broken answer");
  Shard s;
  std::memcpy(&s.padded, out.data(), 8);
  std::memcpy(&s.begin, out.data() + 8, 8);
  std::memcpy(&s.end, out.data() + 16, 8);
  return s;
}

CheckResult partition(CheckContext& ctx) {
  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  for (int world : {1, 2, 3, 4, 5, 7, 8})
    for (int64_t numel : {1, 2, 3, 5, 7, 8, 10, 63, 64, 65, 1000, 65537}) {
      const int64_t padded = (numel + world - 1) / world * world, part = padded / world;
      for (int rank = 0; rank < world; rank++) {
        const Shard s = ask_shard(ctx, p, numel, rank, world);
        if (s.padded == padded && s.begin == rank * part && s.end == (rank + 1) * part) continue;
        CheckResult bad{false, fmt::format("shard_of(numel {}, rank {}, world {}): padded {}, [{}, {})", numel, rank, world, padded, rank * part,
                                           (rank + 1) * part),
                        fmt::format("padded {}, [{}, {})", s.padded, s.begin, s.end), ""};
        if (s.padded == numel && numel % world) bad.hint = fmt::format("{} elements don't split {} ways: pad with zeros to {}", numel, world, padded);
        else if (s.padded != padded) bad.hint = "the smallest multiple of world that holds numel: more padding sends zeros for nothing";
        else if (s.end - s.begin != part) bad.hint = "every rank's part is the same size, padded / world: collectives need equal parts";
        else bad.hint = "rank r's part starts at r * (padded / world): the order reduce_scatter and all_gather use";
        return bad;
      }
    }
  return {true, "", "", "numel 1..65537 on 1..8 ranks (84 sizes, 360 ranks' parts): padded to the smallest multiple, equal parts in rank order"};
}

// ---- 2. AdamW, asked directly, against the engine's (PyTorch's) ----

struct AdamWCase {
  int64_t n;
  bool decay;
  float grad_scale;
  float hyper[6];  // lr, beta1, beta2, eps, weight_decay, max_norm (unused here)
  int64_t t;
};

// The engine's AdamW on one parameter holding w, with moments m and v after t - 1 steps: w, m, v after step t.
void engine_adamw(const AdamWCase& c, std::vector<float>& w, std::vector<float>& m, std::vector<float>& v, const std::vector<float>& g) {
  Runtime rt;
  Parameter p;
  p.decay = c.decay;
  p.data = rt.empty({c.n}, Category::params);
  p.grad = rt.empty({c.n}, Category::grads);
  std::memcpy(p.data.data(), w.data(), size_t(c.n) * 4);
  std::memcpy(p.grad.data(), g.data(), size_t(c.n) * 4);
  AdamW opt({&p}, AdamWOptions{c.hyper[1], c.hyper[2], c.hyper[3], c.hyper[4]});
  std::memcpy(opt.state(rt, 0, "exp_avg", true)->data(), m.data(), size_t(c.n) * 4);
  std::memcpy(opt.state(rt, 0, "exp_avg_sq", true)->data(), v.data(), size_t(c.n) * 4);
  opt.set_param_steps(0, c.t - 1);
  opt.step(rt, c.hyper[0], c.grad_scale);
  std::memcpy(w.data(), p.data.data(), size_t(c.n) * 4);
  std::memcpy(m.data(), opt.state(rt, 0, "exp_avg", false)->data(), size_t(c.n) * 4);
  std::memcpy(v.data(), opt.state(rt, 0, "exp_avg_sq", false)->data(), size_t(c.n) * 4);
}

/* How close an element must be. Each of w, m and v is a sum of terms, each rounded where it is computed:
     m' = beta1 m + (1 - beta1) g s            v' = beta2 v + (1 - beta2) (g s)^2
     w' = w (1 - lr wd) - lr m^ / (sqrt(v^) + eps),   m^ = m' / (1 - beta1^t), v^ = v' / (1 - beta2^t)
   Where two terms nearly cancel (w after its decay minus its update; m with a gradient of the other sign)
   the result is small and its relative error large, in the reference's float kernel as much as in any
   other (a double-precision AdamW can miss a per-element 1e-6 where w is the difference of two near
   numbers; tests/test_grader.cpp grades one, and one in another order of operations). So the tolerance is
   1e-6 of the terms' sizes, |a| + |b|, never of the result. The bias corrections are conditioned too:
   1 - beta2^t at t = 2 is 0.002, and a beta2^t rounded to float (a float pow, as a fused kernel computes it)
   carries its 6e-8 into it 500 times over; the update may differ by that much, computed from the drawn
   betas and t. A wrong formula (no bias correction, L2 decay, a missing grad_scale) moves elements by a good
   part of a term, 1e3-1e5 times this. */
constexpr double kAdamWTolerance = 1e-6;
constexpr double kFloatRounding = 1.0 / (1 << 23);  // float's epsilon: one rounding's relative error, twice over

double adamw_tolerance(const AdamWCase& c, int k, float w0, float m0, float v0, float g, float m1, float v1) {
  const double lr = c.hyper[0], b1 = c.hyper[1], b2 = c.hyper[2], eps = c.hyper[3], wd = c.hyper[4];
  const double gs = double(g) * c.grad_scale;
  if (k == 1) return kAdamWTolerance * (b1 * std::abs(m0) + (1 - b1) * std::abs(gs));
  if (k == 2) return kAdamWTolerance * (b2 * v0 + (1 - b2) * gs * gs);
  const double p1 = std::pow(b1, double(c.t)), p2 = std::pow(b2, double(c.t));
  const double mh = m1 / (1 - p1), vh = v1 / (1 - p2);
  const double update = lr * std::abs(mh) / (std::sqrt(vh) + eps);
  // d(update)/update from beta^t rounded: p1/(1 - p1) through 1/bc1, half of p2/(1 - p2) through 1/sqrt(bc2)
  const double corrections = 2 * kFloatRounding * (p1 / (1 - p1) + 0.5 * p2 / (1 - p2));
  return kAdamWTolerance * (std::abs(w0) * (c.decay ? 1 - lr * wd : 1.0) + update) + corrections * update;
}

CheckResult adamw(CheckContext& ctx) {
  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  std::vector<AdamWCase> cases;
  auto rng = ctx.rng({4, 2});
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int64_t t : {int64_t(1), int64_t(2), int64_t(10), int64_t(1000)})
    for (bool decay : {true, false})
      for (float grad_scale : {1.0f, 0.25f + u(rng)}) {
        AdamWCase c{int64_t(1 + rng() % 3000), decay, grad_scale, {}, t};
        c.hyper[0] = 1e-4f + 1e-2f * u(rng);                 // lr
        c.hyper[1] = rng() % 2 ? 0.9f : 0.8f + 0.19f * u(rng);  // beta1
        c.hyper[2] = rng() % 2 ? 0.999f : 0.95f;             // beta2
        c.hyper[3] = rng() % 2 ? 1e-8f : 1e-6f;              // eps
        c.hyper[4] = 0.05f + 0.3f * u(rng);                  // weight_decay
        cases.push_back(c);
      }
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::string detail;
  for (const AdamWCase& c : cases) {
    std::vector<float> w(size_t(c.n)), m(size_t(c.n)), v(size_t(c.n)), g(size_t(c.n));
    for (int64_t i = 0; i < c.n; i++) {
      w[size_t(i)] = nd(rng), g[size_t(i)] = 0.1f * nd(rng);
      m[size_t(i)] = c.t > 1 ? 0.05f * nd(rng) : 0.0f;  // a first step starts from zero moments
      v[size_t(i)] = c.t > 1 ? 1e-3f * std::abs(nd(rng)) : 0.0f;
    }
    std::vector<char> in(36);
    const int64_t t = c.t;
    std::memcpy(in.data(), c.hyper, 24);
    std::memcpy(in.data() + 24, &t, 8);
    std::memcpy(in.data() + 32, &c.grad_scale, 4);
    for (const auto* x : {&w, &m, &v, &g}) in.insert(in.end(), reinterpret_cast<const char*>(x->data()), reinterpret_cast<const char*>(x->data() + c.n));
    const std::string during = fmt::format("adamw_step(t {}, lr {:.3g}, betas ({:.3g}, {:.4g}), eps {:g}, weight_decay {:.3g}, decay {}, grad_scale {:.3g}, n {})",
                                           c.t, c.hyper[0], c.hyper[1], c.hyper[2], c.hyper[3], c.hyper[4], c.decay, c.grad_scale, c.n);
    wire::Frame f;
    f.op = labproto::kCall;
    f.arg[0] = labproto::kAdamWStep, f.arg[1] = c.n, f.arg[2] = c.decay;
    p.send(f, in.data(), in.size(), ctx.deadline, during.c_str());
    std::vector<char> out;
    p.receive(f, out, ctx.deadline, during.c_str(), size_t(c.n) * 12 + 1024);
    if (f.op == labproto::kRaised)
      throw CheckAbort("error", fmt::format("{} threw: {}", during, sanitize_output(std::string(out.begin(), out.end()), 1500)));
    if (f.op != labproto::kReturn || out.size() != size_t(c.n) * 12) throw CheckAbort("error", during + " sent a broken answer");
    std::vector<float> w0 = w, want_w = w, want_m = m, want_v = v;
    engine_adamw(c, want_w, want_m, want_v, g);
    const char* names[] = {"w", "m", "v"};
    const std::vector<float>* want[] = {&want_w, &want_m, &want_v};
    for (int k = 0; k < 3; k++) {
      for (int64_t i = 0; i < c.n; i++) {
        float got;
        std::memcpy(&got, out.data() + size_t(k * c.n + i) * 4, 4);
        const float ref = (*want[k])[size_t(i)];
        const double tol = adamw_tolerance(c, k, w0[size_t(i)], m[size_t(i)], v[size_t(i)], g[size_t(i)], want_m[size_t(i)], want_v[size_t(i)]) + 1e-30;
        if (std::abs(double(got) - double(ref)) <= tol) continue;
        CheckResult bad{false, fmt::format("{}: {}[{}] = {:.9g} (PyTorch's AdamW, within {:.3g}: 1e-6 of the size of the terms it is made of, and the bias corrections' rounding)",
                                           during, names[k], i, ref, tol),
                        fmt::format("{:.9g}", got), fmt::format("g[{}] = {:.6g}, w before = {:.6g}", i, g[size_t(i)], w0[size_t(i)])};
        // what the difference looks like: the course's AdamW mistakes
        const float moved = got - w0[size_t(i)], want_moved = ref - w0[size_t(i)];
        // AdamW's first step without 1 - beta^t: the step is lr * (1 - beta1) / sqrt(1 - beta2) instead of lr,
        // a factor the drawn betas can bring anywhere near 1 (0.77 at betas 0.828 and 0.95): computed, not guessed
        const double gs = double(g[size_t(i)]) * c.grad_scale, lr = c.hyper[0];
        const double no_correction = w0[size_t(i)] * (c.decay ? 1.0 - lr * c.hyper[4] : 1.0) -
                                     lr * (1.0 - c.hyper[1]) * gs / (std::sqrt((1.0 - c.hyper[2]) * gs * gs) + c.hyper[3]);
        const bool uncorrected = std::abs(got - no_correction) <= 1e-5 * std::abs(no_correction) + 1e-9;
        if (k == 0 && c.t == 1 &&
            (uncorrected || !(std::abs(moved) > 0.67f * std::abs(want_moved) && std::abs(moved) < 1.5f * std::abs(want_moved))))
          bad.hint = fmt::format("at t = 1 the weights moved {:.2f}x as far as AdamW's: m and v start at 0, so both need their bias "
                                 "correction, 1 - beta1^t and 1 - beta2^t",
                                 std::abs(moved / want_moved));
        else if (k == 1 && c.decay)
          bad.hint = "m differs only where weight decay is on: AdamW's decay is decoupled (the weights shrink by 1 - lr * weight_decay), it "
                     "never goes through the gradient (that is Adam with L2)";
        else if (k == 1 && c.grad_scale != 1.0f)
          bad.hint = "the moments see the gradient times grad_scale (the clipping coefficient)";
        else if (k == 0 && !c.decay)
          bad.hint = "where decay is false the weights do not shrink: biases and norms are not decayed";
        else if (k == 0 && c.t > 100)
          bad.hint = "late steps differ: the bias corrections are 1 - beta^t for THIS step's t";
        return bad;
      }
    }
  }
  return {true, "", "", fmt::format("{} steps (t 1, 2, 10, 1000; with and without decay; clipped and not) equal PyTorch's AdamW", cases.size())};
}

// ---- 3-5. the stages in training jobs, against the engine's DDP ----

// Unclipped: the global norm over the parts is the engine's arithmetic, not the student's, and a rank that
// keeps the whole gradient would otherwise fail these checks through the norm instead of the memory check.
// 6 steps: a right ZeRO is DDP to the bit (0.0 relative); the course's wrong ones are off by 1.4e-4 (a
// rank-local norm under the clip) to 6.9e-2 (empty parts) within them, 140 times the 1e-6 allowed or more
// (12 steps only made the same verdicts take twice as long).
const std::vector<std::string> kFp32 = {"precision.mode=fp32", "train.steps=6", "train.log_every=1000", "optim.clip_grad_norm=0"};

std::vector<std::string> strategy(const std::string& s, std::vector<std::string> sets = kFp32) { return with(std::move(sets), "parallel.strategy=" + s); }

// The student's stage `zero` on `ranks` ranks against the engine's DDP: the losses within 1e-6 relative at
// every step, and the replicas equal at the end (the trainer checks that and fails the run otherwise).
CheckResult follows_ddp(CheckContext& ctx, const std::string& zero, int ranks, const std::vector<std::string>& sets = kFp32,
                        const std::string& tag = "") {
  const Job& ref = job(ctx, fmt::format("ddp-fp32{}-{}", tag, ranks), ranks, false, strategy("ddp", sets));
  const Job& mine = job(ctx, fmt::format("{}-fp32{}-{}", zero, tag, ranks), ranks, true, strategy(zero, sets), true);
  const std::string setup = fmt::format("{} on {} ranks{}", zero, ranks, tag.empty() ? "" : ", clipped to a global norm of 0.05");
  if (!mine.ok)  // trained to the end, but the ranks' weights differ
    return {false, setup + ": every rank ends with the same weights", "the replicas diverged", "",
            "after the step every rank has only its own part updated: all_gather every rank's part and set_weights the whole flat"};
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < std::min(ref.losses.size(), mine.losses.size()); i++) {
    const double d = std::abs(ref.losses[i] - mine.losses[i]) / std::abs(ref.losses[i]);
    if (!(d <= worst)) worst = d, at = i;
  }
  if (mine.losses.size() == ref.losses.size() && worst <= 1e-6)
    return {true, "", "", fmt::format("{}: {:.1e} from DDP at worst", setup, worst)};
  return {false, fmt::format("{}: DDP's losses within 1e-6 relative (step {}: {:.6f})", setup, at + 1, ref.losses.empty() ? 0.0 : ref.losses[at]),
          mine.losses.size() != ref.losses.size() ? fmt::format("{} steps instead of {}", mine.losses.size(), ref.losses.size())
                                                  : fmt::format("{:.6f} ({:.1e} relative)", mine.losses[at], worst),
          "",
          at == 0 ? "the first step already differs: the reduction must AVERAGE (ReduceOp::avg) and each rank keep the part it owns"
          : !tag.empty() ? "with clipping on: the global norm is over every rank's parts (each holds 1/N of every averaged gradient): "
                           "all-reduce the sum of squares before the square root"
                         : "the parts must tile each padded flat exactly once: rank r keeps [r·S/N, (r+1)·S/N), the same range it steps and "
                           "gathers"};
}

CheckResult zero1_equals_ddp(CheckContext& ctx) {
  std::string detail;
  for (int ranks : {2, 3}) {
    CheckResult r = follows_ddp(ctx, "zero1", ranks);
    if (!r.passed) return r;
    detail += (detail.empty() ? "" : "; ") + r.detail;
  }
  return {true, "", "", detail};
}

// Clipped (the global norm over the parts is the student's all-reduce now): DDP with the same clip.
const std::vector<std::string> kFp32Clipped = {"precision.mode=fp32", "train.steps=6", "train.log_every=1000", "optim.clip_grad_norm=0.05"};

CheckResult zero2_equals_ddp(CheckContext& ctx) {
  const Job& ref = job(ctx, "ddp-fp32-clip-3", 3, false, strategy("ddp", kFp32Clipped));
  // the clip must have bitten, else this is the unclipped check again
  double clipped = 0;
  for (const auto& s : ref.steps) clipped += s.value("grad_norm", 0.0) > 0.05;
  if (clipped == 0) throw CheckAbort("error", "the reference run never clipped (max_norm 0.05): the check needs a smaller max_norm");
  return follows_ddp(ctx, "zero2", 3, kFp32Clipped, "-clip");
}

// Every rank's own record (the summary's "ranks", gathered by the trainers), or rank 0's summary where there
// is one rank: a check of memory or bytes holds for every rank, not for rank 0 alone.
std::vector<nlohmann::json> per_rank(const Job& j) {
  std::vector<nlohmann::json> v;
  if (j.summary.contains("ranks") && j.summary["ranks"].is_array())
    for (const auto& r : j.summary["ranks"]) v.push_back(r);
  if (v.empty()) v.push_back({{"rank", 0}, {"peak_memory", j.summary.value("peak_memory", nlohmann::json::object())},
                              {"comm_bytes_sent_last_step", j.steps.empty() ? 0.0 : j.steps.back().value("comm_bytes_sent", 0.0)}});
  return v;
}

// The bytes of the rank that sent the fewest, or the most, in the last step (the check wants both at DDP's).
double bytes_per_step(const Job& j, bool most) {
  double v = most ? 0.0 : 1e300;
  for (const auto& r : per_rank(j)) {
    const double b = r.value("comm_bytes_sent_last_step", 0.0);
    v = most ? std::max(v, b) : std::min(v, b);
  }
  return v;
}

// "" when `mine` has ref's number of steps and every loss within `tol` relative of ref's; else the worst step.
std::string losses_apart(const Job& ref, const Job& mine, double tol) {
  if (mine.losses.size() != ref.losses.size() || ref.losses.empty())
    return fmt::format("{} steps where the engine's run has {}", mine.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); i++)
    if (!(std::abs(ref.losses[i] - mine.losses[i]) <= tol * std::abs(ref.losses[i])))
      return fmt::format("step {}: loss {:.7f} where the engine's is {:.7f}", i + 1, mine.losses[i], ref.losses[i]);
  return "";
}

// Bytes and memory count only for a ZeRO that trains: a run whose parts are empty or never gathered moves
// the right bytes and holds the right memory while the model learns nothing.
CheckResult trains_first(CheckContext& ctx, const std::string& zero, int ranks, const std::string& what) {
  CheckResult r = zero == "zero2" ? zero2_equals_ddp(ctx) : follows_ddp(ctx, zero, ranks);  // zero2: the clipped 3-rank run
  if (r.passed) return r;
  r.expected = what + " counts only for a " + zero + " that trains as DDP does: " + r.expected;
  return r;
}

CheckResult comm_equals_ddp(CheckContext& ctx) {
  const Job& ref = job(ctx, "ddp-fp32-2", 2, false, strategy("ddp"));
  const double want = bytes_per_step(ref, true);
  std::string detail;
  for (const std::string zero : {"zero1", "zero2"}) {
    if (CheckResult r = trains_first(ctx, zero, 2, "its communication"); !r.passed) return r;
    const Job& mine = job(ctx, zero + "-fp32-2", 2, true, strategy(zero), true);
    const double lo = bytes_per_step(mine, false), hi = bytes_per_step(mine, true);
    const double got = std::abs(lo / want - 1) > std::abs(hi / want - 1) ? lo : hi;  // the rank furthest from DDP's
    detail += fmt::format("{}{}: {:.0f} bytes per step, {:.3f}x DDP's", detail.empty() ? "" : "; ", zero, got, got / want);
    if (std::abs(got / want - 1) <= 0.01) continue;
    CheckResult bad{false, fmt::format("{} on 2 ranks sends DDP's {:.0f} bytes per step (within 1 %)", zero, want),
                    fmt::format("{:.0f} bytes ({:.2f}x)", got, got / want), ""};
    if (got / want > 1.4)
      bad.hint = "an all_reduce of the gradient plus an all_gather of the weights is 1.5x DDP: reduce_scatter gives each rank its averaged "
                 "part for half an all_reduce, and the all_gather is the other half";
    else if (got / want < 0.9)
      bad.hint = "fewer bytes than an all-reduce can't average the gradients: every element must be reduced and gathered once";
    return bad;
  }
  return {true, "", "", detail};
}

// ZeRO-2's reduce-scatters during backward, each hidden behind the next unit's backward as DDP's buckets
// are: the modeled exposed communication (t4-pcie) against the engine's ZeRO-2, which overlaps them.
CheckResult zero2_overlaps(CheckContext& ctx) {
  if (CheckResult r = trains_first(ctx, "zero2", 3, "its overlap"); !r.passed) return r;
  const std::vector<std::string> sets = with(with(strategy("zero2"), "log.profile=t4-pcie"), "log.trace_step=2");
  const Job& ref = job(ctx, "zero2-t4-2-engine", 2, false, sets);
  const Job& mine = job(ctx, "zero2-t4-2", 2, true, sets);
  // the run whose step is traced must train as the engine's ZeRO-2 too: a reduction skipped in the steps that
  // are not traced would hide nothing there
  if (const std::string apart = losses_apart(ref, mine, 1e-6); !apart.empty())
    return {false, "the run whose overlap is measured (2 ranks, t4-pcie, step 2 traced) trains as the engine's ZeRO-2, every loss within 1e-6",
            apart, "", "every step reduces every flat's gradient: an overlap measured on one step holds for all of them only if they all do the same"};
  const double want = ref.summary.value("modeled_exposed_comm_s", 0.0), got = mine.summary.value("modeled_exposed_comm_s", 1e9);
  const double step = mine.summary.value("modeled_step_s", 0.0);
  const std::string numbers = fmt::format("modeled on t4-pcie, 2 ranks: {:.1f} us of communication exposed per step (the engine's ZeRO-2: {:.1f} us); "
                                          "the step {:.1f} us",
                                          got * 1e6, want * 1e6, step * 1e6);
  if (got <= 1.1 * want + 1e-6) return {true, "", "", numbers};
  return {false, fmt::format("at most the engine's exposed communication + 10 % ({:.1f} us)", 1.1e6 * want), fmt::format("{:.1f} us", got * 1e6),
          numbers,
          "each flat's reduce_scatter waits where it starts: start it with reduce_scatter_async in zero2_reduce and wait for it later (the next "
          "flat's zero2_reduce, or zero2_finish), so the network works while backward computes"};
}

// ---- 5-6. memory: the paper's formulas, measured by the trainers ----

// bf16 parameters and gradients, AdamW with f32 master weights and moments: K = 12, the paper's setting.
// The GPT is 8 blocks of width 128 here (Ψ = 1.63M; the lab's own is 4 blocks of 64, Ψ = 0.22M): ZeRO's
// per-rank state must stand out from one block's working copies and the C++ runtime in the plugin's
// process, and with 4 blocks a whole model's copy (4Ψ) was no bigger than those.
const std::vector<std::string> kBf16 = {"precision.mode=bf16", "train.steps=2", "train.log_every=1000", "model.n_layer=8", "model.n_embd=128"};

/* What the plugin's own process held. The trainer counts the memory it holds (parameters, the parts kept, the
   state buffers); the plugin's process is measured from outside it (grader/bridge/plugin_process.h: its own
   memory cgroup's peak over what the host held before the plugin was loaded), less the state buffers the
   host keeps for the trainer to count. ZeRO's design leaves the plugin working copies only: the parts kept
   this step as f32 (4Ψ/N, read back for the norm and the step), and a few messages' worth of one flat at a
   time — its whole gradient, its part, its gathered weights, each also in the socket's receive buffer —
   at most kMessages x the largest message the design sends (the trainer's own figure: a flat's padded
   gradient, or its state read back; never the socket's largest, which a junk all-reduce could inflate to
   buy room); and kSlackBytes for the C++ runtime and
   the heap's own bookkeeping. Optimizer state, master weights or whole gradients kept in the plugin's own
   vectors are Ψ-sized and land far above it. */
constexpr double kMessages = 4, kSlackBytes = 1 << 20;

struct PluginHeld {
  std::string method;
  double own = 0, allowed = 0, before = 0, peak = 0, counted = 0;
};

PluginHeld plugin_held(const nlohmann::json& rank, double psi, int n) {
  PluginHeld h;
  if (!rank.contains("plugin_memory") || !rank["plugin_memory"].is_object()) return h;
  const auto& m = rank["plugin_memory"];
  h.method = m.value("method", "");
  h.before = m.value("before_load", 0.0), h.peak = m.value("peak", 0.0), h.counted = m.value("counted_by_trainer", 0.0);
  h.own = std::max(0.0, h.peak - h.before - h.counted);
  const auto& rep = rank.contains("strategy_report") ? rank["strategy_report"] : nlohmann::json::object();
  h.allowed = 4.0 * psi / n + kMessages * rep.value("largest_flat_message_bytes", 0.0) + kSlackBytes;
  return h;
}

CheckResult memory(CheckContext& ctx, const std::string& zero) {
  if (CheckResult r = trains_first(ctx, zero, zero == "zero1" ? 2 : 3, "its memory"); !r.passed) return r;
  std::string detail;
  for (int n : {2, 4}) {
    const Job& mine = job(ctx, fmt::format("{}-bf16-{}", zero, n), n, true, strategy(zero, kBf16), true);
    if (!mine.ok) return {false, fmt::format("{} on {} ranks: every rank ends with the same weights", zero, n), "the replicas diverged", ""};
    // the measured run trains as the engine's of the same job (bf16: 1e-4; its first AdamW step moves the step-2
    // loss from 5.561 to 5.436 on 2 ranks, 2.2e-2 relative, measured with optim.lr=0 beside it):
    // a ZeRO that holds the right buffers and steps nothing in them holds the right memory too
    const Job& ref = job(ctx, fmt::format("ref:{}-bf16-{}", zero, n), n, false, strategy(zero, kBf16));
    if (const std::string apart = losses_apart(ref, mine, 1e-4); !apart.empty())
      return {false, fmt::format("{} on {} ranks in bf16 (the run whose memory is measured) trains as the engine's {}: every loss within 1e-4", zero, n, zero),
              apart, "", "memory counts for a ZeRO that trains: the bf16 run must reduce, step and gather as the fp32 runs do"};
    const double psi = mine.summary.value("params", 0.0);
    for (const auto& rank : per_rank(mine)) {
      const auto& pm = rank["peak_memory"];
      const int r = rank.value("rank", 0);
      const double params = pm.value("params", 0.0), grads = pm.value("grads", 0.0), state = pm.value("optim_state", 0.0);
      const double measured = params + grads + state;
      // the working set the formula leaves out: ZeRO-2 holds a unit's whole gradients while it reduces
      // them, and GPT's root unit (the tied embedding, whose gradient the lm_head starts) all through backward
      const auto& rep = mine.summary["strategy_report"];
      const double ws = zero == "zero2" ? 2.0 * (rep.value("unit0_elements", 0.0) + rep.value("largest_unit_elements", 0.0)) : 0.0;
      const double k = zero == "zero1" ? 4 + 12.0 / n : 2 + 14.0 / n;
      const double expected = k * psi + ws;
      const std::string formula = zero == "zero1" ? "4Ψ + 12Ψ/N" : "2Ψ + 14Ψ/N + the unit in flight";
      const PluginHeld held = plugin_held(rank, psi, n);
      detail += fmt::format("{}N = {}, rank {}: params {:.0f} + grads {:.0f} + optimizer state {:.0f} = {:.0f} bytes; {} = {:.0f} ({:+.1f} %)",
                            detail.empty() ? "" : "\n", n, r, params, grads, state, measured, formula, expected, 100 * (measured / expected - 1));
      if (!held.method.empty())
        detail += fmt::format("; your plugin's own process: {:.0f} bytes at its peak beyond its host and the state buffers (measured by {}; "
                              "a ZeRO's working copies: at most {:.0f})",
                              held.own, held.method == "cgroup" ? "its memory cgroup" : "resident sets", held.allowed);
      if (held.own > held.allowed)
        return {false,
                fmt::format("{} on {} ranks (Ψ = {:.0f}): your plugin's own process holds only working copies, at most 4Ψ/N + {:.0f} x the largest "
                            "message + {:.0f} MiB = {:.0f} bytes (rank {})",
                            zero, n, psi, kMessages, kSlackBytes / (1 << 20), held.allowed, r),
                fmt::format("{:.0f} bytes ({:.1f}x Ψ, {:.2f}x the model state the trainer counted)", held.own, held.own / psi, held.own / measured),
                detail,
                "memory your plugin keeps in its own vectors counts as this rank's: optimizer state, master weights or whole gradients held "
                "there are what ZeRO shards. Keep the state in step.state buffers, for your part only, and let go of each flat's whole "
                "gradient once its part is kept"};
      // ZeRO-2: the collectives' buffers the trainer holds for this rank (a reduction's padded input and its
      // part, from its start to its wait). A design that waits for a unit's reductions while the next unit
      // computes holds at most two units' (this one's, starting, and the previous one's, finishing): 4 bytes
      // x (1 + 1/N) of their elements. Reductions left in flight until backward ends hold the whole gradient
      // there, uncounted by the model state above: ZeRO-2's point lost. (ZeRO-1 keeps whole gradients anyway.)
      if (zero == "zero2") {
        const double unit0 = rep.value("unit0_elements", 0.0), largest = rep.value("largest_unit_elements", 0.0);
        const double comm = pm.value("comm_buffers", 0.0), comm_allowed = 4.0 * (1.0 + 1.0 / n) * (largest + std::max(largest, unit0)) + kSlackBytes;
        detail += fmt::format("; collective buffers in flight at their peak {:.0f} bytes (two units' at a time: at most {:.0f})", comm, comm_allowed);
        if (comm > comm_allowed)
          return {false,
                  fmt::format("{} on {} ranks: the reductions in flight hold at most two units' gradients at a time (this unit's and the "
                              "previous one's), {:.0f} bytes (rank {})",
                              zero, n, comm_allowed, r),
                  fmt::format("{:.0f} bytes ({:.1f}x)", comm, comm / comm_allowed), detail,
                  "a reduction in flight holds its whole padded gradient in the trainer until you wait for it: wait for a unit's reductions "
                  "while the next unit computes, not all at the end of backward (then every gradient is whole at once, as in DDP)"};
      }
      if (std::abs(measured / expected - 1) <= 0.05) continue;
      CheckResult bad{false, fmt::format("{} on {} ranks (Ψ = {:.0f} parameters): model state {} = {:.0f} bytes within 5 % on every rank (rank {})",
                                         zero, n, psi, formula, expected, r),
                      fmt::format("{:.0f} bytes ({:+.1f} %)", measured, 100 * (measured / expected - 1)), detail};
      const double state_per_rank = 12.0 * psi / n;
      if (state > 1.5 * state_per_rank)
        bad.hint = fmt::format("the optimizer holds {:.0f} bytes of state on this rank, {:.1f}x the 12Ψ/N = {:.0f} of a 1/{} part: every rank steps "
                               "(much) more than its own part. Keep only your part of each flat",
                               state, state / state_per_rank, state_per_rank, n);
      else if (state < 0.5 * state_per_rank)
        bad.hint = "almost no optimizer state was counted: AdamW's master weights and moments live in step.state buffers, 12 bytes per "
                   "element this rank owns";
      else if (zero == "zero2" && grads > 1.5 * (2.0 * psi / n + ws))
        bad.hint = "whole gradients stay alive: in ZeRO-2 each flat is reduced (and its whole gradient freed) in zero2_reduce, during backward";
      return bad;
    }
  }
  return {true, "", "", detail};
}

}  // namespace checks04

std::map<std::string, CheckDef> lab04_checks() {
  using namespace checks04;
  return {
      {"partition", {partition}},
      {"adamw", {adamw}},
      // training jobs: each student job's limit comes from the engine's own run of the same job
      {"zero1_equals_ddp", {zero1_equals_ddp, true}},
      {"zero2_equals_ddp", {zero2_equals_ddp, true}},
      {"zero2_overlaps", {zero2_overlaps, true}},
      {"comm_equals_ddp", {comm_equals_ddp, true}},
      {"zero1_memory", {[](CheckContext& c) { return memory(c, "zero1"); }, true}},
      {"zero2_memory", {[](CheckContext& c) { return memory(c, "zero2"); }, true}},
  };
}

}  // namespace distlab::grader
