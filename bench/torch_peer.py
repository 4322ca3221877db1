"""The PyTorch peer of bench/vs_pytorch.sh: the same Llama-style decoder as remat's (RMSNorm, RoPE, causal
grouped-query attention, SwiGLU MLP, untied output layer, mean cross-entropy, AdamW), trained a few steps on
random tokens. Prints the median step time and the process's peak RSS.

    /usr/bin/python3 bench/torch_peer.py --dtype bfloat16 --checkpoint --steps 3
"""
import argparse
import math
import resource
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class RMSNorm(torch.nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.scale.to(x.dtype)


def rope(x, cos, sin):  # x [B, T, H, Dh]: rotate the two halves
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, d, heads, kv_heads, head_dim, mlp):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.q = torch.nn.Linear(d, heads * head_dim, bias=False)
        self.k = torch.nn.Linear(d, kv_heads * head_dim, bias=False)
        self.v = torch.nn.Linear(d, kv_heads * head_dim, bias=False)
        self.o = torch.nn.Linear(heads * head_dim, d, bias=False)
        self.wi0 = torch.nn.Linear(d, mlp, bias=False)
        self.wi1 = torch.nn.Linear(d, mlp, bias=False)
        self.wo = torch.nn.Linear(mlp, d, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = rope(self.q(h).view(b, t, self.heads, self.head_dim), cos, sin)
        k = rope(self.k(h).view(b, t, self.kv_heads, self.head_dim), cos, sin)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim)
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        scores = torch.einsum("bshd,bthd->bhst", q.float(), k.float()) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).to(v.dtype)
        ctx = torch.einsum("bhst,bthd->bshd", probs, v).reshape(b, t, -1)
        x = x + self.o(ctx)
        h = self.mlp_norm(x)
        return x + self.wo(F.silu(self.wi0(h)) * self.wi1(h))


class Model(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = torch.nn.Embedding(a.vocab, a.d)
        self.layers = torch.nn.ModuleList(Layer(a.d, a.heads, a.kv_heads, a.head_dim, a.mlp) for _ in range(a.layers))
        self.norm = RMSNorm(a.d)
        self.head = torch.nn.Linear(a.d, a.vocab, bias=False)
        self.checkpoint = a.checkpoint
        pos = torch.arange(a.seq, dtype=torch.float32)[:, None]
        inv = 10000.0 ** (-torch.arange(0, a.head_dim // 2, dtype=torch.float32) / (a.head_dim // 2))
        self.cos, self.sin = torch.cos(pos * inv)[None, :, None, :], torch.sin(pos * inv)[None, :, None, :]
        self.mask = torch.tril(torch.ones(a.seq, a.seq, dtype=torch.bool))

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for layer in self.layers:
            if self.checkpoint:
                x = checkpoint(layer, x, self.cos, self.sin, self.mask, use_reentrant=False)
            else:
                x = layer(x, self.cos, self.sin, self.mask)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("d", 768), ("layers", 12), ("heads", 12), ("kv_heads", 12), ("head_dim", 64), ("mlp", 3072),
                          ("seq", 512), ("batch", 4), ("vocab", 32000), ("steps", 3), ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint around every layer")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Model(a)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq))
    targets = torch.randint(0, a.vocab, (a.batch, a.seq))
    times = []
    for _ in range(a.steps):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16"):
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(f"torch {a.dtype} checkpoint={a.checkpoint}: {1e3 * statistics.median(times[1:] or times):.0f} ms/step, "
          f"peak RSS {peak:.2f} GiB, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
