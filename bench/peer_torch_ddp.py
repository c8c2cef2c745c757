#!/usr/bin/python3
"""PyTorch DDP on gloo, the reference CNN at batch 64 per rank: images/s of the whole job on rank 0's stdout.

Run it as PyTorch users do, one process per rank under torchrun, which sets OMP_NUM_THREADS=1 for each
(bench/ddp_throughput.sh does, and also pins OpenBLAS's and MKL's threads to 1, since Debian's torch takes
its BLAS from the system's alternatives):

  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \\
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 --redirects 1 --tee 1 bench/peer_torch_ddp.py STEPS
"""
import os, sys, time
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    dist.init_process_group("gloo")  # rank, world size and the rendezvous from torchrun's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                      nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4096, 10))
    ddp = nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 32, 32); y = torch.randint(0, 10, (64,))
    for s in range(steps + 3):
        if s == 3:
            dist.barrier(); t0 = time.perf_counter()
        opt.zero_grad(); F.cross_entropy(ddp(x), y).backward(); opt.step()
    dist.barrier()
    if rank == 0:
        print("%.0f" % (64 * world * steps / (time.perf_counter() - t0)))
        print("threads per rank: torch %d, OMP_NUM_THREADS=%s, OPENBLAS_NUM_THREADS=%s" % (
            torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS", "unset"), os.environ.get("OPENBLAS_NUM_THREADS", "unset")),
            file=sys.stderr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
