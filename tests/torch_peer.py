#!/usr/bin/python3
"""PyTorch's side of the parity tests (Debian's python3-torch). Reads and writes safetensors with its own
small parser of the format, so no extra package is needed.

  torch_peer.py logits IN.safetensors OUT.safetensors LOGITS.txt [bn]
      load our weights into the reference CNN, print its logits on a fixed input, save 2x the weights
  torch_peer.py train IN.safetensors OUT.safetensors LOSSES.txt bn|plain STEPS LR
      SGD-momentum steps of the reference CNN in train mode on a fixed batch; save weights, print losses
"""
import json, struct, sys
import torch, torch.nn as nn, torch.nn.functional as F

def load(p):
    raw = open(p, 'rb').read(); n = struct.unpack('<Q', raw[:8])[0]; h = json.loads(raw[8:8 + n]); out = {}
    dt = {'F32': torch.float32, 'BF16': torch.bfloat16, 'F16': torch.float16, 'I64': torch.int64}
    for k, v in h.items():
        if k == '__metadata__': continue
        b, e = v['data_offsets']
        out[k] = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + e]), dtype=dt[v['dtype']]).reshape(v['shape'])
    return out

def save(sd, p):
    names = {torch.float32: 'F32', torch.int64: 'I64'}; h = {}; off = 0; blobs = []
    for k in sorted(sd):
        t = sd[k].contiguous(); b = t.numpy().tobytes()
        h[k] = {'dtype': names[t.dtype], 'shape': list(t.shape), 'data_offsets': [off, off + len(b)]}
        off += len(b); blobs.append(b)
    s = json.dumps(h).encode(); s += b' ' * ((8 - len(s) % 8) % 8)
    open(p, 'wb').write(struct.pack('<Q', len(s)) + s + b''.join(blobs))

def cnn(bn):
    m = nn.Sequential()
    m.add_module('conv1', nn.Conv2d(3, 32, 3, padding=1))
    if bn: m.add_module('bn1', nn.BatchNorm2d(32))
    m.add_module('r1', nn.ReLU()); m.add_module('p1', nn.MaxPool2d(2))
    m.add_module('conv2', nn.Conv2d(32, 64, 3, padding=1))
    if bn: m.add_module('bn2', nn.BatchNorm2d(64))
    m.add_module('r2', nn.ReLU()); m.add_module('p2', nn.MaxPool2d(2))
    m.add_module('flat', nn.Flatten()); m.add_module('fc', nn.Linear(4096, 10))
    return m

def fixed_input(n):  # the same formula as the C++ side
    return torch.arange(n * 3 * 32 * 32, dtype=torch.float32).reshape(n, 3, 32, 32) / 3000.0 - 1.0

mode, src, dst, txt = sys.argv[1:5]
torch.set_num_threads(1)
if mode == 'logits':
    m = cnn(len(sys.argv) > 5 and sys.argv[5] == 'bn')
    m.load_state_dict({k: (v if v.dtype == torch.int64 else v.float()) for k, v in load(src).items()}, strict=True)
    m.eval()
    print(' '.join('%.6f' % v for v in m(fixed_input(2)).flatten().tolist()), file=open(txt, 'w'))
    with torch.no_grad():
        for p in m.parameters(): p.mul_(2.0)
    save(m.state_dict(), dst)
elif mode == 'train':
    bn, steps, lr = sys.argv[5] == 'bn', int(sys.argv[6]), float(sys.argv[7])
    m = cnn(bn)
    m.load_state_dict({k: (v if v.dtype == torch.int64 else v.float()) for k, v in load(src).items()}, strict=True)
    m.train()
    x = torch.sin(fixed_input(8) * 7.0); y = torch.arange(8) % 10
    opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad(); loss = F.cross_entropy(m(x), y); loss.backward(); opt.step(); losses.append(loss.item())
    print(' '.join('%.8f' % v for v in losses), file=open(txt, 'w'))
    save(m.state_dict(), dst)
