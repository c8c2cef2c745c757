#!/usr/bin/env python3
"""Mixed precision against fp32: the same model, data and seed trained in fp32, bf16 and fp16 (dynamic
loss scale), step by step. Prints, per model, the loss gap to fp32 (largest over all steps, and the mean
over the last 20), the peak activation bytes, the bytes per parameter of params/grads/optimizer state,
skipped steps and the wall-clock cost of the emulation; writes bench/results/precision_gap.json.

    bench/precision_gap.py [--steps 200] [--distlab build/bin/distlab]
"""
import argparse, json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "cifar-cnn": ("configs/cifar-cnn.toml", ["data.name=synthetic-images", "data.synthetic_train=4096", "train.global_batch=32"]),
    "gpt-tiny": ("configs/gpt-tiny.toml", []),
}

def run(distlab, cfg, sets, steps, mode):
    with tempfile.TemporaryDirectory() as d:
        m = os.path.join(d, "m.jsonl")
        args = [distlab, "train", os.path.join(ROOT, cfg), "--set", f"train.steps={steps}", "--set", "train.log_every=100000",
                "--set", f"precision.mode={mode}", "--set", f"log.metrics={m}"]
        for s in sets:
            args += ["--set", s]
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
        recs = [json.loads(l) for l in open(m)]
    steps_ = [r for r in recs if r["kind"] == "step"]
    summary = [r for r in recs if r["kind"] == "summary"][0]
    return {"loss": [r["loss"] for r in steps_], "scale": [r["loss_scale"] for r in steps_], "summary": summary}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--distlab", default=os.path.join(ROOT, "build/bin/distlab"))
    a = ap.parse_args()
    out = {}
    print(f"{'model':<10} {'mode':<5} {'max |dloss|':>11} {'first 10':>9} {'20-step means':>13} {'last-20 mean':>12} {'final loss':>10} {'activations':>12} "
          f"{'p+g+opt B/param':>15} {'skipped':>7} {'wall s':>7} {'x fp32':>6}")
    for name, (cfg, sets) in MODELS.items():
        res = {mode: run(a.distlab, cfg, sets, a.steps, mode) for mode in ("fp32", "bf16", "fp16")}
        ref = res["fp32"]["loss"]
        out[name] = {}
        for mode, r in res.items():
            gaps = [abs(x - y) for x, y in zip(r["loss"], ref)]
            s = r["summary"]
            n = s["params"]
            pm = s["peak_memory"]
            W = 20  # per-step losses of a noisy small-batch run drift apart; 20-step means are the curve
            wins = [abs(sum(r["loss"][i:i + W]) - sum(ref[i:i + W])) / W for i in range(0, len(ref) - W + 1, W)]
            row = {"max_gap": max(gaps), "first10_max_gap": max(gaps[:10]), "max_window_gap": max(wins), "last20_mean_gap": sum(gaps[-20:]) / len(gaps[-20:]), "final_loss": r["loss"][-1],
                   "activations_bytes": pm["activations"], "params_per_param": pm["params"] / n, "grads_per_param": pm["grads"] / n,
                   "optim_state_per_param": pm["optim_state"] / n, "skipped_steps": s["skipped_steps"], "wall_s": s["wall_s"],
                   "final_loss_scale": s["final_loss_scale"], "samples_per_s": s["samples_per_s"]}
            out[name][mode] = row
            print(f"{name:<10} {mode:<5} {row['max_gap']:>11.4f} {row['first10_max_gap']:>9.5f} {row['max_window_gap']:>13.4f} {row['last20_mean_gap']:>12.4f} {row['final_loss']:>10.4f} "
                  f"{row['activations_bytes'] / 2**20:>9.2f} MiB {row['params_per_param']:>4.0f}+{row['grads_per_param']:.0f}+{row['optim_state_per_param']:.0f}"
                  f"{'':>6} {row['skipped_steps']:>7} {row['wall_s']:>7.1f} {row['wall_s'] / out[name]['fp32']['wall_s']:>6.2f}")
    os.makedirs(os.path.join(ROOT, "bench/results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench/results/precision_gap.json"), "w") as f:
        json.dump({"steps": a.steps, "models": out}, f, indent=1)

if __name__ == "__main__":
    main()
