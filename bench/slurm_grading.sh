#!/usr/bin/env bash
# A class graded three ways on this machine, timed, interleaved: `distlab grade --submissions` one student
# after another, the same with --jobs 2, and as a Slurm array job (`--slurm --wait`, two tasks at once) on
# a one-node cluster started for the run (tests/slurm/cluster.sh). The class: N copies of the lab's
# solution. Every way must give the same gradebook; the table shows what the array job's scheduling costs
# where there is one node (its gain is the nodes a real cluster adds: about tasks-at-once-fold).
#
#   bash bench/slurm_grading.sh 01 8      # lab 01, 8 students, 2 rounds
#   ROUNDS=3 bash bench/slurm_grading.sh 09 16
#
# Prints the environment, one line per run and a summary; writes bench/results/slurm_grading_<lab>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
lab=${1:?usage: slurm_grading.sh LAB [N]}
n=${2:-8}
rounds=${ROUNDS:-2}
bin=$PWD/build/bin/distlab
mkdir -p bench/results
work=$(mktemp -d /tmp/distlab-bench-XXXXXX)
cleanup() {
  bash tests/slurm/cluster.sh stop "$work/cluster" || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/cluster" "$work/subs"
sol=$(ls -d solutions/"$lab"-*/ | head -n 1)
for i in $(seq -w 1 "$n"); do cp -r "$sol" "$work/subs/student$i"; done
bash tests/slurm/cluster.sh start "$work/cluster" $$ > "$work/cluster.out"
export SLURM_CONF=$work/cluster/slurm.conf
echo "environment: $(nproc --all) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(sinfo -V), OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"
echo "lab $lab, $n students (copies of $sol), seed 7, every way graded $rounds times, interleaved"
common=(grade "$lab" --submissions "$work/subs" --seed 7 --hints never)
: > "$work/runs.jsonl"
for r in $(seq 1 "$rounds"); do
  for way in sequential jobs2 slurm; do
    rm -rf "$work/out"
    mkdir -p "$work/out"
    start=$(date +%s.%N)
    case $way in
      sequential) "$bin" "${common[@]}" --csv "$work/out/grades.csv" > "$work/out/log" 2>&1 ;;
      jobs2) "$bin" "${common[@]}" --jobs 2 --csv "$work/out/grades.csv" > "$work/out/log" 2>&1 ;;
      slurm) "$bin" "${common[@]}" --slurm --results "$work/out/r" --max-running 2 --cpus-per-task 1 --wait > "$work/out/log" 2>&1
             cp "$work/out/r/grades.csv" "$work/out/grades.csv" ;;
    esac
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    if [ -f "$work/ref.csv" ]; then same=$(cmp -s "$work/ref.csv" "$work/out/grades.csv" && echo yes || echo NO); else cp "$work/out/grades.csv" "$work/ref.csv"; same=yes; fi
    printf 'round %d %-10s %7.1f s   same gradebook: %s\n' "$r" "$way" "$secs" "$same"
    echo "{\"round\": $r, \"way\": \"$way\", \"seconds\": $secs, \"same_gradebook\": \"$same\"}" >> "$work/runs.jsonl"
  done
done
python3 - "$work/runs.jsonl" "$lab" "$n" > "bench/results/slurm_grading_$lab.json" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
ways = {}
for r in runs: ways.setdefault(r["way"], []).append(r["seconds"])
for w, s in ways.items(): print(f"{w:<10} min {min(s):6.1f} s  max {max(s):6.1f} s", file=sys.stderr)
print(json.dumps({"lab": sys.argv[2], "students": int(sys.argv[3]), "runs": runs}, indent=1))
PY
echo "wrote bench/results/slurm_grading_$lab.json"
