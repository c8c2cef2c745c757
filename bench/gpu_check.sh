#!/usr/bin/env bash
# The GPU checks in one go, for a machine with an NVIDIA GPU. A lent GPU comes for minutes, so the steps run
# in the order of what a short loan must measure first, within a time budget (GPU_CHECK_BUDGET_S, 540 s by
# default: a step that would not fit says so and is skipped), and end with one table of every target:
#   1. the programs: unpacked from .gpubundle/bundle.tar.xz when there is one (bench/gpu_bundle.sh packs it
#      on a machine with this project's packages: a lent GPU machine has CUDA but not Gloo or OpenBLAS),
#      else a CUDA build in build-cuda/ for this machine's GPU (CUDA_ARCHS overrides);
#   2. every CUDA kernel against its cpu twin, and the NCCL group (distlab_cuda_tests);
#   3. the speed targets: GPT-2 124M in bf16 (tokens/s and MFU, target >= 35 %; also with model.attention=flash,
#      the tensor-core kernel), its measured memory against the engine's accounting (within 5 %), and Llama 3 8B
#      cut to 2 blocks (B 2, T 8192) against eager PyTorch's step (bench/peer_torch_llama.py with SDPA held to
#      FlashAttention-2, where PyTorch with CUDA is installed; target: within 1.2x);
#   4. GEMM TFLOP/s against raw cuBLAS at 4096^3 and 8192^3 (bench_gemm_cuda: bf16, TF32, f32, naive), and
#      attention at GPT-2's and LLaMA-3-8B's shapes: naive, flash on CUDA cores, flash on tensor cores;
#   5. `distlab bench comm --backend nccl` on every GPU (one rank each; one GPU gives n = 1, no traffic);
#   6. the cost model calibrated on this GPU (distlab bench calibrate, with step 5's NCCL table on 2+ GPUs):
#      GPT-2 124M and Llama 3 8B cut to 2 blocks, each modeled from its calibrated profile against the same
#      run measured here, and the Llama blocks modeled with eager PyTorch's op chains against eager PyTorch's
#      step of step 3 (targets: +-10 %);
#   7. training on --device cuda against the cpu (within 1e-4): GPT-tiny and the CNN with batch norm, ZeRO-2
#      and ZeRO-3 with CPU offload; ZeRO-1 and ZeRO-3 over NCCL against Gloo on every GPU (bf16, within 1e-2);
#      the CNN's img/s; with 2 or more GPUs, DDP and FSDP over NCCL too, and GPT split over 2 GPUs (tp 2, pp 2);
#   8. every lab's solution graded on the GPU (distlab grade NN --solution --device cuda): points and seconds.
# Every run is stopped when the budget is spent. The table goes to the screen and, as tab-separated rows, to
# $OUT/gpu_check_summary.tsv ($OUT: the device tool's folder that comes back; /tmp elsewhere); the exit status
# is 1 when a run failed (a target missed is a verdict, not a failure). Without the toolkit or without a GPU
# each step says why it is skipped, and the script still exits 0: it is safe to run anywhere.
#   bash bench/gpu_check.sh            CUDA_ARCHS=90 GPU_CHECK_BUDGET_S=900 bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t0=$SECONDS
BUDGET=${GPU_CHECK_BUDGET_S:-540}
status=0
M=${OUT:-/tmp}
SUMMARY="$M/gpu_check_summary.tsv"
printf 'what\tmeasured\ttarget\tverdict\n' > "$SUMMARY"
B="" GRADE_BUILD=""  # the unpacked bundle and the labs' build folder: removed at the end
say() { printf '\n== %s   [%d s of %d]\n' "$*" $((SECONDS - t0)) "$BUDGET"; }
row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$SUMMARY"; }  # what, measured, target, verdict
left() { echo $((BUDGET - (SECONDS - t0))); }
# fits SECONDS WHAT...: true when the budget has about SECONDS left for the step; else says so, and the
# step's targets are recorded as not measured
fits() {
  local need=$1; shift
  [ "$(left)" -ge "$need" ] && return 0
  echo "(skipped: $(left) s of the ${BUDGET} s budget left, the step needs about ${need} s; GPU_CHECK_BUDGET_S raises it)"
  for w in "$@"; do row "$w" "not measured" "" "skipped: out of time"; done
  return 1
}
# within COMMAND...: the command, stopped when the budget is spent (the script's table still comes out)
within() { local l; l=$(left); [ "$l" -lt 5 ] && l=5; timeout "$l" "$@"; }
py=python3  # the summaries' Python; PyTorch's may be another one (peer_torch_llama.py)
# judge WHAT GOT WANT_TEXT KIND LIMIT UNIT [DETAIL]: a row for GOT (a number, or empty/nan when the run gave
# none: FAIL) against LIMIT: KIND "min" (GOT >= LIMIT), "max" (GOT <= LIMIT), "near" (|GOT - 1| <= LIMIT)
judge() {
  local line
  line=$($py - "$2" "$4" "$5" "$6" <<'PY'
import math, sys
try:
    got = float(sys.argv[1])
except ValueError:
    got = float("nan")
kind, limit, unit = sys.argv[2], float(sys.argv[3]), sys.argv[4]
if not math.isfinite(got):
    print("not measured\tFAIL")
else:
    ok = got >= limit if kind == "min" else got <= limit if kind == "max" else abs(got - 1) <= limit
    print(f"{got:.3g}{unit}\t{'ok' if ok else 'MISSED'}")
PY
)
  local value=${line%%$'\t'*} verdict=${line#*$'\t'}
  [ "$verdict" = FAIL ] && status=1
  row "$1" "${value}${7:+ ($7)}" "$3" "$verdict"
}
# ratio A B: A / B, or empty when either is missing or B is 0
ratio() { $py -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print('%.2f' % (a / b) if b else '')" "$1" "$2" 2>/dev/null; }

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit,clocks.max.sm --format=csv,noheader
  gpu=1
  ngpu=$(nvidia-smi -L | wc -l)
else
  echo "no GPU answers nvidia-smi: the CUDA code is built, the GPU checks skip"
  gpu=0
  ngpu=0
fi

# CUDA's own libraries where the GPU machine keeps them: the toolkit, or the Python wheels' copies
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && cuda_libs="$cuda_libs:$d"
done
for p in python3 /usr/bin/python3; do
  extra=$($p - 2>/dev/null <<'PY'
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += glob.glob(os.path.join(s, "nvidia", "*", "lib"))
print(":".join(dirs))
PY
) && [ -n "$extra" ] && cuda_libs="$cuda_libs:$extra" && break
done

summary() {  # the table of every target, last whatever happened
  say "summary (also in $SUMMARY)"
  $py - "$SUMMARY" <<'PY'
import sys
head = ("what", "measured", "target", "verdict")
rows = [(l.rstrip("\n").split("\t") + [""] * 4)[:4] for l in open(sys.argv[1])][1:]
w = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
print("  ".join(h.ljust(w[i]) for i, h in enumerate(head)))
for r in rows:
    print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
PY
  say "done in $((SECONDS - t0)) s, status ${status}"
  [ -n "$B" ] && rm -rf "$B"
  [ -n "$GRADE_BUILD" ] && rm -rf "$GRADE_BUILD"
  exit $status
}
trap summary EXIT

say "1. the programs"
if [ -f .gpubundle/bundle.tar.xz ]; then
  B=$(mktemp -d /tmp/distlab-gpu-XXXXXX)
  tar -C "$B" -xJf .gpubundle/bundle.tar.xz || { echo "cannot unpack .gpubundle/bundle.tar.xz"; status=1; exit 1; }
  head -2 "$B/MANIFEST"
  export LD_LIBRARY_PATH="$B/lib${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  TESTS=$B/bin/distlab_cuda_tests GEMM=$B/bin/bench_gemm_cuda DISTLAB=$B/bin/distlab
  missing=$(ldd "$TESTS" "$GEMM" | grep "not found" | sort -u)
  [ -z "$missing" ] || { echo "libraries not found (CUDA 13's cudart, cuBLAS and NCCL are the GPU machine's):"; echo "$missing"; status=1; exit 1; }
else
  NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  if [ ! -x "$NVCC" ]; then
    echo "skipped: no CUDA toolkit (nvcc not found; set NVCC=/path/to/nvcc), and no .gpubundle/bundle.tar.xz"
    row "the programs" "none" "a bundle or a toolkit" "skipped"
    exit 0
  fi
  if [ $gpu -eq 1 ]; then archs=${CUDA_ARCHS:-native}; else archs=${CUDA_ARCHS:-"75;80;90"}; fi
  echo "a CUDA build (sm ${archs}) in build-cuda/"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DDISTLAB_CUDA=ON -DDISTLAB_TESTS=ON \
        -DCMAKE_CUDA_COMPILER="$NVCC" "-DCMAKE_CUDA_ARCHITECTURES=${archs}" >build-cuda.log 2>&1 \
    || { tail -30 build-cuda.log; echo "configure failed (build-cuda.log): bash scripts/setup.sh installs the packages, or pack a bundle"; status=1; exit 1; }
  grep "distlab features" build-cuda.log
  cmake --build build-cuda --target distlab distlab-labhost distlab_cuda_tests bench_gemm_cuda >>build-cuda.log 2>&1 \
    || { tail -40 build-cuda.log; echo "build failed (build-cuda.log)"; status=1; exit 1; }
  TESTS=build-cuda/tests/distlab_cuda_tests GEMM=build-cuda/bin/bench_gemm_cuda DISTLAB=build-cuda/bin/distlab
fi
echo "ready after $((SECONDS - t0)) s"
"$DISTLAB" doctor || status=1

say "2. every CUDA kernel against the cpu one; the NCCL group"
if fits 60 "kernels against the cpu"; then
  within "$TESTS" --durations yes
  rc=$?
  if [ $rc -eq 77 ]; then echo "(skipped)"; row "kernels against the cpu" "not run" "all pass" "skipped: no GPU"
  elif [ $rc -ne 0 ]; then status=1; row "kernels against the cpu" "failures or a stop (exit $rc, above)" "all pass" "FAIL"
  else row "kernels against the cpu" "all pass" "all pass" "ok"; fi
fi

# rates METRICS UNIT PER_SAMPLE: the steady rate of a run (the first 5 steps, allocator warm-up and cuBLAS
# heuristics, left out); MFU = the step's FLOPs (the trainer's count: matmuls and attention) over the measured
# step (each ends with a device synchronize), against the dense bf16 peak (PEAK_TFLOPS; 989 on an H100/H200
# SXM). Prints a line, and "ms mfu" to $M/.rate for the table.
rates() {
  rm -f "$M/.rate"
  [ -f "$1" ] || return 1
  $py - "$1" "$2" "${PEAK_TFLOPS:-989}" "$3" "$M/.rate" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"step"' in l]
steady = steps[5:] or steps
t = sum(s["wall_s"] for s in steady) / len(steady)
samples = steady[0]["samples"]
tok = samples * int(sys.argv[4])
tflops = steady[0]["flops"] / t / 1e12
mfu = 100 * tflops / float(sys.argv[3])
print(f"{len(steady)} steady steps: {1e3 * t:.1f} ms per step, {tok / t:,.0f} {sys.argv[2]}/s, "
      f"{tflops:.1f} TFLOP/s = {mfu:.1f} % MFU of {sys.argv[3]} TFLOP/s")
waits = sorted(s["host_waits"] for s in steady if "host_waits" in s)
if waits:  # each leaves the GPU idle until the host queues more: a fixed few a step, not one per parameter
    print(f"the host waited for the GPU's results {waits[len(waits) // 2]} times a step (median, inside the step; bf16 under none or DDP: 0, fp16: 1, the overflow flag)")
open(sys.argv[5], "w").write(f"{1e3 * t:.1f} {mfu:.1f}\n")
PY
}
measured_memory() {  # metrics.jsonl: the device allocator's measured peak against the engine's accounting
  rm -f "$M/.memory"
  [ -f "$1" ] || return 1
  $py - "$1" "$M/.memory" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"summary"' in l][-1]
held, res, tot = s.get("peak_memory_device_measured", -1), s.get("peak_memory_reserved", 0), s.get("peak_memory_total", 0)
g = lambda b: b / 2**30
r = held / res if res and held > 0 else float("nan")
print(f"memory: measured {g(held):.2f} GiB (the caching allocator's cudaMalloc'd peak) against {g(res):.2f} GiB modeled reserved "
      f"({r:.3f}x; the target: within 5 %) and {g(tot):.2f} GiB counted in tensors "
      f"({held / tot if tot else float('nan'):.3f}x; a 16-bit run's f32 kernels also hold f32 copies of what they read, uncounted)")
open(sys.argv[2], "w").write(f"{g(held):.2f} {g(res):.2f} {r:.3f}\n")
PY
}
summary_ms() {  # metrics.jsonl KEY: the summary's KEY (seconds) in ms, or nothing
  [ -f "$1" ] && $py -c "
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '\"kind\":\"summary\"' in l][-1]
v = s.get(sys.argv[2], 0)
print('%.1f' % (1e3 * v) if v else '')" "$1" "$2" 2>/dev/null
}

say "3. the speed targets: GPT-2 124M in bf16 (MFU), its memory, Llama 3 8B's blocks against eager PyTorch"
# Llama 3 8B cut to 2 blocks, B 2, T 8192, bf16 with f32 master weights and FlashAttention-2: distlab's step,
# then eager PyTorch's (torchtitan's model code, SDPA held to flash, foreach AdamW) where a Python with
# PyTorch and CUDA is installed
llama_sets="--set model.n_layer=2 --set train.micro_batch=2 --set model.attention=flash --set precision.mode=bf16"
pt_ms=""  # eager PyTorch's step, for step 6 too
if [ $gpu -eq 0 ]; then
  echo "(skipped: no GPU)"
  "$DISTLAB" train configs/fashion-mnist-mlp.toml --device cuda 2>&1 | head -1
  for w in "GPT-2 124M bf16, MFU|>= 35 %" "GPT-2 124M bf16, measured peak / modeled reserved|within 5 %" \
           "GPT-2 124M bf16 + flash attention, MFU|>= 35 %" "Llama 3 8B, 2 blocks: distlab / eager PyTorch|<= 1.2x" \
           "GPT-2 124M: modeled (calibrated) / measured step|within 10 %" "Llama 3 8B, 2 blocks: modeled (calibrated) / measured step|within 10 %" \
           "Llama 3 8B, 2 blocks: modeled eager (calibrated) / eager PyTorch|within 10 %"; do
    row "${w%%|*}" "not measured" "${w#*|}" "skipped: no GPU"
  done
fi
if [ $gpu -eq 1 ] && fits 60 "GPT-2 124M bf16, MFU" "GPT-2 124M bf16, measured peak / modeled reserved"; then
  rm -f "$M/gpt2_124m_cuda.jsonl"
  within "$DISTLAB" train configs/gpt2-124m.toml --device cuda --set train.steps=25 --metrics "$M/gpt2_124m_cuda.jsonl" 2>&1 | tail -14
  ms="" mfu="" r=""
  rates "$M/gpt2_124m_cuda.jsonl" tokens 1024 && read -r ms mfu < "$M/.rate"
  judge "GPT-2 124M bf16, MFU" "${mfu:-nan}" ">= 35 %" min 35 " %" "${ms:+$ms ms a step}"
  measured_memory "$M/gpt2_124m_cuda.jsonl" && read -r held res r < "$M/.memory"
  judge "GPT-2 124M bf16, measured peak / modeled reserved" "${r:-nan}" "within 5 %" near 0.05 "" "${r:+$held of $res GiB}"
fi
if [ $gpu -eq 1 ] && fits 45 "GPT-2 124M bf16 + flash attention, MFU"; then
  # with flash attention: in bf16 on sm 80+ it is attention_tc.cu's tensor-core kernel
  rm -f "$M/gpt2_124m_flash_cuda.jsonl"
  within "$DISTLAB" train configs/gpt2-124m.toml --device cuda --set train.steps=25 --set model.attention=flash \
    --metrics "$M/gpt2_124m_flash_cuda.jsonl" 2>&1 | tail -3
  ms="" mfu=""
  printf 'flash attention: '
  rates "$M/gpt2_124m_flash_cuda.jsonl" tokens 1024 && read -r ms mfu < "$M/.rate"
  judge "GPT-2 124M bf16 + flash attention, MFU" "${mfu:-nan}" ">= 35 %" min 35 " %" "${ms:+$ms ms a step}"
fi
if [ $gpu -eq 1 ] && fits 90 "Llama 3 8B, 2 blocks: distlab / eager PyTorch"; then
  rm -f "$M/llama_2_blocks_cuda.jsonl" "$M/peer_torch_llama.json"
  # shellcheck disable=SC2086
  within "$DISTLAB" train configs/llama3-8b.toml --device cuda $llama_sets --set train.steps=10 --set train.eval_every=0 \
    --metrics "$M/llama_2_blocks_cuda.jsonl" 2>&1 | tail -4
  dl_ms=""
  rates "$M/llama_2_blocks_cuda.jsonl" tokens 8192 && read -r dl_ms _ < "$M/.rate"
  torch_py=""
  for p in python3 /usr/bin/python3; do
    $p -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && { torch_py=$p; break; }
  done
  if [ -z "$torch_py" ]; then
    row "Llama 3 8B, 2 blocks: distlab / eager PyTorch" "distlab ${dl_ms:-failed}; PyTorch not measured" "<= 1.2x" "no PyTorch with CUDA here"
    [ -n "$dl_ms" ] || status=1
  elif fits 60 "Llama 3 8B, 2 blocks: distlab / eager PyTorch"; then
    within $torch_py bench/peer_torch_llama.py --only steps --layers 2 --sdpa flash --json "$M/peer_torch_llama.json" 2>&1 | tail -4
    pt_ms=$($py -c "import json, sys; print('%.1f' % json.load(open(sys.argv[1]))['steps'][0]['step_ms'])" "$M/peer_torch_llama.json" 2>/dev/null)
    judge "Llama 3 8B, 2 blocks: distlab / eager PyTorch" "$(ratio "${dl_ms:-nan}" "${pt_ms:-nan}")" "<= 1.2x" max 1.2 x \
      "${dl_ms:-distlab failed} / ${pt_ms:-PyTorch failed} ms"
  fi
fi

say "4. GEMM: distlab against raw cuBLAS; attention: naive, flash (f32), flash on tensor cores"
if fits 60 "GEMM bf16 TFLOP/s, distlab / cuBLAS"; then
  within "$GEMM"
  rc=$?
  [ -n "${OUT:-}" ] && [ -f bench/results/gemm_cuda.json ] && cp bench/results/gemm_cuda.json "$OUT/"
  if [ $gpu -eq 1 ]; then
    if [ $rc -eq 0 ]; then row "GEMM bf16 TFLOP/s, distlab / cuBLAS" "the table above (bench/results/gemm_cuda.json)" "equal" "see above"
    else status=1; row "GEMM bf16 TFLOP/s, distlab / cuBLAS" "exit $rc (above)" "equal" "FAIL"; fi
  fi
fi

say "5. distlab bench comm over NCCL, one rank per GPU (its table feeds step 6's calibration with 2+ GPUs)"
if [ $gpu -eq 1 ] && fits 30; then
  within "$DISTLAB" bench comm -n "$ngpu" --backend nccl --max 1GiB || status=1
  [ -n "${OUT:-}" ] && cp bench/results/comm_nccl_n"$ngpu".json "$OUT/" 2>/dev/null
else
  [ $gpu -eq 1 ] || echo "(skipped: no GPU)"
fi

say "6. the cost model calibrated here: modeled from the calibrated profile against the measured step"
# bench calibrate times every GEMM shape of the model's step, flash attention and a streaming kernel on this
# GPU (with 2+ GPUs, NCCL's table of step 5 too); the same run is then trained here with that profile, and
# its summary holds both the modeled and the measured step (the target: within ±10 %). The Llama blocks are
# also modeled with eager PyTorch's op chains from the same profile, against eager PyTorch's step of step 3.
if [ $gpu -eq 1 ]; then
  comm=""
  [ "$ngpu" -ge 2 ] && [ -f bench/results/comm_nccl_n"$ngpu".json ] && comm="--comm bench/results/comm_nccl_n$ngpu.json"
  for spec in "GPT-2 124M|configs/gpt2-124m.toml|--set precision.mode=bf16" "Llama 3 8B, 2 blocks|configs/llama3-8b.toml|$llama_sets"; do
    name=${spec%%|*}; rest=${spec#*|}; cfg=${rest%%|*}; sets=${rest#*|}
    eager_row="Llama 3 8B, 2 blocks: modeled eager (calibrated) / eager PyTorch"
    if [ "$cfg" = configs/llama3-8b.toml ]; then fits 90 "$name: modeled (calibrated) / measured step" "$eager_row" || continue
    else fits 90 "$name: modeled (calibrated) / measured step" || continue; fi
    rm -f "$M/calibrated.json" "$M/calibrated_run.jsonl"
    # shellcheck disable=SC2086
    within "$DISTLAB" bench calibrate "$cfg" $sets --device cuda $comm -o "$M/calibrated.json" 2>&1 | tail -4
    # shellcheck disable=SC2086
    within "$DISTLAB" train "$cfg" $sets --device cuda --set train.steps=12 --set log.trace_step=10 --set train.eval_every=0 \
      --set log.profile="$M/calibrated.json" --metrics "$M/calibrated_run.jsonl" >/dev/null 2>&1
    mod=$(summary_ms "$M/calibrated_run.jsonl" modeled_step_s) meas=$(summary_ms "$M/calibrated_run.jsonl" measured_step_s)
    echo "$cfg: modeled ${mod:-?} ms a step from the calibrated profile, measured ${meas:-?} ms"
    judge "$name: modeled (calibrated) / measured step" "$(ratio "${mod:-nan}" "${meas:-nan}")" "within 10 %" near 0.10 "" \
      "${mod:-?} / ${meas:-?} ms"
    [ "$cfg" = configs/llama3-8b.toml ] || continue
    # eager PyTorch's step of step 3, modeled from the same profile with its op chains (log.kernels = "eager")
    if [ -z "$pt_ms" ]; then
      row "$eager_row" "not measured" "within 10 %" "no eager PyTorch step (step 3)"
      continue
    fi
    rm -f "$M/eager_modeled.jsonl"
    # shellcheck disable=SC2086
    within "$DISTLAB" train "$cfg" $sets --device meta --set train.steps=2 --set log.trace_step=2 --set train.eval_every=0 \
      --set log.kernels=eager --set log.profile="$M/calibrated.json" --metrics "$M/eager_modeled.jsonl" >/dev/null 2>&1
    em=$(summary_ms "$M/eager_modeled.jsonl" modeled_step_s)
    judge "$eager_row" "$(ratio "${em:-nan}" "$pt_ms")" "within 10 %" near 0.10 "" "${em:-?} / ${pt_ms} ms"
  done
else
  echo "(skipped: no GPU)"
fi

say "7. training on the GPU against the cpu: the CNN (img/s), parity, NCCL against Gloo, CPU offload"
# against_cpu LABEL CPU_METRICS CUDA_METRICS: the largest relative difference in loss and grad norm, in the
# table against 1e-4 (fp32 on both sides: the GPU sums in another order, about 1e-5 apart)
against_cpu() {
  local worst
  worst=$([ -f "$2" ] && [ -f "$3" ] && $py - "$1" "$2" "$3" <<'PY'
import json, sys
def steps(f): return [json.loads(l) for l in open(f) if '"kind":"step"' in l]
a, b = steps(sys.argv[2]), steps(sys.argv[3])
worst = max((abs(x[k] - y[k]) / max(abs(x[k]), 1e-30) for x, y in zip(a, b) for k in ("loss", "grad_norm")), default=float("nan"))
losses = " ".join("%.6f" % s["loss"] for s in b)
print(f"{sys.argv[1]}: {len(b)} steps on cuda; loss {losses}; largest relative difference from the cpu (loss, grad norm): {worst:.2e}",
      file=sys.stderr)
print(worst if len(a) == len(b) and a else "nan")
PY
)
  judge "cuda against the cpu: $1" "${worst:-nan}" "within 1e-4" max 1e-4 "" "largest relative difference"
}
nccl_vs_gloo() {  # strategy, steps: gpt-tiny in bf16 on every GPU over NCCL, then over Gloo
  for b in nccl gloo; do
    rm -f "$M/$1_$b.jsonl"
    within "$DISTLAB" run -n "$ngpu" train configs/gpt-tiny.toml --device cuda --set parallel.strategy=$1 --set dist.backend=$b \
      --set precision.mode=bf16 --set train.steps=$2 --metrics "$M/$1_$b.jsonl" 2>&1 | grep -E "^step|communication in|collectives on"
  done
  local worst
  worst=$([ -f "$M/$1_nccl.jsonl" ] && [ -f "$M/$1_gloo.jsonl" ] && $py - "$1 on $ngpu GPU(s)" "$M/$1_nccl.jsonl" "$M/$1_gloo.jsonl" <<'PY'
import json, sys
def steps(f): return [json.loads(l) for l in open(f) if '"kind":"step"' in l]
a, b = steps(sys.argv[2]), steps(sys.argv[3])
worst = max((abs(x["loss"] - y["loss"]) / max(abs(y["loss"]), 1e-30) for x, y in zip(a, b)), default=float("nan"))
ms = lambda s: 1e3 * sum(r["wall_s"] for r in s[2:]) / max(len(s[2:]), 1)
print(f"{sys.argv[1]}: {ms(a):.1f} ms per step over nccl, {ms(b):.1f} over gloo; losses within {worst:.1e} (bf16 sums in another order)",
      file=sys.stderr)
print(worst if len(a) == len(b) and a else "nan")
PY
)
  judge "$1 over NCCL against Gloo (bf16 losses)" "${worst:-nan}" "within 1e-2" max 1e-2 "" "largest relative difference"
}
if [ $gpu -eq 1 ] && fits 120; then
  rm -f "$M/cnn_cuda.jsonl"
  within "$DISTLAB" train configs/cifar-cnn.toml --device cuda --set train.steps=60 --set train.global_batch=256 --metrics "$M/cnn_cuda.jsonl" 2>&1 | tail -6
  rates "$M/cnn_cuda.jsonl" img 1 || status=1
  # the trainer on the GPU against the cpu: the same runs' first losses and gradient norms
  for c in "configs/gpt-tiny.toml" "configs/cifar-cnn-bn.toml"; do
    rm -f "$M"/parity_*.jsonl
    for d in cpu cuda; do
      within "$DISTLAB" train $c --device $d --set train.steps=5 --set data.synthetic_train=2048 --metrics "$M/parity_$d.jsonl" >/dev/null 2>&1
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
      within "$DISTLAB" run -n "$ngpu" train configs/gpt-tiny.toml --device $d --set parallel.strategy=$s --set parallel.offload=cpu \
        --set train.steps=5 --metrics "$M/offload_$d.jsonl" >/dev/null 2>&1
    done
    against_cpu "$s with cpu offload on $ngpu GPU(s)" "$M/offload_cpu.jsonl" "$M/offload_cuda.jsonl"
  done
  if [ "$ngpu" -ge 2 ] && fits 90; then  # DDP over NCCL, a rank per GPU
    rm -f "$M/ddp_nccl.jsonl"
    within "$DISTLAB" run -n "$ngpu" train configs/cifar-cnn.toml --device cuda --set parallel.strategy=ddp --set dist.backend=nccl \
      --set train.steps=60 --set train.global_batch=$((256 * ngpu)) --metrics "$M/ddp_nccl.jsonl" 2>&1 | tail -4
    rates "$M/ddp_nccl.jsonl" img 1 || status=1  # samples: the global batch
    nccl_vs_gloo fsdp 20  # FSDP's prefetched all-gathers across GPUs
    # a model split over 2 GPUs: tensor parallel (its all-reduces over NCCL), then 2 pipeline stages
    for split in "parallel.tp=2" "parallel.pp=2 --set parallel.micro_batches=4"; do
      rm -f "$M"/split_*.jsonl
      for d in cpu cuda; do
        backend=gloo; [ $d = cuda ] && backend=nccl
        # shellcheck disable=SC2086
        within "$DISTLAB" run -n 2 train configs/gpt-tiny.toml --device $d --set $split --set dist.backend=$backend \
          --set train.steps=5 --metrics "$M/split_$d.jsonl" >/dev/null 2>&1
      done
      against_cpu "$split on 2 GPUs" "$M/split_cpu.jsonl" "$M/split_cuda.jsonl"
    done
  fi
else
  [ $gpu -eq 1 ] || echo "(skipped: no GPU)"
fi

say "8. every lab's solution graded with its training jobs on the GPU (distlab grade NN --device cuda)"
# a bundle's distlab finds this tree and a build folder of its own through the environment (cli/paths.h);
# the plugins are compiled here, so the machine needs g++. GRADE_LABS=0 skips this step. Each lab gets what
# is left of the budget (at most 600 s); a lab that does not finish in it is recorded as not measured.
if [ $gpu -eq 1 ] && [ "${GRADE_LABS:-1}" = 1 ] && command -v g++ >/dev/null; then
  GRADE_BUILD=$(mktemp -d /tmp/distlab-gpu-grade-XXXXXX)
  export DISTLAB_SOURCE_DIR="$PWD" DISTLAB_BUILD_DIR="$GRADE_BUILD"
  for lab in 01 02 03 04 05 06 07 08 09 10; do
    fits 30 "lab $lab graded on cuda" || continue
    t=$SECONDS
    limit=$(left); [ "$limit" -gt 600 ] && limit=600
    out=$(timeout "$limit" "$DISTLAB" grade "$lab" --solution --device cuda 2>&1)
    rc=$?
    total=$(printf '%s\n' "$out" | grep -m1 -E '^  total ' | awk '{print $2 "/" $3}')
    printf 'lab %s: %s on cuda in %d s%s\n' "$lab" "${total:-no total}" $((SECONDS - t)) "$([ $rc -eq 0 ] || echo ", exit $rc")"
    if [ $rc -eq 0 ]; then row "lab $lab graded on cuda" "${total} in $((SECONDS - t)) s" "full marks" "ok"
    elif [ $rc -eq 124 ]; then row "lab $lab graded on cuda" "stopped after ${limit} s" "full marks" "skipped: out of time"
    else printf '%s\n' "$out" | tail -25; status=1; row "lab $lab graded on cuda" "${total:-no total}, exit $rc" "full marks" "FAIL"; fi
  done
else
  why=()
  [ $gpu -eq 1 ] || why+=("no GPU")
  [ "${GRADE_LABS:-1}" = 1 ] || why+=("GRADE_LABS=0")
  command -v g++ >/dev/null || why+=("no g++ to compile the plugins")
  echo "(skipped: $(IFS=,; echo "${why[*]}" | sed 's/,/, /g'))"
fi
