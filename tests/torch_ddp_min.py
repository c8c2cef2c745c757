# A PyTorch program as torchrun runs it, unchanged: init_process_group("gloo") from the environment
# (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; rank 0 binds its own TCPStore on MASTER_PORT), one
# all_reduce, one broadcast, a barrier. `distlab run -n 2 -- /usr/bin/python3 tests/torch_ddp_min.py`
# must run it as torchrun does (tests/test_launcher.cpp).
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
x = torch.full((1000,), float(rank + 1))
dist.all_reduce(x)
y = torch.arange(4, dtype=torch.float32) * (rank + 1)
dist.broadcast(y, src=0)
dist.barrier()
print("torch rank %d of %d: all_reduce %.1f, broadcast %s, local rank %s" %
      (rank, world, x[0].item(), y.tolist(), os.environ["LOCAL_RANK"]), flush=True)
dist.destroy_process_group()
