#!/usr/bin/python3
"""PyTorch's side of the parity tests (Debian's python3-torch). Reads and writes safetensors with its own
small parser of the format, so no extra package is needed.

  torch_peer.py logits IN.safetensors OUT.safetensors LOGITS.txt [bn]
      load our weights into the reference CNN, print its logits on a fixed input, save 2x the weights
  torch_peer.py train IN.safetensors OUT.safetensors LOSSES.txt bn|plain STEPS LR
      SGD-momentum steps of the reference CNN in train mode on a fixed batch; save weights, print losses
  torch_peer.py gpt IN.safetensors OUT.safetensors LOGITS.txt N_LAYER N_HEAD N_EMBD VOCAB BLOCK
      nanoGPT's GPT (lm_head tied to wte) loads our file with strict=True, prints its logits on tokens
      0..BLOCK-1 (mod VOCAB), and saves its state_dict (both keys of the tied pair, as PyTorch holds them)
  torch_peer.py llama IN.safetensors GRADS.safetensors LOGITS.txt N_LAYER N_HEAD N_KV_HEAD N_EMBD INTER VOCAB T THETA EPS
      Hugging Face's LlamaForCausalLM, written out here as modeling_llama.py computes it (RMSNorm in f32,
      rotate_half RoPE, repeat_kv, SwiGLU, untied lm_head), loads our file strictly; prints its logits on
      tokens 0..T-1 (mod VOCAB) and saves every parameter's gradient of the mean cross-entropy against the
      next token (targets t+1 mod VOCAB)
  torch_peer.py lora IN.safetensors OUT.safetensors LOSSES.txt N_LAYER N_HEAD N_KV_HEAD N_EMBD INTER VOCAB B T THETA EPS R ALPHA TARGETS STEPS LR [rslora]
      PEFT's LoRA on that LlamaForCausalLM, written out here as peft/tuners/lora/layer.py computes it
      (result = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling, every base weight frozen): loads our
      base and adapters (strictly), trains STEPS AdamW steps on the batches of lora_batch(), prints the
      losses and saves every parameter
  torch_peer.py peft BASE.safetensors ADAPTER_DIR LOGITS.txt N_LAYER N_HEAD N_KV_HEAD N_EMBD INTER VOCAB T THETA EPS OUT_DIR
      PeftModel.from_pretrained's reading of an adapter folder, written out: the base loaded strictly (its
      adapters left out), adapter_config.json's r, lora_alpha, target_modules and use_rslora applied,
      adapter_model.safetensors' base_model.model.* tensors loaded strictly; prints the logits on tokens
      0..T-1 (mod VOCAB), and writes OUT_DIR as save_pretrained would, every lora_B doubled
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

class CausalSelfAttention(nn.Module):  # nanoGPT's, without the mask buffer (computed here)
    def __init__(self, C, H):
        super().__init__(); self.H = H
        self.c_attn = nn.Linear(C, 3 * C); self.c_proj = nn.Linear(C, C)
    def forward(self, x):
        B, T, C = x.shape; q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = [t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / (k.size(-1) ** 0.5)
        att = att.masked_fill(torch.ones(T, T).tril() == 0, float('-inf')).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

class MLP(nn.Module):
    def __init__(self, C):
        super().__init__(); self.c_fc = nn.Linear(C, 4 * C); self.c_proj = nn.Linear(4 * C, C)
    def forward(self, x): return self.c_proj(F.gelu(self.c_fc(x), approximate='tanh'))  # GPT-2's GELU

class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C); self.attn = CausalSelfAttention(C, H); self.ln_2 = nn.LayerNorm(C); self.mlp = MLP(C)
    def forward(self, x):
        x = x + self.attn(self.ln_1(x)); return x + self.mlp(self.ln_2(x))

class GPT(nn.Module):
    def __init__(self, L, H, C, V, T):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C),
                                              h=nn.ModuleList([Block(C, H) for _ in range(L)]), ln_f=nn.LayerNorm(C)))
        self.lm_head = nn.Linear(C, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT
    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.size(1)))
        for b in self.transformer.h: x = b(x)
        return self.lm_head(self.transformer.ln_f(x))

class LlamaRMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__(); self.weight = nn.Parameter(torch.ones(C)); self.eps = eps
    def forward(self, x):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(v + self.eps)).to(x.dtype)

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)

class LlamaAttention(nn.Module):
    def __init__(self, C, H, KV, theta):
        super().__init__(); self.H, self.KV, self.hd = H, KV, C // H
        self.q_proj = nn.Linear(C, H * self.hd, bias=False); self.k_proj = nn.Linear(C, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(C, KV * self.hd, bias=False); self.o_proj = nn.Linear(H * self.hd, C, bias=False)
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2).float() / self.hd))
    def forward(self, x):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.KV, self.hd).transpose(1, 2)
        freqs = torch.arange(T).float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1); cos, sin = emb.cos(), emb.sin()
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.H // self.KV, dim=1); v = v.repeat_interleave(self.H // self.KV, dim=1)  # repeat_kv
        att = (q @ k.transpose(-2, -1)) / (self.hd ** 0.5)
        att = att.masked_fill(torch.ones(T, T).tril() == 0, float('-inf')).softmax(dim=-1)
        return self.o_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

class LlamaMLP(nn.Module):
    def __init__(self, C, I):
        super().__init__()
        self.gate_proj = nn.Linear(C, I, bias=False); self.up_proj = nn.Linear(C, I, bias=False); self.down_proj = nn.Linear(I, C, bias=False)
    def forward(self, x): return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

class LlamaDecoderLayer(nn.Module):
    def __init__(self, C, H, KV, I, theta, eps):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(C, eps); self.self_attn = LlamaAttention(C, H, KV, theta)
        self.post_attention_layernorm = LlamaRMSNorm(C, eps); self.mlp = LlamaMLP(C, I)
    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x)); return x + self.mlp(self.post_attention_layernorm(x))

class LlamaForCausalLM(nn.Module):
    def __init__(self, L, H, KV, C, I, V, theta, eps):
        super().__init__()
        self.model = nn.ModuleDict(dict(embed_tokens=nn.Embedding(V, C),
                                        layers=nn.ModuleList([LlamaDecoderLayer(C, H, KV, I, theta, eps) for _ in range(L)]),
                                        norm=LlamaRMSNorm(C, eps)))
        self.lm_head = nn.Linear(C, V, bias=False)
    def forward(self, idx):
        x = self.model.embed_tokens(idx)
        for l in self.model.layers: x = l(x)
        return self.lm_head(self.model.norm(x))

class LoraLinear(nn.Module):  # peft.tuners.lora.Linear with one adapter, bias "none", no dropout
    def __init__(self, base, r, alpha, rslora):
        super().__init__(); self.base_layer = base; self.scaling = alpha / (r ** 0.5 if rslora else r)
        self.lora_A = nn.Linear(base.in_features, r, bias=False); self.lora_B = nn.Linear(r, base.out_features, bias=False)
    def forward(self, x): return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scaling

def lora_batch(step, B, T, V):  # the same formula as tests/test_lora.cpp
    idx = [[(step * 7 + b * 13 + t * 5 + (t * t) % 11) % V for t in range(T + 1)] for b in range(B)]
    x = torch.tensor(idx, dtype=torch.int64)
    return x[:, :T], x[:, 1:]

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
elif mode == 'gpt':
    L, H, C, V, T = (int(a) for a in sys.argv[5:10])
    m = GPT(L, H, C, V, T)
    m.load_state_dict({k: v.float() for k, v in load(src).items()}, strict=True)
    m.eval()
    with torch.no_grad(): logits = m(torch.arange(T).remainder(V).view(1, T))
    print(' '.join('%.6f' % v for v in logits.flatten().tolist()), file=open(txt, 'w'))
    save(m.state_dict(), dst)
elif mode == 'llama':
    L, H, KV, C, I, V, T = (int(a) for a in sys.argv[5:12]); theta, eps = float(sys.argv[12]), float(sys.argv[13])
    m = LlamaForCausalLM(L, H, KV, C, I, V, theta, eps)
    m.load_state_dict({k: v.float() for k, v in load(src).items()}, strict=True)
    idx = torch.arange(T).remainder(V).view(1, T); tgt = (torch.arange(T) + 1).remainder(V)
    logits = m(idx)
    F.cross_entropy(logits.view(T, V), tgt).backward()
    print(' '.join('%.6f' % v for v in logits.detach().flatten().tolist()), file=open(txt, 'w'))
    save({k: p.grad for k, p in m.named_parameters()}, dst)
elif mode == 'lora':
    L, H, KV, C, I, V, B, T = (int(a) for a in sys.argv[5:13]); theta, eps = float(sys.argv[13]), float(sys.argv[14])
    r, alpha, targets, steps, lr = int(sys.argv[15]), float(sys.argv[16]), sys.argv[17].split(','), int(sys.argv[18]), float(sys.argv[19])
    rslora = len(sys.argv) > 20 and sys.argv[20] == 'rslora'  # use_rslora: alpha / sqrt(r)
    m = LlamaForCausalLM(L, H, KV, C, I, V, theta, eps)
    for p in m.parameters(): p.requires_grad_(False)  # get_peft_model: the base frozen
    for name, mod in list(m.named_modules()):
        for child, sub in list(mod.named_children()):
            if child in targets and isinstance(sub, nn.Linear): setattr(mod, child, LoraLinear(sub, r, alpha, rslora))
    sd = load(src)
    theirs = {}
    for k, v in ((k, v.float()) for k, v in sd.items()):  # PEFT keeps the base weight under base_layer
        if '.lora_' not in k and any(k.endswith('.' + t + '.weight') for t in targets): k = k[:-len('weight')] + 'base_layer.weight'
        theirs[k] = v
    m.load_state_dict(theirs, strict=True)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for step in range(steps):
        x, y = lora_batch(step, B, T, V)
        opt.zero_grad(); loss = F.cross_entropy(m(x).view(B * T, V), y.reshape(B * T)); loss.backward(); opt.step()
        losses.append(loss.item())
    print(' '.join('%.9g' % v for v in losses), file=open(txt, 'w'))
    out = {}
    for k, v in m.state_dict().items(): out[k.replace('.base_layer.', '.')] = v
    save(out, dst)
elif mode == 'peft':
    L, H, KV, C, I, V, T = (int(a) for a in sys.argv[5:12]); theta, eps, out_dir = float(sys.argv[12]), float(sys.argv[13]), sys.argv[14]
    cfg = json.load(open(dst + '/adapter_config.json'))
    assert cfg['peft_type'] == 'LORA' and cfg['bias'] == 'none', cfg
    targets, r, alpha, rslora = cfg['target_modules'], cfg['r'], cfg['lora_alpha'], cfg.get('use_rslora', False)
    m = LlamaForCausalLM(L, H, KV, C, I, V, theta, eps)
    m.load_state_dict({k: v.float() for k, v in load(src).items() if '.lora_' not in k}, strict=True)
    for name, mod in list(m.named_modules()):
        for child, sub in list(mod.named_children()):
            if child in targets and isinstance(sub, nn.Linear): setattr(mod, child, LoraLinear(sub, r, alpha, rslora))
    adapters = load(dst + '/adapter_model.safetensors')
    want = {k: p for k, p in m.named_parameters() if '.lora_' in k}
    got = {}
    for k, v in adapters.items():
        assert k.startswith('base_model.model.'), k
        got[k[len('base_model.model.'):]] = v.float()
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))
    with torch.no_grad():
        for k, p in want.items(): p.copy_(got[k])
        logits = m(torch.arange(T).remainder(V).view(1, T))
    print(' '.join('%.7f' % v for v in logits.flatten().tolist()), file=open(txt, 'w'))
    import os; os.makedirs(out_dir, exist_ok=True)
    save({'base_model.model.' + k: (2 * v if '.lora_B.' in k else v) for k, v in got.items()}, out_dir + '/adapter_model.safetensors')
    json.dump(cfg, open(out_dir + '/adapter_config.json', 'w'))
