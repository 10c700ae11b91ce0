"""A synthetic Hugging Face checkpoint at Llama-3-8B's shapes, streamed to disk shard by shard.

    python benchmarks/synth_checkpoint.py OUT_DIR [--layers N] [--hidden D --heads H --kv-heads K
        --head-dim E --intermediate F --vocab V] [--shard-gb 5] [--seed 0] [--dtype bfloat16]
        [--rope-scaling llama3]

Defaults are Llama-3-8B's: d 4096, 32 layers, 32 query / 8 KV heads of 128, d_ff 14 336, vocab
128 256, untied unembedding, RMSNorm ε 1e-5, RoPE θ 500 000, bfloat16 — 8.03 G parameters, 16.1 GB
in four shards of ≤ 5 GB with ``model.safetensors.index.json`` (the layout ``save_pretrained``
writes).  ``--layers N`` keeps the full width with fewer layers (each layer is 218 M parameters);
the other options shrink the shapes for quick runs.

The weights are random at the scales a trained model has: every matrix N(0, 1/fan_in) (nn.Linear
weight (out, in): std 1/√in; the embedding std 1/√d), RMSNorm weights log-normal around 1
(exp(0.2·z): positive, spread ±20 %, no two equal), no biases, as in Llama.  Nothing is held
in memory beyond one chunk of ≤ 16 M values: each tensor is drawn and written chunk by chunk,
each chunk from its own seed (the seed, the tensor's name, the chunk index), so the files are
the same whatever the order or the machine.  No tokenizer is written (``check`` and
``transform`` draw seeded token ids; ``--text`` would need one).

``--rope-scaling llama3`` writes Llama-3.1's ``rope_scaling`` (factor 8, 131 072 positions), which
the llama family reads as its frequency table (``models/rope.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import time
import zlib
from pathlib import Path

import torch

NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
CHUNK = 1 << 24  # values per draw


def hf_config(a) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "initializer_range": 0.02,
        "torch_dtype": a.dtype,
    }
    if a.rope_scaling == "llama3":
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
        cfg["max_position_embeddings"] = 131072
    return cfg


def tensors(a) -> list[tuple[str, tuple[int, ...], str, float]]:
    """(name, shape, kind, scale) in save_pretrained's order: kind 'normal' (std = scale) or 'norm'."""
    d, e, f = a.hidden, a.head_dim, a.intermediate
    out = [("model.embed_tokens.weight", (a.vocab, d), "normal", d**-0.5)]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (d,), "norm", 0.2),
            (p + "self_attn.q_proj.weight", (a.heads * e, d), "normal", d**-0.5),
            (p + "self_attn.k_proj.weight", (a.kv_heads * e, d), "normal", d**-0.5),
            (p + "self_attn.v_proj.weight", (a.kv_heads * e, d), "normal", d**-0.5),
            (p + "self_attn.o_proj.weight", (d, a.heads * e), "normal", (a.heads * e) ** -0.5),
            (p + "post_attention_layernorm.weight", (d,), "norm", 0.2),
            (p + "mlp.gate_proj.weight", (f, d), "normal", d**-0.5),
            (p + "mlp.up_proj.weight", (f, d), "normal", d**-0.5),
            (p + "mlp.down_proj.weight", (d, f), "normal", f**-0.5),
        ]
    out += [("model.norm.weight", (d,), "norm", 0.2), ("lm_head.weight", (a.vocab, d), "normal", d**-0.5)]
    return out


def chunks(name: str, shape: tuple[int, ...], kind: str, scale: float, seed: int, dtype: torch.dtype):
    """The tensor's values, row-major, in chunks of ≤ CHUNK values (each from its own seed)."""
    n = math.prod(shape)
    g = torch.Generator()
    for k, start in enumerate(range(0, n, CHUNK)):
        g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode()) * 4099 + k) % (1 << 63))
        z = torch.randn(min(CHUNK, n - start), generator=g, dtype=torch.float32)
        yield (z.mul_(scale) if kind == "normal" else z.mul_(scale).exp_()).to(dtype)


def shard_plan(items, itemsize: int, shard_bytes: int) -> list[list]:
    shards, cur, size = [], [], 0
    for it in items:
        nbytes = math.prod(it[1]) * itemsize
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(it)
        size += nbytes
    return shards + [cur] if cur else shards


def write_shard(path: Path, items, a, dtype: torch.dtype) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    header, offset = {}, 0
    for name, shape, _, _ in items:
        nbytes = math.prod(shape) * itemsize
        header[name] = {"dtype": NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape, kind, scale in items:
            for c in chunks(name, shape, kind, scale, a.seed, dtype):
                f.write(c.view(torch.uint8).numpy())
    return offset


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--shard-gb", type=float, default=5.0, help="largest shard, GB (10⁹ bytes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--rope-scaling", choices=("none", "llama3"), default="none")
    a = p.parse_args(argv)
    if a.out.exists():
        print(f"{a.out} already exists", file=sys.stderr)
        return 2
    dtype = getattr(torch, a.dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    items = tensors(a)
    shards = shard_plan(items, itemsize, int(a.shard_gb * 1e9))
    a.out.mkdir(parents=True)
    (a.out / "config.json").write_text(json.dumps(hf_config(a), indent=2) + "\n")
    t0, total, weight_map = time.perf_counter(), 0, {}
    for k, group in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(a.out / fname, group, a, dtype)
        weight_map.update({name: fname for name, *_ in group})
        print(
            f"{fname}: {len(group)} tensors, {total / 1e9:.2f} GB so far, {time.perf_counter() - t0:.0f} s", flush=True
        )
    (a.out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
    )
    n = sum(math.prod(s) for _, s, *_ in items)
    print(
        f"wrote {a.out}: {n / 1e9:.3f} G parameters, {total / 1e9:.2f} GB in {len(shards)} shard(s), "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
