#!/usr/bin/env bash
# The GPU checks in one go, for a machine with an NVIDIA GPU (one H200: a few minutes):
#   1. the programs: unpacked from .gpubundle/bundle.tar.xz when there is one (bench/gpu_bundle.sh packs it
#      on a machine with this project's packages: a lent GPU machine has CUDA but not Gloo or OpenBLAS),
#      else a CUDA build in build-cuda/ for this machine's GPU (CUDA_ARCHS overrides);
#   2. every CUDA kernel against its cpu twin, and the NCCL group (distlab_cuda_tests);
#   3. GEMM TFLOP/s against raw cuBLAS at 4096^3 and 8192^3 (bench_gemm_cuda: bf16, TF32, f32, naive), and
#      attention at GPT-2's and LLaMA-3-8B's shapes: naive, flash on CUDA cores, flash on tensor cores;
#   4. `distlab bench comm --backend nccl` on every GPU (one rank each; one GPU gives n = 1, no traffic).
#   5. training on --device cuda: GPT-124M in bf16 (tokens/s and MFU) and the CNN (img/s, its loss next to the cpu's);
#      ZeRO-1 and ZeRO-3 over NCCL against Gloo on every GPU, ZeRO-2 and ZeRO-3 with CPU offload against the cpu;
#      with 2 or more GPUs, DDP and FSDP over NCCL too, and GPT split over 2 GPUs (tp 2, pp 2) against the cpu.
#   6. every lab's solution graded on the GPU (distlab grade NN --solution --device cuda): points and seconds.
#   7. the cost model calibrated on this GPU (distlab bench calibrate): GPT-2 124M and Llama 3 8B cut to 2
#      blocks, each modeled from its calibrated profile against the same run measured here.
# Without the toolkit or without a GPU each step says why it is
# skipped, and the script still exits 0: it is safe to run anywhere. Output also goes to $OUT when set.
#   bash bench/gpu_check.sh            CUDA_ARCHS=90 bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
status=0
say() { printf '\n== %s\n' "$*"; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  gpu=1
else
  echo "no GPU answers nvidia-smi: the CUDA code is built, the GPU checks skip"
  gpu=0
fi

# CUDA's own libraries where the GPU machine keeps them: the toolkit, or the Python wheels' copies
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && cuda_libs="$cuda_libs:$d"
done
for py in python3 /usr/bin/python3; do
  extra=$($py - 2>/dev/null <<'PY'
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += glob.glob(os.path.join(s, "nvidia", "*", "lib"))
print(":".join(dirs))
PY
) && [ -n "$extra" ] && cuda_libs="$cuda_libs:$extra" && break
done

say "1. the programs"
if [ -f .gpubundle/bundle.tar.xz ]; then
  B=$(mktemp -d /tmp/distlab-gpu-XXXXXX)
  tar -C "$B" -xJf .gpubundle/bundle.tar.xz || { echo "cannot unpack .gpubundle/bundle.tar.xz"; exit 1; }
  head -2 "$B/MANIFEST"
  export LD_LIBRARY_PATH="$B/lib${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  TESTS=$B/bin/distlab_cuda_tests GEMM=$B/bin/bench_gemm_cuda DISTLAB=$B/bin/distlab
  missing=$(ldd "$TESTS" "$GEMM" | grep "not found" | sort -u)
  [ -z "$missing" ] || { echo "libraries not found (CUDA 13's cudart, cuBLAS and NCCL are the GPU machine's):"; echo "$missing"; exit 1; }
else
  NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  if [ ! -x "$NVCC" ]; then
    say "skipped: no CUDA toolkit (nvcc not found; set NVCC=/path/to/nvcc), and no .gpubundle/bundle.tar.xz"
    exit 0
  fi
  if [ $gpu -eq 1 ]; then archs=${CUDA_ARCHS:-native}; else archs=${CUDA_ARCHS:-"75;80;90"}; fi
  echo "a CUDA build (sm ${archs}) in build-cuda/"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DDISTLAB_CUDA=ON -DDISTLAB_TESTS=ON \
        -DCMAKE_CUDA_COMPILER="$NVCC" "-DCMAKE_CUDA_ARCHITECTURES=${archs}" >build-cuda.log 2>&1 \
    || { tail -30 build-cuda.log; echo "configure failed (build-cuda.log): bash scripts/setup.sh installs the packages, or pack a bundle"; exit 1; }
  grep "distlab features" build-cuda.log
  cmake --build build-cuda --target distlab distlab_cuda_tests bench_gemm_cuda >>build-cuda.log 2>&1 \
    || { tail -40 build-cuda.log; echo "build failed (build-cuda.log)"; exit 1; }
  TESTS=build-cuda/tests/distlab_cuda_tests GEMM=build-cuda/bin/bench_gemm_cuda DISTLAB=build-cuda/bin/distlab
fi
echo "ready after $((SECONDS - t0)) s"
"$DISTLAB" doctor || status=1

say "2. every CUDA kernel against the cpu one; the NCCL group"
"$TESTS" --durations yes
rc=$?
if [ $rc -eq 77 ]; then echo "(skipped)"; elif [ $rc -ne 0 ]; then status=1; fi

say "3. GEMM: distlab against raw cuBLAS; attention: naive, flash (f32), flash on tensor cores"
"$GEMM" || status=1
[ -n "${OUT:-}" ] && [ -f bench/results/gemm_cuda.json ] && cp bench/results/gemm_cuda.json "$OUT/"

say "4. distlab bench comm over NCCL, one rank per GPU"
if [ $gpu -eq 1 ]; then
  ngpu=$(nvidia-smi -L | wc -l)
  "$DISTLAB" bench comm -n "$ngpu" --backend nccl --max 1GiB || status=1
  [ -n "${OUT:-}" ] && cp bench/results/comm_nccl_n"$ngpu".json "$OUT/" 2>/dev/null
else
  echo "(skipped: no GPU)"
fi

say "5. training on the GPU: GPT-124M in bf16 (tokens/s, MFU), the CNN (img/s)"
# MFU = the step's FLOPs (the trainer's count: matmuls and attention, 6·N·tokens and more) over the measured
# step time (each step ends with a device synchronize), against the GPU's dense bf16 peak (PEAK_TFLOPS;
# 989 on an H100/H200 SXM). The first 5 steps (allocator warm-up, cuBLAS heuristics) are left out.
rates() {  # metrics.jsonl, the unit, units per sample: prints the steady rate
  python3 - "$1" "$2" "${PEAK_TFLOPS:-989}" "$3" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"step"' in l]
steady = steps[5:] or steps
t = sum(s["wall_s"] for s in steady) / len(steady)
samples = steady[0]["samples"]
tok = samples * int(sys.argv[4])
tflops = steady[0]["flops"] / t / 1e12
print(f"{len(steady)} steady steps: {1e3 * t:.1f} ms per step, {tok / t:,.0f} {sys.argv[2]}/s, "
      f"{tflops:.1f} TFLOP/s = {100 * tflops / float(sys.argv[3]):.1f} % MFU of {sys.argv[3]} TFLOP/s")
PY
}
measured_memory() {  # metrics.jsonl: the device allocator's measured peak against the engine's accounting
  python3 - "$1" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"summary"' in l][-1]
held, res, tot = s.get("peak_memory_device_measured", -1), s.get("peak_memory_reserved", 0), s.get("peak_memory_total", 0)
g = lambda b: b / 2**30
print(f"memory: measured {g(held):.2f} GiB (the caching allocator's cudaMalloc'd peak) against {g(res):.2f} GiB modeled reserved "
      f"({held / res if res else float('nan'):.3f}x; the target: within 5 %) and {g(tot):.2f} GiB counted in tensors "
      f"({held / tot if tot else float('nan'):.3f}x; a 16-bit run's f32 kernels also hold f32 copies of what they read, uncounted)")
PY
}
against_cpu() {  # label, cpu metrics, cuda metrics: the largest relative difference in loss and grad norm
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def steps(f): return [json.loads(l) for l in open(f) if '"kind":"step"' in l]
a, b = steps(sys.argv[2]), steps(sys.argv[3])
worst = max((abs(x[k] - y[k]) / max(abs(x[k]), 1e-30) for x, y in zip(a, b) for k in ("loss", "grad_norm")), default=float("nan"))
losses = " ".join("%.6f" % s["loss"] for s in b)
print(f"{sys.argv[1]}: {len(b)} steps on cuda; loss {losses}; largest relative difference from the cpu (loss, grad norm): {worst:.2e}")
PY
}
nccl_vs_gloo() {  # strategy, steps: gpt-tiny in bf16 on every GPU over NCCL, then over Gloo
  for b in nccl gloo; do
    "$DISTLAB" run -n "$ngpu" train configs/gpt-tiny.toml --device cuda --set parallel.strategy=$1 --set dist.backend=$b \
      --set precision.mode=bf16 --set train.steps=$2 --metrics "$M/$1_$b.jsonl" 2>&1 | grep -E "^step|communication in|collectives on" || status=1
  done
  python3 - "$1 on $ngpu GPU(s)" "$M/$1_nccl.jsonl" "$M/$1_gloo.jsonl" <<'PY'
import json, sys
def steps(f): return [json.loads(l) for l in open(f) if '"kind":"step"' in l]
a, b = steps(sys.argv[2]), steps(sys.argv[3])
worst = max((abs(x["loss"] - y["loss"]) / max(abs(y["loss"]), 1e-30) for x, y in zip(a, b)), default=float("nan"))
ms = lambda s: 1e3 * sum(r["wall_s"] for r in s[2:]) / max(len(s[2:]), 1)
print(f"{sys.argv[1]}: {ms(a):.1f} ms per step over nccl, {ms(b):.1f} over gloo; losses within {worst:.1e} (bf16 sums in another order)")
PY
}
if [ $gpu -eq 1 ]; then
  M=${OUT:-/tmp}
  "$DISTLAB" train configs/gpt2-124m.toml --device cuda --set train.steps=25 --metrics "$M/gpt2_124m_cuda.jsonl" 2>&1 | tail -14 || status=1
  [ -f "$M/gpt2_124m_cuda.jsonl" ] && rates "$M/gpt2_124m_cuda.jsonl" tokens 1024 && measured_memory "$M/gpt2_124m_cuda.jsonl"
  # the same with flash attention: in bf16 on sm 80+ it is attention_tc.cu's tensor-core kernel
  "$DISTLAB" train configs/gpt2-124m.toml --device cuda --set train.steps=25 --set model.attention=flash \
    --metrics "$M/gpt2_124m_flash_cuda.jsonl" 2>&1 | tail -3 || status=1
  [ -f "$M/gpt2_124m_flash_cuda.jsonl" ] && { printf 'flash attention: '; rates "$M/gpt2_124m_flash_cuda.jsonl" tokens 1024; }
  "$DISTLAB" train configs/cifar-cnn.toml --device cuda --set train.steps=60 --set train.global_batch=256 --metrics "$M/cnn_cuda.jsonl" 2>&1 | tail -6 || status=1
  [ -f "$M/cnn_cuda.jsonl" ] && rates "$M/cnn_cuda.jsonl" img 1
  # the trainer on the GPU against the cpu: the same runs' first losses and gradient norms (fp32; the GPU
  # sums in another order, so they agree to about 1e-5 relative, not bit for bit)
  for c in "configs/gpt-tiny.toml" "configs/cifar-cnn-bn.toml"; do
    for d in cpu cuda; do
      "$DISTLAB" train $c --device $d --set train.steps=5 --set data.synthetic_train=2048 --metrics "$M/parity_$d.jsonl" >/dev/null 2>&1 || status=1
    done
    against_cpu "$c" "$M/parity_cpu.jsonl" "$M/parity_cuda.jsonl"
  done
  # the strategies' NCCL path on whatever GPUs there are (one GPU: a 1-rank communicator, which still runs
  # every reduce-scatter and all-gather through NCCL, 16-bit wire included), against the same run over Gloo
  nccl_vs_gloo zero1 10
  nccl_vs_gloo zero3 10
  # CPU offload: the parts and the optimizer state in host memory, the step on the host, against the cpu ranks
  for s in zero2 zero3; do
    rm -f "$M"/offload_*.jsonl  # a failed run leaves nothing for against_cpu to mistake for its own
    for d in cpu cuda; do
      "$DISTLAB" run -n "$ngpu" train configs/gpt-tiny.toml --device $d --set parallel.strategy=$s --set parallel.offload=cpu \
        --set train.steps=5 --metrics "$M/offload_$d.jsonl" >/dev/null 2>&1 || status=1
    done
    against_cpu "$s with cpu offload on $ngpu GPU(s)" "$M/offload_cpu.jsonl" "$M/offload_cuda.jsonl"
  done
  if [ "$ngpu" -ge 2 ]; then  # DDP over NCCL, a rank per GPU
    "$DISTLAB" run -n "$ngpu" train configs/cifar-cnn.toml --device cuda --set parallel.strategy=ddp --set dist.backend=nccl \
      --set train.steps=60 --set train.global_batch=$((256 * ngpu)) --metrics "$M/ddp_nccl.jsonl" 2>&1 | tail -4 || status=1
    [ -f "$M/ddp_nccl.jsonl" ] && rates "$M/ddp_nccl.jsonl" img 1  # samples: the global batch
    nccl_vs_gloo fsdp 20  # FSDP's prefetched all-gathers across GPUs
    # a model split over 2 GPUs: tensor parallel (its all-reduces over NCCL), then 2 pipeline stages
    for split in "parallel.tp=2" "parallel.pp=2 --set parallel.micro_batches=4"; do
      rm -f "$M"/split_*.jsonl
      for d in cpu cuda; do
        "$DISTLAB" run -n 2 train configs/gpt-tiny.toml --device $d --set $split --set dist.backend=$([ $d = cuda ] && echo nccl || echo gloo) \
          --set train.steps=5 --metrics "$M/split_$d.jsonl" >/dev/null 2>&1 || status=1
      done
      against_cpu "$split on 2 GPUs" "$M/split_cpu.jsonl" "$M/split_cuda.jsonl"
    done
  fi
else
  echo "(skipped: no GPU)"
  "$DISTLAB" train configs/fashion-mnist-mlp.toml --device cuda 2>&1 | head -1
fi

say "6. every lab's solution graded with its training jobs on the GPU (distlab grade NN --device cuda)"
# a bundle's distlab finds this tree and a build folder of its own through the environment (cli/paths.h);
# the plugins are compiled here, so the machine needs g++. GRADE_LABS=0 skips this step.
if [ $gpu -eq 1 ] && [ "${GRADE_LABS:-1}" = 1 ] && command -v g++ >/dev/null; then
  export DISTLAB_SOURCE_DIR="$PWD" DISTLAB_BUILD_DIR="${OUT:-/tmp}/gpu-grade-build"
  for lab in 01 02 03 04 05 06 07 08 09; do
    t=$SECONDS
    out=$(timeout 600 "$DISTLAB" grade "$lab" --solution --device cuda 2>&1)
    rc=$?
    total=$(printf '%s\n' "$out" | grep -E '^  total ' | awk '{print $2 "/" $3}')
    printf 'lab %s: %s on cuda in %d s%s\n' "$lab" "${total:-no total}" $((SECONDS - t)) "$([ $rc -eq 0 ] || echo ", exit $rc")"
    [ $rc -eq 0 ] || { printf '%s\n' "$out" | tail -25; status=1; }
  done
else
  echo "(skipped: $([ $gpu -eq 1 ] || echo 'no GPU')$([ "${GRADE_LABS:-1}" = 1 ] || echo 'GRADE_LABS=0')$(command -v g++ >/dev/null || echo ' no g++ to compile the plugins'))"
fi

say "done in $((SECONDS - t0)) s, status ${status}"
say "7. the cost model calibrated here: modeled from the calibrated profile against the measured step"
# bench calibrate times every GEMM shape of the model's step, flash attention and a streaming kernel on this
# GPU (with 2+ GPUs, NCCL's table of step 4 too); the same run is then trained here with that profile, and
# its summary holds both the modeled and the measured step (the target: within ±10 %).
if [ $gpu -eq 1 ]; then
  M=${OUT:-/tmp}
  comm=""
  [ "${ngpu:-1}" -ge 2 ] && [ -f bench/results/comm_nccl_n"$ngpu".json ] && comm="--comm bench/results/comm_nccl_n$ngpu.json"
  for spec in "configs/gpt2-124m.toml|--set precision.mode=bf16" \
              "configs/llama3-8b.toml|--set model.n_layer=2 --set train.micro_batch=2 --set model.attention=flash --set precision.mode=bf16"; do
    cfg=${spec%%|*}; sets=${spec#*|}
    rm -f "$M/calibrated.json" "$M/calibrated_run.jsonl"
    # shellcheck disable=SC2086
    "$DISTLAB" bench calibrate "$cfg" $sets --device cuda $comm -o "$M/calibrated.json" 2>&1 | tail -4 || status=1
    # shellcheck disable=SC2086
    "$DISTLAB" train "$cfg" $sets --device cuda --set train.steps=12 --set log.trace_step=10 --set train.eval_every=0 \
      --set log.profile="$M/calibrated.json" --metrics "$M/calibrated_run.jsonl" >/dev/null 2>&1 || status=1
    [ -f "$M/calibrated_run.jsonl" ] && python3 - "$cfg" "$M/calibrated_run.jsonl" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[2]) if '"kind":"summary"' in l][-1]
m, r = s.get("modeled_step_s", 0), s.get("measured_step_s", 0)
print(f"{sys.argv[1]}: modeled {1e3 * m:.1f} ms a step from the calibrated profile, measured {1e3 * r:.1f} ms: ratio {m / r if r else float('nan'):.2f}")
PY
  done
else
  echo "(skipped: no GPU)"
fi
exit $status
