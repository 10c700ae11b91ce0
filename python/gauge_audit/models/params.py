"""Random generic parameter points, drawn reproducibly from a seed.

Draws are made on the CPU in float64 and only then moved/cast, so a seed names
the same parameters on every device and in every dtype.  The point is *generic*
(norm weights bounded away from 0 and distinct, biases non-zero), which is what
the gauge claims are about.
"""

from __future__ import annotations

import math

import torch

from ..errors import GaugeAuditError
from ..runtime import generator
from .config import Config
from .lazy import LazyParams, Params


def init_params(shapes: dict, seed: int, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = generator(seed)
    out = {}
    for name, (shape, role) in shapes.items():
        if role == "weight":
            fan_in = math.prod(shape[-2:-1]) if len(shape) >= 2 else shape[0]
            if name.endswith("W_O"):
                fan_in = shape[0] * shape[1]  # Σ over heads feeds one output
            t = torch.randn(shape, generator=g, dtype=torch.float64) / math.sqrt(fan_in)
        elif role == "embed":
            t = torch.randn(shape, generator=g, dtype=torch.float64)
        elif role == "pos":
            t = 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif role == "norm_w":
            t = 0.6 + 0.8 * torch.rand(shape, generator=g, dtype=torch.float64)
        elif role in ("bias", "norm_b"):
            t = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:  # pragma: no cover - programming error
            raise ValueError(f"unknown role {role} for {name}")
        out[name] = t.to(device=device, dtype=dtype)
    return out


def cast(params: Params, device=None, dtype=None) -> Params:
    if isinstance(params, LazyParams):  # a checkpoint read on access: convert on access too
        return params.cast(dtype=dtype, device=device)
    return {k: v.to(device=device or v.device, dtype=dtype or v.dtype) for k, v in params.items()}


def untie(cfg: Config, params):
    """Make a tied unembedding explicit: W_U = W_Eᵀ becomes its own tensor (QuaRot's first step).

    The function is unchanged; afterwards W_E (a stream writer) and W_U (a reader of the final
    norm) can be transformed independently, which the stream rotation needs.  Adds
    vocab·d_model parameters.  Works on a dict or on :class:`LazyParams` (computed on access).
    """
    if not cfg.tied:
        raise GaugeAuditError("the unembedding is already untied")
    new = cfg.with_(tied=False)
    if isinstance(params, LazyParams):
        return new, params.extended(
            {"unembed.W_U": ((cfg.d_model, cfg.vocab), lambda p: p["embed.W_E"].T.contiguous())}
        )
    return new, {**params, "unembed.W_U": params["embed.W_E"].T.contiguous()}
