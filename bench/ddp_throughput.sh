#!/usr/bin/env bash
# 2-rank DDP training throughput of the reference CNN at batch 64 per rank, against one rank at batch 64
# (the same per-rank work; one compute thread per rank), and against Debian's PyTorch 1.13 DDP on gloo
# (bench/peer_torch_ddp.py) run as its users run it: torchrun, one process per rank, OMP_NUM_THREADS=1 (what
# torchrun sets) and the BLAS's threads pinned to 1 too, plainly and with glibc keeping freed memory (see
# keep_memory below). distlab's 2 ranks and PyTorch's alternate
# (A B A B, ROUNDS times) so that a change in the machine's load hits both; the table gives each side's
# range and the ratio's. Prints the environment, writes bench/results/ddp_throughput.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/distlab
steps=${STEPS:-60}
rounds=${ROUNDS:-3}
mkdir -p bench/results
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
# both sides on the same OpenBLAS kernels: distlab runs the CPU's best (core/ops/cpu/blas_core.h); Debian's
# PyTorch links the same OpenBLAS, which on an unknown CPU model picks an older core by itself
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$($bin env --blas-core)}
run() {  # ranks extra-args... -> images/s from the summary
  local n=$1; shift
  $bin run -n "$n" --master-port 0 --threads-per-rank 1 train configs/cifar-cnn.toml --set parallel.strategy=ddp \
    --set train.global_batch=$((64 * n)) --set train.steps="$steps" --set train.log_every=1000 \
    --metrics bench/results/ddp_n$n.jsonl "$@" > /dev/null
  tail -1 bench/results/ddp_n$n.jsonl | python3 -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["samples_per_s"])'
}
# --redirects 1 --tee 1: torchrun of Debian's 1.13 under Python 3.11 fails on its default (--redirects 0: an
# enum.Flag of value 0 is no longer iterated, AttributeError in to_map); teeing stdout works and prefixes
# each line with the rank ("[default0]:")
# PyTorch's CPU allocator hands a step's large tensors back to glibc, which unmaps them: every step faults
# its memory in again, and on a VM a page fault is expensive (1-thread CNN steps of 200-250 ms here, 61-75 ms
# with glibc told to keep freed memory). The kept-memory run is the engine-to-engine comparison; the plain
# run is what a user gets by default. Both are reported.
keep_memory=(MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736)
torch_run() {
  env "$@" /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 --tee 1 bench/peer_torch_ddp.py "$steps" \
    2> bench/results/torch_ddp.err | sed -n 's/^\[default0\]://p' | head -1
}
echo "environment: $(getconf _NPROCESSORS_ONLN) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(grep -o -m1 -w 'avx512f' /proc/cpuinfo || echo 'no avx512f')"
echo "  OMP_NUM_THREADS=$OMP_NUM_THREADS OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS MKL_NUM_THREADS=$MKL_NUM_THREADS OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE; distlab --threads-per-rank 1;" \
     "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') under torchrun, gloo; $steps steps, $rounds rounds"
one=$(run 1)
twos=() torches=() kept=()
for ((r = 0; r < rounds; r++)); do
  twos+=("$(run 2)")
  torches+=("$(torch_run || echo 0)")
  kept+=("$(torch_run "${keep_memory[@]}" || echo 0)")
done
grep -m1 "threads per rank" bench/results/torch_ddp.err | sed 's/^.*threads per rank/  PyTorch: threads per rank/' || true
two_naive=$(run 2 --set parallel.ddp_mode=naive)
python3 - "$one" "$two_naive" "${twos[*]}" "${torches[*]}" "${kept[*]}" <<'PY'
import json, sys
one, naive = float(sys.argv[1]), float(sys.argv[2])
twos = [float(v) for v in sys.argv[3].split()]
torches = [float(v) for v in sys.argv[4].split()]
kept = [float(v) for v in sys.argv[5].split()]
ratios = [a / b for a, b in zip(twos, torches) if b > 0]
ratios_kept = [a / b for a, b in zip(twos, kept) if b > 0]
rng = lambda v: "%.0f-%.0f" % (min(v), max(v)) if v else "-"
print("%-40s %14s" % ("run", "images/s"))
print("%-40s %14.0f" % ("distlab 1 rank, batch 64", one))
print("%-40s %14s" % ("distlab 2 ranks DDP bucketed, 64 each", rng(twos)))
print("%-40s %14.0f" % ("distlab 2 ranks DDP naive, 64 each", naive))
print("%-40s %14s" % ("PyTorch DDP gloo (torchrun), 64 each", rng(torches)))
print("%-40s %14s" % ("  the same, glibc keeping freed memory", rng(kept)))
show = lambda v: ", ".join("%.2fx" % r for r in v) if v else "PyTorch did not run"
print("speed-up 2 ranks / 1 rank: %.2fx (median); distlab / PyTorch, round by round: %s; against the kept-memory runs: %s" % (
    sorted(twos)[len(twos) // 2] / one, show(ratios), show(ratios_kept)))
json.dump(dict(one_rank=one, two_ranks_bucketed=twos, two_ranks_naive=naive, torch_ddp=torches, torch_ddp_kept_memory=kept,
               ratio_by_round=ratios, ratio_kept_memory_by_round=ratios_kept,
               speedup=sorted(twos)[len(twos) // 2] / one), open("bench/results/ddp_throughput.json", "w"), indent=2)
PY
