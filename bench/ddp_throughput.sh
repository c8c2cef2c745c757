#!/usr/bin/env bash
# 2-rank DDP training throughput of the reference CNN at batch 64 per rank, against one rank at batch 64
# (the same per-rank work; one compute thread per rank), and against Debian's PyTorch 1.13 DDP on gloo
# (bench/peer_torch_ddp.py). Prints a table and writes bench/results/ddp_throughput.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/distlab
steps=${STEPS:-60}
mkdir -p bench/results
run() {  # ranks extra-args... -> images/s from the summary
  local n=$1; shift
  $bin run -n "$n" --master-port 0 --threads-per-rank 1 train configs/cifar-cnn.toml --set parallel.strategy=ddp \
    --set train.global_batch=$((64 * n)) --set train.steps="$steps" --set train.log_every=1000 \
    --metrics bench/results/ddp_n$n.jsonl "$@" > /dev/null
  tail -1 bench/results/ddp_n$n.jsonl | python3 -c 'import json,sys; print("%.0f" % json.load(sys.stdin)["samples_per_s"])'
}
one=$(run 1)
two=$(run 2)
two_naive=$(run 2 --set parallel.ddp_mode=naive)
torch=$(/usr/bin/python3 bench/peer_torch_ddp.py "$steps" 2>/dev/null || echo 0)
printf '%-34s %10s\n' "run" "images/s"
printf '%-34s %10s\n' "distlab 1 rank, batch 64" "$one"
printf '%-34s %10s\n' "distlab 2 ranks DDP bucketed, 64 each" "$two"
printf '%-34s %10s\n' "distlab 2 ranks DDP naive, 64 each" "$two_naive"
printf '%-34s %10s\n' "PyTorch 1.13 DDP gloo, 64 each" "$torch"
python3 - "$one" "$two" "$two_naive" "$torch" <<'PY'
import json, sys
one, two, naive, torch = map(float, sys.argv[1:])
print("speed-up 2 ranks / 1 rank: %.2fx; vs PyTorch DDP: %.2fx" % (two / one, two / torch if torch else float("nan")))
json.dump(dict(one_rank=one, two_ranks_bucketed=two, two_ranks_naive=naive, torch_ddp=torch, speedup=two / one),
          open("bench/results/ddp_throughput.json", "w"), indent=2)
PY
