#!/usr/bin/env bash
# The course's signature run, for real on this machine: FSDP training steps of the ~1B GPT
# (configs/gpt-1b.toml, fp32 AdamW: 16 bytes per parameter = 16 GB of model state for one replica) on 2 CPU
# ranks. Each rank holds 1/2 of the parameters, gradients and optimizer state (8 GB) plus the units it
# gathers; two DDP replicas (2 x 16 GB) cannot fit in this machine's memory, and at the per-rank
# --device-mem FSDP fits in, DDP is refused with the OOM ladder.
# Prints a table (peak RSS per rank, device peak, s/step, tokens/s) and writes bench/results/fsdp_1b.json.
# Env: STEPS (3), SEQ (64), MEM (the per-rank --device-mem, 11GiB), STRATEGY (fsdp), PLUGIN (lab 05's hooks, e.g.
# build/labs/05-fsdp-1b/student.so: the FSDP run uses them instead of the engine's).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/distlab
steps=${STEPS:-3}
seq=${SEQ:-64}
mem=${MEM:-11GiB}
strategy=${STRATEGY:-fsdp}
mkdir -p bench/results
common=(--master-port 0 --threads-per-rank 1 train configs/gpt-1b.toml --set data.seq_len="$seq" --set train.micro_batch=1
        --set train.steps="$steps" --set train.log_every=1 --set train.eval_every=0 --set train.eval_batches=1 --device-mem "$mem")
plugin=()
[ -n "${PLUGIN:-}" ] && plugin=(--set lab.plugin="$(realpath "$PLUGIN")")
echo "== $strategy, 2 ranks, --device-mem $mem per rank"
/usr/bin/time -f "%M" -o bench/results/fsdp_1b.rss $bin run -n 2 "${common[@]}" --set parallel.strategy="$strategy" "${plugin[@]}" \
  --metrics bench/results/fsdp_1b.jsonl | tee bench/results/fsdp_1b.log
echo "== ddp, 2 ranks, --device-mem $mem per rank (expected: refused with the OOM ladder)"
set +e
$bin run -n 2 "${common[@]}" --set parallel.strategy=ddp --set train.steps=1 > bench/results/fsdp_1b_ddp.log 2>&1
ddp_code=$?
set -e
grep -A12 "out of memory" bench/results/fsdp_1b_ddp.log | head -16 || true
python3 - "$ddp_code" "$steps" "$seq" "$mem" "$strategy" <<'PY'
import json, sys
ddp_code, steps, seq, mem, strategy = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
recs = [json.loads(l) for l in open("bench/results/fsdp_1b.jsonl")]
st = [r for r in recs if r["kind"] == "step"]
s = [r for r in recs if r["kind"] == "summary"][0]
rss_kb = int(open("bench/results/fsdp_1b.rss").read().split()[-1])  # the launcher's largest child: one rank
later = st[1:] or st
sec = sum(r["wall_s"] for r in later) / len(later)
tokens = 2 * seq  # micro-batch 1 x 2 ranks
pm = s["peak_memory"]
state = pm["params"] + pm["grads"] + pm["optim_state"] + pm.get("host", 0)
print("%-40s %14s" % ("1B GPT, %s, 2 ranks" % strategy, "measured"))
rows = [("parameters", "%d" % s["params"]),
        ("peak RSS of a rank", "%.2f GiB" % (rss_kb / 2**20)),
        ("device peak per rank (accounted)", "%.2f GiB" % (s["peak_memory_total"] / 2**30)),
        ("model state per rank (p + g + os)", "%.2f GiB = %.2f bytes/param" % (state / 2**30, state / s["params"])),
        ("seconds per step (after the first)", "%.1f" % sec),
        ("tokens per second", "%.1f" % (tokens / sec)),
        ("final loss", "%.4f" % s["final_loss"]),
        ("ddp at the same --device-mem", "refused (exit %d)" % ddp_code if ddp_code else "ran (unexpected)")]
for k, v in rows: print("%-40s %14s" % (k, v))
json.dump(dict(strategy=strategy, params=s["params"], peak_rss_gib=rss_kb / 2**20, device_peak_gib=s["peak_memory_total"] / 2**30,
               model_state_bytes_per_param=state / s["params"], seconds_per_step=sec, tokens_per_s=tokens / sec,
               device_mem=mem, ddp_refused=ddp_code != 0, peak_memory=pm), open("bench/results/fsdp_1b.json", "w"), indent=2)
PY
