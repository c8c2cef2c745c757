#!/usr/bin/env bash
# Grades a lab's reference solution N times in a row, optionally beside a load (two copies of a slice of
# the test suite running in a loop), and counts the gradings that lost points: the grader's flake rate.
# A grade must not depend on the machine's load: every run should give full marks.
#
#   bash bench/grade_repeat.sh 01 100          # 100 gradings of lab 01, idle machine
#   LOAD=1 bash bench/grade_repeat.sh 01 100   # the same beside two looping test jobs
#
# Prints one line per grading and a summary; writes bench/results/grade_repeat_<lab>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
lab=${1:?usage: grade_repeat.sh LAB [N]}
n=${2:-20}
bin=build/bin/distlab
mkdir -p bench/results
work=$(mktemp -d)
load_pids=()
cleanup() {
  for p in "${load_pids[@]}"; do kill -- -"$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
if [[ "${LOAD:-0}" == 1 ]]; then
  for k in 1 2; do  # the multi-rank unit tests and the trainer's end-to-end runs: processes, threads, Gloo
    setsid bash -c "while true; do build/tests/distlab_tests '[dist],[ddp],[train]' > /dev/null 2>&1 || true; done" &
    load_pids+=($!)
  done
fi
full=0
lost=0
: > "$work/runs.jsonl"
for i in $(seq 1 "$n"); do
  start=$(date +%s.%N)
  $bin grade "$lab" --solution --json "$work/g.json" > "$work/out.txt" 2>&1 || true
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  python3 - "$work/g.json" "$i" "$secs" >> "$work/runs.jsonl" <<'PY'
import json, sys
try:
    g = json.load(open(sys.argv[1]))
    lost = [c["name"] + ":" + c["status"] for c in g["checks"] if c["status"] != "pass"]
    print(json.dumps(dict(run=int(sys.argv[2]), points=g["points"], max=g["max_points"], seconds=float(sys.argv[3]), lost=lost)))
except Exception as e:  # no report at all is a lost grading too
    print(json.dumps(dict(run=int(sys.argv[2]), points=0, max=-1, seconds=float(sys.argv[3]), lost=["no report: %s" % e])))
PY
  line=$(tail -1 "$work/runs.jsonl")
  if python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(0 if r["points"] == r["max"] else 1)' "$line"; then
    full=$((full + 1))
  else
    lost=$((lost + 1))
    cp "$work/out.txt" "bench/results/grade_repeat_${lab}_run${i}.txt"
  fi
  echo "$line"
done
python3 - "$work/runs.jsonl" "$lab" "${LOAD:-0}" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
secs = sorted(r["seconds"] for r in runs)
full = sum(r["points"] == r["max"] for r in runs)
print("# lab %s: %d gradings%s: %d full marks, %d lost points; seconds per grading: median %.1f, max %.1f"
      % (sys.argv[2], len(runs), " beside two looping test jobs" if sys.argv[3] == "1" else "", full, len(runs) - full,
         secs[len(secs) // 2], secs[-1]))
json.dump(dict(lab=sys.argv[2], load=sys.argv[3] == "1", runs=runs, full_marks=full, lost=len(runs) - full),
          open("bench/results/grade_repeat_%s.json" % sys.argv[2], "w"), indent=1)
PY
[[ $lost == 0 ]]
