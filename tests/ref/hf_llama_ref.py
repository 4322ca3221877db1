#!/usr/bin/env python3
"""A Hugging Face-style Llama in plain PyTorch, and the small HF folders remat's tests load.

The model follows transformers' modeling_llama.py: the same module tree (so the same state_dict names:
model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ..., lm_head.weight), nn.Linear weights
[out_features, in_features], RMSNorm `weight * x * rsqrt(mean(x^2) + eps)`, rotary embeddings applied with
`rotate_half` (a head's first and second halves are the pairs), grouped-query attention by `repeat_kv`, a
SiLU-gated MLP. Debian has no Python safetensors nor transformers, so the files are written here with
`struct` + `json` in the safetensors format (8-byte little-endian header length, JSON header, raw data).

Writes, under tests/ref/hf/:
  tiny/         config.json + model.safetensors, f32, grouped-query attention (4 heads, 2 kv), untied
  tiny_bf16/    the same model with its weights rounded to bf16, stored as BF16
  tiny_f16/     the same rounded to f16, stored as F16
  tiny_tied/    a tied model (tie_word_embeddings, no lm_head.weight) in two shards with
                model.safetensors.index.json
  <name>.logits.safetensors   `tokens` (I32 [B, T]) and `logits` (F32 [B, T, V]) of each folder's model,
                computed in float64 from the exact stored weights

Run by hand (not in CI; needs Debian's python3-torch):  /usr/bin/python3 tests/ref/hf_llama_ref.py
It gives the same bytes every time.
"""

import json
import math
import os
import struct

import torch
from torch import nn

torch.set_num_threads(1)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf")

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "vocab_size": 259,
    "hidden_size": 16,
    "intermediate_size": 40,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 50000.0,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
BATCH, SEQ = 2, 8


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary(seq, head_dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):
    b, kv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.heads
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.heads // self.kv_heads), repeat_kv(v, self.heads // self.kv_heads)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)
        mask = torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
        out = torch.softmax(scores + mask, dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = LlamaModel(c)
        self.lm_head = None if c["tie_word_embeddings"] else nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def forward(self, tokens):
        c = self.c
        cos, sin = rotary(tokens.shape[1], c["hidden_size"] // c["num_attention_heads"], c["rope_theta"])
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return x @ w.T


def make_model(config, seed):
    torch.manual_seed(seed)
    m = LlamaForCausalLM(config).double()
    with torch.no_grad():
        for name, p in m.named_parameters():
            # Weights large enough that the logits are O(1): a wrong layout or pairing shows far above 1e-5.
            scale = 0.2 if name.endswith("layernorm.weight") or name.endswith("norm.weight") else 0.5
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + scale * torch.randn(p.shape, dtype=torch.float64))
            # Linear weights scaled by 1/sqrt(fan_in) (the embedding's rows too, used as the tied output).
            if p.dim() == 2:
                p.mul_(1.0 / math.sqrt(p.shape[1]))
    return m


def round_to(m, dtype):
    """The model's weights rounded to `dtype` (kept in float64, exactly representable)."""
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(dtype).to(torch.float64))


ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int32: "I32"}


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bf16: its bits as int16
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors):
    header, data, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        data.append(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in data:
            f.write(b)


def read_safetensors(path):
    """Reads back what write_safetensors wrote (a self-check of the format)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        raw = bytearray(data[e["data_offsets"][0] : e["data_offsets"][1]])
        if e["dtype"] == "BF16":
            out[name] = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16).reshape(e["shape"])
        else:
            dt = {v: k for k, v in ST_DTYPES.items()}[e["dtype"]]
            out[name] = torch.frombuffer(raw, dtype=dt).reshape(e["shape"])
    return out


def write_folder(name, config, model, dtype, shards=1):
    folder = os.path.join(OUT, name)
    os.makedirs(folder, exist_ok=True)
    config = dict(config, torch_dtype={torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype])
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}
    names = list(state)
    if shards == 1:
        files = {"model.safetensors": state}
    else:  # HF's names for shards, and the index mapping each tensor to its file
        files = {f"model-{i + 1:05d}-of-{shards:05d}.safetensors": {k: state[k] for k in names[i::shards]}
                 for i in range(shards)}
        weight_map = {k: file for file, part in files.items() for k in part}
        size = sum(t.numel() * t.element_size() for t in state.values())
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
            f.write("\n")
    read = {}
    for file, part in files.items():
        write_safetensors(os.path.join(folder, file), part)
        read.update(read_safetensors(os.path.join(folder, file)))
    for k in state:  # the files hold exactly the weights the logits are computed from
        assert torch.equal(read[k].double(), model.state_dict()[k]), k


def write_logits(name, model, tokens):
    with torch.no_grad():
        logits = model(tokens)
    write_safetensors(os.path.join(OUT, name + ".logits.safetensors"),
                      {"tokens": tokens.to(torch.int32), "logits": logits.to(torch.float32)})
    return logits


def self_check(model, tokens):
    """Rotate-half rotary equals the complex-pair form on a head's (i, i + Dh/2) elements."""
    dh = model.c["hidden_size"] // model.c["num_attention_heads"]
    cos, sin = rotary(tokens.shape[1], dh, model.c["rope_theta"])
    x = torch.randn(tokens.shape[1], dh, dtype=torch.float64)
    half = dh // 2
    z = torch.complex(x[:, :half], x[:, half:]) * torch.complex(cos[:, :half], sin[:, :half])
    ours = x * cos + rotate_half(x) * sin
    assert torch.allclose(ours, torch.cat((z.real, z.imag), dim=-1))
    # The batched forward equals one sequence at a time (causality, no mixing across the batch).
    with torch.no_grad():
        assert torch.allclose(model(tokens)[1:], model(tokens[1:]))


def main():
    torch.manual_seed(1)
    tokens = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ))
    model = make_model(CONFIG, seed=0)
    self_check(model, tokens)
    round_to(model, torch.float32)
    write_folder("tiny", CONFIG, model, torch.float32)
    write_logits("tiny", model, tokens)
    for name, dtype in (("tiny_bf16", torch.bfloat16), ("tiny_f16", torch.float16)):
        rounded = make_model(CONFIG, seed=0)
        round_to(rounded, dtype)
        write_folder(name, CONFIG, rounded, dtype)
        write_logits(name, rounded, tokens)
    tied_config = dict(CONFIG, tie_word_embeddings=True)
    tied = make_model(tied_config, seed=2)
    round_to(tied, torch.float32)
    write_folder("tiny_tied", tied_config, tied, torch.float32, shards=2)
    write_logits("tiny_tied", tied, tokens)


if __name__ == "__main__":
    main()
