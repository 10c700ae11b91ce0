"""The architecture families by name: the table a :class:`~.config.Config`'s ``family`` selects
its ``param_shapes`` / ``forward`` / ``sample_inputs`` from.

Its own module, below both the checkpoint reader (which checks shapes against a family) and the
registry of named models (which loads real checkpoints), so neither imports the other to get it.
"""

from __future__ import annotations

import math
from types import ModuleType

from . import attn, bert, deepseek, gemma, gpt2, llama, moe, neox, olmo2, phi3, qwen, qwen3

FAMILIES: dict[str, ModuleType] = {
    "gpt2": gpt2,
    "bert": bert,
    "llama": llama,
    "qwen": qwen,
    "moe": moe,
    "attn": attn,
    "qwen3": qwen3,
    "olmo2": olmo2,
    "phi3": phi3,
    "neox": neox,
    "gemma": gemma,
    "deepseek": deepseek,
}


def family_of(cfg) -> ModuleType:
    """The module that computes a model of this configuration: its ``param_shapes``, ``forward``
    and ``sample_inputs`` (the rooms ask it, never the family's name)."""
    return FAMILIES[cfg.family]


def param_shapes(cfg) -> dict:
    """name → (shape, role) of every parameter of a model of this configuration."""
    return family_of(cfg).param_shapes(cfg)


def plain_stack(cfg) -> bool:
    """The forward is the shared stack of blocks (models/gpt2.py's), not a family's own."""
    return family_of(cfg).forward is gpt2.forward


def parameter_count(cfg) -> int:
    """The number of parameters of a model of this configuration (from its family's shapes)."""
    return sum(math.prod(shape) for shape, _ in param_shapes(cfg).values())
