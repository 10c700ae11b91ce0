"""The translations of the group that alignment moves: elements that add a vector, so that the best
one is a linear least-squares problem with a closed form.

* writer-ones — row r of every writer into a LayerNorm's input gets a_r·1 (invisible to the mean
  subtraction): a_r = mean(W_A[r] − W[r]);
* key-bias-shift — b_K[j] + c_j on the coordinates RoPE leaves alone (all without RoPE, the
  unrotated ones of a partial rotary): c = b_K^A − b_K there, 0 on the rotated ones;
* value-bias-fold — b_V[j] + c_j with b_O − Σ_j c_j·S_j (S_j = Σ_{h in group j} W_O[h]): per layer
  (I + S·Sᵀ)·c = (b_V^A − b_V) + S·(b_O − b_O^A);
* norm-shift — β + δ with every reader's bias b − δ·W: (I + Σ W·Wᵀ)·δ = (β_A − β) + Σ W·(b − b_A).

Each is the exact minimiser of the distance of the tensors it moves (the others fixed).
"""

from __future__ import annotations

import torch

from ..actions import ACTIONS, Element
from ..actions.attention import rotated_coordinates
from ..actions.offsets import ln_writers
from ..actions.stream import norm_readers
from ..models.config import Config
from ..runtime import stacked_solve

Params = dict
ORDER = ("writer-ones", "key-bias-shift", "value-bias-fold", "norm-shift")


def applicable(cfg: Config) -> list[str]:
    return [a for a in ORDER if ACTIONS[a].applies(cfg) is None and ACTIONS[a].expected_holds(cfg)]


def element(action: str, cfg: Config, b: Params, a: Params) -> Element | None:
    """The least-squares element of ``action`` (one of :data:`ORDER`) moving B' towards A."""
    if action == "writer-ones":
        parts = {w: (a[w] - b[w]).mean(-1) for w in ln_writers(cfg, b)}
        return Element(parts, 1.0) if parts else None
    if action == "key-bias-shift":
        c = torch.stack([a[f"blocks.{i}.attn.b_K"] - b[f"blocks.{i}.attn.b_K"] for i in range(cfg.n_layers)])
        c[..., : rotated_coordinates(cfg)] = 0.0
        return Element({"c": c}, 1.0)
    if action == "value-bias-fold":
        return Element({"c": torch.stack([_value_bias(cfg, b, a, i) for i in range(cfg.n_layers)])}, 1.0)
    if action == "norm-shift":
        parts = {}
        for n, readers in norm_readers(cfg, b).items():
            if f"{n}.b" not in b or any(bias is None for _, bias in readers):
                continue  # not a norm this action shifts
            lhs = torch.eye(cfg.d_model, dtype=torch.float64)
            rhs = a[f"{n}.b"] - b[f"{n}.b"]
            for w, bias in readers:
                assert bias is not None  # every reader of a shifted norm has a bias (checked above)
                wf = b[w].movedim(-2, 0).reshape(cfg.d_model, -1)
                lhs = lhs + wf @ wf.T
                rhs = rhs + wf @ (b[bias] - a[bias]).reshape(-1)
            parts[n] = stacked_solve(lhs, rhs)
        return Element(parts, 1.0) if parts else None
    raise AssertionError(action)  # pragma: no cover - ORDER lists the actions above


def _value_bias(cfg: Config, b: Params, a: Params, i: int) -> torch.Tensor:
    pre = f"blocks.{i}.attn"
    e, g = cfg.d_head, cfg.group_size
    s = b[f"{pre}.W_O"].reshape(cfg.n_kv_heads, g, e, cfg.d_model).sum(1).reshape(-1, cfg.d_model)
    lhs = torch.eye(s.shape[0], dtype=torch.float64) + s @ s.T
    rhs = (a[f"{pre}.b_V"] - b[f"{pre}.b_V"]).reshape(-1) + s @ (b[f"{pre}.b_O"] - a[f"{pre}.b_O"])
    return stacked_solve(lhs, rhs).reshape(cfg.n_kv_heads, e)
