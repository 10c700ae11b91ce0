"""Activation matching: heads and hidden units matched by the correlations of what they compute on
data (Git Re-Basin's activation matching, extended to heads), instead of by their weights.

Both models read the same token ids; per layer, from each model's own stream:

* a head's contribution to the stream, z_h·W_O[h] (its attention evaluated with the other heads'
  output rows zeroed, by the project's own attention code: QK-norms, RoPE, windows included) —
  invariant under qk-gl and vo-gl, and compared in stream coordinates (the full group rotates
  the stream first);
* a hidden unit's activation act(x·w_i + b_i) (SwiGLU: silu(x·g_i)·(x·w_i)), read as the output
  of the FFN with W_out = I — invariant under permutations of the other units; a rescaling
  multiplies it by s_i, so the correlation is unchanged (SwiGLU's s_i < 0 flips its sign: |corr|).

Cost = 1 − correlation (Pearson, over every position of the data), one assignment per layer as
for weight matching (:mod:`.matching`).  The architectures whose forward is the plain stack of
blocks (the GPT-2 / LLaMA family files) are read; others are refused in one line.
"""

from __future__ import annotations

import torch

from ..errors import GaugeAuditError
from ..models import plain_stack
from ..models.config import Config
from ..models.layers import attention, block, mlp, normalize

MAX_POSITIONS = 4096  # positions read (batch·seq); beyond it a seeded subset of the sequences


def _supported(cfg: Config) -> str | None:
    if not plain_stack(cfg):
        return f"activation matching reads the plain stack of blocks; the {cfg.family} family's forward is its own"
    if cfg.experts:
        return "activation matching of MoE experts is not implemented (weight matching is)"
    if cfg.normed_sums or (cfg.normed_inputs and cfg.normed_outputs):
        return f"activation matching needs pre-norm or output-norm blocks, not {cfg.norm_placement}"
    return None


def _corr_cost(xb: torch.Tensor, xa: torch.Tensor, absolute: bool) -> torch.Tensor:
    """1 − Pearson correlation between the rows of xb (items × samples) and of xa."""
    xb = xb - xb.mean(1, keepdim=True)
    xa = xa - xa.mean(1, keepdim=True)
    nb = xb.norm(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
    na = xa.norm(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
    c = (xb @ xa.T) / (nb[:, None] * na[None, :])
    return 1.0 - (c.abs() if absolute else c)


class Activations:
    """A's activations on ``data`` (computed once) and the cost matrices of a current B'."""

    def __init__(self, cfg: Config, a: dict, data: torch.Tensor, seed: int):
        reason = _supported(cfg)
        if reason:
            raise GaugeAuditError(reason)
        if data.dim() != 2 or data.dtype not in (torch.int64, torch.int32):
            raise GaugeAuditError("data must be a (batch, seq) tensor of token ids")
        if int(data.min()) < 0 or int(data.max()) >= cfg.vocab:
            raise GaugeAuditError(f"data: token ids must lie in 0..{cfg.vocab - 1}")
        if cfg.pos == "learned" and data.shape[1] > cfg.n_ctx:
            raise GaugeAuditError(f"data: sequences of {data.shape[1]} tokens exceed n_ctx {cfg.n_ctx}")
        rows = max(1, MAX_POSITIONS // data.shape[1])
        if data.shape[0] > rows:  # every forward below reads the whole batch: bound it
            keep = torch.randperm(data.shape[0], generator=torch.Generator().manual_seed(seed))[:rows]
            data = data[keep.sort().values]
        self.cfg, self.tokens = cfg, data.long()
        self.heads_a, self.units_a = self._read(a)

    def _flat(self, t: torch.Tensor) -> torch.Tensor:
        """(batch, seq, …) → (samples, …)."""
        return t.reshape(-1, *t.shape[2:])

    def _read(self, p: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per layer: head contributions (heads × samples·d) and unit activations (d_ff × samples)."""
        cfg = self.cfg
        heads, units = [], []
        with torch.no_grad():
            x = p["embed.W_E"][self.tokens]
            if cfg.pos == "learned":
                x = x + p["embed.W_pos"][: self.tokens.shape[1]]
            for layer in range(cfg.n_layers):
                pre = f"blocks.{layer}"
                xin = normalize(p, f"{pre}.ln1", cfg, x) if cfg.pre_norm else x
                per = []
                for h in range(cfg.n_heads):
                    only = dict(p)
                    w_o = torch.zeros_like(p[f"{pre}.attn.W_O"])
                    w_o[h] = p[f"{pre}.attn.W_O"][h]
                    only[f"{pre}.attn.W_O"] = w_o
                    only.pop(f"{pre}.attn.b_O", None)
                    per.append(self._flat(attention(only, f"{pre}.attn", cfg, xin)).reshape(-1))
                heads.append(torch.stack(per))
                if cfg.pre_norm and not cfg.parallel_residual:
                    mid = x + attention(p, f"{pre}.attn", cfg, xin)
                    fin = normalize(p, f"{pre}.ln2", cfg, mid)
                elif cfg.pre_norm:
                    fin = normalize(p, f"{pre}.ln2", cfg, x)
                else:  # output norms: the FFN reads the stream after the normed attention output
                    fin = x + normalize(p, f"{pre}.ln1", cfg, attention(p, f"{pre}.attn", cfg, x))
                eye = dict(p)
                eye[f"{pre}.mlp.W_out"] = torch.eye(cfg.d_ff, dtype=torch.float64)
                eye.pop(f"{pre}.mlp.b_out", None)
                units.append(self._flat(mlp(eye, f"{pre}.mlp", cfg, fin)).T)
                x = block(p, cfg, layer, x)
        return heads, units

    def head_costs(self, b: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
        heads_b, _ = self._read(b)
        zero = torch.zeros(self.cfg.n_kv_heads, self.cfg.n_kv_heads, dtype=torch.float64)
        return [(_corr_cost(hb, ha, absolute=False), zero) for hb, ha in zip(heads_b, self.heads_a)]

    def unit_costs(self, b: dict) -> list[list[torch.Tensor]]:
        _, units_b = self._read(b)
        absolute = self.cfg.act == "swiglu"
        return [[_corr_cost(ub, ua, absolute)] for ub, ua in zip(units_b, self.units_a)]
