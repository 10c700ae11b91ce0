"""Group elements as files: an ``.npz`` with one array per part (``M``, ``perm``, ``blocks.0.ln1`` …),
written by :func:`save_element` and read back, validated, by :func:`load_element`.

Above both :mod:`.base` (the :class:`~.base.Element` itself) and :mod:`.composite` (whose parts,
named STEP.ACTION.PART, are recognised here and their κ recomputed).
"""

from __future__ import annotations

import zipfile
from typing import Any

import numpy as np
import torch

from ..errors import GaugeAuditError
from . import composite
from .base import Element, require_invertible


def element_from_arrays(parts: dict) -> Element:
    """A user-supplied element (e.g. read from an .npz file): floats become float64
    tensors, integer arrays stay integer (permutations); κ is the largest condition
    number among its square floating-point parts (1 if none) — for a composite element
    (parts named STEP.ACTION.PART, see :mod:`.composite`) the product over its steps."""
    out = {}
    for k, v in parts.items():
        t = torch.as_tensor(v)
        out[k] = t.to(torch.float64) if t.is_floating_point() else t.to(torch.long)
    if composite.is_composite(out):
        for k, t in out.items():
            if t.is_floating_point() and not torch.isfinite(t).all():
                raise GaugeAuditError(f"{k} contains NaN or infinite entries")
        return Element(out, composite.kappa(out), note="user-supplied composite")
    ks = [1.0]
    for k, t in out.items():
        if t.is_floating_point() and t.dim() >= 2 and t.shape[-1] == t.shape[-2]:
            ks.append(require_invertible(k, t))
        elif t.is_floating_point() and not torch.isfinite(t).all():
            raise GaugeAuditError(f"{k} contains NaN or infinite entries")
    return Element(out, max(ks), note="user-supplied")


def save_element(path, element: Element) -> None:
    """Write ``element`` as an ``.npz`` file (one array per part), the format :func:`load_element` reads."""
    # typed Any: numpy's stub reads **arrays as possibly its allow_pickle keyword
    arrays: dict[str, Any] = {k: v.detach().cpu().numpy() for k, v in element.parts.items()}
    np.savez(path, **arrays)


def load_element(path: str) -> Element:
    """A group element from an ``.npz`` file (one array per part, e.g. ``M``), via
    :func:`element_from_arrays`; unreadable files are one-line errors."""
    try:
        with np.load(path, allow_pickle=False) as data:
            parts = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise GaugeAuditError(f"cannot read element file {path}: {exc}") from None
    if not parts:
        raise GaugeAuditError(f"element file {path} holds no arrays")
    return element_from_arrays(parts)
