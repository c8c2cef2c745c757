#include "core/perf/hardware.h"

#include <cctype>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/util/error.h"
#include "core/util/read_file.h"
#include "core/util/units.h"

namespace distlab {

namespace {

// Collective latency α. NCCL's own tuning model (src/graph/tuning.cc) charges a ring all-reduce with the
// low-latency protocol about 6.8 µs of base latency plus a per-hop latency (≈0.6 µs over NVLink, ≈1.0 µs
// over PCIe). Our α-β model has no base term, so we spread it over the 2(n−1) steps of the ring that the
// profile is meant for: 8 ranks over NVLink → (6.8 + 14·0.6)/14 ≈ 1.1 µs; 2 ranks over PCIe →
// (6.8 + 2·1.0)/2 ≈ 4.4 µs. That keeps small all-reduces at the ~10–20 µs nccl-tests shows.
constexpr double kAlphaNvlink_s = 1.1e-6;
constexpr double kAlphaPcie2_s = 4.4e-6;

// Calibration (see hardware.h). GEMMs: Bekman's "Maximum Achievable Matmul FLOPS" table (ml-engineering,
// compute/accelerator, bf16, torch 2.6–2.7): A100 SXM 271.2 of 312 TFLOPS (86.9 %), H100 SXM 794.5 of 989
// (80.3 %, "H200 is the same"). Flash attention: the FlashAttention-2 paper (Dao 2023) reaches 50–73 % of
// the A100's peak; the FlashAttention-3 paper (Shah et al. 2024) reports FlashAttention-2 at 35 % of the
// H100's. Streaming kernels: STREAM-style triads reach ~90 % of the data sheet's HBM bandwidth (H100 80GB
// HBM3: 3.09 of 3.35 TB/s). The step overhead is an estimate: one host synchronization per step (the loss
// read back, the next batch copied in) before the first kernel of the next step is queued.
constexpr double kGemmA100 = 271.2 / 312.0;
constexpr double kGemmH100 = 794.5 / 989.0;
constexpr double kFlashA100 = 0.60;  // the FA2 paper's 50–73 % range, toward its low end (causal, head dim 128)
// FlashAttention-2 on Hopper: measured on one H200 (the H100's compute die, 700 W) through SDPA at Llama 3
// 8B's shapes (T 8192, head size 128, causal), forward and backward: 0.30 of the bf16 peak
// (bench/peer_torch_llama.py, 2026-12-04; bench/published.toml's measured row). The FA3 paper gives FA2
// about 35 % on H100 for the forward alone.
constexpr double kFlashH100 = 0.30;
constexpr double kHbmEfficiency = 0.90;
constexpr double kStepOverheadGpu_s = 100e-6;
// CUTLASS's default threadblock tile for tensor-core GEMMs on sm75-sm90 (128×256; cuBLAS's large kernels
// use the same), and the SM counts of the data sheets: T4 40, A100 108, H100 SXM 132, H100 PCIe 114.
constexpr int kTileM = 128, kTileN = 256;
// the shallowest piece of K a split-K GEMM gives one tile (four of CUTLASS's 64-deep k-blocks: a piece
// shallower than that spends its time filling and draining its pipeline)
constexpr double kSplitK = 256;
// SMs a collective holds while it runs beside the compute stream (NCCL: one thread block per channel). An HGX
// A100's rings over NVSwitch use 24 channels (NCCL's log on one: "Channel 23/24", nccl-tests issue #100); on
// an H100, Nsight Systems shows ncclAllGather's kernel with 24 blocks beside a GEMM, which then runs its
// tiles in waves on the 108 SMs left (NVIDIA developer forum, "Compute-Communication Overlap Causes Severe
// GEMM Performance Degradation because of Tail Effect", thread 337991). A large GEMM beside a collective so loses
// 18-22 % of its rate (more where the waves come out worse), within what Lee et al. measured across GPT and
// LLaMA layers on A100s and H100s ("Characterizing Compute-Communication Overlap in GPU-Accelerated
// Distributed Deep Learning", arXiv 2507.03114, 2025: compute 18.9 % slower on average beside the
// collectives, up to 40 %). PCIe-only rings (t4-pcie, h100-pcie): no published channel count, not modeled.
constexpr int kCommSmsNvlink = 24;

std::vector<HardwareProfile> make_profiles() {
  std::vector<HardwareProfile> p;
  // Memory-only profiles (capacity as the vendor's data sheet states it).
  p.push_back({.name = "t4", .memory_bytes = 16LL << 30, .source = "NVIDIA T4 data sheet: 16 GB GDDR6"});
  p.push_back({.name = "a100-40g", .memory_bytes = 40LL << 30, .source = "NVIDIA A100 data sheet: 40 GB HBM2"});
  p.push_back({.name = "a100-80g", .memory_bytes = 80LL << 30, .source = "NVIDIA A100 data sheet: 80 GB HBM2e"});
  p.push_back({.name = "h100", .memory_bytes = 80LL << 30, .source = "NVIDIA H100 SXM data sheet: 80 GB HBM3"});

  // 2×T4 in one machine, talking over PCIe gen3 x16 (no NVLink), e.g. a 2-GPU cloud VM.
  p.push_back({
      .name = "t4-pcie",
      .memory_bytes = 16LL << 30,                // T4 data sheet: 16 GB GDDR6
      .source = "T4 data sheet; PCIe gen3 busbw from nccl-tests on 2 GPUs; α from NCCL's tuning model",
      .fp32_flops_per_s = 8.1e12,                // T4 data sheet: 8.1 TFLOPS fp32
      .low_precision_flops_per_s = 65e12,        // T4 data sheet: 65 TFLOPS fp16 tensor cores (no bf16 on Turing)
      .mem_bw_bytes_per_s = 320e9,               // T4 data sheet: 320 GB/s
      .intra_node_busbw_bytes_per_s = 11e9,      // nccl-tests all_reduce, 2 GPUs on PCIe gen3 x16: ~10–12 GB/s
      .inter_node_busbw_bytes_per_s = 3e9,       // estimate: 25–32 Gb/s cloud Ethernet, one NIC per VM
      .collective_latency_s = kAlphaPcie2_s,
      .launch_overhead_s = 5e-6,                 // estimate: CUDA kernel launch ≈ 3–5 µs
      // one GPU's share of the host: a 2-GPU VM with 8 vCPUs (4 AVX2 cores) and 4 DDR4 channels
      .host_link_bytes_per_s = 12e9,             // PCIe gen3 x16: pinned cudaMemcpy ≈ 12 GB/s
      .host_flops_per_s = 0.16e12,               // estimate: 2 cores × 2.5 GHz × 32 fp32 FLOP/cycle (AVX2 FMA)
      .host_mem_bw_bytes_per_s = 20e9,           // estimate: half of 4 channels of DDR4-2666
      .host_memory_per_node_bytes = 30LL << 30,  // a 2×T4 VM with 8 vCPUs (GCP n1-standard-8: 30 GB)
      .gemm_efficiency = 0.6,                    // estimate: the 70 W card lowers its clock under sustained GEMMs (no published MAMF)
      .attention_efficiency = 0.3,               // estimate: FlashAttention-2 does not support Turing; a generic tiled kernel
      .mem_bw_efficiency = kHbmEfficiency,
      .step_overhead_s = kStepOverheadGpu_s,
      .calibration_source = "estimates (no published T4 MAMF); streaming ~90 % of GDDR6; one host sync per step",
      .sm_count = 40, .gemm_tile_m = kTileM, .gemm_tile_n = kTileN,
  });
  // One DGX/HGX A100 node: 8× A100 SXM4 80GB on NVLink3 / NVSwitch, 8× HDR InfiniBand NICs.
  p.push_back({
      .name = "a100-nvlink",
      .memory_bytes = 80LL << 30,                // A100 data sheet: 80 GB HBM2e
      .source = "A100 SXM data sheet; NVLink busbw from nccl-tests on 8 GPUs; IB from nccl-tests multi-node",
      .fp32_flops_per_s = 19.5e12,               // A100 data sheet: 19.5 TFLOPS fp32 (156 with TF32)
      .low_precision_flops_per_s = 312e12,       // A100 data sheet: 312 TFLOPS bf16/fp16 dense
      .mem_bw_bytes_per_s = 2.039e12,            // A100 80GB SXM data sheet: 2,039 GB/s
      .intra_node_busbw_bytes_per_s = 230e9,     // nccl-tests all_reduce_perf, 8×A100 one node: ~230 GB/s
      .inter_node_busbw_bytes_per_s = 180e9,     // 8× HDR 200 Gb/s (24 GB/s each); nccl-tests reach ~90 % of the NICs' sum
      .collective_latency_s = kAlphaNvlink_s,
      .launch_overhead_s = 4e-6,                 // estimate: CUDA kernel launch ≈ 3–5 µs
      // one GPU's eighth of a DGX A100 host: 2× EPYC 7742 (128 Zen 2 cores), 16 channels of DDR4-3200
      .host_link_bytes_per_s = 25e9,             // PCIe gen4 x16: pinned cudaMemcpy ≈ 25 GB/s
      .host_flops_per_s = 1.15e12,               // 128 cores × 2.25 GHz × 32 FLOP/cycle = 9.2 TFLOP/s, / 8 GPUs
      .host_mem_bw_bytes_per_s = 51e9,           // 16 × 25.6 GB/s = 410 GB/s, / 8 GPUs
      .host_memory_per_node_bytes = 2000000000000LL,  // DGX A100 640GB data sheet: 2 TB system memory
      .gemm_efficiency = kGemmA100,              // MAMF: 271.2 of 312 TFLOPS
      .attention_efficiency = kFlashA100,        // FlashAttention-2 paper: 50–73 % of the A100's peak
      .mem_bw_efficiency = kHbmEfficiency,
      .step_overhead_s = kStepOverheadGpu_s,
      .calibration_source = "Bekman's MAMF table (A100 SXM bf16 86.9 %); FlashAttention-2 paper; STREAM-style ~90 % of HBM",
      .sm_count = 108, .gemm_tile_m = kTileM, .gemm_tile_n = kTileN, .comm_sms = kCommSmsNvlink,
  });
  // One HGX H100 node: 8× H100 SXM5 on NVLink4 / NVSwitch, 8× NDR 400 Gb/s NICs.
  HardwareProfile h100{
      .name = "h100-nvlink",
      .memory_bytes = 80LL << 30,                // H100 SXM data sheet: 80 GB HBM3
      .source = "H100 SXM data sheet; NVLink busbw from nccl-tests on 8 GPUs (ring); NDR from nccl-tests",
      .fp32_flops_per_s = 67e12,                 // H100 SXM data sheet: 67 TFLOPS fp32
      .low_precision_flops_per_s = 989e12,       // H100 SXM data sheet: 989 TFLOPS bf16 dense (1,979 is with sparsity)
      .mem_bw_bytes_per_s = 3.35e12,             // H100 SXM data sheet: 3.35 TB/s
      .intra_node_busbw_bytes_per_s = 360e9,     // nccl-tests all_reduce, 8×H100, ring ~360 GB/s (NVLS reaches ~475)
      .inter_node_busbw_bytes_per_s = 340e9,     // 8× NDR 400 Gb/s, 46–48 GB/s each (nccl-tests), ~90 % of the sum
      .collective_latency_s = kAlphaNvlink_s,
      .launch_overhead_s = 4e-6,                 // estimate: CUDA kernel launch ≈ 3–5 µs
      // one GPU's eighth of a DGX H100 host: 2× Xeon 8480C (112 cores, AVX-512), 16 channels of DDR5-4800
      .host_link_bytes_per_s = 50e9,             // PCIe gen5 x16: pinned cudaMemcpy ≈ 50 GB/s
      .host_flops_per_s = 1.8e12,                // 112 cores × 2.0 GHz × 64 FLOP/cycle = 14.3 TFLOP/s, / 8 GPUs
      .host_mem_bw_bytes_per_s = 77e9,           // 16 × 38.4 GB/s = 614 GB/s, / 8 GPUs
      .host_memory_per_node_bytes = 2000000000000LL,  // DGX H100 data sheet: 2 TB system memory (DGX H200: the same)
      .gemm_efficiency = kGemmH100,              // MAMF: 794.5 of 989 TFLOPS
      .attention_efficiency = kFlashH100,        // FlashAttention-2 forward + backward, measured on an H200: 0.30
      .mem_bw_efficiency = kHbmEfficiency,       // STREAM triad on H100 80GB HBM3: 3.09 of 3.35 TB/s
      .step_overhead_s = kStepOverheadGpu_s,
      .calibration_source = "Bekman's MAMF table (H100 SXM bf16 80.3 %); FA2 measured at 0.30 on an H200 (the FA3 paper: 35 % forward); STREAM triad 92 % of HBM3",
      .sm_count = 132, .gemm_tile_m = kTileM, .gemm_tile_n = kTileN, .comm_sms = kCommSmsNvlink,
  };
  p.push_back(h100);
  // H200: the H100's compute and links with bigger, faster memory.
  HardwareProfile h200 = h100;
  h200.name = "h200";
  h200.memory_bytes = 141000000000LL;            // H200 data sheet: 141 GB HBM3e
  h200.mem_bw_bytes_per_s = 4.8e12;              // H200 data sheet: 4.8 TB/s
  h200.source = "H200 data sheet: 141 GB HBM3e, 4.8 TB/s; compute and links as h100-nvlink";
  p.push_back(h200);
  // The H100s torchtitan's published runs used (Meta's Grand Teton): SXM5 silicon with 96 GB of HBM2e at
  // 2.4 TB/s, run at the default 500 W power limit, NVLink inside the node, 400 Gb/s RDMA per GPU.
  HardwareProfile h100_96g = h100;
  h100_96g.name = "h100-96g";
  h100_96g.memory_bytes = 96LL << 30;            // torchtitan docs/performance.md: 96GB HBM2e
  h100_96g.mem_bw_bytes_per_s = 2.4e12;          // torchtitan docs/performance.md: 2.4 TB/s peak
  h100_96g.source = "torchtitan docs/performance.md (Grand Teton: H100 96GB HBM2e, 2.4 TB/s, 500 W); compute and links as h100-nvlink";
  h100_96g.calibration_source = h100.calibration_source + "; the 500 W power limit (MAMF ran at 700 W) is not modeled";
  p.push_back(h100_96g);
  // H100 PCIe: a different card (114 SMs, lower clocks, 350 W), eight to a host on PCIe gen5 without NVLink.
  HardwareProfile h100_pcie = h100;
  h100_pcie.name = "h100-pcie";
  h100_pcie.memory_bytes = 80LL << 30;           // H100 PCIe data sheet: 80 GB HBM2e
  h100_pcie.fp32_flops_per_s = 51e12;            // H100 PCIe data sheet: 51 TFLOPS fp32
  h100_pcie.low_precision_flops_per_s = 756e12;  // H100 PCIe data sheet: 756 TFLOPS bf16 dense
  h100_pcie.mem_bw_bytes_per_s = 2.0e12;         // H100 PCIe data sheet: 2.0 TB/s
  h100_pcie.intra_node_busbw_bytes_per_s = 40e9; // estimate: a ring through PCIe gen5 switches (x16 ≈ 50 GB/s a direction)
  h100_pcie.inter_node_busbw_bytes_per_s = 40e9; // estimate: 400 Gb/s per GPU, bounded by the PCIe ring
  h100_pcie.collective_latency_s = kAlphaPcie2_s;
  h100_pcie.sm_count = 114;                      // H100 PCIe data sheet: 114 SMs
  h100_pcie.comm_sms = 0;                        // a PCIe ring's channel count: not published, not modeled
  h100_pcie.host_memory_per_node_bytes = 1000000000000LL;  // estimate: a 2-socket PCIe server with 1 TB
  h100_pcie.source = "H100 PCIe data sheet; PCIe gen5 busbw estimated; host as h100-nvlink";
  h100_pcie.calibration_source = h100.calibration_source + "; the PCIe card is assumed to reach the same shares";
  p.push_back(h100_pcie);
  // The machine the course's CPU labs run on: a 2-core AMD EPYC with AVX2, ranks as processes over
  // loopback Gloo. One rank = one core (2 ranks share the machine), so the peak is one thread's sgemm.
  p.push_back({
      .name = "cpu",
      .memory_bytes = 8LL << 30,                 // a per-rank share of this machine's 23 GiB of RAM
      .source = "measured here: OpenBLAS sgemm, memcpy and Gloo all-reduce over loopback on a 2-core EPYC",
      .fp32_flops_per_s = 87e9,                  // measured here: sgemm ≈ 87 GFLOP/s on one thread (≈174 with 2)
      .low_precision_flops_per_s = 87e9,         // no bf16 units: bf16 math runs in fp32
      .mem_bw_bytes_per_s = 7e9,                 // measured here: memcpy ≈ 7 GB/s
      .intra_node_busbw_bytes_per_s = 1.3e9,     // measured here: Gloo ring all-reduce, 2 ranks, loopback
      .inter_node_busbw_bytes_per_s = 0.11e9,    // estimate: 1 Gb/s Ethernet between two such machines
      .collective_latency_s = 50e-6,             // measured here: Gloo over loopback, α ≈ 50 µs per step
      .launch_overhead_s = 5e-6,                 // estimate: one OpenMP fork/join per op
      // "device" and host are the same memory here: offloading is a memcpy, the host's CPU is the rank's core
      .host_link_bytes_per_s = 7e9,              // measured here: memcpy ≈ 7 GB/s
      .host_flops_per_s = 87e9,
      .host_mem_bw_bytes_per_s = 7e9,
      .host_memory_per_node_bytes = 24LL << 30,  // measured here: 24 GiB of RAM (both ranks together)
      .calibration_source = "none needed: the rates above were measured here",
  });
  return p;
}

}  // namespace

std::string profile_names(bool with_cost_model_only) {
  std::string names;
  for (const auto& p : hardware_profiles())
    if (!with_cost_model_only || p.has_cost_model()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

const std::vector<HardwareProfile>& hardware_profiles() {
  static const std::vector<HardwareProfile> p = make_profiles();
  return p;
}

HardwareProfile at_peak(HardwareProfile hw) {
  hw.gemm_efficiency = hw.attention_efficiency = hw.mem_bw_efficiency = 1;
  hw.step_overhead_s = 0;
  hw.sm_count = 0;  // no tile or wave quantization
  hw.comm_sms = 0;  // nor SMs held by a collective: the roofline a hand calculation gives
  hw.measured_gemms.clear();
  hw.measured_attention.clear();
  hw.calibration_source = "none: the data sheet's peaks (log.calibrated = false)";
  return hw;
}

HardwareProfile beside_collective(HardwareProfile hw) {
  if (hw.comm_sms <= 0 || hw.sm_count <= hw.comm_sms) return hw;
  const double share = double(hw.sm_count - hw.comm_sms) / double(hw.sm_count);
  hw.sm_count -= hw.comm_sms;
  hw.fp32_flops_per_s *= share;
  hw.low_precision_flops_per_s *= share;
  for (MeasuredGemm& g : hw.measured_gemms) g.flops_per_s *= share;
  for (MeasuredAttention& a : hw.measured_attention) a.flops_per_s *= share;
  return hw;
}

std::optional<HardwareProfile> find_profile(const std::string& name) {
  for (const auto& p : hardware_profiles())
    if (p.name == name) return p;
  if (name.size() > 5 && name.ends_with(".json")) return load_profile_file(name);
  return std::nullopt;
}

double gemm_quantization(const GemmShape& g, const HardwareProfile& hw) {
  if (hw.sm_count <= 0 || hw.gemm_tile_m <= 0 || hw.gemm_tile_n <= 0 || g.m <= 0 || g.n <= 0) return 1;
  double best = 0;
  for (const auto [tm, tn] : {std::pair{hw.gemm_tile_m, hw.gemm_tile_n}, std::pair{hw.gemm_tile_n, hw.gemm_tile_m}}) {
    const double rows = std::ceil(double(g.m) / tm), cols = std::ceil(double(g.n) / tn), tiles = rows * cols;
    const double tile_use = double(g.m) * double(g.n) / (tiles * tm * tn);  // the tiles' filled share
    // Fewer tiles than SMs: the kernels split K too (cuBLAS's split-K, CUTLASS's stream-K), each piece of
    // K ≥ kSplitK deep, so a small output with a long K (a weight's gradient) still fills the GPU
    const double split = tiles >= hw.sm_count ? 1 : std::max(1.0, std::min(std::floor(hw.sm_count / tiles), std::floor(double(g.k) / kSplitK)));
    const double units = tiles * split;
    const double wave_use = units / (std::ceil(units / hw.sm_count) * hw.sm_count);  // the waves' busy SMs
    best = std::max(best, tile_use * wave_use);
  }
  return best;
}

namespace {

// The numeric fields a profile file may set, by name
struct NumberField {
  const char* key;
  double HardwareProfile::*d = nullptr;
  int64_t HardwareProfile::*i = nullptr;
  int HardwareProfile::*n = nullptr;
};
const NumberField kNumberFields[] = {
    {"memory_bytes", nullptr, &HardwareProfile::memory_bytes},
    {"fp32_flops_per_s", &HardwareProfile::fp32_flops_per_s},
    {"low_precision_flops_per_s", &HardwareProfile::low_precision_flops_per_s},
    {"mem_bw_bytes_per_s", &HardwareProfile::mem_bw_bytes_per_s},
    {"intra_node_busbw_bytes_per_s", &HardwareProfile::intra_node_busbw_bytes_per_s},
    {"inter_node_busbw_bytes_per_s", &HardwareProfile::inter_node_busbw_bytes_per_s},
    {"collective_latency_s", &HardwareProfile::collective_latency_s},
    {"launch_overhead_s", &HardwareProfile::launch_overhead_s},
    {"host_link_bytes_per_s", &HardwareProfile::host_link_bytes_per_s},
    {"host_flops_per_s", &HardwareProfile::host_flops_per_s},
    {"host_mem_bw_bytes_per_s", &HardwareProfile::host_mem_bw_bytes_per_s},
    {"host_memory_per_node_bytes", nullptr, &HardwareProfile::host_memory_per_node_bytes},
    {"gemm_efficiency", &HardwareProfile::gemm_efficiency},
    {"attention_efficiency", &HardwareProfile::attention_efficiency},
    {"mem_bw_efficiency", &HardwareProfile::mem_bw_efficiency},
    {"step_overhead_s", &HardwareProfile::step_overhead_s},
    {"sm_count", nullptr, nullptr, &HardwareProfile::sm_count},
    {"gemm_tile_m", nullptr, nullptr, &HardwareProfile::gemm_tile_m},
    {"gemm_tile_n", nullptr, nullptr, &HardwareProfile::gemm_tile_n},
    {"comm_sms", nullptr, nullptr, &HardwareProfile::comm_sms},
};

double number_at(const nlohmann::json& v, const std::string& key, const std::string& path) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
    throw ConfigError(fmt::format("profile file {}: {} is {}, not a number ≥ 0", path, key, v.dump()),
                      "rates in bytes or FLOPs per second, times in seconds, efficiencies as shares (0.8)");
  return v.get<double>();
}

}  // namespace

HardwareProfile load_profile_file(const std::string& path) {
  std::vector<uint8_t> bytes;
  try {
    bytes = read_regular_file(path, 16 << 20, "the profile file");
  } catch (const IoError& e) {
    throw ConfigError(fmt::format("profile file {}: {}", path, e.what()), "a file written by `distlab bench calibrate`, or a built-in: " + profile_names(true));
  }
  const nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (!j.is_object()) throw ConfigError(fmt::format("profile file {}: not a JSON object", path), "a file written by `distlab bench calibrate`");
  auto text = [&](const char* key) -> std::string {
    if (!j.contains(key)) return "";
    if (!j[key].is_string()) throw ConfigError(fmt::format("profile file {}: {} is not a string", path, key));
    return j[key].get<std::string>();
  };
  const std::string base = text("base");
  if (base.empty()) throw ConfigError(fmt::format("profile file {}: no \"base\"", path), "the built-in profile it refines: " + profile_names(true));
  std::optional<HardwareProfile> from;
  for (const auto& p : hardware_profiles())
    if (p.name == base) from = p;
  if (!from) throw ConfigError(fmt::format("profile file {}: base \"{}\" is no built-in profile", path, base), "one of: " + profile_names(true));
  HardwareProfile hw = *from;
  hw.file = path;
  for (const auto& [key, v] : j.items()) {
    if (key == "base") continue;
    if (key == "name" || key == "source" || key == "calibration_source") {
      (key == "name" ? hw.name : key == "source" ? hw.source : hw.calibration_source) = text(key.c_str());
      continue;
    }
    if (key == "measured_gemms" || key == "measured_attention") {
      if (!v.is_array()) throw ConfigError(fmt::format("profile file {}: {} is not a list", path, key));
      for (const auto& m : v) {
        if (!m.is_object()) throw ConfigError(fmt::format("profile file {}: an entry of {} is not an object", path, key));
        auto num = [&](const char* k) {
          if (!m.contains(k)) throw ConfigError(fmt::format("profile file {}: an entry of {} has no {}", path, key, k));
          return number_at(m[k], key + "." + k, path);
        };
        auto flag = [&](const char* k) { return m.contains(k) && m[k].is_boolean() && m[k].get<bool>(); };
        if (key == "measured_gemms")
          hw.measured_gemms.push_back({{int64_t(num("m")), int64_t(num("n")), int64_t(num("k"))}, flag("low_precision"), num("flops_per_s")});
        else
          hw.measured_attention.push_back({int64_t(num("seq")), int64_t(num("head_dim")), flag("backward"), num("flops_per_s")});
      }
      continue;
    }
    const NumberField* f = nullptr;
    for (const NumberField& c : kNumberFields)
      if (key == c.key) f = &c;
    if (!f) throw ConfigError(fmt::format("profile file {}: unknown key \"{}\"", path, key), "the keys are HardwareProfile's fields (core/perf/hardware.h)");
    const double x = number_at(v, key, path);
    if (f->d) hw.*(f->d) = x;
    else if (f->i) hw.*(f->i) = int64_t(x);
    else hw.*(f->n) = int(x);
  }
  if (!hw.has_cost_model())
    throw ConfigError(fmt::format("profile file {}: a rate is 0, so no step can be modeled", path), "leave out the keys it did not measure: the base's stay");
  return hw;
}

std::string profile_file_json(const HardwareProfile& hw, const std::string& base) {
  nlohmann::json j = {{"name", hw.name}, {"base", base}, {"source", hw.source}, {"calibration_source", hw.calibration_source}};
  for (const NumberField& f : kNumberFields)
    j[f.key] = f.d ? nlohmann::json(hw.*(f.d)) : f.i ? nlohmann::json(hw.*(f.i)) : nlohmann::json(hw.*(f.n));
  j["measured_gemms"] = nlohmann::json::array();
  for (const MeasuredGemm& g : hw.measured_gemms)
    j["measured_gemms"].push_back({{"m", g.shape.m}, {"n", g.shape.n}, {"k", g.shape.k}, {"low_precision", g.low_precision}, {"flops_per_s", g.flops_per_s}});
  j["measured_attention"] = nlohmann::json::array();
  for (const MeasuredAttention& a : hw.measured_attention)
    j["measured_attention"].push_back({{"seq", a.seq}, {"head_dim", a.head_dim}, {"backward", a.backward}, {"flops_per_s", a.flops_per_s}});
  return j.dump(2) + "\n";
}

std::optional<HardwareProfile> profile_for_gpu(const std::string& gpu_name) {
  auto has = [&](const char* w) { return gpu_name.find(w) != std::string::npos; };
  if (has("H200")) return find_profile("h200");
  if (has("H100")) return find_profile(has("PCIe") ? "h100-pcie" : has("NVL") ? "h100-96g" : "h100-nvlink");
  if (has("A100")) return find_profile("a100-nvlink");
  if (has("T4")) return find_profile("t4-pcie");
  return std::nullopt;
}

HardwareProfile require_profile(const std::string& name, const std::string& what, bool need_cost_model) {
  auto p = find_profile(name);
  if (!p) throw ConfigError(what + ": unknown hardware profile '" + name + "'", "use one of: " + profile_names(need_cost_model));
  if (need_cost_model && !p->has_cost_model())
    throw ConfigError(what + ": profile '" + name + "' only carries device memory, not FLOP/s or link bandwidths",
                      "for modeled time use a link-aware profile: " + profile_names(true));
  return *p;
}

int64_t parse_device_memory(const std::string& text, const std::string& what) {
  if (auto p = find_profile(text)) return p->memory_bytes;
  if (!text.empty() && !std::isdigit(static_cast<unsigned char>(text[0])) && text[0] != '.') {
    throw ConfigError(what + ": unknown device profile '" + text + "'",
                      "use a size such as 16GiB or a profile: " + profile_names(false));
  }
  return parse_bytes(text, what);
}

}  // namespace distlab
