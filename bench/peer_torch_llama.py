#!/usr/bin/env python3
"""Llama-3-8B's pieces on one GPU in eager PyTorch, measured: what distlab's cost model (core/perf/hardware.cpp,
cost_model.cpp, eager.cpp) claims for the same shapes on the same GPU. Run it on a GPU machine with PyTorch 2.x:

  python3 bench/peer_torch_llama.py [--quick] [--json FILE]

  1. bf16 GEMMs at torchtitan's shapes (local batch 2, T 8192: 16,384 tokens; width 4,096, 8 KV heads, SwiGLU
     14,336, vocabulary 128,256): forward (x @ Wᵀ), input gradient (dy @ W) and weight gradient (dyᵀ @ x), TFLOP/s;
  2. causal attention through F.scaled_dot_product_attention (B 2, 32 heads, T 8192, head 128), per backend
     (flash, cuDNN, memory-efficient), forward and forward + backward, TFLOP/s counting the causal half;
  3. whole training steps of Llama-3-8B cut to L = 1, 2, 4 layers (embedding, L blocks, norm, untied head,
     cross-entropy on pred.float(), gradient clipping, foreach AdamW on f32 master weights: bf16 parameters and
     gradients as FSDP's mixed precision computes with): forward, backward, optimizer ms and peak memory. The
     per-layer cost is the slope over L. `distlab train configs/llama3-8b.toml --device meta --set
     model.n_layer=L --set train.micro_batch=2 --set model.attention=flash --set log.profile=h200 --set
     log.kernels=eager` models the same steps (the closing note of issue 35 puts the two side by side).

The model code follows torchtitan (commit d4c86e3) as tests/eager_chains.py does: RMSNorm in f32 then type_as,
RoPE through complex numbers, repeat_kv before SDPA, F.silu(w1(x)) * w3(x). Timings: CUDA events around
`--iters` repetitions after `--warmup`; the GPU's clocks are left as the machine has them.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

DIM, HEADS, KV_HEADS, FFN, VOCAB, THETA, EPS = 4096, 32, 8, 14336, 128256, 500000.0, 1e-5


# --- torchtitan/models/norms.py, llama/model.py (d4c86e3) ---
class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def precompute_freqs_cis(dim, end, theta):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs).float())


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * f).flatten(3).type_as(xq), torch.view_as_real(xk_ * f).flatten(3).type_as(xk)


def repeat_kv(x, n_rep):
    bs, slen, n_kv, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv, n_rep, hd).reshape(bs, slen, n_kv * n_rep, hd)


SDPA_BACKEND = None  # --sdpa: which kernel the training steps' attention runs (None: PyTorch's choice)


def causal_attention(q, k, v):
    """F.scaled_dot_product_attention, whichever backend the caller's context allows"""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # PyTorch 1.x (the CPU smoke run only): the same math, the (T, T) scores stored
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), -1).type_as(q) @ v


def sdpa(q, k, v):
    """the model's attention: --sdpa's backend, or PyTorch's choice"""
    if SDPA_BACKEND is not None:
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel([SDPA_BACKEND]):
            return causal_attention(q, k, v)
    return causal_attention(q, k, v)


class Attention(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, dim // heads
        self.wq = torch.nn.Linear(dim, heads * self.hd, bias=False)
        self.wk = torch.nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = torch.nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = torch.nn.Linear(heads * self.hd, dim, bias=False)

    def forward(self, x, freqs_cis):
        bs, T, _ = x.shape
        xq = self.wq(x).view(bs, T, self.h, self.hd)
        xk = self.wk(x).view(bs, T, self.kv, self.hd)
        xv = self.wv(x).view(bs, T, self.kv, self.hd)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        keys, values = repeat_kv(xk, self.h // self.kv), repeat_kv(xv, self.h // self.kv)
        out = sdpa(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2))
        return self.wo(out.transpose(1, 2).contiguous().view(bs, T, -1))


class FeedForward(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = torch.nn.Linear(dim, hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, dim, bias=False)
        self.w3 = torch.nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(torch.nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn):
        super().__init__()
        self.attention, self.feed_forward = Attention(dim, heads, kv_heads), FeedForward(dim, ffn)
        self.attention_norm, self.ffn_norm = RMSNorm(dim, EPS), RMSNorm(dim, EPS)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(torch.nn.Module):
    def __init__(self, layers, dim, heads, kv_heads, ffn, vocab, T):
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(Block(dim, heads, kv_heads, ffn) for _ in range(layers))
        self.norm, self.output = RMSNorm(dim, EPS), torch.nn.Linear(dim, vocab, bias=False)
        # complex, so kept out of the module's tensors: Module.to(torch.bfloat16) would drop its imaginary part
        self.freqs_cis = precompute_freqs_cis(dim // heads, T, THETA)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


def copy_all(dst, src):
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dst, src)
    else:  # PyTorch 1.x
        for d, s in zip(dst, src):
            d.copy_(s)


def clip(params):
    try:
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
    except TypeError:  # PyTorch 1.x
        torch.nn.utils.clip_grad_norm_(params, 1.0)


# --- timing ---
def timed(fn, warmup, iters, dev):
    """ms per call: CUDA events on a GPU, perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return 1e3 * (time.perf_counter() - t0) / iters


def gemms(tokens, dim, kv_dim, ffn, vocab, dt, dev, warmup, iters):
    rows = []
    shapes = [("wq, wo", dim, dim), ("wk, wv", dim, kv_dim), ("w1, w3", dim, ffn), ("w2", ffn, dim), ("output", dim, vocab)]
    for name, k_in, n_out in shapes:
        x = torch.randn(tokens, k_in, dtype=dt, device=dev)
        w = torch.randn(n_out, k_in, dtype=dt, device=dev) / math.sqrt(k_in)
        dy = torch.randn(tokens, n_out, dtype=dt, device=dev)
        flops = 2.0 * tokens * k_in * n_out
        for part, fn in (("forward x@W^T", lambda: x @ w.t()), ("dx = dy@W", lambda: dy @ w),
                         ("dW = dy^T@x", lambda: dy.t() @ x)):
            ms = timed(fn, warmup, iters, dev)
            rows.append(dict(weight=name, part=part, M=tokens, K=k_in, N=n_out, ms=ms, tflops=flops / ms / 1e9))
        del x, w, dy
    return rows


def attention(B, H, T, hd, dt, dev, warmup, iters):
    rows = []
    backends = [("default", None)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends += [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    except ImportError:
        sdpa_kernel = None
    # causal: half of the 4·B·H·T²·hd multiply-adds of the two products; the backward does 2.5x the forward's
    fwd_flops = 4.0 * B * H * T * T * hd / 2
    for name, backend in backends:
        q = torch.randn(B, H, T, hd, dtype=dt, device=dev, requires_grad=True)
        k = torch.randn(B, H, T, hd, dtype=dt, device=dev, requires_grad=True)
        v = torch.randn(B, H, T, hd, dtype=dt, device=dev, requires_grad=True)
        g = torch.randn(B, H, T, hd, dtype=dt, device=dev)

        def fwd():  # not sdpa(): --sdpa is for section 3, each backend is tried here
            return causal_attention(q, k, v)

        def fwd_bwd():
            fwd().backward(g)

        try:
            if backend is None:
                ms_f, ms_fb = timed(fwd, warmup, iters, dev), timed(fwd_bwd, warmup, iters, dev)
            else:
                with sdpa_kernel([backend]):
                    ms_f, ms_fb = timed(fwd, warmup, iters, dev), timed(fwd_bwd, warmup, iters, dev)
        except RuntimeError as e:
            rows.append(dict(backend=name, error=str(e).splitlines()[0][:160]))
            continue
        rows.append(dict(backend=name, B=B, H=H, T=T, head=hd, fwd_ms=ms_f, fwd_bwd_ms=ms_fb,
                         fwd_tflops=fwd_flops / ms_f / 1e9, fwd_bwd_tflops=3.5 * fwd_flops / ms_fb / 1e9))
    return rows


class Trainee:
    """Llama-3-8B cut to L blocks, trained as FSDP's mixed precision computes: bf16 parameters and gradients,
    f32 master weights in foreach AdamW, the f32 gradients alive only while the optimizer runs."""

    def __init__(self, L, B, T, dims, dev):
        dim, heads, kv_heads, ffn, vocab = dims
        torch.manual_seed(0)
        model = Llama(L, dim, heads, kv_heads, ffn, vocab, T).to(dev)
        model.freqs_cis = model.freqs_cis.to(dev)
        self.master = [p.detach().float().clone() for p in model.parameters()]  # f32 master weights
        self.model = model.to(torch.bfloat16)
        self.params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(self.master, lr=3e-4, weight_decay=0.1, foreach=True)
        self.tokens = torch.randint(0, vocab, (B, T), device=dev)
        self.labels = torch.randint(0, vocab, (B, T), device=dev)
        self.loss = None

    def forward(self):
        self.loss = None  # the last forward's graph goes first: two graphs alive at once would double the peak
        self.loss = F.cross_entropy(self.model(self.tokens).flatten(0, 1).float(), self.labels.flatten(0, 1))

    def backward(self):
        self.loss.backward()
        self.loss = None

    def optimizer(self, keep_grads=False):
        clip(self.params)
        for m, p in zip(self.master, self.params):
            m.grad = p.grad.float()
        self.opt.step()
        with torch.no_grad():
            copy_all(self.params, self.master)
        if keep_grads:  # to time the optimizer again on the same gradients
            return
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None

    def step(self):
        self.forward()
        self.backward()
        self.optimizer()


def steps(layer_counts, B, T, dims, dev, warmup, iters):
    rows = []
    for L in layer_counts:
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t = Trainee(L, B, T, dims, dev)
        step_ms = timed(t.step, warmup, iters, dev)
        # the peak of whole steps (the parts below hold other things at other times)
        peak = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else float("nan")
        # the parts, each timed on its own
        fwd_ms = timed(t.forward, 1, iters, dev)
        fb_ms = timed(lambda: (t.forward(), t.backward(), [setattr(p, "grad", None) for p in t.params]), 1, iters, dev)
        t.forward()
        t.backward()
        opt_ms = timed(lambda: t.optimizer(keep_grads=True), 1, iters, dev)
        rows.append(dict(layers=L, params=sum(p.numel() for p in t.params), step_ms=step_ms, forward_ms=fwd_ms,
                         backward_ms=fb_ms - fwd_ms, optimizer_ms=opt_ms, peak_gib=peak, tokens_per_s=B * T / step_ms * 1e3))
        del t
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes (a CPU smoke run of the script itself)")
    ap.add_argument("--json", default="bench/results/peer_torch_llama.json")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--sdpa", choices=["default", "flash", "cudnn", "efficient"], default="default",
                    help="the training steps' attention kernel (torchtitan of April 2024 ran flash: FlashAttention-2)")
    ap.add_argument("--only", choices=["all", "steps", "profile", "saved"], default="all",
                    help="steps: section 3 alone; profile: section 4 alone (a GPU only); saved: section 5 alone")
    ap.add_argument("--layers", default="",
                    help="section 3's layer counts, comma-separated (default 1,2,4; bench/gpu_check.sh times 2)")
    a = ap.parse_args()
    global SDPA_BACKEND
    if a.sdpa != "default":
        from torch.nn.attention import SDPBackend
        SDPA_BACKEND = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION}[a.sdpa]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = dict(torch=torch.__version__, device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
               cuda=getattr(torch.version, "cuda", None))
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        env["sm_clock_note"] = "clocks as the machine has them (not locked)"
    print(json.dumps(env))
    if a.quick:
        B, T, dims, layer_counts, dt = 2, 64, (256, 4, 2, 512, 1024), (1, 2), torch.float32
    else:
        B, T, dims, layer_counts, dt = 2, 8192, (DIM, HEADS, KV_HEADS, FFN, VOCAB), (1, 2, 4), torch.bfloat16
    if a.layers:
        try:
            layer_counts = tuple(int(x) for x in a.layers.split(","))
        except ValueError:
            ap.error(f"--layers {a.layers!r}: layer counts such as 2 or 1,2,4")
        if not layer_counts or min(layer_counts) < 1:
            ap.error(f"--layers {a.layers!r}: each count is at least 1")
    dim, heads, kv_heads, ffn, vocab = dims
    res = dict(env=env, B=B, T=T, dims=dims, sdpa=a.sdpa)
    t0 = time.time()
    if a.only == "steps":
        return finish(a, res, steps_section(a, res, B, T, dims, layer_counts, dev, t0))
    if a.only == "profile":
        return finish(a, res, profile_section(a, res, B, T, dims, dev))
    if a.only == "saved":
        return finish(a, res, saved_section(a, res, B, T, dims, dev))

    res["gemms"] = gemms(B * T, dim, dim // heads * kv_heads, ffn, vocab, dt, dev, a.warmup, a.iters)
    print(f"\n1. GEMMs at {B * T} tokens ({dt}):")
    print(f"{'weight':>8} {'part':>14} {'M':>6} {'K':>6} {'N':>7} {'ms':>8} {'TFLOP/s':>8}")
    for r in res["gemms"]:
        print(f"{r['weight']:>8} {r['part']:>14} {r['M']:>6} {r['K']:>6} {r['N']:>7} {r['ms']:>8.3f} {r['tflops']:>8.1f}")
    tot_flops = sum(2.0 * r["M"] * r["K"] * r["N"] for r in res["gemms"])
    tot_ms = sum(r["ms"] for r in res["gemms"])
    print(f"   all together: {tot_flops / tot_ms / 1e9:.1f} TFLOP/s (time-weighted)  [{time.time() - t0:.0f} s]")

    res["attention"] = attention(B, heads, T, dim // heads, dt, dev, a.warmup, a.iters)
    print(f"\n2. causal SDPA, B {B}, {heads} heads, T {T}, head {dim // heads}:")
    for r in res["attention"]:
        if "error" in r:
            print(f"{r['backend']:>10}: not run: {r['error']}")
        else:
            print(f"{r['backend']:>10}: forward {r['fwd_ms']:.2f} ms {r['fwd_tflops']:.1f} TFLOP/s | "
                  f"forward+backward {r['fwd_bwd_ms']:.2f} ms {r['fwd_bwd_tflops']:.1f} TFLOP/s")
    print(f"   [{time.time() - t0:.0f} s]")

    return finish(a, res, steps_section(a, res, B, T, dims, layer_counts, dev, t0))


def steps_section(a, res, B, T, dims, layer_counts, dev, t0):
    res["steps"] = steps(layer_counts, B, T, dims, dev, max(1, a.warmup - 1), max(2, a.iters // 2))
    print(f"\n3. training steps, Llama-3-8B cut to L layers, B {B}, T {T}, bf16 compute, f32 AdamW, SDPA {a.sdpa}:")
    print(f"{'L':>3} {'params':>14} {'step ms':>9} {'fwd ms':>8} {'bwd ms':>8} {'optim ms':>9} {'peak GiB':>9} {'tokens/s':>9}")
    for r in res["steps"]:
        print(f"{r['layers']:>3} {r['params']:>14,} {r['step_ms']:>9.1f} {r['forward_ms']:>8.1f} {r['backward_ms']:>8.1f} "
              f"{r['optimizer_ms']:>9.1f} {r['peak_gib']:>9.2f} {r['tokens_per_s']:>9.0f}")
    s = res["steps"]
    if len(s) >= 2 and s[-1]["layers"] != s[0]["layers"]:
        per_layer = (s[-1]["step_ms"] - s[0]["step_ms"]) / (s[-1]["layers"] - s[0]["layers"])
        print(f"   per layer (slope): {per_layer:.1f} ms a step; a 32-layer step would be "
              f"{s[0]['step_ms'] + (32 - s[0]['layers']) * per_layer:.0f} ms on one GPU  [{time.time() - t0:.0f} s]")
    return res


def kernel_kind(name):
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if "gemm" in n or "nvjet" in n or "xmma" in n or "cutlass" in n or "cublas" in n:
        return "gemm"
    if "multi_tensor" in n or "foreach" in n:
        return "optimizer (foreach)"
    if "reduce" in n or "norm" in n:
        return "reductions"
    if "copy" in n or "cat" in n or "memcpy" in n or "memset" in n:
        return "copies"
    return "elementwise"


def profile_section(a, res, B, T, dims, dev):
    """one training step of L = 1 under torch.profiler: the GPU time of every kernel, grouped by kind."""
    from torch.profiler import ProfilerActivity, profile
    t = Trainee(1, B, T, dims, dev)
    step = t.step
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        k = kernels.setdefault(e.name, [0, 0.0])
        k[0] += 1
        k[1] += e.time_range.elapsed_us()  # a device event's own span: the kernel's time
    rows = sorted(([n, c, us / 1e3] for n, (c, us) in kernels.items()), key=lambda r: -r[2])
    kinds = {}
    for n, c, ms in rows:
        kk = kinds.setdefault(kernel_kind(n), [0, 0.0])
        kk[0] += c
        kk[1] += ms
    res["profile"] = dict(kernels=rows, kinds=kinds)
    total = sum(ms for _, _, ms in rows)
    print(f"\n4. one step of L = 1 under torch.profiler: {total:.1f} ms of kernels, by kind:")
    for k, (c, ms) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:>22} {c:>6} kernels {ms:>9.2f} ms")
    print("   the 30 longest kernels:")
    for n, c, ms in rows[:30]:
        print(f"   {ms:>8.2f} ms {c:>5}x  {n[:110]}")
    return res


def saved_section(a, res, B, T, dims, dev):
    """what autograd keeps from one block's forward (eager, bf16, --sdpa's attention): bytes per element of the
    block's (B, T, dim) input, the parameters and the input itself left out. The memory side of eager.cpp."""
    dim, heads, kv_heads, ffn, vocab = dims
    torch.manual_seed(0)
    blk = Block(dim, heads, kv_heads, ffn).to(dev).to(torch.bfloat16)
    freqs = precompute_freqs_cis(dim // heads, T, THETA).to(dev)
    x = torch.randn(B, T, dim, dtype=torch.bfloat16, device=dev, requires_grad=True)
    skip = {p.data_ptr() for p in blk.parameters()} | {x.data_ptr(), freqs.data_ptr()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.data_ptr()
        if ptr not in skip and ptr not in seen:
            nbytes = t.untyped_storage().nbytes() if hasattr(t, "untyped_storage") else t.numel() * t.element_size()
            seen[ptr] = (nbytes, list(t.shape), str(t.dtype).replace("torch.", ""))
        return t

    if dev.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = blk(x, freqs)
    held = torch.cuda.memory_allocated() - before - y.numel() * y.element_size() if dev.type == "cuda" else float("nan")
    sbh = B * T * dim
    rows = sorted(seen.values(), key=lambda r: -r[0])
    total = sum(r[0] for r in rows)
    res["saved"] = dict(bytes_per_sbh=total / sbh, allocator_bytes_per_sbh=held / sbh, tensors=rows)
    print(f"\n5. saved for backward by one block (B {B}, T {T}, dim {dim}, SDPA {a.sdpa}): {total / sbh:.2f} bytes per "
          f"element of (B, T, dim), {total / 2**30:.2f} GiB; the allocator holds {held / sbh:.2f} bytes per element")
    for nbytes, shape, dt in rows:
        print(f"   {nbytes / sbh:7.3f}  {dt:>9} {shape}")
    return res


def finish(a, res, _):
    import os
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
