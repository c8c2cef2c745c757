#!/usr/bin/python3
"""The same measurement as bench_cnn on Debian's PyTorch (run with /usr/bin/python3): the reference CNN,
batch 128, SGD momentum, images/s with 1 and 2 threads. Writes bench/results/peer_torch_cnn.json."""
import json, os, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

def model(bn):
    layers = [nn.Conv2d(3, 32, 3, padding=1)] + ([nn.BatchNorm2d(32)] if bn else []) + [nn.ReLU(), nn.MaxPool2d(2),
              nn.Conv2d(32, 64, 3, padding=1)] + ([nn.BatchNorm2d(64)] if bn else []) + [nn.ReLU(), nn.MaxPool2d(2),
              nn.Flatten(), nn.Linear(4096, 10)]
    return nn.Sequential(*layers)

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
# Debian's torch links the system OpenBLAS: the same kernels as distlab's run only with the same core
# (OPENBLAS_CORETYPE=$(build/bin/distlab env --blas-core); core/ops/cpu/blas_core.h)
print("OPENBLAS_CORETYPE=%s" % os.environ.get("OPENBLAS_CORETYPE", "unset (OpenBLAS's own pick)"))
results = []
print(f"{'threads':>8} {'batchnorm':>10} {'ms/step':>12} {'images/s':>12}")
for bn in (False, True):
    for threads in (1, 2):
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        m = model(bn)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(128, 3, 32, 32); y = torch.randint(0, 10, (128,))
        total = 0.0
        for s in range(3 + steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(m(x), y).backward()
            opt.step()
            if s >= 3: total += time.perf_counter() - t0
        ms, ips = 1e3 * total / steps, 128 * steps / total
        print(f"{threads:>8} {'yes' if bn else 'no':>10} {ms:>12.2f} {ips:>12.0f}")
        results.append(dict(threads=threads, batchnorm=bn, ms_per_step=ms, images_per_s=ips, batch=128))
os.makedirs("bench/results", exist_ok=True)
json.dump(results, open("bench/results/peer_torch_cnn.json", "w"), indent=2)
