#!/usr/bin/python3
"""Eager PyTorch's op chains, measured: the other side of core/perf/eager.cpp.

  eager_chains.py
      runs torchtitan's Llama pieces (RMSNorm, apply_rotary_emb, the SwiGLU product, cross_entropy on
      pred.float(), foreach AdamW) forward and backward, in bf16 and in f32, under a dispatch mode that sees
      every ATen op PyTorch executes; prints JSON {chain: {"2"|"4": {"bytes_per_element", "kernels"}}}:
      the bytes every op reads and writes (its tensor arguments and results, at their dtypes) and the number
      of ops that run a kernel (views, which move nothing, are not counted), per element of the main tensor.

The code below is torchtitan's (commit d4c86e3, the one its performance table was measured with), so what
is counted is what that table's eager run executed, op for op; CPU and CUDA run the same ATen graph.
"""
import json
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

# ops that only reinterpret memory: no kernel, no bytes
VIEWS = {'view', '_unsafe_view', 'reshape', 'expand', 'transpose', 't', 'unsqueeze', 'squeeze', 'permute', 'detach',
         'view_as_complex', 'view_as_real', 'alias', 'as_strided', 'slice', 'select', 'flatten', '_reshape_alias',
         'lift_fresh', 'split', 'unbind', 'empty_like', 'empty', 'empty_strided', 'new_empty', 'new_empty_strided',
         'is_same_size', 'resolve_conj', 'resolve_neg', '_conj', 'conj'}


def nbytes(x):
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(nbytes(y) for y in x)
    return 0


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes, self.kernels, self.ops = 0, 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__.rstrip('_')
        if name in VIEWS:
            return out
        # an op returning its (aliased) input, like x.float() on an f32 x, never reaches dispatch
        read = nbytes(list(args)) + nbytes(list((kwargs or {}).values()))
        # written: the results; an in-place op that returns nothing (_foreach_mul_) writes the arguments
        # its schema marks as mutated
        written = nbytes(out)
        if not written:
            for i, a in enumerate(func._schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    written += nbytes(args[i] if i < len(args) else (kwargs or {}).get(a.name))
        self.bytes += read + written
        self.kernels += 1
        self.ops.append((name, read, written))
        return out


# --- torchtitan/models/norms.py, llama/model.py (d4c86e3), verbatim in their math ---
class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def apply_rotary_emb_one(x, freqs_cis):
    x_ = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    f = freqs_cis.view(1, x_.shape[1], 1, x_.shape[-1])
    return torch.view_as_real(x_ * f).flatten(3).type_as(x)


def measure(fn, make_inputs, elements, backward=True):
    """bytes and kernels of fn's forward, and of its backward (from a fresh forward's output)."""
    inputs = make_inputs()
    with Count() as fwd:
        y = fn(*inputs)
    g = torch.ones_like(y) if y.dim() > 0 else None
    if not backward:
        return {"forward": (fwd.bytes / elements, fwd.kernels, fwd.ops)}
    with Count() as bwd:
        y.backward(g)
    return {"forward": (fwd.bytes / elements, fwd.kernels, fwd.ops), "backward": (bwd.bytes / elements, bwd.kernels, bwd.ops)}


def main():
    torch.manual_seed(0)
    B, T, C, H, hd, I, V = 2, 64, 256, 4, 64, 512, 4096
    out = {}
    for a, dt in ((2, torch.bfloat16), (4, torch.float32)):
        res = {}
        norm = RMSNorm(C).to(dt)
        r = measure(lambda x: norm(x), lambda: [torch.randn(B, T, C, dtype=dt, requires_grad=True)], B * T * C)
        res["rmsnorm_forward"], res["rmsnorm_backward"] = r["forward"], r["backward"]

        freqs = torch.polar(torch.ones(T, hd // 2), torch.randn(T, hd // 2))
        r = measure(lambda x: apply_rotary_emb_one(x, freqs), lambda: [torch.randn(B, T, H, hd, dtype=dt, requires_grad=True)],
                    B * T * H * hd)
        res["rope_forward"], res["rope_backward"] = r["forward"], r["backward"]

        # the MLP's elementwise part: F.silu(w1(x)) * w3(x), with w1(x) and w3(x) given
        r = measure(lambda g, u: F.silu(g) * u, lambda: [torch.randn(B * T, I, dtype=dt, requires_grad=True),
                                                        torch.randn(B * T, I, dtype=dt, requires_grad=True)], B * T * I)
        res["swiglu_forward"], res["swiglu_backward"] = r["forward"], r["backward"]

        # torchtitan's loss_fn: cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        labels = torch.randint(0, V, (B, T))
        r = measure(lambda p: F.cross_entropy(p.flatten(0, 1).float(), labels.flatten(0, 1)),
                    lambda: [torch.randn(B, T, V, dtype=dt, requires_grad=True)], B * T * V)
        res["softmax_crossentropy_forward"], res["softmax_crossentropy_backward"] = r["forward"], r["backward"]

        # torch.optim.AdamW(foreach=True) on f32 parameters (FSDP's sharded master weights), one step after the first
        ps = [torch.nn.Parameter(torch.randn(4096)) for _ in range(4)]
        opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, foreach=True)
        for p in ps:
            p.grad = torch.randn_like(p)
        opt.step()
        with Count() as step:
            opt.step()
        n = sum(p.numel() for p in ps)
        # a foreach op launches one kernel per list, not per tensor: count distinct op calls
        res["adamw_step"] = (step.bytes / n, step.kernels, step.ops)
        out[str(a)] = res
    chains = {}
    for a, res in out.items():
        for k, (b, n, ops) in res.items():
            chains.setdefault(k, {})[a] = {"bytes_per_element": b, "kernels": n, "ops": ops}
    print(json.dumps(chains, indent=1))


if __name__ == "__main__":
    main()
