#!/usr/bin/env bash
# The GPU checks in one go, for a machine with an NVIDIA GPU (one H200 takes a few minutes):
#   1. a CUDA build (build-cuda/, DISTLAB_CUDA=ON, for this machine's GPU unless CUDA_ARCHS says otherwise);
#   2. the CUDA kernels against the cpu kernels (distlab_cuda_tests);
#   3. GEMM TFLOP/s against raw cuBLAS at 4096^3 and 8192^3 (bench_gemm_cuda: bf16, TF32, f32, naive).
# Training on the GPU (GPT-124M tokens/s and MFU, the CNN's img/s) and `distlab bench comm` over NCCL are
# listed at the end with what they wait for. On a machine without the toolkit or without a GPU every step
# says why it is skipped, and the script still exits 0: it is safe to run anywhere.
#   bash bench/gpu_check.sh            CUDA_ARCHS=90 bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
status=0
say() { printf '\n== %s\n' "$*"; }

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then
  say "skipped: no CUDA toolkit (nvcc not found; set NVCC=/path/to/nvcc)"
  exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  archs=${CUDA_ARCHS:-native}
else
  echo "no GPU answers nvidia-smi: the CUDA code is compiled and linked, the GPU checks skip"
  archs=${CUDA_ARCHS:-"75;80;90"}
fi

say "1. CUDA build (sm ${archs}) in build-cuda/"
bash scripts/setup.sh >/dev/null || { echo "scripts/setup.sh failed"; exit 1; }
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DDISTLAB_CUDA=ON -DDISTLAB_TESTS=ON \
      -DCMAKE_CUDA_COMPILER="$NVCC" "-DCMAKE_CUDA_ARCHITECTURES=${archs}" >build-cuda.log 2>&1 \
  || { tail -30 build-cuda.log; echo "configure failed (build-cuda.log)"; exit 1; }
grep "distlab features" build-cuda.log
cmake --build build-cuda --target distlab distlab_cuda_tests bench_gemm_cuda >>build-cuda.log 2>&1 \
  || { tail -40 build-cuda.log; echo "build failed (build-cuda.log)"; exit 1; }
echo "built in $((SECONDS - t0)) s"

say "2. the CUDA kernels against the cpu kernels"
build-cuda/tests/distlab_cuda_tests --durations yes
rc=$?
if [ $rc -eq 77 ]; then echo "(skipped)"; elif [ $rc -ne 0 ]; then status=1; fi

say "3. GEMM: distlab against raw cuBLAS"
build-cuda/bin/bench_gemm_cuda || status=1

say "4. not measured by this version"
echo "GPT-124M bf16 tokens/s and MFU, the CNN's img/s: need training on --device cuda (the trainer runs on cpu and meta)"
echo "distlab bench comm over NCCL: needs the NCCL process group"
echo "$(build-cuda/bin/distlab train configs/fashion-mnist-mlp.toml --device cuda 2>&1 | head -1)"

say "done in $((SECONDS - t0)) s, status ${status}"
exit $status
