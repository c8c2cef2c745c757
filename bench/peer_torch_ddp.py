#!/usr/bin/python3
"""PyTorch 1.13 DDP on gloo, 2 processes, the reference CNN at batch 64 per rank, 1 thread each: images/s."""
import os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp, torch.nn as nn, torch.nn.functional as F

def worker(rank, steps, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                      nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4096, 10))
    ddp = nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 3, 32, 32); y = torch.randint(0, 10, (64,))
    for s in range(steps + 3):
        if s == 3: dist.barrier(); t0 = time.perf_counter()
        opt.zero_grad(); F.cross_entropy(ddp(x), y).backward(); opt.step()
    dist.barrier()
    if rank == 0: out.put(128 * steps / (time.perf_counter() - t0))
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(int(sys.argv[1]) if len(sys.argv) > 1 else 60, port, q), nprocs=2)
    print("%.0f" % q.get())
