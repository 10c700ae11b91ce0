"""Named model configurations and :func:`build`, which makes the :class:`~.model.Model` of one."""

from __future__ import annotations

import torch

from ..errors import GaugeAuditError
from ..runtime import resolve_device
from . import attn, bert, gemma, gemma3, gpt2, llama, minilm, moe, qwen, smollm2
from .config import Config
from .families import FAMILIES
from .model import Model
from .params import init_params, untie

# Tiny configs: d_model 16, 4 heads of size 4, 2 layers — small enough for exact
# Jacobians, big enough that every symmetry family is non-trivial.
NAMED: dict[str, Config] = {
    "gpt2-tiny": gpt2.config(),
    "gpt2-tiny-tied": gpt2.config(tied=True),
    "gpt2-tiny-relu": gpt2.config(act="relu"),
    "gpt2-tiny-noaffine": gpt2.config(norm="layernorm-noaffine"),
    "bert-tiny": bert.config(),
    "llama-tiny": llama.config(),
    "llama-tiny-interleaved": llama.config(rope_style="interleaved"),
    "llama-tiny-gqa": llama.config(n_kv_heads=2),
    "llama-tiny-mqa": llama.config(n_kv_heads=1),
    "llama-tiny-noweight": llama.config(norm="rmsnorm-noweight"),
    "qwen-tiny": qwen.config(n_kv_heads=2),
    "moe-tiny": moe.config(),
    "attn-tiny": attn.config(),
    "attn-tiny-gqa": attn.config(n_kv_heads=2),
    "attn-tiny-rope": attn.config(pos="rope", attn_bias=False),
    # Gemma 3: QK-norm, sliding layers (window 8 of 16 positions) and a full last layer, two RoPE
    # bases; Gemma 2: soft-capped scores and logits, alternating sliding and full layers, GQA.
    "gemma3-tiny": gemma.config(n_kv_heads=2, window=5, sliding_pattern=2),
    "gemma2-tiny": gemma.gemma2_config(n_kv_heads=2, window=5),
}
REAL = ("minilm", "smollm2", "gemma3")
# Untied copies of tied real checkpoints (QuaRot's first step): the same function, with W_U its own
# tensor, so that the stream rotation applies.  Used for claims about untied models.
UNTIED = {"smollm2-untied": "smollm2"}


def model_names() -> list[str]:
    return [*NAMED, *REAL, *UNTIED]


def build_config(
    cfg: Config, seed: int = 0, device: str = "auto", dtype: torch.dtype = torch.float64, name: str | None = None
) -> Model:
    family = FAMILIES[cfg.family]
    dev = resolve_device(device)
    params = init_params(family.param_shapes(cfg), seed, dev, dtype)
    return Model(name or cfg.family, cfg, params, family)


def config_of(name: str) -> Config:
    """The configuration of a named model (for the real ones, read from their files)."""
    if name == "minilm":
        return minilm.config()
    if name == "smollm2":
        return smollm2.checkpoint().cfg
    if name == "gemma3":
        return gemma3.checkpoint().cfg
    if name in UNTIED:
        return config_of(UNTIED[name]).with_(tied=False)
    if name not in NAMED:
        raise GaugeAuditError(f"unknown model {name!r}; known: {', '.join(model_names())}")
    return NAMED[name]


def build(name: str, seed: int = 0, device: str = "auto", dtype: torch.dtype = torch.float64) -> Model:
    """A named model: random generic parameters from ``seed``, or real weights (MiniLM held in
    memory; SmolLM2 read from its GGUF on access, kept resident after the first read)."""
    if name == "minilm":
        cfg = minilm.config()
        return Model(name, cfg, minilm.load_params(cfg, resolve_device(device), dtype), bert)
    if name in ("smollm2", "gemma3"):
        m = {"smollm2": smollm2, "gemma3": gemma3}[name].checkpoint().model(name, device=device, resident=True)
        m.params = m.params.cast(dtype=dtype)
        return m
    if name in UNTIED:
        m = build(UNTIED[name], seed, device, dtype)
        m.cfg, m.params = untie(m.cfg, m.params)
        m.name = name
        return m
    return build_config(config_of(name), seed, device, dtype, name)


def release(name: str) -> None:
    """Drop the resident weights of a real checkpoint (``build`` reads them again): for a process
    done with that checkpoint.  Nothing to do for the other models (their Model holds them)."""
    base = UNTIED.get(name, name)
    if base in ("smollm2", "gemma3"):
        {"smollm2": smollm2, "gemma3": gemma3}[base].checkpoint().release()
