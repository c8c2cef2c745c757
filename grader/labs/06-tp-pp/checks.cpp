// Lab 06's checks. The layers and the pipeline executor are asked of the student's plugin directly: t copies
// of it, each in its own sandboxed host, one per tensor-parallel rank, whose all-reduces are served here
// (summed, and counted) — the references are the whole Linear computed here in double; the executor runs
// for every stage of many pipelines, and its calls are checked against the engine's 1F1B order and matched
// across stages as blocking sends and receives would be (a deadlock named).
// Then training jobs, in training.cpp beside this file; lab06_checks(), at the bottom, names them all.
// Read next: training.cpp, bridge.cpp beside it (the trainer's side), then host.cpp (the plugin's).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "core/parallel/pipeline.h"
#include "grader/check.h"

namespace distlab::grader {

namespace checks06 {  // named: a unity build (CMakeLists.txt) puts several labs' checks in one unit

// ---- the layers, on t plugins at once ----

struct Ranks {
  std::vector<std::unique_ptr<PluginProcess>> p;
  Ranks(CheckContext& ctx, int t) {
    for (int r = 0; r < t; r++) p.push_back(std::make_unique<PluginProcess>(ctx.launch(fmt::format("tensor-parallel rank {}'s plugin", r))));
    for (auto& q : p) q->wait_ready(ctx.deadline);
  }
};

// One collective the ranks asked for: an all-reduce of n floats, an all-gather or a reduce-scatter of n per rank.
struct Coll {
  char op = 'A';  // 'A' all-reduce, 'G' all-gather, 'S' reduce-scatter
  int64_t n = 0;
  bool operator==(const Coll& o) const { return op == o.op && n == o.n; }
  bool operator!=(const Coll& o) const { return !(*this == o); }
};
std::string coll_name(char op) { return op == 'A' ? "all_reduce" : op == 'G' ? "all_gather" : "reduce_scatter"; }

struct Called {
  std::vector<std::vector<float>> out;  // each rank's answer, as floats
  std::vector<Coll> colls;              // the collectives, in order
  std::string mismatch;                 // the ranks did not ask for the same collectives
};

// Runs `fn` on every rank at once: each receives its own payload; their collectives are answered as the
// trainer's process group would — an all-reduce with the sum over the ranks (in rank order), an all-gather
// with every rank's floats in rank order, a reduce-scatter with this rank's part of the sum.
Called call_all(CheckContext& ctx, Ranks& ranks, labproto::Fn fn, int64_t rows, int64_t in, int64_t out, bool bias,
                const std::vector<std::vector<float>>& payloads, const std::string& during) {
  const int t = int(ranks.p.size());
  for (int r = 0; r < t; r++) {
    wire::Frame f;
    f.op = labproto::kCall;
    const int64_t args[] = {fn, r, t, rows, in, out, bias ? 1 : 0};
    for (int k = 0; k < 7; k++) f.arg[k] = args[k];
    ranks.p[size_t(r)]->send(f, payloads[size_t(r)].data(), payloads[size_t(r)].size() * 4, ctx.deadline, during.c_str());
  }
  // the largest answer or collective a rank may send: every output of the layer at once (y or dx, dW, db),
  // plus room for an exception's text; anything larger is refused before the grader allocates for it
  const uint64_t limit = 4 * (uint64_t(rows) * uint64_t(in + out) + uint64_t(in) * uint64_t(out) + uint64_t(out)) + (uint64_t(64) << 10);
  Called c;
  c.out.resize(size_t(t));
  std::vector<bool> done(static_cast<size_t>(t), false);
  for (;;) {
    std::vector<std::vector<float>> asked(static_cast<size_t>(t));
    std::vector<Coll> kind(static_cast<size_t>(t));
    std::vector<int> waiting, returned;
    for (int r = 0; r < t; r++) {
      if (done[size_t(r)]) {
        returned.push_back(r);
        continue;
      }
      wire::Frame f;
      std::vector<char> payload;
      ranks.p[size_t(r)]->receive(f, payload, ctx.deadline, during.c_str(), limit);
      if (f.op == labproto::kRaised)
        throw CheckAbort("error", fmt::format("rank {}'s {} threw: {}", r, during, sanitize_output(std::string(payload.begin(), payload.end()), 1500)));
      const bool coll = f.op == labproto::kAllReduce || f.op == labproto::kAllGather || f.op == labproto::kReduceScatter;
      if ((f.op != labproto::kReturn && !coll) || payload.size() % 4)
        throw CheckAbort("error", fmt::format("rank {}'s {} sent a broken request (opcode {})", r, during, f.op));
      std::vector<float> v(payload.size() / 4);
      if (!v.empty()) std::memcpy(v.data(), payload.data(), payload.size());
      if (f.op == labproto::kReturn) {
        done[size_t(r)] = true;
        c.out[size_t(r)] = std::move(v);
        returned.push_back(r);
        continue;
      }
      // the per-rank count the host put in the frame must describe the payload (the host checks it too)
      const int64_t n = int64_t(v.size());
      if (f.op == labproto::kAllGather) kind[size_t(r)] = {'G', n};
      else if (f.op == labproto::kReduceScatter) {
        if (n % t != 0 || f.arg[1] != n / t || f.arg[0] != 0)
          throw CheckAbort("error", fmt::format("rank {}'s {} sent a broken reduce_scatter ({} floats for n = {})", r, during, n, f.arg[1]));
        kind[size_t(r)] = {'S', n / t};
      } else kind[size_t(r)] = {'A', n};
      asked[size_t(r)] = std::move(v);
      waiting.push_back(r);
    }
    if (waiting.empty()) return c;
    if (!returned.empty()) {  // the others wait in a collective that rank `returned[0]` never joins: a hang in a real group
      const Coll& k = kind[size_t(waiting[0])];
      c.mismatch = fmt::format("rank {} asked for {} of {} floats that rank {} never joined (it returned): on a real group rank {} would wait forever",
                               waiting[0], coll_name(k.op), k.n, returned[0], waiting[0]);
      return c;
    }
    for (int r = 1; r < t; r++)
      if (kind[size_t(r)] != kind[0]) {
        c.mismatch = fmt::format("in the same collective rank 0 asked for {} of {} floats and rank {} for {} of {}", coll_name(kind[0].op),
                                 kind[0].n, r, coll_name(kind[size_t(r)].op), kind[size_t(r)].n);
        return c;
      }
    const Coll k = kind[0];
    std::vector<float> all;  // all-gather: every rank's floats; else the sum
    if (k.op == 'G') {
      for (int r = 0; r < t; r++) all.insert(all.end(), asked[size_t(r)].begin(), asked[size_t(r)].end());
    } else {
      all.assign(asked[0].size(), 0.0f);
      for (int r = 0; r < t; r++)
        for (size_t i = 0; i < all.size(); i++) all[i] += asked[size_t(r)][i];
    }
    for (int r = 0; r < t; r++) {
      wire::Frame a;
      a.op = labproto::kData;
      const float* at = k.op == 'S' ? all.data() + r * k.n : all.data();
      ranks.p[size_t(r)]->send(a, at, size_t(k.op == 'S' ? k.n : int64_t(all.size())) * 4, ctx.deadline, during.c_str());
    }
    c.colls.push_back(k);
  }
}

// The whole Linear y = x·Wᵀ + b and its gradients, in double: x (rows, IN), W (OUT, IN), dy (rows, OUT).
struct Whole {
  int64_t rows, IN, OUT;
  std::vector<float> x, w, b, dy;
  std::vector<double> y, dx, dw, db;
  Whole(int64_t rows_, int64_t in, int64_t out, uint32_t seed) : rows(rows_), IN(in), OUT(out) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto* v : {&x, &w, &b, &dy}) {
      const int64_t n = v == &x ? rows * IN : v == &w ? OUT * IN : v == &b ? OUT : rows * OUT;
      for (int64_t i = 0; i < n; i++) v->push_back(u(g));
    }
    y.assign(size_t(rows * OUT), 0.0);
    dx.assign(size_t(rows * IN), 0.0);
    dw.assign(size_t(OUT * IN), 0.0);
    db.assign(size_t(OUT), 0.0);
    for (int64_t i = 0; i < rows; i++)
      for (int64_t o = 0; o < OUT; o++) {
        double s = b[size_t(o)];
        const double d = dy[size_t(i * OUT + o)];
        for (int64_t k = 0; k < IN; k++) {
          s += double(x[size_t(i * IN + k)]) * w[size_t(o * IN + k)];
          dx[size_t(i * IN + k)] += d * w[size_t(o * IN + k)];
          dw[size_t(o * IN + k)] += d * x[size_t(i * IN + k)];
        }
        y[size_t(i * OUT + o)] = s;
        db[size_t(o)] += d;
      }
  }
};

// columns [c0, c0 + nc) of a (rows, cols) matrix
template <class T>
std::vector<T> cols(const std::vector<T>& m, int64_t rows, int64_t ncols, int64_t c0, int64_t nc) {
  std::vector<T> v;
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = c0; j < c0 + nc; j++) v.push_back(m[size_t(i * ncols + j)]);
  return v;
}
template <class T>
std::vector<T> rows_of(const std::vector<T>& m, int64_t ncols, int64_t r0, int64_t nr) {
  return std::vector<T>(m.begin() + r0 * ncols, m.begin() + (r0 + nr) * ncols);
}
std::vector<float> concat(std::initializer_list<std::vector<float>> parts) {
  std::vector<float> v;
  for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

// "" when got[at, at + want.size()) is want to f32 accuracy; else where it is not
std::string compare(const std::vector<float>& got, size_t at, const std::vector<double>& want, const char* name) {
  if (got.size() < at + want.size()) return fmt::format("{} is missing", name);
  for (size_t i = 0; i < want.size(); i++) {
    const double g = got[at + i];
    if (!(std::abs(g - want[i]) <= 1e-4 * (1 + std::abs(want[i]))))
      return fmt::format("{}[{}] = {:.6g} where the whole layer gives {:.6g}", name, i, g, want[i]);
  }
  return "";
}

std::string colls_text(const std::vector<Coll>& r) {
  if (r.empty()) return "no communication";
  std::string s;
  for (const Coll& c : r) s += fmt::format("{}{} of {} floats{}", s.empty() ? "" : ", ", coll_name(c.op), c.n, c.op == 'A' ? "" : " per rank");
  return s;
}
std::vector<Coll> all_reduces(int64_t n) { return n ? std::vector<Coll>{{'A', n}} : std::vector<Coll>{}; }

constexpr int64_t kRows = 6, kIn = 16, kOut = 12;  // both split over 2 and 4

CheckResult layer_check(CheckContext& ctx, bool column) {
  const char* fwd = column ? "column_forward" : "row_forward";
  const char* bwd = column ? "column_backward" : "row_backward";
  for (int t : {2, 4}) {
    const Whole W(kRows, kIn, kOut, 1234u + uint32_t(t));
    Ranks ranks(ctx, t);
    const int64_t in = column ? kIn : kIn / t, out = column ? kOut / t : kOut;
    // each rank's slice: column — W's rows (its outputs), b's entries; row — W's columns (its inputs), b whole
    std::vector<std::vector<float>> fin(static_cast<size_t>(t)), bin(static_cast<size_t>(t));
    for (int r = 0; r < t; r++) {
      const std::vector<float> w = column ? rows_of(W.w, kIn, r * out, out) : cols(W.w, kOut, kIn, r * in, in);
      const std::vector<float> x = column ? W.x : cols(W.x, kRows, kIn, r * in, in);
      const std::vector<float> b = column ? rows_of(W.b, 1, r * out, out) : W.b;
      const std::vector<float> dy = column ? cols(W.dy, kRows, kOut, r * out, out) : W.dy;
      fin[size_t(r)] = concat({x, w, b});
      bin[size_t(r)] = concat({x, w, dy});
    }
    const std::string setup = fmt::format("t = {}, rows {}, in {}, out {} on each rank", t, kRows, in, out);
    const int64_t want_fwd = column ? 0 : kRows * kOut, want_bwd = column ? kRows * kIn : 0;
    // forward
    const Called f = call_all(ctx, ranks, column ? labproto::kTpColumnForward : labproto::kTpRowForward, kRows, in, out, true, fin,
                              fmt::format("{} ({})", fwd, setup));
    if (!f.mismatch.empty()) return {false, fmt::format("{} ({}): every rank asks for the same collectives", fwd, setup), f.mismatch, ""};
    for (int r = 0; r < t; r++) {
      const std::vector<double> want = column ? cols(W.y, kRows, kOut, r * out, out) : W.y;
      if (std::string bad = compare(f.out[size_t(r)], 0, want, "y"); !bad.empty()) {
        CheckResult res{false, fmt::format("{} ({}), rank {}: {}", fwd, setup, r, column ? "its outputs of the whole layer" : "the whole layer's output"),
                        bad + fmt::format(" ({})", colls_text(f.colls)), ""};
        if (!column && f.colls.empty()) res.hint = "each rank holds one term of y = Σ_r x_r·W_rᵀ: all-reduce it";
        else if (!column) res.hint = "the bias once, after the all-reduce: added before it, the sum counts it t times";
        return res;
      }
    }
    if (f.colls != all_reduces(want_fwd))
      return {false, fmt::format("{} ({}): {}", fwd, setup, want_fwd ? fmt::format("one all-reduce of rows x out = {} floats", want_fwd) : "no communication"),
              colls_text(f.colls), "",
              column ? "x is whole on every rank: a column-parallel forward needs nothing from the others (f is the identity)"
                     : "one all-reduce of the partial outputs, nothing else"};
    // backward
    const Called b = call_all(ctx, ranks, column ? labproto::kTpColumnBackward : labproto::kTpRowBackward, kRows, in, out, true, bin,
                              fmt::format("{} ({})", bwd, setup));
    if (!b.mismatch.empty()) return {false, fmt::format("{} ({}): every rank asks for the same collectives", bwd, setup), b.mismatch, ""};
    for (int r = 0; r < t; r++) {
      const std::vector<double> dx = column ? W.dx : cols(W.dx, kRows, kIn, r * in, in);
      const std::vector<double> dw = column ? rows_of(W.dw, kIn, r * out, out) : cols(W.dw, kOut, kIn, r * in, in);
      const std::vector<double> db = column ? rows_of(W.db, 1, r * out, out) : W.db;
      const auto& got = b.out[size_t(r)];
      std::string bad = compare(got, 0, dx, "dx");
      if (!bad.empty()) {
        CheckResult res{false, fmt::format("{} ({}), rank {}: {}", bwd, setup, r, column ? "dx, the gradient of the whole input" : "dx, its columns of the input's gradient"),
                        bad + fmt::format(" ({})", colls_text(b.colls)), ""};
        if (column && b.colls.empty())
          res.hint = "every rank's outputs depend on all of x: dx = Σ_r dy_r·W_r, one term per rank — all-reduce it (f's backward)";
        else if (!column && !b.colls.empty()) res.hint = "dy is whole on every rank: dx = dy·W_r needs no communication (g's backward is the identity)";
        return res;
      }
      if (bad = compare(got, size_t(kRows * in), dw, "dw"); bad.empty()) bad = compare(got, size_t(kRows * in + out * in), db, "db");
      if (!bad.empty())
        return {false, fmt::format("{} ({}), rank {}: dw = dyᵀ·x and db = Σ dy for its slice", bwd, setup, r), bad, "",
                "this rank's weights see only this rank's slice: dw = dy_rᵀ·x (column) or dyᵀ·x_r (row), no communication"};
    }
    if (b.colls != all_reduces(want_bwd))
      return {false, fmt::format("{} ({}): {}", bwd, setup, want_bwd ? fmt::format("one all-reduce of rows x in = {} floats (dx)", want_bwd) : "no communication"),
              colls_text(b.colls), "",
              column ? "one all-reduce of dx, nothing else: dw and db are this rank's own" : "dy is whole on every rank: nothing to communicate"};
  }
  return {true, "", "", column ? "y, dx, dw and db on every rank within the tolerance; backward: one all-reduce of dx, forward: none"
                               : "y, dx, dw and db on every rank within the tolerance; forward: one all-reduce of y, backward: none"};
}

// ---- sequence parallel: the same layers with the stream's side split by rows ----

constexpr int64_t kSpRows = 8;  // every rank's token rows together: 8/t each

// One sequence-parallel call on t ranks: each rank's outputs compared with `want` (name, values), in the
// order the host returns them, and the collectives with `colls`. "" or what went wrong (its hint in `hint`).
std::string sp_call(CheckContext& ctx, Ranks& ranks, labproto::Fn fn, const char* name, int64_t in, int64_t out, bool bias,
                    const std::vector<std::vector<float>>& payloads, const std::vector<std::vector<std::pair<const char*, std::vector<double>>>>& want,
                    const std::vector<Coll>& colls, const std::function<std::string(const Called&, int, const char*)>& hint, std::string& hint_out) {
  const int t = int(ranks.p.size());
  const std::string setup = fmt::format("{} (t = {}, rows {} of which {} on each rank, in {}, out {})", name, t, kSpRows, kSpRows / t, in, out);
  const Called c = call_all(ctx, ranks, fn, kSpRows, in, out, bias, payloads, setup);
  if (!c.mismatch.empty()) return fmt::format("{}: {}", setup, c.mismatch);
  for (int r = 0; r < t; r++) {
    size_t at = 0;
    for (const auto& [what, values] : want[size_t(r)]) {
      if (std::string bad = compare(c.out[size_t(r)], at, values, what); !bad.empty()) {
        hint_out = hint(c, r, what);
        return fmt::format("{}, rank {}: {} ({})", setup, r, bad, colls_text(c.colls));
      }
      at += values.size();
    }
  }
  // the collectives as a set: an order the data allows (dx reduce-scattered before x is gathered for dw) is
  // as good; every rank asked for the same sequence (call_all)
  auto sorted = [](std::vector<Coll> v) {
    std::sort(v.begin(), v.end(), [](const Coll& a, const Coll& b) { return a.op != b.op ? a.op < b.op : a.n < b.n; });
    return v;
  };
  if (sorted(c.colls) != sorted(colls)) {
    hint_out = hint(c, -1, "");
    return fmt::format("{}: {} where the layer needs {}", setup, colls_text(c.colls), colls_text(colls));
  }
  return "";
}

bool has(const Called& c, char op) {
  return std::any_of(c.colls.begin(), c.colls.end(), [op](const Coll& k) { return k.op == op; });
}

// sp_layers, column-parallel: W's rows (outputs) split; x and dx this rank's token rows, y and dy every row.
// The forward runs on F's inputs, the backward on W's: each call gets all it needs, and an input gathered
// in a forward and kept for the backward (with a dummy all-gather to look right) computes dw from the wrong x.
// "" or what went wrong (its hint in `hint`); sp_row and sp_norm below the same.
std::string sp_column(CheckContext& ctx, Ranks& ranks, const Whole& F, const Whole& W, int t, std::string& hint) {
  const int64_t mine = kSpRows / t, out = kOut / t;
  std::vector<std::vector<float>> fin, bin;
  std::vector<std::vector<std::pair<const char*, std::vector<double>>>> fw, bw;
  for (int r = 0; r < t; r++) {
    const auto x = rows_of(W.x, kIn, r * mine, mine), w = rows_of(W.w, kIn, r * out, out);
    fin.push_back(concat({rows_of(F.x, kIn, r * mine, mine), rows_of(F.w, kIn, r * out, out), rows_of(F.b, 1, r * out, out)}));
    bin.push_back(concat({x, w, cols(W.dy, kSpRows, kOut, r * out, out)}));
    fw.push_back({{"y", cols(F.y, kSpRows, kOut, r * out, out)}});
    bw.push_back({{"dx", rows_of(W.dx, kIn, r * mine, mine)}, {"dw", rows_of(W.dw, kIn, r * out, out)}, {"db", rows_of(W.db, 1, r * out, out)}});
  }
  std::string bad = sp_call(ctx, ranks, labproto::kTpSpColumnForward, "sp_column_forward", kIn, out, true, fin, fw, {{'G', mine * kIn}},
                            [](const Called& c, int, const char*) {
                              if (has(c, 'A') || has(c, 'S'))
                                return std::string("the input is split by rows, not summed: every rank's rows gathered (all_gather) make x "
                                                   "whole, and nothing else is needed");
                              return std::string("x holds this rank's rows only, and y needs every row: all_gather the rows first (the "
                                                 "paper's g, in Megatron's f's place), rank 0's first");
                            },
                            hint);
  if (!bad.empty()) return bad;
  bad = sp_call(ctx, ranks, labproto::kTpSpColumnBackward, "sp_column_backward", kIn, out, true, bin, bw, {{'G', mine * kIn}, {'S', mine * kIn}},
                [](const Called& c, int, const char* what) {
                  if (has(c, 'A'))
                    return std::string("an all-reduce of dx leaves every rank every row, for twice a reduce-scatter's bytes: each rank keeps only its rows "
                                       "of the sum — reduce_scatter (g's backward)");
                  if (what && std::string(what) == "dw")
                    return std::string("dw = dyᵀ·x needs every row of this call's x: gather the input again, and keep nothing between calls "
                                       "(the forward's gathered copy is the memory sequence parallelism frees)");
                  if (!has(c, 'G'))
                    return std::string("the input was kept from the forward: keep nothing between calls — Megatron gathers it again in backward, so a "
                                       "rank stores only its rows of the stream between the layers");
                  return std::string("dx = Σ_r dy_r·W_r, one term per rank, and each rank keeps its own rows of the sum: reduce_scatter");
                },
                hint);
  return bad;
}

// sp_layers, row-parallel: W's columns (inputs) split; x and dx every row, y and dy this rank's token rows
std::string sp_row(CheckContext& ctx, Ranks& ranks, const Whole& W, int t, std::string& hint) {
  const int64_t mine = kSpRows / t, in = kIn / t;
  std::vector<std::vector<float>> fin, bin;
  std::vector<std::vector<std::pair<const char*, std::vector<double>>>> fw, bw;
  for (int r = 0; r < t; r++) {
    const auto x = cols(W.x, kSpRows, kIn, r * in, in), w = cols(W.w, kOut, kIn, r * in, in);
    fin.push_back(concat({x, w, W.b}));
    bin.push_back(concat({x, w, rows_of(W.dy, kOut, r * mine, mine)}));
    fw.push_back({{"y", rows_of(W.y, kOut, r * mine, mine)}});
    bw.push_back({{"dx", cols(W.dx, kSpRows, kIn, r * in, in)}, {"dw", cols(W.dw, kOut, kIn, r * in, in)}, {"db", W.db}});
  }
  std::string bad = sp_call(ctx, ranks, labproto::kTpSpRowForward, "sp_row_forward", in, kOut, true, fin, fw, {{'S', mine * kOut}},
                            [](const Called& c, int, const char*) {
                              if (has(c, 'A'))
                                return std::string("an all-reduce, then your rows: every rank receives the whole sum and drops (t-1)/t of it, twice "
                                                   "the bytes of a reduce-scatter (ḡ), which delivers each rank its rows of the sum alone");
                              if (c.colls.empty())
                                return std::string("each rank holds one term of y: its rows of the sum need every rank's term — reduce_scatter");
                              return std::string("the bias once per row, after the sum (before it, the sum counts it t times)");
                            },
                            hint);
  if (!bad.empty()) return bad;
  bad = sp_call(ctx, ranks, labproto::kTpSpRowBackward, "sp_row_backward", in, kOut, true, bin, bw, {{'G', mine * kOut}},
                [](const Called& c, int, const char* what) {
                  if (what && std::string(what) == "db" && has(c, 'G'))
                    return std::string("db is the whole micro-batch's: Σ over every row's dy, the gathered one");
                  if (!has(c, 'G'))
                    return std::string("dy holds this rank's rows only; dx and dw need every row's: all_gather dy (ḡ's backward)");
                  return std::string("one all-gather of dy, then the given GEMM: nothing else crosses the ranks");
                },
                hint);
  return bad;
}

// sp_layers, a LayerNorm's gradient from this rank's rows: the micro-batch's is the sum over the ranks
std::string sp_norm(CheckContext& ctx, Ranks& ranks, int t, std::string& hint) {
  std::vector<std::vector<float>> in;
  std::vector<double> sum(size_t(kOut), 0.0);
  std::mt19937 g(99u + uint32_t(t));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int r = 0; r < t; r++) {
    std::vector<float> v;
    for (int64_t i = 0; i < kOut; i++) v.push_back(u(g)), sum[size_t(i)] += v.back();
    in.push_back(v);
  }
  const std::string setup = fmt::format("sp_norm_grads (t = {}, {} floats)", t, kOut);
  const Called c = call_all(ctx, ranks, labproto::kTpSpNormGrads, kOut, 0, 0, false, in, setup);
  if (!c.mismatch.empty()) return fmt::format("{}: {}", setup, c.mismatch);
  for (int r = 0; r < t; r++)
    if (std::string bad = compare(c.out[size_t(r)], 0, sum, "grads"); !bad.empty()) {
      hint = "each rank's LayerNorm saw its own rows: the micro-batch's gradient is the sum of every rank's (Megatron all-reduces the "
             "sequence-parallel LayerNorm gradients)";
      return fmt::format("{}, rank {}: {} ({})", setup, r, bad, colls_text(c.colls));
    }
  return "";
}

CheckResult sp_layers(CheckContext& ctx) {
  const char* kWhat = "every rank's outputs equal its part of the whole layer, with Megatron's sequence-parallel collectives";
  for (int t : {2, 4}) {
    auto draw = ctx.rng({6, 41, t});  // the layers' inputs, drawn per grading
    const Whole F(kSpRows, kIn, kOut, uint32_t(draw())), W(kSpRows, kIn, kOut, uint32_t(draw()));
    Ranks ranks(ctx, t);
    std::string hint, bad = sp_column(ctx, ranks, F, W, t, hint);
    if (bad.empty()) bad = sp_row(ctx, ranks, W, t, hint);
    if (bad.empty()) bad = sp_norm(ctx, ranks, t, hint);
    if (!bad.empty()) return {false, kWhat, bad, "", hint};
  }
  return {true, "", "",
          "t = 2 and 4, every output on every rank: column forward one all-gather; column backward all-gather again + reduce-scatter; row "
          "forward one reduce-scatter; row backward one all-gather; the LayerNorms' gradients summed"};
}

// ---- the executor, run directly for every stage of many pipelines, its sends and receives matched here ----

// One call of the student's executor on its stage, as it made it.
struct Call {
  labproto::Op op;
  int a = 0, b = 0;
};

const char* call_name(labproto::Op op) {
  switch (op) {
    case labproto::kPipeForward: return "forward";
    case labproto::kPipeBackward: return "backward";
    case labproto::kPipeRecvForward: return "recv_forward";
    case labproto::kPipeSendForward: return "send_forward";
    case labproto::kPipeRecvBackward: return "recv_backward";
    case labproto::kPipeSendBackward: return "send_backward";
    case labproto::kPipeSendForwardRecvBackward: return "send_forward_recv_backward";
    default: return "send_backward_recv_forward";
  }
}

// Runs train_step_1f1b for stage `stage` of a (stages, m) pipeline and records its calls, each answered at
// once: the executor computes nothing from what it receives, so each stage's calls are what they would be
// in a real run, and matching them across stages (below) says whether the real run would hang.
std::vector<Call> run_executor(CheckContext& ctx, PluginProcess& p, int stages, int stage, int m) {
  wire::Frame f;
  f.op = labproto::kCall;
  const int64_t args[] = {labproto::kPipeRun, stages, stage, m};
  for (int k = 0; k < 4; k++) f.arg[k] = args[k];
  const std::string during = fmt::format("train_step_1f1b on stage {} of {} ({} micro-batches)", stage, stages, m);
  p.send(f, nullptr, 0, ctx.deadline, during.c_str());
  std::vector<Call> calls;
  for (;;) {
    std::vector<char> in;
    p.receive(f, in, ctx.deadline, during.c_str(), 1 << 16);
    if (f.op == labproto::kReturn) return calls;
    if (f.op == labproto::kRaised)
      throw CheckAbort("error", fmt::format("{} threw: {}", during, sanitize_output(std::string(in.begin(), in.end()), 1500)));
    if (f.op < labproto::kPipeForward || f.op > labproto::kPipeSendBackwardRecvForward)
      throw CheckAbort("error", fmt::format("{} sent request {}, which lab 06's executor has no use for", during, f.op));
    if (calls.size() > size_t(8 * m + 64))
      throw CheckAbort("error", fmt::format("{} made more than {} calls: a step has 2m computations and their sends and receives", during, 8 * m + 64));
    calls.push_back({labproto::Op(f.op), int(std::clamp<int64_t>(f.arg[0], -1, 1 << 20)), int(std::clamp<int64_t>(f.arg[1], -1, 1 << 20))});
    wire::Frame ok;
    ok.op = labproto::kData;
    p.send(ok, nullptr, 0, ctx.deadline, during.c_str());
  }
}

// What one stage's calls do, checked as the trainer's Pipeline::Driver checks them: "" or the first problem.
// `order` gets the forwards and backwards as they ran.
std::string stage_problem(const std::vector<Call>& calls, int p, int s, int m, std::vector<PipeAction>& order) {
  std::set<int> x, dy, y, dx;  // received inputs, computed outputs not yet sent
  std::vector<int> fwd(size_t(m), 0), bwd(size_t(m), 0);
  const bool first = s == 0, last = s == p - 1;
  auto bad = [&](int j, const std::string& what) { return fmt::format("stage {} of {} ({} micro-batches), micro-batch {}: {}", s, p, m, j, what); };
  for (const Call& c : calls) {
    for (int j : {c.a, c.b}) {
      if (j >= 0 && j < m) continue;
      if (j == c.b && c.op != labproto::kPipeSendForwardRecvBackward && c.op != labproto::kPipeSendBackwardRecvForward) continue;
      return fmt::format("stage {} of {}: {}({}), but the micro-batches are 0..{}", s, p, call_name(c.op), j, m - 1);
    }
    const int j = c.a;
    switch (c.op) {
      case labproto::kPipeForward:
        if (fwd[size_t(j)]++) return bad(j, "its forward runs a second time");
        if (!first && !x.erase(j)) return bad(j, fmt::format("its forward runs before its activations arrived from stage {}", s - 1));
        if (!last) y.insert(j);
        order.push_back({PipeAction::forward, j});
        break;
      case labproto::kPipeBackward:
        if (!fwd[size_t(j)]) return bad(j, "its backward runs before its forward");
        if (bwd[size_t(j)]++) return bad(j, "its backward runs a second time");
        if (!last && !dy.erase(j)) return bad(j, fmt::format("its backward runs before its gradient arrived from stage {}", s + 1));
        if (!first) dx.insert(j);
        order.push_back({PipeAction::backward, j});
        break;
      case labproto::kPipeRecvForward:
        if (!first && !x.insert(j).second) return bad(j, "its activations are received a second time");
        break;
      case labproto::kPipeRecvBackward:
        if (!last && !dy.insert(j).second) return bad(j, "its gradient is received a second time");
        break;
      case labproto::kPipeSendForward:
      case labproto::kPipeSendForwardRecvBackward:
        if (last) break;
        if (!y.erase(j)) return bad(j, fmt::format("{} sends activations this stage has not computed (or sent already)", call_name(c.op)));
        if (c.op == labproto::kPipeSendForwardRecvBackward && !dy.insert(c.b).second) return bad(c.b, "its gradient is received a second time");
        break;
      default:  // kPipeSendBackward, kPipeSendBackwardRecvForward
        if (first) break;
        if (!dx.erase(j)) return bad(j, fmt::format("{} sends a gradient this stage has not computed (or sent already)", call_name(c.op)));
        if (c.op == labproto::kPipeSendBackwardRecvForward && !x.insert(c.b).second) return bad(c.b, "its activations are received a second time");
    }
  }
  if (const std::string invalid = check_schedule(order, m); !invalid.empty()) return fmt::format("stage {} of {}: {}", s, p, invalid);
  if (!y.empty()) return bad(*y.begin(), fmt::format("the step ended and its activations were never sent to stage {}", s + 1));
  if (!dx.empty()) return bad(*dx.begin(), fmt::format("the step ended and its gradient was never sent to stage {}", s - 1));
  if (!x.empty() || !dy.empty()) return bad(!x.empty() ? *x.begin() : *dy.begin(), "the step ended and what was received for it was never used");
  return "";
}

// A transfer half: this stage sends to (or receives from) `peer` micro-batch `micro`'s activations or gradient.
struct Half {
  bool send = false;
  int peer = 0, micro = 0;
  bool gradient = false;
  bool matched = false;
  std::string text() const {
    return fmt::format("{} micro-batch {}'s {} {} stage {}", send ? "to send" : "to receive", micro, gradient ? "gradient" : "activations",
                       send ? "to" : "from", peer);
  }
};
struct Exchange {
  std::vector<Half> halves;
  std::string call;  // "send_forward(3)"
};

std::vector<Exchange> exchanges(const std::vector<Call>& calls, int p, int s) {
  std::vector<Exchange> v;
  for (const Call& c : calls) {
    Exchange e;
    const bool has_prev = s > 0, has_next = s < p - 1;
    switch (c.op) {
      case labproto::kPipeRecvForward: if (has_prev) e.halves.push_back({false, s - 1, c.a, false}); break;
      case labproto::kPipeSendForward: if (has_next) e.halves.push_back({true, s + 1, c.a, false}); break;
      case labproto::kPipeRecvBackward: if (has_next) e.halves.push_back({false, s + 1, c.a, true}); break;
      case labproto::kPipeSendBackward: if (has_prev) e.halves.push_back({true, s - 1, c.a, true}); break;
      case labproto::kPipeSendForwardRecvBackward:
        if (has_next) e.halves = {{true, s + 1, c.a, false}, {false, s + 1, c.b, true}};
        break;
      case labproto::kPipeSendBackwardRecvForward:
        if (has_prev) e.halves = {{true, s - 1, c.a, true}, {false, s - 1, c.b, false}};
        break;
      default: break;
    }
    if (e.halves.empty()) continue;
    e.call = c.op == labproto::kPipeSendForwardRecvBackward || c.op == labproto::kPipeSendBackwardRecvForward
                 ? fmt::format("{}({}, {})", call_name(c.op), c.a, c.b)
                 : fmt::format("{}({})", call_name(c.op), c.a);
    v.push_back(std::move(e));
  }
  return v;
}

// Every stage's exchanges run as blocking point-to-point calls do: an exchange completes when each of its
// halves meets the neighbour's opposite half — both posted at once — for the same micro-batch and tensor.
// "" when every stage gets to its end; else who waits for what.
std::string deadlock(std::vector<std::vector<Exchange>> ex, int m) {
  const int p = int(ex.size());
  std::vector<size_t> at(size_t(p), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < p; s++) {
      if (at[size_t(s)] >= ex[size_t(s)].size()) continue;
      for (Half& h : ex[size_t(s)][at[size_t(s)]].halves) {
        if (h.matched || at[size_t(h.peer)] >= ex[size_t(h.peer)].size()) continue;
        for (Half& o : ex[size_t(h.peer)][at[size_t(h.peer)]].halves)
          if (!o.matched && o.send != h.send && o.peer == s && o.micro == h.micro && o.gradient == h.gradient) {
            h.matched = o.matched = true;
            break;
          }
      }
    }
    for (int s = 0; s < p; s++) {
      if (at[size_t(s)] >= ex[size_t(s)].size()) continue;
      const auto& hs = ex[size_t(s)][at[size_t(s)]].halves;
      if (std::all_of(hs.begin(), hs.end(), [](const Half& h) { return h.matched; })) at[size_t(s)]++, moved = true;
    }
  }
  std::string out;
  int blocked = 0;
  for (int s = 0; s < p; s++) {
    if (at[size_t(s)] >= ex[size_t(s)].size()) continue;
    const Exchange& e = ex[size_t(s)][at[size_t(s)]];
    std::string waits;
    for (const Half& h : e.halves)
      if (!h.matched) waits += (waits.empty() ? "" : " and ") + h.text();
    if (blocked++ < 3) out += fmt::format("{}stage {} waits in {} {}", out.empty() ? "" : "; ", s, e.call, waits);
  }
  if (!blocked) return "";
  return fmt::format("p {}, m {}: deadlock — {}{}", p, m, out, blocked > 3 ? fmt::format(" (and {} more stages)", blocked - 3) : "");
}

CheckResult executor_1f1b(CheckContext& ctx) {
  PluginProcess p(ctx.launch("the plugin"));
  p.wait_ready(ctx.deadline);
  int pipelines = 0;
  for (int stages = 1; stages <= 8; stages++)
    for (int m : {stages, stages + 1, 2 * stages + 1}) {
      std::vector<std::vector<Exchange>> ex;
      for (int s = 0; s < stages; s++) {
        const std::vector<Call> calls = run_executor(ctx, p, stages, s, m);
        std::vector<PipeAction> order;
        if (const std::string bad = stage_problem(calls, stages, s, m, order); !bad.empty())
          return {false, fmt::format("stage {} of {} ({} micro-batches): every micro-batch's input received before it runs, its output sent once", s,
                                     stages, m),
                  bad, "", "a forward needs its activations from the stage before; a backward its gradient from the stage after; each output is sent once"};
        const auto want = pipeline_schedule(PipeSchedule::one_f_one_b, stages, s, m);
        if (order != want) {
          CheckResult bad{false, fmt::format("stage {} of {} ({} micro-batches) runs 1F1B: {}", s, stages, m, describe_schedule(want)),
                          describe_schedule(order), ""};
          auto leading = [](const std::vector<PipeAction>& v) {  // forwards before the first backward
            int n = 0;
            while (n < int(v.size()) && v[size_t(n)].op == PipeAction::forward) n++;
            return n;
          };
          if (leading(order) != leading(want))
            bad.hint = fmt::format("stage {} of {} runs {} forward(s) before its first backward (yours: {}): min(p - s - 1, m) = {} warm-up "
                                   "forward(s), for the micro-batches still below it in the pipeline, then the steady state's first",
                                   s, stages, leading(want), leading(order), warmup_forwards(stages, s, m));
          else bad.hint = "after the warm-up, alternate one forward and one backward (the oldest micro-batch first), then the backwards left";
          return bad;
        }
        ex.push_back(exchanges(calls, stages, s));
      }
      if (const std::string hang = deadlock(ex, m); !hang.empty())
        return {false, fmt::format("p {}, m {}: every stage's sends meet their neighbours' receives (blocking point-to-point calls)", stages, m),
                hang, "",
                "in the steady state a stage sends activations on while the stage after sends a gradient back: two sends towards each "
                "other wait for each other's receive. Megatron pairs them: send_forward_recv_backward and send_backward_recv_forward"};
      pipelines++;
    }
  return {true, "", "", fmt::format("{} pipelines (p = 1..8, m = p, p + 1, 2p + 1), every stage: Megatron's 1F1B order, every send met by "
                                    "its neighbour's receive",
                                    pipelines)};
}

// ---- the training jobs: training.cpp beside this file ----

CheckResult tp_equals_tp1(CheckContext& ctx);
CheckResult tp_comm_volume(CheckContext& ctx);
CheckResult sp_equals_tp(CheckContext& ctx);
CheckResult sp_comm_volume(CheckContext& ctx);
CheckResult pp_equals_pp1(CheckContext& ctx);
CheckResult bubble_and_memory(CheckContext& ctx);
CheckResult dp_sync_once(CheckContext& ctx);

}  // namespace checks06

std::map<std::string, CheckDef> lab06_checks() {
  using namespace checks06;
  return {
      {"column_parallel", {[](CheckContext& c) { return layer_check(c, true); }}},
      {"row_parallel", {[](CheckContext& c) { return layer_check(c, false); }}},
      {"tp_equals_tp1", {tp_equals_tp1, true}},
      {"tp_comm_volume", {tp_comm_volume, true}},
      {"sp_layers", {sp_layers}},
      {"sp_equals_tp", {sp_equals_tp, true}},
      {"sp_comm_volume", {sp_comm_volume, true}},
      {"executor_1f1b", {executor_1f1b}},
      {"pp_equals_pp1", {pp_equals_pp1, true}},
      {"bubble_and_memory", {bubble_and_memory, true}},
      {"dp_sync_once", {dp_sync_once, true}},
  };
}

}  // namespace distlab::grader
