"""Who reads and who writes the residual stream: the reader / writer lists of a pre-norm
model and the tangent-vector pieces that move a reader's columns or a writer's rows.  The
norm, stream, first-block and post-norm families are all built from these.
"""

from __future__ import annotations

import torch

from ...actions.stream import norm_readers, stream_writers
from ...models.config import Config
from ..measure import Problem
from .base import Rows


def pre_norm_readers(cfg: Config, p: dict) -> dict[str, list[tuple[str, str | None]]]:
    """norm prefix → [(reader weight, its bias or None)] as the stream actions define them,
    plus a tied final norm's reader, written as ``embed.W_E^T``."""
    out = norm_readers(cfg, p)
    if cfg.tied:
        out["ln_final"] = [("embed.W_E^T", None)]
    return out


pre_norm_writers = stream_writers


def reader_rows(R: Rows, v: torch.Tensor, name: str) -> torch.Tensor:
    """The reader weight with d_model moved to the front: (d, *rest), as a writable view.
    ``embed.W_E^T`` is W_Eᵀ (d, vocab)."""
    if name == "embed.W_E^T":
        return R.at(v, "embed.W_E").T
    return R.at(v, name).movedim(-2, 0)


def set_reader_column(R: Rows, v: torch.Tensor, name: str, col: int, a: torch.Tensor) -> None:
    """Set reader column ``col`` (flat index over the reader's non-d axes, in the order of
    its bias) to the d-vector ``a``."""
    if name == "embed.W_E^T":
        R.at(v, "embed.W_E")[col, :] = a
        return
    t = R.at(v, name)  # (*lead, d, f)
    lead, f = t.shape[:-2], t.shape[-1]
    idx = []
    rem = col
    for size in (*lead, f)[::-1]:
        idx.append(rem % size)
        rem //= size
    *lead_idx, fi = idx[::-1]
    t[(*lead_idx, slice(None), fi)] = a


def reader_ones(problem: Problem, R: Rows, norm: str, readers: list[tuple[str, str | None]]) -> int:
    """LayerNorm's output y = γ⊙n + β has n ⊥ 1, so y·γ⁻¹ = β·γ⁻¹ is the same for every input
    (y·1 = 0 without affine).  So each output column of a reader may add γ⁻¹ (resp. 1) to its
    weights; the reader's output then moves by the constant β·γ⁻¹, which (a) its bias absorbs,
    (b) is invisible for a key column (constant over the keys of a query; not under RoPE, which
    rotates it), (c) for a value column reaches the output as a constant that b_O absorbs.
    Without affine there is nothing to absorb.  (MoE router with affine LN: the uniform column
    pattern is the router offset; single columns would change the softmax.)"""
    cfg, p, d = problem.cfg, problem.params(), problem.cfg.d_model
    if cfg.norm == "layernorm":
        a, c = 1.0 / p[f"{norm}.w"], float((p[f"{norm}.b"] / p[f"{norm}.w"]).sum())
    else:
        a, c = torch.ones(d, dtype=torch.float64), 0.0
    count = 0
    for w, b in readers:
        b = b if (b is not None and b in p) else None
        pre = w.rsplit(".", 1)[0]
        if c == 0.0 or b is not None:
            mode = "bias"
        elif w.endswith(".W_K") and cfg.pos != "rope":
            mode = "key"
        elif w.endswith(".W_V") and f"{pre}.b_O" in p:
            mode = "fold"
        else:
            continue
        cols = reader_value(p, w).reshape(d, -1).shape[1]
        for col in range(cols):
            v = R.new()
            set_reader_column(R, v, w, col, a)
            if mode == "bias" and b is not None and c != 0.0:
                R.at(v, b).view(-1)[col] = -c
            elif mode == "fold":
                j, e = divmod(col, cfg.d_head)
                for h in range(j * cfg.group_size, (j + 1) * cfg.group_size):
                    R.at(v, f"{pre}.b_O")[...] -= c * p[f"{pre}.W_O"][h][e]
            count += 1
    return count


def reader_value(p: dict, name: str) -> torch.Tensor:
    if name == "embed.W_E^T":
        return p["embed.W_E"].T
    return p[name].movedim(-2, 0)


def writer_rows(t: torch.Tensor) -> torch.Tensor:
    """A writer tensor as (rows, d)."""
    return t.reshape(-1, t.shape[-1])


def stream_map_vector(
    problem: Problem, R: Rows, v: torch.Tensor, a: torch.Tensor, readers: dict, writers: list[str]
) -> None:
    """The tangent of x ↦ x·(I + t·A) on the stream: writers W·A; for a norm with weight γ,
    C = D_γ⁻¹·A·D_γ, β·C and readers −C·W.  A tied final norm is left to the caller."""
    p, d, tied = problem.params(), problem.cfg.d_model, problem.cfg.tied
    for w in writers:
        R.at(v, w)[...] = p[w] @ a
    for n, rs in readers.items():
        if tied and n == "ln_final":
            continue  # W_Eᵀ follows the writer rule: (W_E·R)ᵀ = Rᵀ·W_Eᵀ, as the reader rule asks
        if f"{n}.w" in p:
            gamma = p[f"{n}.w"]
            c = a * gamma[None, :] / gamma[:, None]  # D_γ⁻¹·A·D_γ
        else:
            c = a
        if f"{n}.b" in p:
            R.at(v, f"{n}.b")[...] = p[f"{n}.b"] @ c
        for w, _ in rs:
            rv = reader_value(p, w)
            reader_rows(R, v, w)[...] = -(c @ rv.reshape(d, -1)).reshape(rv.shape)
