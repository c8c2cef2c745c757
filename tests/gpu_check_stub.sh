#!/usr/bin/env bash
# bench/gpu_check.sh against a stub GPU: a lent GPU comes for minutes, so the script must not first meet its
# own bugs there. A fake nvidia-smi answers for one H200, and a bundle of stub programs stands in for the
# CUDA build (distlab: a run writes metrics of 134 ms steps of 4.4 TFLOP, lab 03's grading fails; the kernel
# tests pass). Checked: the steps run in the order a short loan needs, every target reaches the table with
# its verdict, a failing lab makes the exit status 1, a budget too small skips the steps that would overrun
# and records them as not measured (exit 0), runs that all fail give FAIL rows (exit 1), and without a GPU
# the targets are recorded as not measured.
#   bash tests/gpu_check_stub.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: gpu_check_stub.sh SOURCE_DIR}
w=$(mktemp -d /tmp/distlab-gpucheck-XXXXXX)
trap 'rm -rf "$w"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$w/tree/bench" "$w/tree/.gpubundle" "$w/stage/bin" "$w/stage/lib" "$w/fakebin" "$w/out"
cp "$src/bench/gpu_check.sh" "$src/bench/peer_torch_llama.py" "$w/tree/bench/"
cat > "$w/stage/bin/distlab" <<'EOF'
#!/bin/bash
args="$*"; metrics=""; out=""
while [ $# -gt 0 ]; do case "$1" in --metrics) metrics=$2; shift;; -o) out=$2; shift;; esac; shift; done
echo "$args" >> "$OUT/calls"
case "$args" in
  doctor*) echo "doctor: one stub H200";;
  bench\ calibrate*) echo '{"base": "h200"}' > "$out";;
  bench\ comm*) echo "comm table";;
  grade\ 03*) echo "  total 6 12"; exit 1;;
  grade*) echo "  total 12 12";;
  *train*)
    [ -n "${STUB_TRAIN_FAILS:-}" ] && { echo "stub: the run fails"; exit 1; }
    [ -n "$metrics" ] && {
      for i in $(seq 12); do echo '{"kind":"step","wall_s":0.134,"samples":8,"flops":4.4e12,"loss":3.1,"grad_norm":1.0,"host_waits":4}'; done
      echo '{"kind":"summary","peak_memory_device_measured":10737418240,"peak_memory_reserved":10500000000,"peak_memory_total":9000000000,"modeled_step_s":0.121,"measured_step_s":0.134}'
    } > "$metrics"
    echo "trained";;
esac
EOF
printf '#!/bin/bash\necho "21 test cases passed"\n' > "$w/stage/bin/distlab_cuda_tests"
printf '#!/bin/bash\necho "GEMM table"\n' > "$w/stage/bin/bench_gemm_cuda"
echo "stub bundle" > "$w/stage/MANIFEST"
chmod +x "$w/stage/bin/"*
tar -C "$w/stage" -cJf "$w/tree/.gpubundle/bundle.tar.xz" . || fail "cannot pack the stub bundle"
cat > "$w/fakebin/nvidia-smi" <<'EOF'
#!/bin/bash
[ "${1:-}" = -L ] && { echo "GPU 0: NVIDIA H200 (UUID: GPU-stub)"; exit 0; }
echo "NVIDIA H200, 143771 MiB, 580.00, 700.00 W, 1980 MHz"
EOF
# and a PyTorch with CUDA: its Llama step (peer_torch_llama.py) takes 250 ms; every other Python call is the real one's
real_py=$(command -v python3)
cat > "$w/fakebin/python3" <<EOF
#!/bin/bash
case "\$*" in
  *"import torch"*) exit 0;;
  *peer_torch_llama.py*)
    while [ \$# -gt 0 ]; do [ "\$1" = --json ] && j=\$2; shift; done
    echo '{"steps": [{"layers": 2, "step_ms": 250.0}]}' > "\$j"; echo "3. training steps (stub)"; exit 0;;
esac
exec "$real_py" "\$@"
EOF
chmod +x "$w/fakebin/nvidia-smi" "$w/fakebin/python3"

# 1. the whole script on the stub GPU
(cd "$w/tree" && PATH="$w/fakebin:$PATH" OUT="$w/out" bash bench/gpu_check.sh > "$w/log" 2>&1)
rc=$?
cat "$w/log"
[ $rc -eq 1 ] || fail "exit status $rc, not 1 (lab 03's grading failed)"
prev=0
for step in "== 1." "== 2." "== 3." "== 4." "== 5." "== 6." "== 7." "== 8." "== summary"; do
  at=$(grep -n -F -- "$step" "$w/log" | head -1 | cut -d: -f1)
  [ -n "$at" ] && [ "$at" -gt "$prev" ] || fail "step '$step' missing or out of order"
  prev=$at
done
t="$w/out/gpu_check_summary.tsv"
[ -f "$t" ] || fail "no $t"
want() { grep -q -F -- "$1" "$t" || fail "the table has no row with: $1"; }
want "$(printf 'kernels against the cpu\tall pass\tall pass\tok')"
want "$(printf 'GPT-2 124M bf16, MFU\t3.3 %% (134.0 ms a step)\t>= 35 %%\tMISSED')"
want "$(printf 'GPT-2 124M bf16, measured peak / modeled reserved\t1.02 (10.00 of 9.78 GiB)\twithin 5 %%\tok')"
want "GPT-2 124M bf16 + flash attention, MFU"
want "$(printf 'GPT-2 124M: modeled (calibrated) / measured step\t0.9 (121.0 / 134.0 ms)\twithin 10 %%\tok')"
want "$(printf 'Llama 3 8B, 2 blocks: modeled (calibrated) / measured step\t0.9 (')"
want "$(printf 'cuda against the cpu: configs/gpt-tiny.toml\t0 (largest relative difference)\twithin 1e-4\tok')"
want "$(printf 'zero3 over NCCL against Gloo (bf16 losses)\t0 (largest relative difference)\twithin 1e-2\tok')"
want "$(printf 'Llama 3 8B, 2 blocks: distlab / eager PyTorch\t0.54x (134.0 / 250.0 ms)\t<= 1.2x\tok')"
want "$(printf 'Llama 3 8B, 2 blocks: modeled eager (calibrated) / eager PyTorch\t0.48 (121.0 / 250.0 ms)\twithin 10 %%\tMISSED')"
grep -q "^train configs/llama3-8b.toml --set model.n_layer=2 .* --device meta .* --set log.kernels=eager --set log.profile=$w/out/calibrated.json" "$w/out/calls" ||
  fail "eager PyTorch's step was not modeled with log.kernels=eager from the calibrated profile"
want "$(printf 'lab 03 graded on cuda\t6/12, exit 1\tfull marks\tFAIL')"
want "$(printf 'lab 10 graded on cuda\t12/12 in')"
grep -q "^train configs/llama3-8b.toml --device cuda --set model.n_layer=2 --set train.micro_batch=2 --set model.attention=flash --set precision.mode=bf16" "$w/out/calls" ||
  fail "Llama 3 8B's 2 blocks were not trained as the target says (B 2, T 8192, flash, bf16)"
grep -q "^grade 10 --solution --device cuda" "$w/out/calls" || fail "lab 10 was not graded"
grep -q "^what" "$w/log" && grep -q "done in" "$w/log" || fail "the table or the closing line is not printed"
grep -q "the host waited for the GPU's results 4 times a step" "$w/log" || fail "a run's host waits per step are not printed"

# 2. a budget too small: the steps that would overrun are skipped and recorded, the script exits 0
rm -rf "$w/out"/*
(cd "$w/tree" && PATH="$w/fakebin:$PATH" OUT="$w/out" GPU_CHECK_BUDGET_S=20 bash bench/gpu_check.sh > "$w/log" 2>&1)
rc=$?
cat "$w/log"
[ $rc -eq 0 ] || fail "exit status $rc with a 20 s budget, not 0"
grep -q "skipped: .* s of the 20 s budget left" "$w/log" || fail "no step says it was skipped for the budget"
want "$(printf 'GPT-2 124M bf16, MFU\tnot measured\t\tskipped: out of time')"
want "$(printf 'lab 10 graded on cuda\tnot measured\t\tskipped: out of time')"

# 3. every training run fails: its targets are FAIL rows, not numbers left from an earlier run, and exit 1
(cd "$w/tree" && PATH="$w/fakebin:$PATH" OUT="$w/out" STUB_TRAIN_FAILS=1 bash bench/gpu_check.sh > "$w/log" 2>&1)
rc=$?
cat "$w/log"
[ $rc -eq 1 ] || fail "exit status $rc when every run fails, not 1"
want "$(printf 'GPT-2 124M bf16, MFU\tnot measured\t>= 35 %%\tFAIL')"
want "$(printf 'GPT-2 124M: modeled (calibrated) / measured step\tnot measured (? / ? ms)\twithin 10 %%\tFAIL')"
want "$(printf 'cuda against the cpu: configs/gpt-tiny.toml\tnot measured (largest relative difference)\twithin 1e-4\tFAIL')"

# 4. no GPU: every target not measured, exit 0
if command -v nvidia-smi >/dev/null; then echo "ok (this machine has nvidia-smi: the no-GPU case is not checked here)"; exit 0; fi
rm -rf "$w/out"/*
(cd "$w/tree" && OUT="$w/out" bash bench/gpu_check.sh > "$w/log" 2>&1)
rc=$?
cat "$w/log"
[ $rc -eq 0 ] || fail "exit status $rc without a GPU, not 0"
want "$(printf 'GPT-2 124M bf16, MFU\tnot measured\t>= 35 %%\tskipped: no GPU')"
want "$(printf 'Llama 3 8B, 2 blocks: distlab / eager PyTorch\tnot measured\t<= 1.2x\tskipped: no GPU')"
ls -d /tmp/distlab-gpu-* 2>/dev/null | grep -q . && [ -n "$(find /tmp -maxdepth 1 -name 'distlab-gpu-*' -newer "$w/tree/bench/gpu_check.sh")" ] &&
  fail "gpu_check.sh left its unpacked bundle in /tmp"
echo "ok"
