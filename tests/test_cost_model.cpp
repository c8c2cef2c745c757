// The cost model against its definitions: the α-β ring formulas written out here, nccl-tests' busbw
// conventions, timelines worked out by hand on a profile with round numbers, references that need no
// numbers at all (1 rank → speed-up 1; no communication → speed-up N), and the course's claim about
// overlapping DDP's all-reduce with backward on 2×T4.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <unistd.h>
#include <cstdlib>
#include <map>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/perf/chrome_trace.h"
#include "core/perf/cost_model.h"
#include "core/perf/hardware.h"
#include "core/tensor/allocator_model.h"
#include "core/tensor/tensor.h"
#include "core/util/error.h"

using namespace distlab;
using Ranks = std::vector<std::vector<TraceEvent>>;

namespace {

TraceEvent compute(const std::string& name, double flops, double bytes = 0, bool scales = true) {
  TraceEvent e;
  e.name = name;
  e.flops = flops;
  e.bytes = bytes;
  e.scales_with_batch = scales;
  return e;
}

TraceEvent collective(const std::string& op, int64_t bytes, int n, int64_t seq, const std::string& group = "world") {
  TraceEvent e;
  e.name = op;
  e.kind = EventKind::collective;
  e.stream = Stream::comm;
  e.op = op;
  e.payload_bytes = bytes;
  e.group_size = n;
  e.seq = seq;
  e.group = group;
  return e;
}

TraceEvent wait_for(int64_t seq, const std::string& group = "world") {
  TraceEvent e;
  e.name = "wait";
  e.kind = EventKind::wait;
  e.seq = seq;
  e.group = group;
  return e;
}

// Round numbers, so that timelines can be worked out by hand: 1 GFLOP/s, 1 GB/s everywhere.
HardwareProfile round_profile(double alpha_s = 0, double launch_s = 0) {
  HardwareProfile hw = *find_profile("cpu");
  hw.name = "round";
  hw.fp32_flops_per_s = hw.low_precision_flops_per_s = 1e9;
  hw.mem_bw_bytes_per_s = hw.intra_node_busbw_bytes_per_s = hw.inter_node_busbw_bytes_per_s = 1e9;
  hw.collective_latency_s = alpha_s;
  hw.launch_overhead_s = launch_s;
  return hw;
}

const std::vector<std::string> kOps = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier"};

// The formulas as the course states them: (latency steps, bandwidth factor).
std::pair<double, double> ring_terms(const std::string& op, int n) {
  if (op == "all_reduce") return {2.0 * (n - 1), 2.0 * (n - 1) / n};
  if (op == "reduce_scatter" || op == "all_gather") return {double(n - 1), double(n - 1) / n};
  if (op == "broadcast") return {double(n - 1), 1.0};
  if (op == "barrier") return {2.0 * (n - 1), 0.0};
  return {1.0, 1.0};  // send, recv
}

// A CIFAR CNN with one hidden FC layer, per image at 32×32: conv1 3→32 (896 params, 1.77 MFLOP), pool,
// conv2 32→64 (18,496 params, 9.44 MFLOP), pool, fc1 4096→128 (524,416 params), fc2 128→10 (1,290 params):
// 545,098 parameters (2.18 MB of fp32 gradients), ≈12.3 MFLOP forward, ≈37 MFLOP forward+backward.
// Bytes are activations in+out per image plus the weights once per batch (gradients too in backward).
struct Layer {
  const char* name;
  double fwd_flops_per_image, act_bytes_per_image;
  int64_t params;
};
const std::vector<Layer> kCnn = {
    {"conv1", 2.0 * 32 * 32 * 32 * 27, 4.0 * (3 * 32 * 32 + 32 * 32 * 32), 896},
    {"relu_pool1", 2.0 * 32 * 32 * 32, 4.0 * (2 * 32 * 32 * 32 + 32 * 16 * 16), 0},
    {"conv2", 2.0 * 16 * 16 * 64 * 288, 4.0 * (32 * 16 * 16 + 64 * 16 * 16), 18496},
    {"relu_pool2", 2.0 * 64 * 16 * 16, 4.0 * (2 * 64 * 16 * 16 + 64 * 8 * 8), 0},
    {"fc1", 2.0 * 4096 * 128, 4.0 * (4096 + 128), 524416},
    {"fc2", 2.0 * 128 * 10, 4.0 * (128 + 10), 1290},
};

enum class Sync { overlapped, exposed };

// One DDP step of one rank: forward, backward in reverse with one all-reduce per layer's gradients, waits,
// SGD. overlapped: each all-reduce is issued right after its layer's backward (DDP with small buckets);
// exposed: all of them are issued after the last backward kernel (the naive version), same bytes.
std::vector<TraceEvent> ddp_step(int batch, int n_ranks, Sync sync) {
  std::vector<TraceEvent> ev, pending;
  int64_t seq = 0, total_params = 0;
  for (const Layer& l : kCnn)
    ev.push_back(compute(std::string(l.name) + "_forward", batch * l.fwd_flops_per_image,
                         batch * l.act_bytes_per_image + 4.0 * l.params));
  for (auto l = kCnn.rbegin(); l != kCnn.rend(); ++l) {
    ev.push_back(compute(std::string(l->name) + "_backward", 2 * batch * l->fwd_flops_per_image,
                         2 * batch * l->act_bytes_per_image + 8.0 * l->params));
    if (l->params == 0) continue;
    total_params += l->params;
    (sync == Sync::overlapped ? ev : pending).push_back(collective("all_reduce", 4 * l->params, n_ranks, seq++));
  }
  ev.insert(ev.end(), pending.begin(), pending.end());
  for (int64_t s = 0; s < seq; s++) ev.push_back(wait_for(s));
  // SGD with momentum reads p, g, m and writes p, m; it does not grow with the batch.
  ev.push_back(compute("sgd_step", 3.0 * total_params, 20.0 * total_params, /*scales=*/false));
  return ev;
}

Ranks symmetric(int n_ranks, int batch, Sync sync) { return Ranks(n_ranks, ddp_step(batch, n_ranks, sync)); }

}  // namespace

TEST_CASE("profiles: memory and link-aware profiles are all found", "[costmodel]") {
  for (const char* name : {"t4", "a100-40g", "a100-80g", "h100", "h200", "t4-pcie", "a100-nvlink", "h100-nvlink", "h100-96g", "h100-pcie", "cpu"}) {
    INFO(name);
    REQUIRE(find_profile(name).has_value());
    CHECK(parse_device_memory(name, "test") == find_profile(name)->memory_bytes);
  }
  CHECK(find_profile("t4-pcie")->memory_bytes == (16LL << 30));
  CHECK(find_profile("h200")->memory_bytes == 141000000000LL);
  for (const char* name : {"t4-pcie", "a100-nvlink", "h100-nvlink", "h100-96g", "h100-pcie", "h200", "cpu"}) {
    INFO(name);
    const HardwareProfile p = require_profile(name, "test", /*need_cost_model=*/true);
    CHECK(p.low_precision_flops_per_s >= p.fp32_flops_per_s);
    CHECK(p.inter_node_busbw_bytes_per_s <= p.intra_node_busbw_bytes_per_s);
    CHECK(p.collective_latency_s > 0);
  }
  CHECK_THROWS_AS(require_profile("t4", "test", true), ConfigError);
  CHECK_THROWS_AS(require_profile("v100", "test"), ConfigError);
  CHECK_THROWS_AS(compute_time(compute("x", 1), *find_profile("a100-80g")), ConfigError);
}

TEST_CASE("compute_time is the roofline at the rates real kernels reach, plus the launch overhead", "[costmodel]") {
  const HardwareProfile hw = *find_profile("t4-pcie");
  const double gemm = hw.gemm_efficiency, flash = hw.attention_efficiency, stream = hw.mem_bw_efficiency;
  const double flops = 1e9, bytes = 1e6;  // compute-bound: 123 µs of math at the peak, 3 µs of memory
  CHECK(compute_time(compute("gemm", flops, bytes), hw) == Approx(flops / (hw.fp32_flops_per_s * gemm) + hw.launch_overhead_s));
  CHECK(compute_time(compute("gemm", flops, bytes), hw, true) ==
        Approx(std::max(flops / (hw.low_precision_flops_per_s * gemm), bytes / (hw.mem_bw_bytes_per_s * stream)) + hw.launch_overhead_s));
  // a flash-attention kernel has its own, lower share of the peak
  CHECK(compute_time(compute("flash_attention_forward", flops, bytes), hw) ==
        Approx(flops / (hw.fp32_flops_per_s * flash) + hw.launch_overhead_s));
  // memory-bound: an elementwise op over 64 MB
  CHECK(compute_time(compute("relu", 16e6, 64e6), hw) == Approx(64e6 / (hw.mem_bw_bytes_per_s * stream) + hw.launch_overhead_s));
  CHECK(compute_time(compute("empty", 0, 0), hw) == Approx(hw.launch_overhead_s));
  // at_peak: the data sheet's roofline, as a hand calculation gives it (log.calibrated = false)
  const HardwareProfile peak = at_peak(hw);
  CHECK(compute_time(compute("gemm", flops, bytes), peak) == Approx(flops / hw.fp32_flops_per_s + hw.launch_overhead_s));
  CHECK(compute_time(compute("relu", 16e6, 64e6), peak) == Approx(64e6 / hw.mem_bw_bytes_per_s + hw.launch_overhead_s));
  CHECK(peak.step_overhead_s == 0);
}

TEST_CASE("eager PyTorch's op chains: more bytes and launches for the unfused ops, the same for one-kernel ops, and torch.compile per block and log.fused_ops choose which run eager", "[costmodel]") {
  // RMSNorm forward over 1M elements, bf16: distlab's kernel reads x and writes y (4 bytes an element);
  // torchtitan's chain casts to f32, squares, means, multiplies, casts back and scales: 36 bytes, 8 kernels
  const double n = 1 << 20;
  KernelChain c = eager_chain("rmsnorm_forward", 4 * n, 2);
  CHECK(c.bytes == Approx(36 * n));
  CHECK(c.launches == 8);
  // in fp32 x.float() and type_as(x) return x: no casts
  c = eager_chain("rmsnorm_forward", 8 * n, 4);
  CHECK(c.bytes == Approx(28 * n));
  CHECK(c.launches == 6);
  // SwiGLU: silu, then the product (5a an element against the fused 3a), whatever the dtype
  CHECK(eager_chain("swiglu_forward", 6 * n, 2).bytes == Approx(10 * n));
  CHECK(eager_chain("swiglu_backward", 10 * n, 2).bytes == Approx(18 * n));
  // foreach AdamW: eight passes over f32 state, 84 bytes a parameter against the fused 28
  CHECK(eager_chain("adamw_step", 28 * n, 2).bytes == Approx(84 * n));
  CHECK(eager_chain("adamw_step", 28 * n, 4).bytes == Approx(84 * n));
  // eager PyTorch runs a GEMM, SDPA, LayerNorm or a residual add as one kernel too
  for (const char* one : {"matmul_forward", "matmul_backward", "flash_attention_forward", "layernorm_forward", "gelu_forward", "add",
                          "repeat_kv_forward", "embedding_forward"}) {
    c = eager_chain(one, 1e6, 2);
    CHECK(c.bytes == 1e6);
    CHECK(c.launches == 1);
  }
  // every chain moves at least what the fused kernel moves, in both dtypes
  for (const char* k : {"rmsnorm_forward", "rmsnorm_backward", "rope_forward", "rope_backward", "swiglu_forward", "swiglu_backward",
                        "softmax_crossentropy_forward", "softmax_crossentropy_backward", "adamw_step"})
    for (int a : {2, 4}) {
      INFO(k << " " << a);
      CHECK(eager_chain(k, 1e6, a).bytes >= 1e6);
    }

  // compute_time: a memory-bound op pays the chain's bytes and every launch; a GEMM is unchanged
  const HardwareProfile hw = *find_profile("h100-nvlink");
  const KernelSet eager{eager_ops_for(ModeledKernels::eager, {}), 2};
  const TraceEvent norm = compute("rmsnorm_forward", 4 * n, 4 * n);
  const double chained = 36 * n / (hw.mem_bw_bytes_per_s * hw.mem_bw_efficiency) + 8 * hw.launch_overhead_s;
  const double one_pass = 4 * n / (hw.mem_bw_bytes_per_s * hw.mem_bw_efficiency) + hw.launch_overhead_s;
  CHECK(compute_time(norm, hw, true, eager) == Approx(chained));
  CHECK(compute_time(norm, hw, true, KernelSet{}) == Approx(one_pass));
  const TraceEvent gemm = compute("matmul_forward", 1e12, 1e8);
  CHECK(compute_time(gemm, hw, true, eager) == compute_time(gemm, hw, true));

  // torch.compile on each block (torchtitan's apply_compile): the blocks' chains fused, the loss and AdamW
  // eager; log.fused_ops takes a family out of the eager set (torchtitan's fused_rmsnorm of April 2024)
  const KernelSet compiled{eager_ops_for(ModeledKernels::compiled, {}), 2};
  const TraceEvent loss = compute("softmax_crossentropy_forward", 0, 4 * n), adamw = compute("adamw_step", 0, 28 * n);
  CHECK(compute_time(norm, hw, true, compiled) == Approx(one_pass));
  CHECK(compute_time(loss, hw, true, compiled) == compute_time(loss, hw, true, eager));
  CHECK(compute_time(loss, hw, true, compiled) > 2 * compute_time(loss, hw, true));
  CHECK(compute_time(adamw, hw, true, compiled) == compute_time(adamw, hw, true, eager));
  CHECK(compute_time(adamw, hw, true, compiled) > 2 * compute_time(adamw, hw, true));
  const KernelSet fused_norm{eager_ops_for(ModeledKernels::eager, {"rmsnorm"}), 2};
  CHECK(compute_time(norm, hw, true, fused_norm) == Approx(one_pass));
  CHECK(compute_time(loss, hw, true, fused_norm) == compute_time(loss, hw, true, eager));
  CHECK(eager_ops_for(ModeledKernels::fused, {"rope"}) == 0);
  try {
    eager_ops_for(ModeledKernels::eager, {"layernorm"});
    FAIL("an unknown family was taken");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.full(), Catch::Contains("log.fused_ops: 'layernorm' is no op family") && Catch::Contains("rmsnorm, rope, swiglu, loss, adamw"));
  }
}

TEST_CASE("eager chains against PyTorch: the bytes and kernels its dispatcher sees for torchtitan's code", "[costmodel][peer]") {
  // tests/eager_chains.py runs torchtitan's RMSNorm, RoPE, SwiGLU, loss and foreach AdamW forward and
  // backward in bf16 and f32 and counts every ATen op's tensor bytes; eager.cpp's chains were written from
  // the same code by hand. They agree op for op except where the dispatcher sees a tensor the kernel only
  // touches a row of (mean's backward reads the row's value spread by a view, nll_loss reads one value a
  // row): at most 4 bytes an element, which the comparison allows; and PyTorch 1.13's AdamW runs
  // exp_avg's update as mul_ + add_ (8 bytes more) where 2.x, which torchtitan ran, has one lerp_.
  const std::string json = (std::filesystem::temp_directory_path() / ("distlab-eager-" + std::to_string(::getpid()) + ".json")).string();
  const int rc = std::system(("/usr/bin/python3 " + std::string(DISTLAB_SOURCE_DIR) + "/tests/eager_chains.py > " + json).c_str());
  REQUIRE(rc == 0);
  std::ifstream in(json);
  const nlohmann::json measured = nlohmann::json::parse(in);
  std::filesystem::remove(json);
  const std::map<std::string, double> fused = {  // distlab's kernels' bytes per element (OpScope, at 4 bytes a value)
      {"rmsnorm_forward", 8}, {"rmsnorm_backward", 12}, {"rope_forward", 8}, {"rope_backward", 8}, {"swiglu_forward", 12},
      {"swiglu_backward", 20}, {"softmax_crossentropy_forward", 8}, {"softmax_crossentropy_backward", 8}, {"adamw_step", 28}};
  REQUIRE(measured.size() == fused.size());
  for (const auto& [name, per_element32] : fused)
    for (int a : {2, 4}) {
      const nlohmann::json& m = measured.at(name).at(std::to_string(a));
      // OpScope scales batch-sized bytes by a/4; the optimizer's are f32 whatever the activations
      const double fused_bytes = name == "adamw_step" ? per_element32 : per_element32 * a / 4;
      const KernelChain c = eager_chain(name, fused_bytes, a);
      double expect = m["bytes_per_element"].get<double>();
      int kernels = m["kernels"].get<int>();
      if (name == "adamw_step") {
        expect -= 8;  // lerp_ in place of mul_ + add_
        kernels = -1;  // likewise one kernel fewer; the bias corrections' scalar reads and the profiler marker run none
        for (const auto& op : m["ops"]) {
          const std::string o = op[0].get<std::string>();
          kernels += o != "_local_scalar_dense" && o != "_record_function_enter" && o != "zeros";
        }
      }
      INFO(name << " with " << a << "-byte activations: modeled " << c.bytes << " bytes and " << c.launches << " kernels, measured "
                << expect << " and " << kernels << " (" << m["ops"].dump() << ")");
      CHECK(c.bytes >= expect - 4.5);
      CHECK(c.bytes <= expect + 0.5);
      CHECK(std::abs(c.launches - kernels) <= 1);
    }
}

TEST_CASE("calibration: every GPU profile reaches less than its peak, with a source, and the cpu profile was measured", "[costmodel]") {
  for (const char* name : {"t4-pcie", "a100-nvlink", "h100-nvlink", "h100-96g", "h100-pcie", "h200"}) {
    INFO(name);
    const HardwareProfile p = require_profile(name, "test", true);
    for (double e : {p.gemm_efficiency, p.attention_efficiency, p.mem_bw_efficiency}) {
      CHECK(e > 0.2);
      CHECK(e < 1);
    }
    CHECK(p.attention_efficiency <= p.gemm_efficiency);  // flash attention's softmax and its tiles cost what a GEMM does not
    CHECK(p.step_overhead_s > 0);
    CHECK_FALSE(p.calibration_source.empty());
  }
  // the published measurements they come from: MAMF's A100 271.2 / 312, H100 794.5 / 989 TFLOPS
  CHECK(find_profile("a100-nvlink")->gemm_efficiency == Approx(0.869).margin(0.001));
  CHECK(find_profile("h100-nvlink")->gemm_efficiency == Approx(0.803).margin(0.001));
  CHECK(find_profile("h200")->gemm_efficiency == find_profile("h100-nvlink")->gemm_efficiency);
  // torchtitan's H100s: 96 GB of HBM2e at 2.4 TB/s, the SXM's compute
  const HardwareProfile gt = *find_profile("h100-96g");
  CHECK(gt.memory_bytes == (96LL << 30));
  CHECK(gt.mem_bw_bytes_per_s == 2.4e12);
  CHECK(gt.low_precision_flops_per_s == find_profile("h100-nvlink")->low_precision_flops_per_s);
  const HardwareProfile cpu = *find_profile("cpu");
  CHECK(cpu.gemm_efficiency == 1);
  CHECK(cpu.mem_bw_efficiency == 1);
  CHECK(cpu.step_overhead_s == 0);
}

TEST_CASE("ring formulas follow nccl-tests' algbw/busbw conventions", "[costmodel]") {
  const HardwareProfile hw = *find_profile("t4-pcie");
  const HardwareProfile no_latency = round_profile(0);
  for (const std::string& op : kOps) {
    for (int n = 1; n <= 4; n++) {
      for (int64_t bytes : {int64_t(0), int64_t(1), int64_t(7), int64_t(1) << 20, int64_t(1000000007)}) {
        INFO(op << " n=" << n << " S=" << bytes);
        const auto [steps, factor] = ring_terms(op, n);
        const double expected_s = n == 1 ? 0 : steps * hw.collective_latency_s + double(bytes) / hw.intra_node_busbw_bytes_per_s * factor;
        CHECK(collective_time(op, bytes, n, hw) == Approx(expected_s));
        CHECK(busbw_factor(op, n) == Approx(factor));
        // Without latency, the busbw computed from the time is exactly the profile's bus bandwidth.
        if (n > 1 && bytes > 0 && op != "barrier") {
          const double t_s = collective_time(op, bytes, n, no_latency);
          CHECK(algbw(bytes, t_s) * busbw_factor(op, n) == Approx(no_latency.intra_node_busbw_bytes_per_s));
        }
      }
    }
  }
  SECTION("n = 1 costs nothing; S = 0 costs latency only") {
    CHECK(collective_time("all_reduce", 1 << 30, 1, hw) == 0);
    CHECK(collective_time("all_reduce", 0, 4, hw) == Approx(6 * hw.collective_latency_s));
    CHECK(collective_time("all_gather", 0, 3, hw) == Approx(2 * hw.collective_latency_s));
  }
  SECTION("a large all-reduce reaches the profile's busbw; inter-node is slower") {
    const double t_s = collective_time("all_reduce", int64_t(1) << 30, 8, hw);
    CHECK(algbw(int64_t(1) << 30, t_s) * busbw_factor("all_reduce", 8) == Approx(hw.intra_node_busbw_bytes_per_s).epsilon(0.01));
    CHECK(collective_time("all_reduce", int64_t(1) << 30, 8, hw, Link::inter_node) > t_s);
  }
  CHECK_THROWS_AS(collective_time("all_to_all", 8, 2, hw), Error);
  CHECK_THROWS_AS(collective_time("all_reduce", -1, 2, hw), Error);
}

TEST_CASE("replay: a straggler delays the collective on the other rank", "[costmodel]") {
  const double alpha_s = 1e-4;
  const HardwareProfile hw = round_profile(alpha_s);
  // rank 0 computes 1 ms, rank 1 computes 3 ms; both then all-reduce 1 MB and wait for it.
  Ranks ranks = {{compute("fwd", 1e6), collective("all_reduce", 1000000, 2, 0), wait_for(0)},
                 {compute("fwd", 3e6), collective("all_reduce", 1000000, 2, 0), wait_for(0)}};
  const ReplayResult r = replay(ranks, hw);
  const double t_ar_s = 2 * alpha_s + 1e6 / 1e9 * 1.0;  // 2(n−1)α + S/B·2(n−1)/n at n = 2
  const double end_s = 3e-3 + t_ar_s;
  CHECK(r.step_s == Approx(end_s));
  for (const ModeledEvent& e : r.events)
    if (e.kind == EventKind::collective) {
      CHECK(e.start_s == Approx(3e-3));  // when the straggler issued it, not when rank 0 did
      CHECK(e.end_s == Approx(end_s));
    }
  CHECK(r.ranks[0].compute_s == Approx(1e-3));
  CHECK(r.ranks[0].exposed_comm_s == Approx(end_s - 1e-3));  // rank 0 also waits for rank 1
  CHECK(r.ranks[1].exposed_comm_s == Approx(t_ar_s));
  CHECK(r.exposed_comm_s == Approx(end_s - 1e-3));
  CHECK(r.exposed_comm_mean_s == Approx((end_s - 1e-3 + t_ar_s) / 2));
}

TEST_CASE("replay: comm streams run collectives in order and overlap compute", "[costmodel]") {
  const HardwareProfile hw = round_profile(0);
  // Two 1 MB all-reduces (1 ms each at n = 2) issued at 1 ms and 2 ms: the second queues behind the
  // first (starts at 2 ms, ends at 3 ms) while 2 ms of compute runs; the final wait costs nothing extra.
  std::vector<TraceEvent> rank = {compute("b1", 1e6), collective("all_reduce", 1000000, 2, 0), compute("b2", 1e6),
                                  collective("all_reduce", 1000000, 2, 1), compute("b3", 1e6), wait_for(0), wait_for(1)};
  const ReplayResult r = replay(Ranks(2, rank), hw);
  CHECK(r.step_s == Approx(3e-3));
  CHECK(r.compute_s == Approx(3e-3));
  CHECK(r.comm_s == Approx(2e-3));
  CHECK(r.exposed_comm_s == Approx(0).margin(1e-12));
}

TEST_CASE("replay: a kernel beside a running collective loses the SMs NCCL holds, and only while it runs", "[costmodel]") {
  // 4 SMs, one held by a running collective: a kernel beside it runs at 3/4 of its rate (1 ms alone, 4/3 ms
  // beside); the kernels below have no GEMM shape, so only the peak's share of SMs counts.
  HardwareProfile hw = round_profile(0);
  hw.sm_count = 4;
  hw.gemm_tile_m = hw.gemm_tile_n = 1;
  hw.comm_sms = 1;
  const HardwareProfile beside = beside_collective(hw);
  CHECK(beside.sm_count == 3);
  CHECK(beside.low_precision_flops_per_s == Approx(0.75e9));
  CHECK(beside.mem_bw_bytes_per_s == hw.mem_bw_bytes_per_s);  // streaming kernels keep their bandwidth
  // the fake world (one traced rank): a 0.5 ms all-gather issued at 1 ms overlaps the first half-millisecond
  // of b, which does 3/8 of its work then and the other 5/8 alone: b ends at 2.125 ms, 0.125 ms lost
  auto trace = [](int64_t gather_bytes) {
    return std::vector<TraceEvent>{compute("a", 1e6), collective("all_gather", gather_bytes, 2, 0), compute("b", 1e6), compute("c", 1e6), wait_for(0)};
  };
  ReplayOptions fake;
  fake.symmetric = true;
  ReplayResult r = replay(Ranks{trace(1000000)}, hw, fake);
  std::map<std::string, std::pair<double, double>> at;
  for (const ModeledEvent& e : r.events) at[e.name] = {e.start_s, e.end_s};
  CHECK(at["all_gather"].first == Approx(1e-3));
  CHECK(at["all_gather"].second == Approx(1.5e-3));
  CHECK(at["b"].second == Approx(2.125e-3));
  CHECK(at["c"].second - at["c"].first == Approx(1e-3));  // after the collective: alone again
  CHECK(r.contention_s == Approx(0.125e-3));
  CHECK(r.compute_s == Approx(3.125e-3));
  CHECK(r.step_s == Approx(3.125e-3));
  // a 2 ms all-gather: b runs all beside it (4/3 ms), c's first 2/3 ms too (half its work), then alone
  r = replay(Ranks{trace(4000000)}, hw, fake);
  for (const ModeledEvent& e : r.events) at[e.name] = {e.start_s, e.end_s};
  CHECK(at["b"].second == Approx(1e-3 + 4.0 / 3 * 1e-3));
  CHECK(at["c"].second == Approx(3.5e-3));
  CHECK(r.contention_s == Approx(0.5e-3));
  // a pipeline's point-to-point send holds a pair's p2p channels, not a ring's: not counted
  std::vector<TraceEvent> p2p = trace(1000000);
  p2p[1].op = "send";
  r = replay(Ranks{p2p}, hw, fake);
  CHECK(r.contention_s == 0);
  // several traced ranks: a peer may issue a collective after a kernel was placed, so none is modeled
  // (by rank order, identical ranks would otherwise be charged differently)
  r = replay(Ranks(2, trace(1000000)), hw);
  CHECK(r.contention_s == 0);
  CHECK(r.step_s == Approx(3e-3));
  // without comm_sms nothing changes: the old timeline, 3 ms
  hw.comm_sms = 0;
  r = replay(Ranks{trace(1000000)}, hw, fake);
  CHECK(r.step_s == Approx(3e-3));
  CHECK(r.contention_s == 0);
  // A GEMM of exactly one wave on an A100's 108 SMs (9 x 12 tiles of 128 x 256) runs two waves on the 84
  // left beside a collective: twice as long (the tail effect Nsight Systems shows beside ncclAllGather)
  const HardwareProfile a100 = *find_profile("a100-nvlink");
  REQUIRE(a100.comm_sms == 24);
  TraceEvent g = compute("matmul_forward", 2.0 * 1152 * 3072 * 4096);
  g.shape.gemm[0] = {1152, 3072, 4096};
  g.low_precision = true;
  CHECK(gemm_quantization(g.shape.gemm[0], a100) == Approx(1));
  CHECK(compute_time(g, beside_collective(a100)) - a100.launch_overhead_s == Approx(2 * (compute_time(g, a100) - a100.launch_overhead_s)));
  // kernels on the host (an offloaded optimizer) and copies over PCIe hold no SM: never slowed
  TraceEvent host = compute("adamw_step", 1e9, 1e9);
  host.on_host = true;
  CHECK(compute_time(host, beside_collective(a100)) == Approx(compute_time(host, a100)));
}

TEST_CASE("replay: bucketed all-reduce exposes less communication than the naive one", "[costmodel]") {
  for (const char* name : {"t4-pcie", "cpu", "a100-nvlink"}) {
    INFO(name);
    const HardwareProfile hw = *find_profile(name);
    const ReplayResult naive = replay(symmetric(2, 64, Sync::exposed), hw);
    const ReplayResult bucketed = replay(symmetric(2, 64, Sync::overlapped), hw);
    CHECK(naive.comm_s == Approx(bucketed.comm_s));  // same bytes, same collectives
    // the same kernels; two traced ranks, so no contention is modeled (a fake world's replay models it)
    CHECK(naive.compute_s == Approx(bucketed.compute_s));
    CHECK(bucketed.contention_s == 0);
    // naive: nothing overlaps, so everything the comm stream does is exposed
    CHECK(naive.exposed_comm_s == Approx(naive.comm_s));
    CHECK(bucketed.exposed_comm_s < naive.exposed_comm_s);
    CHECK(bucketed.step_s < naive.step_s);
    // the last bucket is issued after the last backward kernel, so it can never be hidden
    CHECK(bucketed.exposed_comm_s >= collective_time("all_reduce", 4 * kCnn.front().params, 2, hw) * (1 - 1e-9));
  }
}

TEST_CASE("modeled speed-up: references without numbers", "[costmodel]") {
  const HardwareProfile hw = *find_profile("t4-pcie");
  // One rank: the same step, speed-up exactly 1.
  CHECK(modeled_speedup(symmetric(1, 64, Sync::overlapped), hw) == Approx(1));
  // Four ranks that never talk and have no per-rank work: perfect scaling.
  Ranks independent(4, {compute("fwd", 1e9, 1e6), compute("bwd", 2e9, 2e6)});
  CHECK(modeled_speedup(independent, hw) == Approx(4));
  CHECK(single_rank_time_s(ddp_step(64, 2, Sync::overlapped), 2, hw) <
        2 * replay(symmetric(1, 64, Sync::overlapped), hw).step_s);  // the optimizer runs once, not twice
}

TEST_CASE("modeled speed-up: CIFAR CNN DDP on 2×T4 over PCIe", "[costmodel]") {
  const HardwareProfile hw = *find_profile("t4-pcie");
  const ReplayResult over = replay(symmetric(2, 64, Sync::overlapped), hw);
  const ReplayResult naive = replay(symmetric(2, 64, Sync::exposed), hw);
  const double t1_s = single_rank_time_s(ddp_step(64, 2, Sync::overlapped), 2, hw);
  const double speedup_over = modeled_speedup(symmetric(2, 64, Sync::overlapped), hw);
  const double speedup_naive = modeled_speedup(symmetric(2, 64, Sync::exposed), hw);
  WARN("t4-pcie, CIFAR CNN 545K params, batch 64/rank: t_1 " << t1_s * 1e6 << " us; overlapped t_2 "
       << over.step_s * 1e6 << " us (compute " << over.compute_s * 1e6 << ", comm " << over.comm_s * 1e6
       << ", exposed " << over.exposed_comm_s * 1e6 << ") speed-up " << speedup_over << "; exposed t_2 "
       << naive.step_s * 1e6 << " us (exposed " << naive.exposed_comm_s * 1e6 << ") speed-up " << speedup_naive);
  CHECK(speedup_over == Approx(t1_s / over.step_s));
  CHECK(speedup_over >= 1.8);
  CHECK(speedup_naive < 1.8);
  CHECK(speedup_naive < speedup_over);
}

TEST_CASE("replay: traces that could not have run are errors, not hangs", "[costmodel]") {
  const HardwareProfile hw = round_profile(1e-5);
  const TraceEvent c = compute("fwd", 1e6);
  SECTION("a collective missing on one rank") {
    Ranks r = {{c, collective("all_reduce", 8, 2, 0), wait_for(0)}, {c}};
    CHECK_THROWS_WITH(replay(r, hw), Catch::Contains("1 participant(s)") && Catch::Contains("group_size 2"));
  }
  SECTION("more participants than group_size (a group name shared by two communicators)") {
    Ranks r(3, {collective("all_reduce", 8, 2, 0, "dp"), wait_for(0, "dp")});
    CHECK_THROWS_WITH(replay(r, hw), Catch::Contains("3 participant(s)"));
  }
  SECTION("a wait with no matching collective") {
    Ranks r(2, {c, wait_for(5)});
    CHECK_THROWS_WITH(replay(r, hw), Catch::Contains("waits for collective seq 5"));
  }
  SECTION("a wait before its collective") {
    Ranks r(2, {wait_for(0), collective("all_reduce", 8, 2, 0)});
    CHECK_THROWS_WITH(replay(r, hw), Catch::Contains("did not issue before the wait"));
  }
  SECTION("ranks disagree on the collective") {
    Ranks r = {{collective("all_reduce", 8, 2, 0)}, {collective("all_gather", 8, 2, 0)}};
    CHECK_THROWS_WITH(replay(r, hw), Catch::Contains("disagree"));
  }
  SECTION("two groups issued in opposite orders deadlock") {
    Ranks r = {{collective("all_reduce", 8, 2, 0, "a"), collective("all_reduce", 8, 2, 0, "b"), wait_for(0, "a")},
               {collective("all_reduce", 8, 2, 0, "b"), collective("all_reduce", 8, 2, 0, "a"), wait_for(0, "a")}};
    CHECK_THROWS_WITH(replay(r, hw), Catch::Contains("deadlock"));
  }
  SECTION("a send and its recv are one transfer") {
    Ranks r = {{collective("send", 1000000, 2, 0, "p2p"), wait_for(0, "p2p")},
               {collective("recv", 1000000, 2, 0, "p2p"), wait_for(0, "p2p")}};
    CHECK(replay(r, hw).step_s == Approx(1e-5 + 1e-3));
  }
}

TEST_CASE("Chrome trace: valid JSON with a process per rank and compute/comm threads", "[costmodel]") {
  const HardwareProfile hw = *find_profile("t4-pcie");
  const Ranks ranks = symmetric(2, 8, Sync::overlapped);
  auto check = [](const nlohmann::json& doc) {
    REQUIRE(doc.contains("traceEvents"));
    std::set<int> pids, compute_tids, comm_tids;
    std::set<std::string> names;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] == "M") {
        names.insert(e["args"]["name"].get<std::string>());
        continue;
      }
      REQUIRE(e["ph"] == "X");
      CHECK(e["dur"].get<double>() >= 0);
      pids.insert(e["pid"].get<int>());
      (e["cat"] == "collective" ? comm_tids : compute_tids).insert(e["tid"].get<int>());
    }
    CHECK(pids == std::set<int>{0, 1});
    CHECK(comm_tids == std::set<int>{1});
    CHECK(compute_tids == std::set<int>{0});
    for (const char* n : {"rank 0", "rank 1", "compute", "comm"}) CHECK(names.count(n) == 1);
  };
  SECTION("modeled") {
    const ReplayResult r = replay(ranks, hw);
    const nlohmann::json doc = nlohmann::json::parse(chrome_trace_json(r));
    check(doc);
    CHECK(doc["otherData"]["profile"] == "t4-pcie");
    const std::string path = "test_cost_model_trace.json";
    write_chrome_trace(path, chrome_trace_json(r));
    std::ifstream f(path);
    CHECK(nlohmann::json::parse(f) == doc);
    std::remove(path.c_str());
  }
  SECTION("measured") {
    Ranks measured = ranks;
    for (auto& rank : measured)
      for (size_t i = 0; i < rank.size(); i++) rank[i].t_begin_us = double(i), rank[i].t_end_us = i + 0.5;
    check(nlohmann::json::parse(chrome_trace_json(measured)));
  }
  CHECK_THROWS_AS(write_chrome_trace("/nonexistent-dir/x.json", "{}"), IoError);
}

// PyTorch's caching allocator, as the planner models what it reserves: each rule against a sequence worked
// out by hand from c10/cuda/CUDACachingAllocator.cpp (512 B rounding, 2 MiB / 20 MiB / rounded segments,
// best fit with splitting, merging on free, a pool per stream, empty_cache and the retry near capacity).
TEST_CASE("allocator model: what PyTorch's caching allocator reserves, rule by rule", "[costmodel][memory]") {
  using M = distlab::CachingAllocatorModel;
  const int64_t MiB = int64_t(1) << 20;
  CHECK(M::round_size(1) == 512);
  CHECK(M::round_size(512) == 512);
  CHECK(M::round_size(513) == 1024);
  CHECK(M::segment_size(M::round_size(1000)) == 2 * MiB);        // small pool: 2 MiB segments
  CHECK(M::segment_size(M::round_size(MiB + 1)) == 20 * MiB);    // large, under 10 MiB: 20 MiB
  CHECK(M::segment_size(M::round_size(10 * MiB)) == 10 * MiB);   // 10 MiB and up: its own, rounded to 2 MiB
  CHECK(M::segment_size(M::round_size(11 * MiB + 1)) == 12 * MiB);

  M m;
  const auto compute = M::StreamId::compute, comm = M::StreamId::comm;
  // three 4 MiB tensors share one 20 MiB segment (split, the rest stays free)
  const int64_t a = m.allocate(4 * MiB, compute), b = m.allocate(4 * MiB, compute), c = m.allocate(4 * MiB, compute);
  CHECK(m.reserved() == 20 * MiB);
  CHECK(m.allocated() == 12 * MiB);
  CHECK(m.segments() == 1);
  // b freed: a 4 MiB hole between a and c; a 6 MiB request does not fit it and takes the 8 MiB tail
  m.free(b);
  const int64_t d = m.allocate(6 * MiB, compute);
  CHECK(m.reserved() == 20 * MiB);
  // a 9 MiB request: neither the 4 MiB hole nor the 2 MiB tail holds it: a second segment
  const int64_t e = m.allocate(9 * MiB, compute);
  CHECK(m.reserved() == 40 * MiB);
  CHECK(m.segments() == 2);
  // the same bytes on another stream never reuse the compute stream's free blocks (fragmentation across pools)
  const int64_t f = m.allocate(MiB + 512, comm);
  CHECK(m.reserved() == 60 * MiB);
  // freeing merges neighbours: a, the hole and c become one 12 MiB block, which an 11 MiB request then fits
  m.free(a);
  m.free(c);
  const int64_t g = m.allocate(11 * MiB, compute);
  CHECK(m.reserved() == 60 * MiB);  // no new segment: the merged block held it
  CHECK(m.allocated() == 6 * MiB + 9 * MiB + 11 * MiB + MiB + 512);
  // empty_cache hands back only segments with nothing in use: f's segment once f is freed
  m.free(f);
  m.empty_cache();
  CHECK(m.reserved() == 40 * MiB);
  for (int64_t id : {d, e, g}) m.free(id);
  CHECK(m.allocated() == 0);
  m.empty_cache();
  CHECK(m.reserved() == 0);
  CHECK(m.segments() == 0);
  // near the card's capacity, a new segment first releases the cached free ones (PyTorch's retry)
  M n;
  const int64_t big = n.allocate(40 * MiB, compute);
  n.free(big);
  CHECK(n.reserved() == 40 * MiB);
  n.allocate(50 * MiB, compute, 60 * MiB);  // 40 cached + 50 > 60: the cached 40 goes first
  CHECK(n.reserved() == 50 * MiB);
  n.allocate(50 * MiB, compute);  // no capacity: it stays cached beside
  CHECK(n.reserved() == 100 * MiB);
}

TEST_CASE("allocator model: a training step's reserved bytes are never below its tensors', and the summary reports both", "[costmodel][memory]") {
  MemoryAccountant acct(0, "meta");
  Tensor x = Tensor::empty({1000, 1000}, acct, DeviceKind::meta, Category::activations);
  Tensor y = Tensor::empty({300}, acct, DeviceKind::meta, Category::comm_buffers);
  CHECK(acct.stats().reserved_current >= acct.stats().current_total);
  // 4,000,000 B: a large request under 10 MiB, a 20 MiB segment; 1,200 B on the collectives' stream: 2 MiB
  CHECK(acct.stats().reserved_current == 22 * (int64_t(1) << 20));
  x = Tensor();
  CHECK(acct.stats().reserved_current == 22 * (int64_t(1) << 20));  // cached, not returned
  acct.empty_cache();
  CHECK(acct.stats().reserved_current == 2 * (int64_t(1) << 20));
  CHECK(acct.stats().reserved_peak == 22 * (int64_t(1) << 20));
}

// GEMMs by shape: tile and wave quantization worked out by hand, and a calibrated profile's measured rate
// for a shape in place of the model's; a profile file that is not one is an error naming the file and key.
TEST_CASE("GEMMs by shape: quantization by hand, measured shapes from a profile file, and its errors", "[costmodel][calibrate]") {
  const HardwareProfile h100 = *find_profile("h100-nvlink");  // 132 SMs, 128×256 tiles
  // 16384×4096: 128 × 16 = 2048 tiles, 16 waves of 132 (the last 68 % full): 2048 / 2112
  CHECK(gemm_quantization({16384, 4096, 4096}, h100) == Approx(2048.0 / 2112.0));
  // 8192×1000: 64 × 4 tiles of 128×256, the last column 232 of 256 wide; 256 tiles in 2 waves of 132
  CHECK(gemm_quantization({8192, 1000, 64}, h100) == Approx((8192.0 * 1000.0) / (256.0 * 128 * 256) * (256.0 / 264.0)));
  // one tile, partly filled, on one SM of 132
  CHECK(gemm_quantization({100, 100, 64}, h100) == Approx(10000.0 / 32768.0 / 132.0));
  CHECK(gemm_quantization({100, 100, 64}, *find_profile("cpu")) == 1);  // a CPU: no tiles
  // fewer tiles than SMs: K split among them, in pieces of 256 or deeper. GPT-2's weight gradients on an
  // A100 (108 SMs): a 768×768 output is 18 tiles; K = 65,536 splits 6 ways, 108 pieces, one full wave;
  // K = 512 only 2 ways: 36 of 108 SMs busy
  const HardwareProfile a100 = *find_profile("a100-nvlink");
  CHECK(gemm_quantization({768, 768, 65536}, a100) == Approx(1.0));
  CHECK(gemm_quantization({768, 768, 512}, a100) == Approx(36.0 / 108.0));
  CHECK(gemm_quantization({16384, 4096, 4096}, at_peak(h100)) == 1);   // the data sheet's roofline

  // a GEMM event's time: its shape's rate; a measured rate for the same shape replaces the model
  TraceEvent e;
  e.name = "matmul_forward";
  e.flops = 2.0 * 16384 * 4096 * 4096;
  e.bytes = 2.0 * (16384.0 * 4096 + 4096.0 * 4096 + 16384.0 * 4096);
  e.low_precision = true;
  e.shape.gemm[0] = {16384, 4096, 4096};
  const double modeled = e.flops / (h100.low_precision_flops_per_s * h100.gemm_efficiency * 2048.0 / 2112.0) + h100.launch_overhead_s;
  CHECK(compute_time(e, h100) == Approx(modeled));
  HardwareProfile measured = h100;
  measured.measured_gemms.push_back({{16384, 4096, 4096}, true, 500e12});
  CHECK(compute_time(e, measured) == Approx(e.flops / 500e12 + h100.launch_overhead_s));
  measured.measured_gemms.back().low_precision = false;  // measured in f32: not this bf16 GEMM's rate
  CHECK(compute_time(e, measured) == Approx(modeled));

  // a profile file: the base's numbers, with what the file says in their place; written and read back
  const std::string dir = (std::filesystem::temp_directory_path() / ("distlab-profile-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  HardwareProfile mine = h100;
  mine.name = "my-h100";
  mine.gemm_efficiency = 0.7;
  mine.measured_gemms = {{{16384, 4096, 4096}, true, 600e12}};
  mine.measured_attention = {{8192, 128, true, 250e12}};
  {
    std::ofstream(dir + "/mine.json") << profile_file_json(mine, "h100-nvlink");
  }
  const HardwareProfile back = *find_profile(dir + "/mine.json");
  CHECK(back.name == "my-h100");
  CHECK(back.file == dir + "/mine.json");
  CHECK(back.gemm_efficiency == 0.7);
  CHECK(back.low_precision_flops_per_s == h100.low_precision_flops_per_s);
  REQUIRE(back.measured_gemms.size() == 1);
  CHECK(back.measured_gemms[0].shape == GemmShape{16384, 4096, 4096});
  CHECK(back.measured_gemms[0].flops_per_s == 600e12);
  REQUIRE(back.measured_attention.size() == 1);
  CHECK(back.measured_attention[0].backward);
  CHECK(compute_time(e, back) == Approx(e.flops / 600e12 + h100.launch_overhead_s));
  auto bad = [&](const std::string& text, const std::string& says) {
    std::ofstream(dir + "/bad.json") << text;
    try {
      find_profile(dir + "/bad.json");
      FAIL("no error for " << text);
    } catch (const ConfigError& err) {
      CHECK_THAT(std::string(err.what()), Catch::Contains(dir + "/bad.json") && Catch::Contains(says));
    }
  };
  bad("{\"base\": \"h100-nvlink\", \"gemm_efficency\": 0.7}", "unknown key \"gemm_efficency\"");
  bad("{\"gemm_efficiency\": 0.7}", "no \"base\"");
  bad("{\"base\": \"h900\"}", "base \"h900\" is no built-in profile");
  bad("{\"base\": \"h100-nvlink\", \"mem_bw_bytes_per_s\": -1}", "mem_bw_bytes_per_s is -1");
  bad("{\"base\": \"h100-nvlink\", \"mem_bw_bytes_per_s\": 0}", "a rate is 0");
  bad("{\"base\": \"h100-nvlink\", \"measured_gemms\": [{\"m\": 1, \"n\": 2}]}", "has no k");
  bad("not json", "not a JSON object");
  CHECK_THROWS_AS(find_profile(dir + "/missing.json"), ConfigError);
  CHECK_FALSE(find_profile("h900").has_value());
  std::filesystem::remove_all(dir);
}
