#!/usr/bin/env python3
"""PyTorch reference for remat's tiny Llama-style decoder LM.

Builds a tiny Llama-style decoder (RMSNorm, RoPE, grouped-query attention,
SwiGLU MLP, untied output projection) in float64, with weights drawn by this
script from torch.manual_seed(0), and writes tests/ref/llama_tiny.bin holding:

  * params/<name>       initial weights (f32; these exact values, widened to
                        f64, are the weights used for every computation)
  * inputs, targets     i32 [B, T] token ids
  * logits              f32 [B, T, V] at the initial weights
  * loss                f32 [] mean next-token cross-entropy at the initial weights
  * grads/<name>        f32 gradient of `loss` w.r.t. each parameter
  * losses_after_adamw  f32 [5] loss on the same batch after each AdamW update
  * lrs                 f32 [5] learning rate used by each update
  * grad_norms          f32 [5] global gradient norm (before clipping) of each update
  * params_after_adamw/<name>, m_after_adamw/<name>, v_after_adamw/<name>
                        f32 parameters and Adam moments after the 5th update

All arithmetic is float64; values are rounded to f32 only when stored.
The AdamW / clipping / schedule logic is written out by hand (torch.optim is
not used) so that its exact semantics are visible here.

File format (little-endian):
  8 bytes   ASCII magic "RMTREF01"
  uint64    n = length of the JSON header in bytes
  n bytes   UTF-8 JSON: {"config": {...}, "tensors": [{"name", "dtype",
            "shape", "offset"}, ...]}; padded with trailing spaces so that
            16 + n is a multiple of 8
  data      raw arrays back to back; "offset" is relative to the start of
            this section and is always a multiple of 8

Run by hand (not in CI):  /usr/bin/python3 tests/ref/llama_ref.py
"""

import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)

# ----------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------

CONFIG = {
    "vocab_size": 256,
    "emb_dim": 32,
    "num_decoder_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 8,
    "mlp_dim": 64,
    "batch": 2,
    "seq_len": 16,
    "rope_theta": 10000.0,
    "rms_eps": 1e-6,
    "learning_rate": 1e-2,
    "warmup_steps": 2,
    "total_steps": 5,
    "min_lr_ratio": 0.1,
    "adam_b1": 0.9,
    "adam_b2": 0.95,
    "adam_eps": 1e-8,
    "weight_decay": 0.1,
    "max_grad_norm": 1.0,
}

V = CONFIG["vocab_size"]
D = CONFIG["emb_dim"]
L = CONFIG["num_decoder_layers"]
H = CONFIG["num_heads"]
KV = CONFIG["num_kv_heads"]
DH = CONFIG["head_dim"]
FF = CONFIG["mlp_dim"]
B = CONFIG["batch"]
T = CONFIG["seq_len"]

DTYPE = torch.float64
OUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llama_tiny.bin")

# ----------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------

# (name, shape, init) in generation order. init is "normal" (std 0.02),
# "out_proj" (std 0.02 / sqrt(2 L)) or "scale" (1 + 0.1 * N(0, 1)).
PARAM_SPECS = [
    ("token_embedder/embedding", [V, D], "normal"),
    ("decoder/layers/pre_self_attention_norm/scale", [L, D], "scale"),
    ("decoder/layers/self_attention/query/kernel", [L, D, H, DH], "normal"),
    ("decoder/layers/self_attention/key/kernel", [L, D, KV, DH], "normal"),
    ("decoder/layers/self_attention/value/kernel", [L, D, KV, DH], "normal"),
    ("decoder/layers/self_attention/out/kernel", [L, H, DH, D], "out_proj"),
    ("decoder/layers/post_self_attention_norm/scale", [L, D], "scale"),
    ("decoder/layers/mlp/wi_0/kernel", [L, D, FF], "normal"),
    ("decoder/layers/mlp/wi_1/kernel", [L, D, FF], "normal"),
    ("decoder/layers/mlp/wo/kernel", [L, FF, D], "out_proj"),
    ("decoder/decoder_norm/scale", [D], "scale"),
    ("decoder/logits_dense/kernel", [D, V], "normal"),
]
PARAM_NAMES = [name for name, _, _ in PARAM_SPECS]


def init_params():
    """Draws the initial weights in float32 (global torch RNG, which the
    caller has seeded). Returns {name: float32 tensor}."""
    out_std = 0.02 / math.sqrt(2 * L)
    params = {}
    for name, shape, kind in PARAM_SPECS:
        z = torch.randn(shape, dtype=torch.float32)
        if kind == "normal":
            w = z * 0.02
        elif kind == "out_proj":
            w = z * out_std
        elif kind == "scale":
            w = 1.0 + 0.1 * z
        else:
            raise ValueError(kind)
        params[name] = w.to(torch.float32)
    return params


# ----------------------------------------------------------------------------
# Model (hand-written forward; gradients come from autograd)
# ----------------------------------------------------------------------------


def rmsnorm(x, w):
    return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + CONFIG["rms_eps"]) * w


def rope_tables():
    """cos/sin tables of shape [T, DH] (halves duplicated)."""
    pos = torch.arange(T, dtype=DTYPE)                                    # [T]
    i = torch.arange(DH // 2, dtype=DTYPE)                                # [DH/2]
    inv_freq = CONFIG["rope_theta"] ** (-2.0 * i / DH)                    # [DH/2]
    angle = pos[:, None] * inv_freq[None, :]                              # [T, DH/2]
    cos = torch.cat([torch.cos(angle), torch.cos(angle)], dim=-1)         # [T, DH]
    sin = torch.cat([torch.sin(angle), torch.sin(angle)], dim=-1)
    return cos, sin


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, T, heads, DH]; cos/sin: [T, DH] broadcast over batch and heads."""
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    return x * c + rotate_half(x) * s


def attention(h, wq, wk, wv, wo, cos, sin):
    q = torch.einsum("btd,dhk->bthk", h, wq)                             # [B,T,H,DH]
    k = torch.einsum("btd,dhk->bthk", h, wk)                             # [B,T,KV,DH]
    v = torch.einsum("btd,dhk->bthk", h, wv)                             # [B,T,KV,DH]
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    # Grouped-query attention: query head j reads kv head j // (H // KV).
    kv_of_head = torch.arange(H) // (H // KV)                            # [H]
    k = k[:, :, kv_of_head, :]                                           # [B,T,H,DH]
    v = v[:, :, kv_of_head, :]
    scores = torch.einsum("bshk,bthk->bhst", q, k) / math.sqrt(DH)       # [B,H,T,T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()                   # t <= s kept
    scores = scores.masked_fill(~causal, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    ctx = torch.einsum("bhst,bthk->bshk", probs, v)                      # [B,T,H,DH]
    return torch.einsum("bshk,hkd->bsd", ctx, wo)


def forward(p, inputs):
    """p: {name: float64 tensor}; inputs: int64 [B, T]. Returns logits [B,T,V]."""
    cos, sin = rope_tables()
    x = p["token_embedder/embedding"][inputs]                             # [B,T,D]
    for l in range(L):
        h = rmsnorm(x, p["decoder/layers/pre_self_attention_norm/scale"][l])
        x = x + attention(
            h,
            p["decoder/layers/self_attention/query/kernel"][l],
            p["decoder/layers/self_attention/key/kernel"][l],
            p["decoder/layers/self_attention/value/kernel"][l],
            p["decoder/layers/self_attention/out/kernel"][l],
            cos, sin)
        h = rmsnorm(x, p["decoder/layers/post_self_attention_norm/scale"][l])
        gate = F.silu(h @ p["decoder/layers/mlp/wi_0/kernel"][l])
        up = h @ p["decoder/layers/mlp/wi_1/kernel"][l]
        x = x + torch.einsum("btf,fd->btd", gate * up, p["decoder/layers/mlp/wo/kernel"][l])
    x = rmsnorm(x, p["decoder/decoder_norm/scale"])
    return x @ p["decoder/logits_dense/kernel"]                           # [B,T,V]


def cross_entropy(logits, targets):
    """Mean over B*T of -log softmax(logits)[target] (natural log), written out."""
    m = logits.max(dim=-1, keepdim=True).values.detach()
    lse = torch.log(torch.exp(logits - m).sum(dim=-1)) + m[..., 0]        # [B,T]
    picked = torch.gather(logits, -1, targets[..., None])[..., 0]         # [B,T]
    return (lse - picked).mean()


def loss_fn(p, inputs, targets):
    logits = forward(p, inputs)
    return cross_entropy(logits, targets), logits


def loss_and_grads(p, inputs, targets):
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in p.items()}
    loss, logits = loss_fn(leaves, inputs, targets)
    grads = torch.autograd.grad(loss, [leaves[n] for n in PARAM_NAMES])
    return loss.detach(), logits.detach(), dict(zip(PARAM_NAMES, grads))


# ----------------------------------------------------------------------------
# Hand-written AdamW with global-norm clipping and warmup + cosine schedule
# ----------------------------------------------------------------------------


def learning_rate(s):
    """LR for update s (0-based)."""
    peak = CONFIG["learning_rate"]
    warmup = CONFIG["warmup_steps"]
    total = CONFIG["total_steps"]
    lo = CONFIG["min_lr_ratio"] * peak
    if s < warmup:
        return peak * (s + 1) / warmup
    progress = (s - warmup) / max(1, total - warmup)
    return lo + 0.5 * (peak - lo) * (1.0 + math.cos(math.pi * progress))


def train(p, inputs, targets):
    b1, b2 = CONFIG["adam_b1"], CONFIG["adam_b2"]
    eps, wd = CONFIG["adam_eps"], CONFIG["weight_decay"]
    max_norm = CONFIG["max_grad_norm"]
    p = {n: t.clone() for n, t in p.items()}
    m = {n: torch.zeros_like(t) for n, t in p.items()}
    v = {n: torch.zeros_like(t) for n, t in p.items()}
    losses, lrs, norms = [], [], []
    for s in range(CONFIG["total_steps"]):
        _, _, g = loss_and_grads(p, inputs, targets)
        gnorm = math.sqrt(sum(float((g[n] * g[n]).sum()) for n in PARAM_NAMES))
        clip = min(1.0, max_norm / (gnorm + 1e-6))
        lr = learning_rate(s)
        t = s + 1
        for n in PARAM_NAMES:
            gn = g[n] * clip
            p[n] = p[n] - lr * wd * p[n]                    # decoupled weight decay
            m[n] = b1 * m[n] + (1 - b1) * gn
            v[n] = b2 * v[n] + (1 - b2) * gn * gn
            mhat = m[n] / (1 - b1 ** t)
            vhat = v[n] / (1 - b2 ** t)
            p[n] = p[n] - lr * mhat / (torch.sqrt(vhat) + eps)
        with torch.no_grad():
            loss, _ = loss_fn(p, inputs, targets)
        losses.append(float(loss))
        lrs.append(lr)
        norms.append(gnorm)
    return losses, lrs, norms, p, m, v


# ----------------------------------------------------------------------------
# Self-checks (float64)
# ----------------------------------------------------------------------------


def self_check(p, inputs, targets, loss, logits, grads):
    # 1. Hand-written cross-entropy matches torch's.
    ref = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    assert abs(float(ref) - float(loss)) < 1e-12, (float(ref), float(loss))
    # 2. Loss at init is near ln(V) (small init => near-uniform predictions).
    assert abs(float(loss) - math.log(V)) < 0.05, float(loss)
    # 3. Autograd gradients agree with central finite differences on a few
    #    entries of every parameter.
    gen = torch.Generator().manual_seed(1234)
    h = 1e-6
    for n in PARAM_NAMES:
        flat = p[n].reshape(-1)
        for _ in range(3):
            idx = int(torch.randint(0, flat.numel(), (1,), generator=gen))
            pp = dict(p)
            plus = flat.clone(); plus[idx] += h
            minus = flat.clone(); minus[idx] -= h
            pp[n] = plus.reshape(p[n].shape)
            lp, _ = loss_fn(pp, inputs, targets)
            pp[n] = minus.reshape(p[n].shape)
            lm, _ = loss_fn(pp, inputs, targets)
            fd = (float(lp) - float(lm)) / (2 * h)
            ag = float(grads[n].reshape(-1)[idx])
            assert abs(fd - ag) <= 1e-7 + 1e-5 * abs(ag), (n, idx, fd, ag)
    # 4. GQA via index gather equals an explicit per-head loop (layer 0).
    cos, sin = rope_tables()
    x = p["token_embedder/embedding"][inputs]
    hh = rmsnorm(x, p["decoder/layers/pre_self_attention_norm/scale"][0])
    wq = p["decoder/layers/self_attention/query/kernel"][0]
    wk = p["decoder/layers/self_attention/key/kernel"][0]
    wv = p["decoder/layers/self_attention/value/kernel"][0]
    wo = p["decoder/layers/self_attention/out/kernel"][0]
    fast = attention(hh, wq, wk, wv, wo, cos, sin)
    q = apply_rope(torch.einsum("btd,dhk->bthk", hh, wq), cos, sin)
    k = apply_rope(torch.einsum("btd,dhk->bthk", hh, wk), cos, sin)
    vv = torch.einsum("btd,dhk->bthk", hh, wv)
    slow = torch.zeros(B, T, D, dtype=DTYPE)
    for b in range(B):
        for j in range(H):
            kv = j // (H // KV)
            for s in range(T):
                sc = torch.stack([(q[b, s, j] * k[b, t, kv]).sum() / math.sqrt(DH)
                                  for t in range(s + 1)])
                pr = torch.softmax(sc, dim=0)
                ctx = sum(pr[t] * vv[b, t, kv] for t in range(s + 1))
                slow[b, s] += ctx @ wo[j]
    assert torch.allclose(fast, slow, rtol=1e-10, atol=1e-14)


# ----------------------------------------------------------------------------
# Serialization
# ----------------------------------------------------------------------------


def write_ref(path, tensors):
    """tensors: list of (name, numpy array with dtype float32 or int32)."""
    entries, blobs, offset = [], [], 0
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr)
        dtype = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32"}[arr.dtype]
        raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        entries.append({"name": name, "dtype": dtype, "shape": list(arr.shape), "offset": offset})
        pad = (-len(raw)) % 8
        blobs.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    header = json.dumps({"config": CONFIG, "tensors": entries}, indent=1).encode("utf-8")
    header += b" " * ((-(16 + len(header))) % 8)  # keep the data section 8-aligned in the file
    with open(path, "wb") as f:
        f.write(b"RMTREF01")
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for blob in blobs:
            f.write(blob)


def main():
    torch.manual_seed(0)
    params32 = init_params()
    seq = torch.randint(0, V, (B, T + 1))
    inputs, targets = seq[:, :-1], seq[:, 1:]
    p = {n: t.to(DTYPE) for n, t in params32.items()}

    loss, logits, grads = loss_and_grads(p, inputs, targets)
    self_check(p, inputs, targets, loss, logits, grads)

    losses, lrs, norms, p5, m5, v5 = train(p, inputs, targets)
    assert all(a > b for a, b in zip([float(loss)] + losses, losses)), losses

    f32 = lambda t: t.detach().to(torch.float32).numpy()
    tensors = [("params/" + n, params32[n].numpy()) for n in PARAM_NAMES]
    tensors += [
        ("inputs", inputs.to(torch.int32).numpy()),
        ("targets", targets.to(torch.int32).numpy()),
        ("logits", f32(logits)),
        ("loss", f32(loss)),
    ]
    tensors += [("grads/" + n, f32(grads[n])) for n in PARAM_NAMES]
    tensors += [
        ("losses_after_adamw", np.array(losses, dtype=np.float64).astype(np.float32)),
        ("lrs", np.array(lrs, dtype=np.float64).astype(np.float32)),
        ("grad_norms", np.array(norms, dtype=np.float64).astype(np.float32)),
    ]
    tensors += [("params_after_adamw/" + n, f32(p5[n])) for n in PARAM_NAMES]
    tensors += [("m_after_adamw/" + n, f32(m5[n])) for n in PARAM_NAMES]
    tensors += [("v_after_adamw/" + n, f32(v5[n])) for n in PARAM_NAMES]
    write_ref(OUT_PATH, tensors)

    print(f"wrote {OUT_PATH} ({os.path.getsize(OUT_PATH)} bytes)")
    print(f"loss at init: {float(loss):.10f} (ln {V} = {math.log(V):.10f})")
    print("losses after AdamW:", " ".join(f"{x:.10f}" for x in losses))
    print("lrs:", " ".join(f"{x:.6g}" for x in lrs))
    print("grad norms:", " ".join(f"{x:.10f}" for x in norms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
