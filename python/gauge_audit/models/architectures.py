"""Architectures by name, at small sizes: the configurations ``nullity --family`` and ``groups``
start from.  One row per architecture — its config builder and the name people know it by;
adding one is one row (and its family file).

Each builder's defaults are that architecture's switches (norms, positions, QK-norm, residual
shape, soft-caps, windows) at the reference families' tiny sizes; the size options override them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import attn, bert, deepseek, gemma, gpt2, llama, moe, neox, olmo2, phi3, qwen, qwen3
from .config import Config


@dataclass(frozen=True)
class Architecture:
    config: Callable[..., Config]
    title: str  # what people call it


ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": Architecture(gpt2.config, "GPT-2"),
    "bert": Architecture(bert.config, "BERT"),
    "llama": Architecture(llama.config, "LLaMA / Llama 3.x"),
    "mistral": Architecture(lambda **o: llama.config(**{"window": 8, **o}), "Mistral"),
    "qwen": Architecture(qwen.config, "Qwen2"),
    "qwen3": Architecture(qwen3.config, "Qwen3"),
    "gemma2": Architecture(gemma.gemma2_config, "Gemma 2"),
    "gemma3": Architecture(gemma.config, "Gemma 3"),
    "gemma": Architecture(gemma.config, "Gemma 3"),  # the family's own name: Gemma 3's defaults
    "olmo2": Architecture(olmo2.config, "OLMo 2"),
    "phi3": Architecture(phi3.config, "Phi-3"),
    "neox": Architecture(neox.config, "GPT-NeoX / Pythia"),
    "deepseek": Architecture(deepseek.config, "DeepSeek-V3 (MLA)"),
    "moe": Architecture(moe.config, "MoE (Mixtral-style)"),
    "attn": Architecture(attn.config, "attention only"),
}

GEMMA_ONLY = ("attn_softcap", "final_softcap", "query_pre_attn_scalar")


def architecture_config(name: str, **overrides) -> Config:
    return ARCHITECTURES[name].config(**overrides)
