// Hardware profiles: what one rank's device can do, as the cost model sees it.
//
// Two kinds of profile share one table:
//   - memory profiles (t4, a100-40g, a100-80g, h100): only the simulated device memory, for "does it fit?";
//   - link-aware profiles (t4-pcie, a100-nvlink, h100-nvlink, h100-96g, h100-pcie, h200, cpu): memory plus
//     peak FLOP/s, memory bandwidth and the links between ranks, for the cost model's modeled step time.
// Every number carries its source (a data sheet, nccl-tests, a published measurement, or "measured here").
//
// Peaks are what the data sheet promises; real kernels reach less. The calibration fields say how much
// less, from published measurements: cuBLAS GEMMs reach 80–87 % of the bf16 peak (Bekman's "maximum
// achievable matmul FLOPS"), FlashAttention-2 35–60 % depending on the GPU, streaming kernels ~90 % of the
// HBM bandwidth. The "cpu" profile's rates were measured here already, so its calibration is 1.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/perf/trace.h"

namespace distlab {

// What `distlab bench calibrate` measured on the user's GPU, per shape of the model it was given.
struct MeasuredGemm {
  GemmShape shape;
  bool low_precision = true;  // bf16/fp16 inputs (tensor cores); false: f32
  double flops_per_s = 0;
};
struct MeasuredAttention {
  int64_t seq = 0, head_dim = 0;
  bool backward = false;
  double flops_per_s = 0;  // the kernel's FLOPs (the causal tiles') per second
};

struct HardwareProfile {
  std::string name;
  int64_t memory_bytes = 0;
  std::string source;  // where the numbers come from

  // --- cost model (all zero for a memory-only profile; see has_cost_model()) ---
  double fp32_flops_per_s = 0;          // peak dense fp32 (no TF32)
  double low_precision_flops_per_s = 0; // peak dense bf16/fp16 (tensor cores where there are any)
  double mem_bw_bytes_per_s = 0;        // device memory bandwidth (HBM / GDDR / DRAM)
  // The "busbw" nccl-tests reports for a large all-reduce: what each rank's link carries per second.
  // The α-β formulas in cost_model.cpp are written so that this is exactly the busbw they yield.
  double intra_node_busbw_bytes_per_s = 0;  // ranks on one node (NVLink, PCIe, loopback)
  double inter_node_busbw_bytes_per_s = 0;  // a ring that crosses nodes (InfiniBand, Ethernet)
  double collective_latency_s = 0;          // α: fixed cost of one ring step
  double launch_overhead_s = 0;             // fixed cost of one kernel (launch, small-kernel tail)
  // CPU offload (ZeRO-Offload, FSDP's CPUOffload): the link between host and device memory, and the host
  // CPU that steps the offloaded optimizer
  double host_link_bytes_per_s = 0;         // one direction of PCIe (what a pinned cudaMemcpy reaches)
  double host_flops_per_s = 0;              // the host's fp32 peak (all its cores, SIMD)
  double host_mem_bw_bytes_per_s = 0;       // the host's DRAM bandwidth
  int64_t host_memory_per_node_bytes = 0;   // the whole node's host memory (what offload rows must fit in, all ranks together)

  // --- calibration: achieved over peak (1 = the peak is reached, as for rates measured here) ---
  double gemm_efficiency = 1;        // a large GEMM (and any math-bound kernel but attention): MAMF / peak
  double attention_efficiency = 1;   // flash attention, forward and backward: achieved FLOP/s / peak
  double mem_bw_efficiency = 1;      // a streaming (memory-bound) kernel: achieved bytes/s / data sheet
  double step_overhead_s = 0;        // once per optimizer step: the host's work the device waits for
  std::string calibration_source{};  // where the four numbers above come from

  // --- GEMMs by shape (data sheet; CUTLASS's tiles): see gemm_quantization() ---
  int sm_count = 0;                      // streaming multiprocessors: a GEMM's output tiles run in waves of this many
  int gemm_tile_m = 0, gemm_tile_n = 0;  // the output tile of the large tensor-core kernels; 0: no quantization (CPU)
  // SMs a running collective holds: NCCL runs each channel as one thread block, which keeps its SM from the
  // compute stream's kernels while the collective lasts (see beside_collective()); 0: not modeled
  int comm_sms = 0;

  // --- measured on the user's own GPU (a profile file from `distlab bench calibrate`) ---
  std::vector<MeasuredGemm> measured_gemms;          // a GEMM of one of these shapes takes its measured rate
  std::vector<MeasuredAttention> measured_attention;  // flash attention at these (T, head size)
  std::string file;                                   // the profile file it was read from ("" for the built-in ones)

  bool has_cost_model() const {
    return fp32_flops_per_s > 0 && mem_bw_bytes_per_s > 0 && intra_node_busbw_bytes_per_s > 0 && host_link_bytes_per_s > 0 &&
           host_flops_per_s > 0 && host_mem_bw_bytes_per_s > 0;
  }
};

const std::vector<HardwareProfile>& hardware_profiles();
// The share of the tensor cores a GEMM's shape leaves busy: its output (m × n) is cut into tiles of
// gemm_tile_m × gemm_tile_n (either way round, whichever wastes less), the last row and column of tiles
// partly empty (tile quantization), and the tiles run sm_count at a time, the last wave partly idle (wave
// quantization); with fewer tiles than SMs, K is split among them (split-K) in pieces at least 256 deep.
// 1 for a profile without tiles. NVIDIA's "Matrix Multiplication Background" guide.
double gemm_quantization(const GemmShape& g, const HardwareProfile& hw);
// The profile as a kernel sees it while a collective runs on the comm stream beside it: comm_sms fewer SMs
// (the tiles' waves recounted on the rest), the peaks and any measured rates scaled by the SMs left. Memory
// bandwidth is left whole: a streaming kernel saturates HBM with fewer SMs (NCCL's own HBM traffic, a few
// percent of it, is not modeled). The profile itself when comm_sms is 0. The replay applies it in the fake
// world only, and to collectives, not to a pipeline's point-to-point sends (cost_model.cpp).
HardwareProfile beside_collective(HardwareProfile hw);
// The same profile with its calibration switched off: every kernel at the data sheet's peak, no per-step
// overhead (log.calibrated = false) — the roofline a hand calculation gives.
HardwareProfile at_peak(HardwareProfile hw);
// "t4, a100-40g, ..." — every profile's name, or only those with a cost model, for hints
std::string profile_names(bool with_cost_model_only);
// A built-in profile by name, or a profile file (a name ending in ".json": what `distlab bench calibrate`
// writes); a file that cannot be read or holds a bad key throws ConfigError naming it.
std::optional<HardwareProfile> find_profile(const std::string& name);
// A profile file: {"name", "base" (a built-in profile it starts from), "source", and any of the rates and
// calibration numbers of HardwareProfile by their field names, "measured_gemms", "measured_attention"}.
HardwareProfile load_profile_file(const std::string& path);
// The file's JSON for a profile (what load_profile_file reads back); `base` names the built-in it started from.
std::string profile_file_json(const HardwareProfile& hw, const std::string& base);
// The profile of a GPU by the name CUDA gives it ("NVIDIA H100 80GB HBM3" -> h100-nvlink, "... PCIe" ->
// h100-pcie, "H100 NVL" -> h100-96g, H200, A100, T4), for the live MFU of a run on it; nullopt when unknown.
std::optional<HardwareProfile> profile_for_gpu(const std::string& gpu_name);
// Like find_profile, but throws ConfigError naming `what` and listing the profiles when there is none, and
// (with need_cost_model) when the profile only carries memory.
HardwareProfile require_profile(const std::string& name, const std::string& what, bool need_cost_model = false);
// "16GiB" / "80GB" / a profile name ("t4", "a100-80g", ...) -> bytes. ConfigError naming `what` otherwise.
int64_t parse_device_memory(const std::string& text, const std::string& what);

}  // namespace distlab
