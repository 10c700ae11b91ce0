"""The straight path between two parameter points of one configuration.

``interpolate`` uses ``torch.lerp``, which computes a + t·(b − a) for t < ½ and b − (1 − t)·(b − a)
otherwise: t = 0 gives A and t = 1 gives B bit for bit, and a model interpolated with itself is
itself at every t (b − a = 0 exactly) — so a self-barrier is exactly 0, not rounding noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


def interpolate(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], t: float) -> dict[str, torch.Tensor]:
    """(1 − t)·A + t·B for every parameter (same keys, shapes and dtypes required)."""
    if set(a) != set(b):
        raise ValueError("the two parameter sets have different names")
    out = {}
    for k in a:
        x, y = a[k], b[k]
        if t == 0:
            out[k] = x.clone()
        elif t == 1:
            out[k] = y.clone()
        else:
            out[k] = torch.lerp(x, y.to(x.dtype), float(t))
    return out


def distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """‖A − B‖/‖A‖ over all parameters together (Frobenius, float64)."""
    num = den = 0.0
    for k in a:
        x = a[k].double()
        num += float((x - b[k].double()).pow(2).sum())
        den += float(x.pow(2).sum())
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)
