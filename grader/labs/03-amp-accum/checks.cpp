// Lab 03's checks. The scaler and clipping are called directly in the student's sandboxed host, fed
// inputs computed here by the engine (an fp16 backward whose gradient underflows, a scripted overflow
// pattern, gradients with an inf on one rank), and compared with the engine's own GradScaler and
// clip_grad_norm. train_step is checked in real training jobs (grader/jobs.h): the trainer runs every
// micro-batch and optimizer step the student asks for and records losses, lrs and loss scales where the
// plugin can't reach them.
// Read next: bridge.cpp beside it (the trainer's side of a step), then host.cpp (the plugin's).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <random>

#include "core/optim/grad_scaler.h"
#include "core/optim/optimizer.h"
#include "core/optim/underflow_case.h"
#include "grader/check.h"
#include "grader/jobs.h"

namespace distlab::grader {

namespace checks03 {  // named: a unity build (CMakeLists.txt) puts several labs' checks in one unit

struct Config {
  float init_scale = 65536, growth = 2, backoff = 0.5f;
  int32_t interval = 2000;
};
struct State {
  float scale = 0;
  int32_t tracker = 0;
};

void put_config(std::vector<char>& v, const Config& c) {
  for (float x : {c.init_scale, c.growth, c.backoff}) v.insert(v.end(), reinterpret_cast<const char*>(&x), reinterpret_cast<const char*>(&x) + 4);
  v.insert(v.end(), reinterpret_cast<const char*>(&c.interval), reinterpret_cast<const char*>(&c.interval) + 4);
}
void put_state(std::vector<char>& v, const State& s) {
  v.insert(v.end(), reinterpret_cast<const char*>(&s.scale), reinterpret_cast<const char*>(&s.scale) + 4);
  v.insert(v.end(), reinterpret_cast<const char*>(&s.tracker), reinterpret_cast<const char*>(&s.tracker) + 4);
}
void put_grads(std::vector<char>& v, const std::vector<std::vector<float>>& grads) {
  for (const auto& g : grads) {
    const int64_t n = int64_t(g.size());
    v.insert(v.end(), reinterpret_cast<const char*>(&n), reinterpret_cast<const char*>(&n) + 8);
  }
  for (const auto& g : grads) v.insert(v.end(), reinterpret_cast<const char*>(g.data()), reinterpret_cast<const char*>(g.data() + g.size()));
}

// The largest message a plugin's answer (or request) may be here: what it was given (every answer of this
// lab is a scaler state or the gradients it got, an all_reduce of them at most) plus room for an exception's
// text. Anything larger is refused before the grader allocates for it.
uint64_t answer_limit(size_t in_bytes) { return uint64_t(in_bytes) + (uint64_t(64) << 10); }

// One call into one plugin, waiting for its answer (no collectives on the way).
std::vector<char> call(CheckContext& ctx, PluginProcess& p, std::initializer_list<int64_t> args, const std::vector<char>& in,
                       const std::string& during) {
  wire::Frame f;
  f.op = labproto::kCall;
  int k = 0;
  for (int64_t a : args) f.arg[k++] = a;
  p.send(f, in.data(), in.size(), ctx.deadline, during.c_str());
  std::vector<char> out;
  p.receive(f, out, ctx.deadline, during.c_str(), answer_limit(in.size()));
  if (f.op == labproto::kRaised)
    throw CheckAbort("error", fmt::format("{} threw: {}", during, sanitize_output(std::string(out.begin(), out.end()), 1500)));
  if (f.op == labproto::kAllReduce)
    throw CheckAbort("error", during + " asked for an all_reduce: only unscale_ talks to the other ranks");
  if (f.op != labproto::kReturn) throw CheckAbort("error", during + " sent a broken answer");
  return out;
}

State read_state(const std::vector<char>& out, const std::string& during) {
  if (out.size() != 8) throw CheckAbort("error", during + " returned a broken ScalerState");
  State s;
  std::memcpy(&s.scale, out.data(), 4);
  std::memcpy(&s.tracker, out.data() + 4, 4);
  return s;
}

// unscale_ on one plugin per rank at once; their all_reduces meet here: the k-th all_reduce of every rank
// is reduced with the others' k-th. Returns each rank's found_inf and gradients, or sets `why` when the
// ranks disagree about the collectives (one returns while another waits in an all_reduce).
struct Unscaled {
  bool found_inf = false;
  std::vector<float> grad;
};
std::vector<Unscaled> unscale_ranks(CheckContext& ctx, std::vector<std::unique_ptr<PluginProcess>>& procs, const State& s,
                                    const std::vector<std::vector<float>>& per_rank, std::string& why) {
  const int world = int(procs.size());
  const std::string during = "unscale_";
  for (int r = 0; r < world; r++) {
    std::vector<char> in;
    put_state(in, s);
    put_grads(in, {per_rank[size_t(r)]});
    wire::Frame f;
    f.op = labproto::kCall;
    const int64_t args[] = {labproto::kUnscale, r, world, 1};
    for (int k = 0; k < 4; k++) f.arg[k] = args[k];
    procs[size_t(r)]->send(f, in.data(), in.size(), ctx.deadline, during.c_str());
  }
  std::vector<Unscaled> res(static_cast<size_t>(world));
  std::vector<bool> done(static_cast<size_t>(world), false);
  for (int round = 0; round < 64; round++) {
    std::vector<std::vector<char>> reduce(static_cast<size_t>(world));
    std::vector<int64_t> ops(static_cast<size_t>(world), -1);
    for (int r = 0; r < world; r++) {
      if (done[size_t(r)]) continue;
      wire::Frame f;
      std::vector<char> payload;
      procs[size_t(r)]->receive(f, payload, ctx.deadline, during.c_str(), answer_limit(4 + per_rank[size_t(r)].size() * 4));
      if (f.op == labproto::kRaised)
        throw CheckAbort("error", fmt::format("rank {}'s unscale_ threw: {}", r, sanitize_output(std::string(payload.begin(), payload.end()), 1500)));
      if (f.op == labproto::kReturn) {
        if (payload.size() != 4 + per_rank[size_t(r)].size() * 4) throw CheckAbort("error", "unscale_ returned a broken answer");
        int32_t found;
        std::memcpy(&found, payload.data(), 4);
        res[size_t(r)].found_inf = found != 0;
        res[size_t(r)].grad.resize(per_rank[size_t(r)].size());
        std::memcpy(res[size_t(r)].grad.data(), payload.data() + 4, payload.size() - 4);
        done[size_t(r)] = true;
      } else if (f.op == labproto::kAllReduce && payload.size() % 4 == 0 && f.arg[0] >= 0 && f.arg[0] <= 2) {
        reduce[size_t(r)] = std::move(payload);
        ops[size_t(r)] = f.arg[0];
      } else {
        throw CheckAbort("error", fmt::format("rank {}'s unscale_ sent a request this lab has no use for", r));
      }
    }
    int waiting = 0;
    for (int r = 0; r < world; r++) waiting += ops[size_t(r)] >= 0;
    if (waiting == 0) return res;
    if (waiting != world) {
      why = "one rank returned while another waits in an all_reduce: every rank must ask for the same all_reduces";
      return res;
    }
    for (int r = 1; r < world; r++)
      if (reduce[size_t(r)].size() != reduce[0].size() || ops[size_t(r)] != ops[0]) {
        why = "the ranks asked for all_reduces of different sizes or ops";
        return res;
      }
    const size_t n = reduce[0].size() / 4;
    std::vector<float> acc(n, ops[0] == 2 ? -INFINITY : 0.0f);
    for (int r = 0; r < world; r++) {
      const float* x = reinterpret_cast<const float*>(reduce[size_t(r)].data());
      for (size_t i = 0; i < n; i++) acc[i] = ops[0] == 2 ? std::max(acc[i], x[i]) : acc[i] + x[i];
    }
    if (ops[0] == 1)
      for (auto& v : acc) v /= float(world);
    for (int r = 0; r < world; r++) {
      wire::Frame a;
      a.op = labproto::kData;
      procs[size_t(r)]->send(a, acc.data(), n * 4, ctx.deadline, during.c_str());
    }
  }
  why = "unscale_ asked for more than 64 all_reduces: one (MAX of the found-inf flag) is enough";
  return res;
}

std::vector<std::unique_ptr<PluginProcess>> start(CheckContext& ctx, int world) {
  std::vector<std::unique_ptr<PluginProcess>> procs;
  for (int r = 0; r < world; r++) procs.push_back(std::make_unique<PluginProcess>(ctx.launch(fmt::format("rank {}'s plugin", r))));
  for (auto& p : procs) p->wait_ready(ctx.deadline);
  return procs;
}

// ---- 1. the scaler rescues an fp16 gradient that underflows ----

// init_scale drawn per grading (2^14 .. 2^18): a scale written into the code is not the config's
CheckResult rescue(CheckContext& ctx) {
  auto procs = start(ctx, 1);
  auto gen = ctx.rng({3, 1});
  Config config;
  config.init_scale = float(1 << (14 + int(gen() % 5)));
  const State s = read_state(call(ctx, *procs[0], {labproto::kScalerInit}, [&] {
                               std::vector<char> v;
                               put_config(v, config);
                               return v;
                             }(), fmt::format("scaler_init(init_scale {})", config.init_scale)),
                             "scaler_init");
  const auto ref = underflow_case_gradient(DType::f32, 1.0f);
  const auto lost = underflow_case_gradient(DType::f16, 1.0f);
  int survived_unscaled = 0;
  for (float v : lost) survived_unscaled += v != 0.0f;
  if (!(s.scale >= 1.0f) || !std::isfinite(s.scale))
    return {false, fmt::format("scaler_init(init_scale {0}) starts at scale {0}", config.init_scale), fmt::format("scale {}", s.scale), ""};
  std::string why;
  auto out = unscale_ranks(ctx, procs, s, {underflow_case_gradient(DType::f16, s.scale)}, why);
  if (!why.empty()) return {false, "unscale_ on one rank", why, ""};
  double ref_max = 0, err = 0;
  int zeros = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    ref_max = std::max(ref_max, double(std::abs(ref[i])));
    err = std::max(err, double(std::abs(out[0].grad[i] - ref[i])));
    zeros += out[0].grad[i] == 0.0f;
  }
  const std::string story = fmt::format("(the true gradient peaks at {:.2e}, under fp16's 2^-24 = 5.96e-08: without scaling {} of {} "
                                        "values survive)",
                                        ref_max, survived_unscaled, ref.size());
  if (out[0].found_inf) return {false, "no overflow found in a finite gradient", "unscale_ returned true", story};
  if (err <= 0.01 * ref_max) {
    if (s.scale == config.init_scale) return {true, "", "", story};
    return {false, fmt::format("scaler_init(init_scale {0}) starts at scale {0}", config.init_scale), fmt::format("scale {}", s.scale), story,
            "the scaler starts from the config's init_scale (GradScaler(init_scale=...)): a scale written into the code is another config's"};
  }
  CheckResult bad{false, "the fp16 gradient, scaled by your scale and unscaled, within 1 % of the f32 gradient " + story,
                  fmt::format("off by {:.2e} ({} values are 0)", err, zeros), ""};
  if (s.scale == 1.0f) bad.hint = "a scale of 1 is no scaling: start from init_scale";
  else if (err > 0.5 * ref_max) bad.hint = "unscale_ must divide every gradient by the scale, in f32";
  return bad;
}

// ---- 2. the scale sequence over a scripted overflow pattern ----

CheckResult sequence(CheckContext& ctx) {
  auto procs = start(ctx, 1);
  struct Case {
    Config c;
    double p;
  };
  for (const Case& cs : {Case{{65536, 2, 0.5f, 3}, 0.15}, Case{{65536, 2, 0.5f, 1}, 0.3}, Case{{1024, 4, 0.25f, 7}, 0.05},
                         Case{{2.0f, 1.5f, 0.7f, 2}, 0.2}, Case{{3e38f, 2, 0.5f, 1}, 0.0}}) {
    std::vector<char> in;
    put_config(in, cs.c);
    State s = read_state(call(ctx, *procs[0], {labproto::kScalerInit}, in, "scaler_init"), "scaler_init");
    LossScaleOptions o;
    o.mode = LossScaleOptions::Mode::dynamic;
    o.init_scale = cs.c.init_scale;
    o.growth_factor = cs.c.growth;
    o.backoff_factor = cs.c.backoff;
    o.growth_interval = cs.c.interval;
    o.min_scale = 1e-38;
    GradScaler ref(o);
    auto gen = ctx.rng({cs.c.interval, int64_t(cs.p * 100)});  // the overflow pattern: drawn per grading
    std::bernoulli_distribution b(cs.p);
    std::string pattern;
    const std::string setup = fmt::format("init_scale {}, growth_factor {}, backoff_factor {}, growth_interval {}", cs.c.init_scale,
                                          cs.c.growth, cs.c.backoff, cs.c.interval);
    if (s.scale != ref.scale() || s.tracker != 0)
      return {false, fmt::format("{}: scaler_init gives scale {}, tracker 0", setup, ref.scale()),
              fmt::format("scale {}, tracker {}", s.scale, s.tracker), ""};
    for (int step = 1; step <= 120; step++) {
      const bool inf = b(gen);
      pattern += inf ? 'X' : '.';
      std::vector<char> req;
      put_config(req, cs.c);
      put_state(req, s);
      s = read_state(call(ctx, *procs[0], {labproto::kScalerUpdate, inf ? 1 : 0}, req, "scaler_update"), "scaler_update");
      ref.update(inf);
      if (s.scale == ref.scale() && s.tracker == ref.growth_tracker()) continue;
      CheckResult bad{false,
                      fmt::format("{}: after the steps {} (X = overflow), scale {} and growth_tracker {}", setup,
                                  pattern.size() > 40 ? "..." + pattern.substr(pattern.size() - 40) : pattern, ref.scale(), ref.growth_tracker()),
                      fmt::format("scale {}, growth_tracker {}", s.scale, s.tracker), ""};
      if (inf && s.scale >= ref.scale() * 1.5f) bad.hint = "on an overflow the scale must back off: scale x backoff_factor, tracker 0";
      else if (!inf && s.scale < ref.scale()) bad.hint = "after growth_interval clean steps in a row the scale grows: x growth_factor, tracker 0";
      else if (!inf && std::isinf(s.scale)) bad.hint = "never grow the scale to inf: keep it when scale x growth_factor is not finite";
      else if (s.tracker != ref.growth_tracker()) bad.hint = "the tracker counts clean steps since the scale last changed: +1 per clean step, 0 after a change or an overflow";
      return bad;
    }
  }
  return {true, "", "", "5 configurations x 120 steps with overflows drawn for this grading: every scale and growth_tracker as "
                        "torch.cuda.amp.GradScaler's"};
}

// ---- 3. an overflow on one rank is every rank's ----

// Each world runs kDraws scenarios drawn from the grading's seed: which rank (if any) holds the overflow,
// where, whether it is an inf or a NaN, the scale and the gradients. At least one draw of each world is
// clean and one is not, in an order no submission can know: a rank without the inf can only learn of it
// through the all-reduce.
constexpr int kDraws = 6;

CheckResult overflow_everywhere(CheckContext& ctx) {
  for (int world : {2, 3}) {
    auto procs = start(ctx, world);
    auto gen = ctx.rng({3, world});
    std::vector<int> bad_ranks = {-1, int(gen() % uint64_t(world))};
    while (int(bad_ranks.size()) < kDraws) bad_ranks.push_back(int(gen() % uint64_t(world + 1)) - 1);
    std::shuffle(bad_ranks.begin(), bad_ranks.end(), gen);
    for (int bad_rank : bad_ranks) {
      const int n = 17 + int(gen() % 40), at = int(gen() % uint64_t(n));
      const bool nan = gen() % 2;
      const State s{std::ldexp(1.0f, 4 + int(gen() % 20)), int32_t(gen() % 7)};  // a power of two: the division is exact
      std::vector<std::vector<float>> g(static_cast<size_t>(world));
      for (int r = 0; r < world; r++) {
        g[size_t(r)].resize(size_t(n));
        for (auto& x : g[size_t(r)]) x = float(int(gen() % 2001) - 1000) * 64.0f;
        if (r == bad_rank) g[size_t(r)][size_t(at)] = nan ? NAN : INFINITY;
      }
      std::string why;
      auto out = unscale_ranks(ctx, procs, s, g, why);
      const std::string setup = bad_rank < 0 ? fmt::format("{} ranks, all gradients finite (scale {})", world, s.scale)
                                             : fmt::format("{} ranks, rank {} holds an {} (scale {})", world, bad_rank, nan ? "NaN" : "inf", s.scale);
      if (!why.empty()) return {false, setup + ": unscale_ returns on every rank", why, ""};
      for (int r = 0; r < world; r++) {
        if (out[size_t(r)].found_inf != (bad_rank >= 0))
          return {false, fmt::format("{}: every rank's unscale_ returns {}", setup, bad_rank >= 0),
                  fmt::format("rank {} returned {}", r, out[size_t(r)].found_inf), "",
                  bad_rank >= 0 ? "one rank's overflow is every rank's: all_reduce the found-inf flag with ReduceOp::max, or the ranks "
                                  "skip different steps and the replicas split"
                                : "a finite gradient is no overflow: test std::isfinite after dividing"};
        for (int i = 0; i < n; i++) {
          const float want = g[size_t(r)][size_t(i)] / s.scale;
          if (r == bad_rank && i == at) continue;
          if (out[size_t(r)].grad[size_t(i)] != want)
            return {false, fmt::format("{}: rank {}'s gradient {} divided by the scale {}: {}", setup, r, i, s.scale, want),
                    fmt::format("{}", out[size_t(r)].grad[size_t(i)]), "", "unscale_ divides every gradient by s.scale, in place"};
        }
      }
    }
  }
  return {true, "", "", fmt::format("2 and 3 ranks, {} draws each (an inf or a NaN on a drawn rank, or none): every rank agreed, every "
                                    "gradient divided exactly",
                                    kDraws)};
}

// ---- 4. clip_grad_norm ----

CheckResult clipping(CheckContext& ctx) {
  auto procs = start(ctx, 1);
  Runtime rt;
  auto gen = ctx.rng({3, 4});  // the values drawn per grading
  // the last case's gradients are tiny (norm ~1e-5): there max_norm / norm and max_norm / (norm + 1e-6), the
  // formula's, are 8 % apart, where at a norm of 3 they are 3e-7 apart
  for (auto [max_norm, sigma] : {std::pair{0.5, 0.3f}, std::pair{1e6, 0.3f}, std::pair{0.0, 0.3f}, std::pair{2.0, 0.3f}, std::pair{1e-6, 1e-6f}}) {
    std::normal_distribution<float> nd(0.0f, sigma);
    std::vector<std::vector<float>> g = {std::vector<float>(100), std::vector<float>(1), std::vector<float>(0), std::vector<float>(37)};
    for (auto& v : g)
      for (auto& x : v) x = nd(gen);
    // the engine's clip_grad_norm on the same values
    std::vector<Parameter> ps(g.size());
    std::vector<Parameter*> pp;
    for (size_t k = 0; k < g.size(); k++) {
      ps[k].data = rt.zeros({int64_t(g[k].size())}, Category::params);
      ps[k].grad = rt.empty({int64_t(g[k].size())}, Category::grads);
      if (!g[k].empty()) std::memcpy(ps[k].grad.data(), g[k].data(), g[k].size() * 4);
      pp.push_back(&ps[k]);
    }
    const double want_norm = clip_grad_norm(rt, pp, max_norm);
    std::vector<char> in(8);
    std::memcpy(in.data(), &max_norm, 8);
    put_grads(in, g);
    const auto out = call(ctx, *procs[0], {labproto::kClipGradNorm, int64_t(g.size())}, in, fmt::format("clip_grad_norm(max_norm {})", max_norm));
    size_t total = 0;
    for (auto& v : g) total += v.size();
    if (out.size() != 8 + total * 4) throw CheckAbort("error", "clip_grad_norm returned a broken answer");
    double norm;
    std::memcpy(&norm, out.data(), 8);
    if (std::abs(norm - want_norm) > 1e-6 * want_norm)
      return {false, fmt::format("max_norm {}: the norm before clipping, {:.6g}", max_norm, want_norm), fmt::format("{:.6g}", norm), "",
              "the global L2 norm: sqrt of the sum of squares over EVERY gradient, accumulated in double"};
    size_t at = 8;
    for (size_t k = 0; k < g.size(); k++)
      for (size_t i = 0; i < g[k].size(); i++, at += 4) {
        float got;
        std::memcpy(&got, out.data() + at, 4);
        const float want = ps[k].grad.f32()[i];
        if (std::abs(got - want) > 1e-6f * std::max(sigma > 1e-3f ? 1.0f : 1e-5f, std::abs(want)))
          return {false, fmt::format("max_norm {} (norm {:.4g}): gradient {}[{}] = {:.6g}", max_norm, want_norm, k, i, want),
                  fmt::format("{:.6g}", got), "",
                  max_norm <= 0 ? "max_norm 0 means no clipping" : "above max_norm, every gradient x max_norm / (norm + 1e-6); below it, untouched"};
      }
  }
  return {true, "", "", "max_norm 0.5, 1e6, 0 and 2 over 4 tensors, and 1e-6 over gradients of ~1e-6: the norm and every gradient as "
                        "torch.nn.utils.clip_grad_norm_'s (the + 1e-6 included)"};
}

// ---- 5-7. train_step in training jobs ----

// k micro-batches of 128 / k (k drawn: 2, 4 or 8) against the engine's one batch of 128 with a step schedule (the lr halves
// every 5 optimizer steps), in fp32: the curves agree to 1e-5. Twice: unclipped, where a gradient k times
// too large shows at once, and clipped at 0.5 (the norm is above it), where clipping the scaled gradient
// shows — and where a clip would hide a missing 1/k, since it rescales any gradient to the same norm.
const std::vector<std::string> kAccum = {"precision.mode=fp32", "optim.lr=0.002", "optim.schedule=step", "optim.step_size=5",
                                         "optim.gamma=0.5", "train.steps=15"};

struct Curve {
  double worst = 0;
  size_t at = 0;
  bool same_length = false;
};
Curve compare_curves(const Job& ref, const Job& mine) {
  Curve c;
  c.same_length = mine.losses.size() == ref.losses.size();
  for (size_t i = 0; i < std::min(ref.losses.size(), mine.losses.size()); i++) {
    const double d = std::abs(ref.losses[i] - mine.losses[i]) / std::abs(ref.losses[i]);
    if (!(d <= c.worst)) {
      c.worst = d;
      c.at = i;
    }
  }
  return c;
}

// k, drawn per grading (2, 4 or 8 micro-batches of 128 / k): a 1/k written as a constant meets one of them
int64_t drawn_k(const CheckContext& ctx) {
  auto gen = ctx.rng({3, 9});
  return int64_t(2) << (gen() % 3);
}
std::string accum_set(const CheckContext& ctx) { return fmt::format("train.accum_steps={}", drawn_k(ctx)); }

CheckResult accumulation(CheckContext& ctx) {
  const int64_t k = drawn_k(ctx);
  for (const std::string clip : {"0", "0.5"}) {
    const auto sets = with(kAccum, "optim.clip_grad_norm=" + clip);
    const Job& ref = job(ctx, "accum-ref-" + clip, 1, false, with(sets, "train.accum_steps=1"));
    const Job& mine = job(ctx, "accum-" + clip, 1, true, with(sets, accum_set(ctx)));
    const Curve c = compare_curves(ref, mine);
    if (c.same_length && c.worst < 1e-5) continue;
    const std::string setup = clip == "0" ? "unclipped" : "clipped at 0.5";
    CheckResult bad{false, fmt::format("{}: {} micro-batches of {} follow one batch of 128 within 1e-5 relative (step {}: {:.6f})", setup, k,
                                       128 / k, c.at + 1, ref.losses.empty() ? 0.0 : ref.losses[c.at]),
                    !c.same_length ? fmt::format("{} steps instead of {}", mine.losses.size(), ref.losses.size())
                                   : fmt::format("{:.6f} at step {} ({:.1e} relative)", mine.losses[c.at], c.at + 1, c.worst),
                    ""};
    if (mine.lrs != ref.lrs) bad.hint = "the lr schedule differs: call scheduler_step once per optimizer step, after the step";
    else if (clip == "0")
      bad.hint = "the big batch's loss is the MEAN of the micro-batches' losses: each backward carries loss_factor = scale / k, "
                 "and the gradients are divided by the scale before the step";
    else bad.hint = "clip once, after the last micro-batch and AFTER unscaling: the threshold is about the true gradient";
    return bad;
  }
  std::string detail;
  for (const std::string clip : {"0", "0.5"}) {
    const Curve c = compare_curves(job(ctx, "accum-ref-" + clip, 1, false, with(with(kAccum, "optim.clip_grad_norm=" + clip), "train.accum_steps=1")),
                                   job(ctx, "accum-" + clip, 1, true, with(with(kAccum, "optim.clip_grad_norm=" + clip), accum_set(ctx))));
    detail += fmt::format("{}{}: {:.1e} from one batch of 128 at worst", detail.empty() ? fmt::format("k = {}, ", k) : "; ",
                          clip == "0" ? "unclipped" : "clipped at 0.5", c.worst);
  }
  return {true, "", "", detail};
}

CheckResult schedule(CheckContext& ctx) {
  const auto sets = with(kAccum, "optim.clip_grad_norm=0");
  const Job& ref = job(ctx, "accum-ref-0", 1, false, with(sets, "train.accum_steps=1"));
  const Job& mine = job(ctx, "accum-0", 1, true, with(sets, accum_set(ctx)));
  for (size_t i = 0; i < ref.lrs.size(); i++) {
    if (i < mine.lrs.size() && std::abs(mine.lrs[i] - ref.lrs[i]) <= 1e-12) continue;
    return {false, fmt::format("the lr of optimizer step {}: {} (halved every 5 optimizer steps)", i + 1, ref.lrs[i]),
            i < mine.lrs.size() ? fmt::format("{}", mine.lrs[i]) : std::string("no such step"), "",
            i < mine.lrs.size() && mine.lrs[i] < ref.lrs[i] ? "the schedule advances per micro-batch: scheduler_step once per optimizer step"
                                                            : "call scheduler_step once per optimizer step (PyTorch's scheduler.step())"};
  }
  return {true, "", "", fmt::format("{} optimizer steps of {} micro-batches: every lr the schedule's (last {:g})", ref.lrs.size(), drawn_k(ctx),
                                    ref.lrs.empty() ? 0.0 : ref.lrs.back())};
}

// fp16 with the student's scaler against the engine's fp32, the lab's config at a global batch of 64 for
// 40 steps: 20-step means of the loss within 0.05. The engine's own fp16 is 0.00002 and 0.0001 off here
// (0.0009 in a third window, at 60 steps). Clipping before unscaling barely learns: at 60 steps it was 0.78
// off in the third window (2.31 against fp32's 1.53).
const std::vector<std::string> kFp16 = {"train.steps=40", "train.global_batch=64"};

CheckResult fp16_tracks(CheckContext& ctx) {
  const Job& ref = job(ctx, "fp32-ref", 1, false, with(kFp16, "precision.mode=fp32"));
  const Job& mine = job(ctx, "fp16", 1, true, with(kFp16, "precision.mode=fp16"));
  if (mine.losses.size() != ref.losses.size() || ref.losses.size() < 20)
    return {false, fmt::format("{} steps", ref.losses.size()), fmt::format("{} steps", mine.losses.size()), ""};
  double worst = 0;
  size_t at = 0;
  for (size_t w = 0; w + 20 <= ref.losses.size(); w += 20) {
    double a = 0, b = 0;
    for (size_t i = w; i < w + 20; i++) {
      a += ref.losses[i];
      b += mine.losses[i];
    }
    const double d = std::abs(a - b) / 20;
    if (!(d <= worst)) {
      worst = d;
      at = w;
    }
  }
  int skipped = 0;
  for (const auto& s : mine.steps) skipped += s.value("skipped", false);
  const std::string detail = fmt::format("{} of {} steps skipped; loss scale {} at the end", skipped, mine.steps.size(),
                                         mine.steps.empty() ? 0.0 : mine.steps.back().value("loss_scale", 0.0));
  if (worst < 0.05) return {true, "", "", detail};
  CheckResult bad{false, fmt::format("fp16 with your scaler follows fp32: 20-step means of the loss within 0.05 (steps {}-{}: fp32 {:.4f})",
                                     at + 1, at + 20, [&] {
                                       double a = 0;
                                       for (size_t i = at; i < at + 20; i++) a += ref.losses[i];
                                       return a / 20;
                                     }()),
                  fmt::format("{:.4f} off", worst), detail};
  if (mine.losses.back() > 0.9 * mine.losses.front())
    bad.hint = "it barely learns: unscale BEFORE clipping — the norm of the scaled gradient is scale times too large, so the clip "
               "shrinks the gradient by that factor";
  else if (skipped > int(mine.steps.size()) / 4)
    bad.hint = "too many skipped steps: the scale must back off on an overflow and only grow after growth_interval clean steps";
  return bad;
}

// The scaler inside train_step: a scale far too high (2^22-2^36, drawn per grading, not a power of two;
// backed off by a factor drawn from 0.1-0.5; grown every 3-12 clean steps, drawn too) makes the first
// 0-15 steps overflow; the scale then grows after each interval, and overflows again where a growth
// crosses the gradients' limit. Measured: seeds 1-4 of the narrower first draw (2^26-2^31) gave 4, 4, 5
// and 4 first skips, seed 4 none after them: a table of the old scenario's skips passed that draw. The student's run must skip the same steps as
// the engine's own fp16 run with the same settings, multiply each backward by the same scale (the trainer
// measures the loss factor), and end on the same curve (the solution's is the engine's to the bit). A
// train_step that never scales, never skips, never updates, or replays a table of skips passes none of it.
std::vector<std::string> overflow_scenario(CheckContext& ctx) {
  auto gen = ctx.rng({7});
  std::uniform_real_distribution<float> exponent(22.0f, 36.0f), backoff(0.1f, 0.5f);
  const float init = std::exp2(exponent(gen)), back = backoff(gen);
  const int interval = 3 + int(gen() % 10);
  return {"train.steps=30", "train.global_batch=64", "precision.mode=fp16", fmt::format("precision.init_scale={}", init),
          fmt::format("precision.backoff_factor={}", back), fmt::format("precision.growth_interval={}", interval)};
}

CheckResult scaler_drives_step(CheckContext& ctx) {
  const auto scenario = overflow_scenario(ctx);
  const Job& ref = job(ctx, "overflow-ref", 1, false, scenario);
  const Job& mine = job(ctx, "overflow", 1, true, scenario);
  if (mine.steps.size() != ref.steps.size())
    return {false, fmt::format("{} steps", ref.steps.size()), fmt::format("{} steps", mine.steps.size()), ""};
  std::string skips_ref, skips_mine;
  for (size_t i = 0; i < ref.steps.size(); i++) {
    skips_ref += ref.steps[i].value("skipped", false) ? 'S' : '.';
    skips_mine += mine.steps[i].value("skipped", false) ? 'S' : '.';
  }
  const std::string legend = fmt::format(" (S = skipped; {}, {}, {})", scenario[3], scenario[4], scenario[5]);
  for (size_t i = 0; i < ref.steps.size(); i++) {
    const double want = ref.steps[i].value("loss_scale", 0.0), got = mine.steps[i].value("loss_scale", 0.0);
    if (std::abs(got - want) > 1e-6 * want)
      return {false, fmt::format("step {}: backward multiplied by the scaler's scale {}", i + 1, want),
              fmt::format("{} (the loss factor you passed x k)", got), "",
              got == 1.0 ? "train_step must scale the loss: forward_backward(micro, s.scale / k)"
                         : "keep the scale the scaler has: scaler_update after every step, skipped or not"};
    if (skips_mine[i] != skips_ref[i])
      return {false, "these steps skipped: " + skips_ref + legend, skips_mine + legend, "",
              skips_ref[i] == 'S' ? "an overflow must skip the step on every rank: when unscale_ returns true, call skip_step, not "
                                    "optimizer_step"
                                  : "skip only when unscale_ found an inf or a NaN"};
  }
  double worst = 0;
  for (size_t i = 0; i < ref.losses.size() && i < mine.losses.size(); i++)
    worst = std::max(worst, std::abs(ref.losses[i] - mine.losses[i]) / std::abs(ref.losses[i]));
  if (worst < 1e-4) return {true, "", "", "skipped: " + skips_mine + legend};
  return {false, "the engine's fp16 curve with the same scaler within 1e-4 relative", fmt::format("{:.1e} off", worst), "",
          "unscale (divide by the scale) before clipping and stepping"};
}

}  // namespace checks03

std::map<std::string, CheckDef> lab03_checks() {
  using namespace checks03;
  return {
      {"scaler_rescues_underflow", {rescue}},
      {"scale_sequence", {sequence}},
      {"overflow_skipped_on_every_rank", {overflow_everywhere}},
      {"clip_grad_norm", {clipping}},
      // training jobs: each student job's limit comes from the engine's own run of the same job
      {"accumulation_equals_big_batch", {accumulation, true}},
      {"schedule_once_per_step", {schedule, true}},
      {"fp16_tracks_fp32", {fp16_tracks, true}},
      {"scaler_drives_the_step", {scaler_drives_step, true}},
  };
}

}  // namespace distlab::grader
