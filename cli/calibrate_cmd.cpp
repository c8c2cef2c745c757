// `distlab bench calibrate CONFIG --device cuda -o my-gpu.json`: measures on this machine's device what the
// cost model otherwise takes from data sheets and published figures, for the model it is given:
//   - every GEMM shape of one training step (the step is run on the meta device first, and its trace says
//     which (M, N, K) the matmuls multiply, forward and backward), each timed through distlab's own kernel
//     at the run's precision: the rate the model then takes for that very shape. The operands are random
//     (N(0, 1)), never zeros, and a GPU is first kept under its largest GEMM for --settle seconds: what a
//     training run sustains (its clock under the power limit and at its working temperature), not a burst
//     at the boost clock;
//   - flash attention, forward and backward, at the model's sequence and head size;
//   - the memory bandwidth a streaming kernel reaches (an accumulate over 256 MiB, 64 MiB on a CPU);
//   - with two or more GPUs, NCCL's bus bandwidth and latency: it runs `distlab bench comm --backend nccl`
//     over every GPU (--comm-ranks N picks how many; on cpu and cuda-sim, N ranks over Gloo) and takes its
//     largest all_reduce's busbw and its smallest one's time for α; `--comm FILE` takes such a table written
//     before (`distlab bench comm ... --json FILE`) instead.
// It writes a profile file (core/perf/hardware.h: load_profile_file) that `log.profile = "FILE"` and
// `distlab plan --profile FILE` take: the base profile's data sheet, with what was measured here in place of
// the published shares. What it did not measure stays the base's, and the file says which.
// Read next: core/perf/cost_model.cpp (compute_time: how a measured shape is used).
#include "cli/calibrate_cmd.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/launch/launcher.h"
#include "core/ops/attach.h"
#include "core/ops/cpu/attention.h"
#include "core/ops/cpu/matmul.h"
#include "core/ops/cpu/pointwise.h"
#include "core/perf/cost_model.h"
#include "core/perf/hardware.h"
#include "core/tensor/device.h"
#include "core/train/trainer.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/read_file.h"
#include "core/util/units.h"
#include "grader/bridge/lab_extension.h"

namespace distlab {

namespace {

struct CalibrateArgs {
  std::string config, device = "cuda", base, out, name, comm, self_exe;
  int comm_ranks = -1;  // ranks of the collectives' benchmark; -1: every GPU on cuda (when 2 or more), none elsewhere
  std::vector<std::string> sets;
  double seconds = 0.2;  // time each kernel at least this long (and at least twice after a warm-up)
  double settle = -1;    // seconds under the largest GEMM before the timings; -1: 10 on a GPU, 0 elsewhere
};

// Random operands, N(0, 1). What a GEMM multiplies changes its speed: its switching power, and so the clock
// it holds under the power limit, depends on the bits it flips. Zeros or constants run up to 15 % faster
// than random values (Horace He, "Strangely, Matrix Multiplications on GPUs Run Faster When Given
// 'Predictable' Data!", 2024: an A100's 8192³ bf16 matmul, 295 TFLOP/s on zeros, 257 on randn). A pool of
// 2^20 draws is laid over the tensor, shifted by a prime each pass: a large operand gets its values in
// milliseconds rather than the seconds a draw per element would take.
void fill_normal(Runtime& rt, Tensor& t, uint64_t seed) {
  constexpr int64_t kPool = int64_t(1) << 20;
  static const std::vector<float> pool = [] {
    std::mt19937_64 gen(2024);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(kPool);
    for (float& x : v) x = normal(gen);
    return v;
  }();
  const int64_t n = t.numel();
  Tensor host = rt.host_empty({n}, Category::other, "calibration operand (host)");
  float* h = host.f32();
  for (int64_t i = 0, pass = 0; i < n; i += kPool, pass++) {
    const int64_t shift = int64_t((seed * 7919 + uint64_t(pass) * 104729) % uint64_t(kPool)), len = std::min(kPool, n - i);
    for (int64_t j = 0; j < len; j++) h[i + j] = pool[size_t((j + shift) % kPool)];
  }
  t.copy_from(host);
}

// One training step of the model on the meta device, traced: which GEMMs and attention calls it makes.
std::vector<TraceEvent> traced_step(const CalibrateArgs& a, const std::string& base, DType& dtype) {
  const std::vector<uint8_t> bytes = read_regular_file(a.config, 1 << 20, "the config");
  std::vector<std::string> sets = a.sets;
  sets.insert(sets.end(), {"train.device=meta", "train.steps=2", "log.trace_step=2", "train.eval_every=0", "checkpoint.dir=",
                           "log.profile=" + base});
  RunConfig cfg = parse_config(std::string(bytes.begin(), bytes.end()), a.config, sets, {}, lab_config_sections());
  std::vector<TraceEvent> events;
  run_planned(cfg, &events);
  dtype = cfg.precision.mode == "bf16" ? DType::bf16 : cfg.precision.mode == "fp16" ? DType::f16 : DType::f32;
  return events;
}

// Seconds per call of `run`: one warm-up, then as many calls as fill `seconds` (at least two), the device
// synchronized before the clock starts and after it stops.
template <class F>
double seconds_per_call(F run, AttachedDevice* dev, double seconds) {
  auto sync = [&] {
    if (dev) dev->synchronize();
  };
  run();
  sync();
  int calls = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double el = 0;
  while (calls < 2 || el < seconds) {
    run();
    calls++;
    sync();
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return el / calls;
}

// Seconds per call of C (m x n) = A (m x k) · B (k x n) at rt.dtype, on random operands, timed for at
// least `seconds` (the operands freed after)
double time_gemm(Runtime& rt, AttachedDevice* dev, int64_t m, int64_t n, int64_t k, double seconds) {
  Tensor A = rt.zeros({m, k}, Category::other, "calibration A"), B = rt.zeros({k, n}, Category::other, "calibration B"),
         C = rt.zeros({m, n}, Category::other, "calibration C");
  fill_normal(rt, A, uint64_t(m * 31 + k));
  fill_normal(rt, B, uint64_t(k * 17 + n));
  return seconds_per_call([&] { gemm(rt, "calibrate_gemm", false, false, m, n, k, 1.0f, A.f32(), k, B.f32(), n, 0.0f, C.f32(), n); }, dev,
                          seconds);
}

struct AttentionShape {
  int64_t heads, seq, head_dim;
  bool backward;
  bool operator<(const AttentionShape& o) const {
    return std::tie(heads, seq, head_dim, backward) < std::tie(o.heads, o.seq, o.head_dim, o.backward);
  }
};

// --comm FILE: `distlab bench comm --json` rows -> the busbw of the largest all_reduce, α from the smallest
// `label` names the table's origin in the profile's calibration_source (the file, or "measured here")
void read_comm_table(const std::string& path, HardwareProfile& hw, std::string& what, const std::string& label) {
  const std::vector<uint8_t> bytes = read_regular_file(path, 16 << 20, "--comm's table");
  const nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (!j.is_object() || !j.contains("rows") || !j["rows"].is_array() || !j.value("world_size", 0))
    throw ConfigError(label + " (" + path + "): not a table of `distlab bench comm --json`", "run distlab bench comm --backend nccl -n N --json FILE");
  const int n = j["world_size"].get<int>();
  const nlohmann::json *small = nullptr, *large = nullptr;
  for (const auto& r : j["rows"]) {
    if (r.value("op", "") != "all_reduce") continue;
    if (!small || r.value("bytes", 0.0) < small->value("bytes", 0.0)) small = &r;
    if (!large || r.value("bytes", 0.0) > large->value("bytes", 0.0)) large = &r;
  }
  if (!large || n < 2) throw ConfigError(label + " (" + path + "): no all_reduce rows over two or more ranks", "the table of a run with -n 2 or more");
  hw.intra_node_busbw_bytes_per_s = large->value("busbw_gbps", 0.0) * 1e9;
  hw.collective_latency_s = small->value("time_us", 0.0) * 1e-6 / (2.0 * (n - 1));  // a small all_reduce: 2(n−1) steps of α
  what = fmt::format("{}: all_reduce over {} ranks ({}: busbw {:.1f} GB/s at {}; α {:.2f} µs from {})", label, n, j.value("backend", "gloo"),
                     large->value("busbw_gbps", 0.0), format_bytes(large->value("bytes", 0.0)), 1e6 * hw.collective_latency_s,
                     format_bytes(small->value("bytes", 0.0)));
}

int run_calibrate(const CalibrateArgs& a) {
  // an output folder that cannot take the file fails now, not after minutes of timing (and leaves nothing)
  const std::filesystem::path folder = std::filesystem::path(a.out).parent_path().empty() ? "." : std::filesystem::path(a.out).parent_path();
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    throw IoError("-o " + a.out + ": cannot write into " + folder.string() + ": " + std::strerror(errno), "a folder that exists and is writable");
  // the device, then: a GPU's name picks the base profile when none is named
  Runtime rt(parse_device(a.device));  // cuda-sim: a cuda rank whose kernels are the CPU's
  if (rt.is_meta()) throw ConfigError("--device meta: nothing to measure on the meta device", "cuda, cuda-sim or cpu");
  std::unique_ptr<AttachedDevice> dev = attach_device(rt, a.device, 0);
  const std::string where = dev ? dev->describe() : "cpu";
  std::string base = a.base;
  if (base.empty()) {
    if (a.device == "cpu" || a.device == "cuda-sim") base = "cpu";  // cuda-sim's kernels are the CPU's
    else if (auto p = profile_for_gpu(where); p && a.device == "cuda") base = p->name;
    else throw ConfigError("--base: no built-in profile for " + where, "name the profile this device is closest to: " + profile_names(true));
  }
  HardwareProfile hw = require_profile(base, "--base", true);
  if (!hw.file.empty()) throw ConfigError("--base " + base + ": a profile file", "calibrate from a built-in profile: " + profile_names(true));
  DType dtype = DType::f32;
  const std::vector<TraceEvent> events = traced_step(a, base, dtype);

  // the shapes the step runs, each once
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, double> gemm_flops;  // (m, n, k, low precision) -> FLOPs a step
  std::map<AttentionShape, double> attention_flops;
  for (const TraceEvent& e : events) {
    if (e.kind != EventKind::compute) continue;
    for (const GemmShape& g : e.shape.gemm)
      if (g.m > 0) gemm_flops[{g.m, g.n, g.k, e.low_precision}] += 2.0 * double(g.m) * double(g.n) * double(g.k);
    if (e.shape.heads > 0) attention_flops[{e.shape.heads, e.shape.seq, e.shape.head_dim, e.name == "flash_attention_backward"}] += e.flops;
  }
  if (gemm_flops.empty())
    throw ConfigError("calibrate " + a.config + ": the step runs no GEMM", "a model with linear layers (configs/gpt2-124m.toml, configs/llama3-8b.toml)");

  std::cout << fmt::format("distlab bench calibrate: {} on {} (base profile {}), {} GEMM shapes and {} attention calls of one step\n", a.config,
                           where, base, gemm_flops.size(), attention_flops.size());
  HardwareProfile out = hw;
  // Settle: the largest GEMM of the step, run for --settle seconds before anything is timed, so that the
  // timings see the clock a training run holds (power limit, temperature), not the first seconds' boost
  const double settle_s = a.settle >= 0 ? a.settle : a.device == "cuda" ? 10.0 : 0.0;
  if (settle_s > 0) {
    auto largest = gemm_flops.begin();
    for (auto it = gemm_flops.begin(); it != gemm_flops.end(); ++it)
      if (std::get<0>(it->first) * std::get<1>(it->first) * std::get<2>(it->first) >
          std::get<0>(largest->first) * std::get<1>(largest->first) * std::get<2>(largest->first))
        largest = it;
    const auto [m, n, k, low] = largest->first;
    rt.dtype = low ? dtype : DType::f32;
    const double s = time_gemm(rt, dev.get(), m, n, k, settle_s);
    std::cout << fmt::format("settled {:g} s under the step's largest GEMM ({} x {} x {}: {:.3g} TFLOP/s on average over it)\n", settle_s, m, n, k,
                             2.0 * double(m) * double(n) * double(k) / s / 1e12);
  }
  std::cout << fmt::format("{:<9} {:>8} {:>8} {:>8} {:>6} {:>12} {:>14} {:>14} {:>7}\n", "kernel", "M", "N", "K", "bf16", "GFLOP/step",
                           "measured TF/s", "base TF/s", "ratio");
  double gemm_total = 0;  // the step's GEMM FLOPs
  for (const auto& [key, step_flops] : gemm_flops) {
    const auto [m, n, k, low] = key;
    rt.dtype = low ? dtype : DType::f32;
    const double s = time_gemm(rt, dev.get(), m, n, k, a.seconds);
    const double flops = 2.0 * double(m) * double(n) * double(k), rate = flops / s;
    const GemmShape g{m, n, k};
    const double peak = low ? hw.low_precision_flops_per_s : hw.fp32_flops_per_s;
    const double modeled = peak * hw.gemm_efficiency * gemm_quantization(g, hw);
    out.measured_gemms.push_back({g, low, rate});
    gemm_total += step_flops;
    std::cout << fmt::format("{:<9} {:>8} {:>8} {:>8} {:>6} {:>12.2f} {:>14.3f} {:>14.3f} {:>7.2f}\n", "gemm", m, n, k, low ? "yes" : "no",
                             step_flops / 1e9, rate / 1e12, modeled / 1e12, rate / modeled);
  }
  // the GEMMs' share of the peak, weighted by the step's FLOPs: what shapes not measured here are modeled at.
  // A measured rate above the base's peak (a CPU faster than the one the cpu profile was measured on) makes
  // the best measured rate the peak: MFU is never above 100 %.
  double best_low = 0, best_f32 = 0;
  for (const MeasuredGemm& g : out.measured_gemms) (g.low_precision ? best_low : best_f32) = std::max(g.low_precision ? best_low : best_f32, g.flops_per_s);
  std::string raised;
  if (best_f32 > out.fp32_flops_per_s) {
    raised += fmt::format("; the fp32 peak raised from the base's {:.3g} to the best measured {:.3g} FLOP/s", out.fp32_flops_per_s, best_f32);
    out.fp32_flops_per_s = best_f32;
    if (hw.low_precision_flops_per_s == hw.fp32_flops_per_s) out.low_precision_flops_per_s = best_f32;  // no 16-bit units (a CPU)
  }
  if (best_low > out.low_precision_flops_per_s) {
    raised += fmt::format("; the 16-bit peak raised from the base's {:.3g} to the best measured {:.3g} FLOP/s", out.low_precision_flops_per_s, best_low);
    out.low_precision_flops_per_s = best_low;
  }
  double gemm_weighted = 0;
  for (const MeasuredGemm& g : out.measured_gemms)
    gemm_weighted += gemm_flops.at({g.shape.m, g.shape.n, g.shape.k, g.low_precision}) * g.flops_per_s /
                     ((g.low_precision ? out.low_precision_flops_per_s : out.fp32_flops_per_s) * gemm_quantization(g.shape, out));
  out.gemm_efficiency = gemm_weighted / gemm_total;
  double att_weighted = 0, att_total = 0;
  for (const auto& [shape, step_flops] : attention_flops) {
    rt.dtype = dtype;
    const int64_t H = shape.heads, T = shape.seq, hd = shape.head_dim;
    Tensor qkv = rt.zeros({H, T, 3 * hd}, Category::other, "calibration qkv"), o = rt.zeros({H, T, hd}, Category::other, "calibration out"),
           lse = rt.zeros({H, T}, Category::other, "calibration lse"), dq = rt.zeros({H, T, 3 * hd}, Category::other, "calibration dqkv");
    fill_normal(rt, qkv, 5);
    fill_normal(rt, o, 6);
    const double flops = flash_attention_flops(H, T, hd, 1, shape.backward);
    const double s = seconds_per_call(
        [&] {
          if (shape.backward) flash_attention_backward(rt, dq.f32(), o.f32(), qkv.f32(), o.f32(), lse.f32(), H, T, hd, 1);
          else flash_attention_forward(rt, o.f32(), lse.f32(), qkv.f32(), H, T, hd, 1);
        },
        dev.get(), a.seconds);
    const double rate = flops / s, peak = dtype == DType::f32 ? out.fp32_flops_per_s : out.low_precision_flops_per_s;
    const double base_rate = (dtype == DType::f32 ? hw.fp32_flops_per_s : hw.low_precision_flops_per_s) * hw.attention_efficiency;
    out.measured_attention.push_back({T, hd, shape.backward, rate});
    att_weighted += step_flops * rate / peak;
    att_total += step_flops;
    std::cout << fmt::format("{:<9} {:>8} {:>8} {:>8} {:>6} {:>12.2f} {:>14.3f} {:>14.3f} {:>7.2f}\n", shape.backward ? "flash bwd" : "flash fwd",
                             H, T, hd, dtype == DType::f32 ? "no" : "yes", step_flops / 1e9, rate / 1e12, base_rate / 1e12, rate / base_rate);
  }
  if (att_total > 0) out.attention_efficiency = att_weighted / att_total;
  // a streaming kernel: dst += src reads 8 bytes and writes 4 per element
  rt.dtype = DType::f32;
  const int64_t n = dev && a.device == "cuda" ? int64_t(64) << 20 : int64_t(16) << 20;
  Tensor x = rt.zeros({n}, Category::other, "calibration x"), y = rt.zeros({n}, Category::other, "calibration y");
  const double s = seconds_per_call([&] { accumulate(rt, x.f32(), y.f32(), n); }, dev.get(), a.seconds);
  const double bw = 12.0 * double(n) / s;
  out.mem_bw_efficiency = bw / hw.mem_bw_bytes_per_s;
  std::cout << fmt::format("{:<9} {:>26} {:>12.2f} {:>11.1f} GB/s {:>11.1f} GB/s {:>7.2f}\n", "stream", format_bytes(12.0 * double(n)), 0.0,
                           bw / 1e9, hw.mem_bw_bytes_per_s * hw.mem_bw_efficiency / 1e9, bw / (hw.mem_bw_bytes_per_s * hw.mem_bw_efficiency));
  std::string comm = "not measured (the base's)";
  int comm_ranks = a.comm_ranks >= 0 ? a.comm_ranks : a.device == "cuda" ? cuda_device_count(nullptr) : 0;
  const std::string backend = a.device == "cuda" ? "nccl" : "gloo";
  if (a.comm.empty() && comm_ranks >= 2 && backend == "nccl") {
    std::string why;
    if (!cuda_symbol("distlab_nccl_bench", &why)) {
      if (a.comm_ranks >= 0) throw ConfigError("--comm-ranks " + std::to_string(comm_ranks) + ": " + why, "a build with NCCL, or --comm-ranks 0");
      comm = "not measured (the base's: this build has no NCCL: " + why + ")";
      comm_ranks = 0;
    }
  }
  if (!a.comm.empty()) {
    read_comm_table(a.comm, out, comm, "--comm");
  } else if (comm_ranks >= 2) {  // the collectives, measured here: bench comm over comm_ranks ranks, its table read back
    const std::string table =
        (std::filesystem::temp_directory_path() / fmt::format("distlab-calibrate-comm-{}-{}.json", ::getpid(), std::time(nullptr))).string();
    struct Remove {  // the table is ours: gone whatever happens
      std::string path;
      ~Remove() {
        std::error_code ec;
        std::filesystem::remove(path, ec);
      }
    } remove_table{table};
    LaunchOptions o;
    o.nproc_per_node = comm_ranks;
    o.master_port = 0;
    o.threads_per_rank = 1;
    o.argv = {a.self_exe, "bench", "comm", "--backend", backend, "--max", backend == "nccl" ? "256MiB" : "8MiB", "--json", table};
    std::cout << fmt::format("collectives: distlab bench comm --backend {} over {} ranks\n", backend, comm_ranks);
    std::cout.flush();
    if (launch(o) != 0)
      throw Error(fmt::format("calibrate: distlab bench comm over {} ranks failed (its output is above)", comm_ranks),
                  "--comm-ranks 0 leaves the collectives at the base's figures");
    read_comm_table(table, out, comm, "distlab bench comm, measured here");
  } else if (a.device == "cuda" && comm_ranks < 2 && a.comm_ranks < 0) {
    comm = "not measured (the base's: one GPU here)";
  }

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  out.name = a.name.empty() ? "calibrated-" + base : a.name;
  out.source = fmt::format("{} (data sheet), calibrated by distlab bench calibrate on {}, {}", hw.source, where, date);
  out.calibration_source = fmt::format("measured on {} ({}) for {}: {} GEMM shapes (FLOP-weighted {:.3f} of peak after quantization; random "
                                       "operands, after {:g} s under load), {} attention calls, streaming {:.1f} GB/s; collectives: {}{}",
                                       where, date, a.config, out.measured_gemms.size(), out.gemm_efficiency, settle_s, out.measured_attention.size(),
                                       bw / 1e9, comm, raised);
  AtomicFile file(a.out);
  file.write(profile_file_json(out, base));
  file.commit();
  std::cout << fmt::format("wrote {}: log.profile = \"{}\" or distlab plan --profile {}\n", a.out, a.out, a.out);
  return 0;
}

}  // namespace

void add_calibrate_command(CLI::App* bench, int& exit_code, const std::string& self_exe) {
  auto a = std::make_shared<CalibrateArgs>();
  a->self_exe = self_exe;
  CLI::App* sub = bench->add_subcommand("calibrate", "measure this device's GEMMs (at a model's shapes), attention and bandwidth into a profile file");
  sub->add_option("config", a->config, "the run config whose step's shapes to measure (configs/gpt2-124m.toml)")->required();
  sub->add_option("--set", a->sets, "any config key, as for train (the micro-batch, the sequence, precision.mode: the shapes)");
  sub->add_option("--device", a->device, "cuda (default), cuda-sim or cpu")->check(CLI::IsMember({"cuda", "cuda-sim", "cpu"}));
  sub->add_option("--base", a->base, "the built-in profile to start from (default: the GPU's own, by its name)");
  sub->add_option("-o,--out", a->out, "the profile file to write (a .json)")->required();
  sub->add_option("--name", a->name, "the profile's name (default calibrated-<base>)");
  sub->add_option("--comm", a->comm, "the JSON of `distlab bench comm --backend nccl -n N`: NCCL's busbw and latency, measured before");
  sub->add_option("--comm-ranks", a->comm_ranks, "ranks to measure the collectives over (default: every GPU on cuda when 2 or more; "
                                                 "0: not measured; on cpu and cuda-sim, ranks over Gloo)")
      ->check(CLI::Range(0, 64));
  sub->add_option("--seconds", a->seconds, "time each kernel at least this long (default 0.2)")->check(CLI::PositiveNumber);
  sub->add_option("--settle", a->settle, "seconds under the step's largest GEMM before timing (default 10 on a GPU, 0 elsewhere)")
      ->check(CLI::Range(0.0, 3600.0));
  sub->callback([a, &exit_code]() {
    if (!a->out.ends_with(".json")) throw ConfigError("-o " + a->out + ": a profile file's name ends in .json", "log.profile tells a file from a built-in by it");
    exit_code = run_calibrate(*a);
  });
}

}  // namespace distlab
