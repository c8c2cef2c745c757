// `distlab bench comm -n N` — measures all_reduce, reduce_scatter, all_gather and broadcast like nccl-tests:
// for each size, the mean time over iterations (the slowest rank's), algbw = S / t, busbw = algbw times the
// algorithm's bus factor (2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter and all_gather, 1 for
// broadcast), and #wrong, the elements that differ from the expected result. A row of raw Gloo ring
// all_reduce (no ProcessGroup around it) is the baseline our all_reduce is held to.
//
// `--backend nccl` measures the NCCL group instead, on GPU buffers, one GPU per rank (core/cuda/nccl_bench.h):
// a build with CUDA on a machine with as many GPUs as ranks.
//
// `--ring DIR` adds lab 01's ring functions from DIR/ring.cpp (your own code, built as the grader builds
// it, then loaded into this benchmark's ranks): their sends and receives go over Gloo's point-to-point
// buffers, so your ring_all_reduce is measured against Gloo's ring on the same wire.
#include "cli/bench_cmd.h"
#include "cli/paths.h"

#include "cli/calibrate_cmd.h"
#include "cli/published_cmd.h"

#include <dlfcn.h>

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/util/atomic_file.h"
#include "core/comm/env.h"
#include "core/comm/errors.h"
#include "core/launch/launcher.h"
#include "core/comm/process_group.h"
#include "core/comm/tcp_store.h"
#include "core/comm/watchdog.h"
#include "core/parallel/pipeline_sim.h"
#include "core/perf/hardware.h"
#include "core/perf/cost_model.h"
#include "core/tensor/device.h"
#include "core/util/units.h"
#include "grader/harness.h"
#include "core/cuda/nccl_bench.h"  // plain C++: the worker itself is in libdistlab_cuda.so
#include "labs/01-collectives/api.h"

namespace distlab {

namespace {

struct BenchArgs {
  int nproc = 2;
  std::string min_size = "1KiB", max_size = "128MiB", json;
  int iters = 0;        // 0: by size
  std::string ring;     // lab 01 folder with ring.cpp (the parent builds it)
  std::string ring_so;  // the built plugin (what the workers load)
  std::string backend = "gloo";
};

// ---- lab 01's Comm over Gloo's unbound buffers --------------------------------------------------------
// The lab's send returns at once and the caller may reuse its buffer, so a send copies the data and
// starts; the copies are waited for when the ring function returns. A recv blocks until its data is in.
constexpr uint64_t kRingSlot = 0x1ab01;

struct RingComm {
  gloo::Context* ctx;
  std::chrono::milliseconds timeout;
  std::deque<std::vector<float>> copies;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends;

  void finish() {
    for (auto& b : sends) b->waitSend(timeout);
    sends.clear();
    copies.clear();
  }
};

void check_peer(const RingComm& c, int peer, int64_t count, const char* what) {
  if (peer < 0 || peer >= c.ctx->size || peer == c.ctx->rank)
    throw CommError(fmt::format("rank {}: your ring's {} names rank {}", c.ctx->rank, what, peer), "the other ranks are 0..size()-1 except yourself");
  if (count < 0) throw CommError(fmt::format("rank {}: your ring's {} of {} floats", c.ctx->rank, what, count), "counts are >= 0");
}

void ring_send(void* c, const float* data, int64_t count, int dst) {
  auto& rc = *static_cast<RingComm*>(c);
  check_peer(rc, dst, count, "send");
  if (count == 0) return;  // nothing on the wire (the matching recv skips too)
  rc.copies.emplace_back(data, data + count);
  rc.sends.push_back(rc.ctx->createUnboundBuffer(rc.copies.back().data(), size_t(count) * 4));
  rc.sends.back()->send(dst, kRingSlot);
}

void ring_recv(void* c, float* data, int64_t count, int src) {
  auto& rc = *static_cast<RingComm*>(c);
  check_peer(rc, src, count, "recv");
  if (count == 0) return;
  auto buf = rc.ctx->createUnboundBuffer(data, size_t(count) * 4);
  buf->recv(src, kRingSlot);
  buf->waitRecv(rc.timeout);
}

const lab01::Comm::Ops kRingOps = {ring_send, ring_recv};

const Lab01Plugin* load_ring(const std::string& so) {
  void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) throw ConfigError(fmt::format("--ring: cannot load {}: {}", so, dlerror()), "rebuild it with distlab bench comm --ring DIR");
  auto* t = static_cast<const Lab01Plugin*>(dlsym(h, "distlab_lab01"));
  if (!t || t->abi != kLab01Abi)
    throw ConfigError(fmt::format("--ring: {} has no distlab_lab01 table of version {}", so, kLab01Abi),
                      "keep the table at the bottom of ring.cpp as the lab's student file has it");
  return t;
}

int iterations_for(int64_t bytes, int fixed) {
  if (fixed > 0) return fixed;
  if (bytes <= (1 << 20)) return 20;
  if (bytes <= (16 << 20)) return 8;
  return 4;
}

// The slowest rank's mean time: what a collective costs the job.
double slowest(ProcessGroup& pg, double t) {
  float v = float(t);
  pg.all_reduce(&v, 1, ReduceOp::max);
  return v;
}

struct CommRow {
  std::string op;
  int64_t bytes = 0, count = 0;
  double time_s = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;
};

// op is all_reduce | reduce_scatter | all_gather | broadcast (the engine's ProcessGroup), the same
// prefixed "raw_gloo_" (Gloo's own collective on `raw`, without our machinery; Gloo has no reduce_scatter
// of this shape), or prefixed "ring_" with `ring` set (your lab 01 functions over `raw`).
CommRow measure(ProcessGroup& pg, std::string op, int64_t bytes, int iters, gloo::Context* raw, const Lab01Plugin* ring = nullptr) {
  const std::string shown = op;
  const bool raw_gloo = op.rfind("raw_gloo_", 0) == 0;
  if (ring) op = op.substr(5);          // ring_all_reduce -> all_reduce
  if (raw_gloo) op = op.substr(9);      // raw_gloo_all_gather -> all_gather
  std::shared_ptr<gloo::Context> ctx(raw, [](gloo::Context*) {});  // not ours to delete
  const int n = pg.size(), r = pg.rank();
  // S is the full buffer (nccl-tests' convention): all_reduce/broadcast of S, reduce_scatter from S, all_gather to S
  const bool split = op == "reduce_scatter" || op == "all_gather";
  const int64_t count = bytes / 4, chunk = split ? count / n : count;
  std::vector<float> in(static_cast<size_t>(split ? (op == "reduce_scatter" ? chunk * n : chunk) : count));
  std::vector<float> out(static_cast<size_t>(op == "all_gather" ? chunk * n : op == "reduce_scatter" ? chunk : 0));
  auto fill = [&] {
    for (size_t i = 0; i < in.size(); i++) in[i] = float((r + 1) * (int64_t(i) % 7 + 1));
  };
  RingComm rc{raw, std::chrono::milliseconds(30000), {}, {}};
  lab01::Comm comm(r, n, &kRingOps, &rc);
  auto run_once = [&] {
    if (ring) {
      if (op == "all_reduce") ring->all_reduce(comm, in.data(), int64_t(in.size()));
      if (op == "reduce_scatter") ring->reduce_scatter(comm, out.data(), in.data(), chunk);
      if (op == "all_gather") ring->all_gather(comm, out.data(), in.data(), chunk);
      rc.finish();
    } else if (op == "all_reduce" && raw_gloo) {
      gloo::AllreduceOptions o(ctx);
      o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      o.setOutput(in.data(), in.size());
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(o);
    } else if (op == "all_gather" && raw_gloo) {
      gloo::AllgatherOptions o(ctx);
      o.setInput(in.data(), in.size());
      o.setOutput(out.data(), out.size());
      gloo::allgather(o);
    } else if (op == "broadcast" && raw_gloo) {
      gloo::BroadcastOptions o(ctx);
      o.setOutput(in.data(), in.size());
      o.setRoot(0);
      gloo::broadcast(o);
    } else if (op == "all_reduce") {
      pg.all_reduce(in.data(), int64_t(in.size()));
    } else if (op == "reduce_scatter") {
      pg.reduce_scatter(out.data(), in.data(), chunk);
    } else if (op == "all_gather") {
      pg.all_gather(out.data(), in.data(), chunk);
    } else {
      pg.broadcast(in.data(), int64_t(in.size()), 0);
    }
  };
  // one checked run
  fill();
  run_once();
  int64_t wrong = 0;
  const double tri = double(n) * (n + 1) / 2;  // Σ (rank + 1)
  if (op == "all_reduce") {
    for (size_t i = 0; i < in.size(); i++) wrong += in[i] != float(tri * (int64_t(i) % 7 + 1));
  } else if (op == "reduce_scatter") {
    for (int64_t i = 0; i < chunk; i++) wrong += out[size_t(i)] != float(tri * ((r * chunk + i) % 7 + 1));
  } else if (op == "all_gather") {
    for (int q = 0; q < n; q++)
      for (int64_t i = 0; i < chunk; i++) wrong += out[size_t(q * chunk + i)] != float((q + 1) * (i % 7 + 1));
  } else {
    for (size_t i = 0; i < in.size(); i++) wrong += in[i] != float(int64_t(i) % 7 + 1);
  }
  float w = float(wrong);
  pg.all_reduce(&w, 1);
  pg.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < iters; k++) run_once();
  const double t = slowest(pg, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
  const double algbw = double(bytes) / t;
  return CommRow{shown, bytes, count, t, algbw, algbw * busbw_factor(op, n), int64_t(w)};
}

int worker(const BenchArgs& a) {
  LaunchEnv env = read_launch_env();
  LauncherWatchdog watchdog(env.launcher_pid, Millis(120000), fmt::format("rank {}", env.rank));
  std::unique_ptr<TcpStoreServer> own_store = serve_store_if_first(env);  // `srun -n N distlab bench comm ...`
  std::unique_ptr<TcpStore> store_client = connect_store(env, Millis(60000));
  TcpStore& store = *store_client;
  if (a.backend == "nccl") {
    std::string why;
    auto run = reinterpret_cast<int (*)(Store*, const NcclBenchOptions*)>(cuda_symbol("distlab_nccl_bench", &why));
    if (!run) throw ConfigError("--backend nccl: " + why, "use --backend gloo, or a build with the CUDA toolkit and NCCL");
    NcclBenchOptions o;
    o.rank = env.rank;
    o.world = env.world_size;
    o.local_rank = env.local_rank;
    o.min_bytes = parse_bytes(a.min_size, "--min");
    o.max_bytes = parse_bytes(a.max_size, "--max");
    o.iters = a.iters;
    o.json = a.json;
    return run(&store, &o);
  }
  ProcessGroupOptions po;
  po.timeout = Millis(120000);
  po.track_arrivals = false;  // raw collective speed, as nccl-tests measures it
  po.host = local_address_for(env.master_addr);
  ProcessGroup pg(store, env.rank, env.world_size, po);
  // the baseline: a Gloo context of our own, used without any ProcessGroup machinery
  gloo::transport::tcp::attr attr;
  attr.hostname = po.host;
  attr.ai_family = AF_INET;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  auto raw = std::make_shared<gloo::rendezvous::Context>(env.rank, env.world_size);
  raw->setTimeout(po.timeout);
  PrefixStore raw_keys("bench-raw-gloo", store);
  raw->connectFullMesh(raw_keys, dev);
  const Lab01Plugin* ring = a.ring_so.empty() ? nullptr : load_ring(a.ring_so);

  const int64_t lo = parse_bytes(a.min_size, "--min"), hi = parse_bytes(a.max_size, "--max");
  const bool print = env.rank == 0;
  nlohmann::json rows = nlohmann::json::array();
  double busbw_sum = 0;
  int64_t wrong = 0, yours_wrong = 0;  // elements that differ from the expected result
  int busbw_n = 0;
  if (print)
    std::cout << fmt::format("# distlab bench comm: {} ranks, Gloo over TCP, float32, sum\n#\n", env.world_size)
              << fmt::format("# {:>22} {:>12} {:>12} {:>6} {:>10} {:>8} {:>8} {:>7}\n", "op", "size", "count", "type", "time",
                             "algbw", "busbw", "#wrong")
              << fmt::format("# {:>22} {:>12} {:>12} {:>6} {:>10} {:>8} {:>8} {:>7}\n", "", "(B)", "(elements)", "", "(us)", "(GB/s)",
                             "(GB/s)", "");
  std::vector<std::string> ops = {"all_reduce", "raw_gloo_all_reduce", "reduce_scatter", "all_gather", "raw_gloo_all_gather",
                                  "broadcast", "raw_gloo_broadcast"};
  if (ring) ops.insert(ops.begin() + 2, {"ring_all_reduce", "ring_reduce_scatter", "ring_all_gather"});
  for (const std::string& op : ops) {
    const bool yours = op.rfind("ring_", 0) == 0;
    for (int64_t bytes = lo; bytes <= hi; bytes *= 2) {
      const bool split = op.find("reduce_scatter") != std::string::npos || op.find("all_gather") != std::string::npos;
      const int64_t b = split ? bytes / (4 * env.world_size) * 4 * env.world_size : bytes;
      CommRow row;
      try {
        row = measure(pg, op, b, iterations_for(b, a.iters), raw.get(), yours ? ring : nullptr);
      } catch (const std::logic_error& e) {  // the lab's stubs throw logic_error until written (every rank throws the same)
        if (print) std::cout << fmt::format("  {:>22} skipped: {}\n", op, e.what());
        break;
      }
      (yours ? yours_wrong : wrong) += row.wrong;
      if (op.rfind("raw_gloo_", 0) != 0 && !yours) {  // the average is over the engine's own collectives
        busbw_sum += row.busbw;
        busbw_n++;
      }
      if (print)
        std::cout << fmt::format("  {:>22} {:>12} {:>12} {:>6} {:>10.1f} {:>8.3f} {:>8.3f} {:>7}\n", op, row.bytes, row.count,
                                 "float", row.time_s * 1e6, row.algbw / 1e9, row.busbw / 1e9, row.wrong)
                  << std::flush;
      rows.push_back({{"op", op}, {"bytes", row.bytes}, {"count", row.count}, {"time_us", row.time_s * 1e6},
                      {"algbw_gbps", row.algbw / 1e9}, {"busbw_gbps", row.busbw / 1e9}, {"wrong", row.wrong}});
    }
  }
  if (print) {
    // ours (and yours) against raw Gloo at the largest size
    double ours = 0, base = 0, yours = -1, rs = 0, ag = 0, raw_ag = 0;
    for (const auto& r : rows) {
      if (r["bytes"] < hi / (4 * env.world_size) * 4 * env.world_size) continue;  // the largest size of each op
      if (r["op"] == "all_reduce") ours = r["busbw_gbps"];
      if (r["op"] == "raw_gloo_all_reduce") base = r["busbw_gbps"];
      if (r["op"] == "ring_all_reduce") yours = r["busbw_gbps"];
      if (r["op"] == "reduce_scatter") rs = r["busbw_gbps"];
      if (r["op"] == "all_gather") ag = r["busbw_gbps"];
      if (r["op"] == "raw_gloo_all_gather") raw_ag = r["busbw_gbps"];
    }
    if (yours >= 0)
      std::cout << fmt::format("# your ring_all_reduce at {}: {:.3f} GB/s busbw = {:.1f} % of raw Gloo ring\n", format_bytes(double(hi)),
                               yours, base > 0 ? 100 * yours / base : 0.0);
    if (ring) std::cout << fmt::format("# your ring's wrong values: {}{}\n", yours_wrong, yours_wrong ? " (see #wrong)" : " OK");
    std::cout << fmt::format("# Out of bounds values : {} {}\n", wrong, wrong ? "FAILED" : "OK")
              << fmt::format("# Avg bus bandwidth    : {:.4f} GB/s\n", busbw_sum / busbw_n / 1e9)
              << fmt::format("# all_reduce at {}: {:.3f} GB/s busbw = {:.1f} % of raw Gloo ring ({:.3f} GB/s)\n",
                             format_bytes(double(hi)), ours, base > 0 ? 100 * ours / base : 0.0, base)
              << fmt::format("# reduce_scatter at {}: {:.3f} GB/s busbw = {:.1f} % of our all_gather ({:.3f}), {:.1f} % of raw Gloo's ({:.3f})\n",
                             format_bytes(double(hi)), rs, ag > 0 ? 100 * rs / ag : 0.0, ag, raw_ag > 0 ? 100 * rs / raw_ag : 0.0, raw_ag);
    std::string path = a.json.empty() ? fmt::format("bench/results/comm_n{}.json", env.world_size) : a.json;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path().empty() ? "." : std::filesystem::path(path).parent_path());
    AtomicFile out(path);
    out.write(nlohmann::json{{"world_size", env.world_size}, {"rows", rows}, {"wrong", wrong}, {"ring_wrong", yours_wrong},
                             {"avg_busbw_gbps", busbw_sum / busbw_n / 1e9}, {"all_reduce_vs_raw_gloo", base > 0 ? ours / base : 0.0},
                             {"reduce_scatter_vs_all_gather", ag > 0 ? rs / ag : 0.0}}
                  .dump(2) +
              "\n");
    out.commit();
    std::cout << "# wrote " << path << "\n";
  }
  return wrong == 0 ? 0 : 1;  // like nccl-tests, a wrong result of the engine's fails the run
}

// Builds DIR/ring.cpp as the grader does (sandboxed compiler where there is one, only the lab's API
// visible); the plugin lands in build/labs/01-collectives/bench.so.
std::string build_ring(const BenchArgs& a, const std::string& self_exe) {
  const grader::Paths p{tree_source_dir(), tree_build_dir(), self_exe};
  const grader::Lab lab = grader::find_lab(p.source_dir, "01");
  const std::string so = (std::filesystem::path(p.build_dir) / "labs" / lab.name / "bench.so").string();
  std::cout << fmt::format("building {} from {} ...\n", lab.name, a.ring) << std::flush;
  const grader::BuildResult b = grader::build_plugin(p, lab, a.ring, so, probe_sandbox());
  if (!b.ok) throw ConfigError(fmt::format("--ring {}: the build failed:\n{}", a.ring, b.log), "the lines above say why");
  return std::filesystem::absolute(so).string();
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code, const std::string& self_exe) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  add_published_command(bench, exit_code);
  add_calibrate_command(bench, exit_code, self_exe);
  CLI::App* comm = bench->add_subcommand("comm", "collectives like nccl-tests: time, algbw, busbw, #wrong, 1 KiB..128 MiB");
  comm->add_option("-n,--nproc-per-node", a->nproc, "ranks (default 2)");
  comm->add_option("--min", a->min_size, "smallest size (default 1KiB)");
  comm->add_option("--max", a->max_size, "largest size (default 128MiB)");
  comm->add_option("--iters", a->iters, "iterations per size (default: 20 small, 8 medium, 4 large)");
  comm->add_option("--json", a->json, "where to write the results (default bench/results/comm_n<N>.json)");
  comm->add_option("--ring", a->ring, "also measure lab 01's ring functions from DIR/ring.cpp (e.g. labs/01-collectives/student)");
  comm->add_option("--ring-plugin", a->ring_so, "(set by the launcher: the ring plugin built from --ring)")->group("");
  comm->add_option("--backend", a->backend, "gloo (CPU ranks, default) or nccl (GPU buffers, one GPU per rank; a CUDA build)")
      ->check(CLI::IsMember({"gloo", "nccl"}));
  // the pipeline's bubble, modeled: equal synthetic stages through the real schedules
  struct PipeArgs {
    std::vector<int> pp{2, 4}, m{1, 2, 4, 8};
    std::string schedule = "both", profile = "h100-nvlink", json;
  };
  auto pa = std::make_shared<PipeArgs>();
  CLI::App* pipe = bench->add_subcommand("pipeline", "the pipeline bubble on the modeled timeline against (p - 1)/(m + p - 1), equal synthetic stages");
  pipe->add_option("--pp", pa->pp, "stages (default 2 4)")->delimiter(',')->check(CLI::Range(1, 64));
  pipe->add_option("--micro-batches", pa->m, "micro-batches per step (default 1 2 4 8)")->delimiter(',')->check(CLI::Range(1, 1024));
  pipe->add_option("--schedule", pa->schedule, "1f1b | gpipe | both (default)")->check(CLI::IsMember({"1f1b", "gpipe", "both"}));
  pipe->add_option("--profile", pa->profile, "hardware profile of the replay (default h100-nvlink)");
  pipe->add_option("--json", pa->json, "also write the rows as JSON to this file (the table is printed either way)");
  pipe->callback([pa]() {
    const HardwareProfile prof = require_profile(pa->profile, "--profile", /*need_cost_model=*/true);
    const HardwareProfile* hw = &prof;
    std::vector<std::string> schedules = pa->schedule == "both" ? std::vector<std::string>{"1f1b", "gpipe"} : std::vector<std::string>{pa->schedule};
    nlohmann::json rows = nlohmann::json::array();
    std::cout << fmt::format("pipeline bubble on {}: p equal stages (forward 1 TFLOP, backward 2), 8 MiB of activations between stages\n", hw->name);
    std::cout << fmt::format("{:>3} {:>5} {:>8} {:>15} {:>15} {:>8} {:>11}  {}\n", "p", "m", "schedule", "bubble modeled", "(p-1)/(m+p-1)",
                             "diff", "span/ideal", "peak micro-batches in flight per stage");
    for (int p : pa->pp)
      for (int m : pa->m)
        for (const std::string& s : schedules) {
          const PipelineSimResult r = simulate_pipeline(p, m, s, *hw);
          std::string peaks;
          for (int k : r.peak_in_flight) peaks += (peaks.empty() ? "" : " ") + std::to_string(k);
          std::cout << fmt::format("{:>3} {:>5} {:>8} {:>14.2f}% {:>14.2f}% {:>+7.2f} {:>11.3f}  {}{}\n", p, m, s, 100 * r.bubble, 100 * r.formula,
                                   100 * (r.bubble - r.formula), r.span_s / r.ideal_s, peaks, m < p ? "   (m < p: training refuses it)" : "");
          rows.push_back({{"pp", p}, {"micro_batches", m}, {"schedule", s}, {"bubble", r.bubble}, {"formula", r.formula},
                          {"span_s", r.span_s}, {"ideal_s", r.ideal_s}, {"peak_in_flight", r.peak_in_flight}});
        }
    if (pa->json.empty()) return;  // a student's question answered on the terminal: nothing written into their folder
    const std::string path = pa->json;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path().empty() ? "." : std::filesystem::path(path).parent_path());
    AtomicFile out(path);
    out.write(nlohmann::json{{"profile", hw->name}, {"rows", rows}}.dump(2) + "\n");
    out.commit();
    std::cout << "wrote " << path << "\n";
  });
  comm->callback([a, &exit_code, self_exe]() {
    // a worker of the job below, or a task of `srun -n N distlab bench comm` (its world from Slurm)
    if (std::getenv("RANK") || read_launch_env().from_slurm) {
      if (!std::getenv("RANK") && !a->ring.empty()) throw ConfigError("--ring builds lab 01's plugin first: run it as `distlab bench comm` on one node, not under srun");
      exit_code = worker(*a);
      return;
    }
    if (a->backend == "nccl") {
      std::string why;
      if (!cuda_symbol("distlab_nccl_bench", &why))
        throw ConfigError("--backend nccl: " + why, "use --backend gloo, or a build with the CUDA toolkit and NCCL");
      if (!a->ring.empty()) throw ConfigError("--ring measures lab 01 over Gloo: it does not go with --backend nccl", "drop one of them");
    }
    if (!a->ring.empty()) a->ring_so = build_ring(*a, self_exe);
    LaunchOptions o;
    o.nproc_per_node = a->nproc;
    o.master_port = 0;
    o.threads_per_rank = 1;
    o.argv = {self_exe, "bench", "comm", "--min", a->min_size, "--max", a->max_size, "--iters", std::to_string(a->iters),
              "--backend", a->backend};
    if (!a->json.empty()) o.argv.insert(o.argv.end(), {"--json", a->json});
    if (!a->ring_so.empty()) o.argv.insert(o.argv.end(), {"--ring-plugin", a->ring_so});
    exit_code = launch(o);
  });
}

}  // namespace distlab
