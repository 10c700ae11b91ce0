"""Apply a gauge action one block at a time, so that a checkpoint larger than memory can be
transformed and checked.

Every action acts on each block through that block's tensors and that block's slice of the
group element only (a per-layer element, a per-norm scale, or a stream rotation shared by all
blocks), plus on the embeddings / final norm / unembedding.  :func:`restrict` cuts the element
to one block (or to the embeddings and head), and :func:`apply_block` runs the action itself —
unchanged — on that block alone, renamed to a one-layer model.  The result equals the
whole-model ``action.apply`` exactly (``tests/test_checkpoint.py`` compares them tensor by tensor
for every action and family).

:class:`TransformedParams` is the lazy result: a mapping that transforms block ``i`` when one of
its tensors is first asked for and keeps only that block (and the transformed embeddings/head).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from ..models.lazy import LazyParams
from .base import Action, Element, Params

_BLOCK = re.compile(r"blocks\.(\d+)\.")


def block_of(name: str) -> int | None:
    """The block index of a parameter name, or None for the embeddings / final norm / head."""
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else None


def _renamed(name: str, i: int, j: int) -> str:
    prefix = f"blocks.{i}."
    return f"blocks.{j}." + name[len(prefix) :] if name.startswith(prefix) else name


def restrict(action: Action, cfg: Config, el: Element, block: int | None) -> Element | None:
    """The part of ``el`` acting on ``block`` (renamed to block 0), or on the embeddings/head when
    ``block`` is None; None when nothing acts there."""
    layout = action.element_layout
    if layout == "shared":
        return el
    if layout == "layers":
        if block is None:
            return None
        parts = {}
        for k, t in el.parts.items():
            if t.dim() == 0 or t.shape[0] != cfg.n_layers:
                raise GaugeAuditError(
                    f"{k} must have a leading layer axis of length {cfg.n_layers}, got shape {tuple(t.shape)}"
                )
            parts[k] = t[block : block + 1]
        return Element(parts, el.kappa, el.note)
    if layout == "norms":
        parts = {}
        for k, t in el.parts.items():
            b = block_of(k + ".")
            if b == block:
                parts[k if block is None else _renamed(k, block, 0)] = t
        return Element(parts, el.kappa, el.note) if parts else None
    raise ValueError(f"unknown element layout {layout!r}")  # pragma: no cover


def apply_block(action: Action, cfg: Config, params: Params, el: Element, block: int | None) -> Params:
    """``action`` on one block's tensors (``blocks.{block}.*``), or on the embeddings / final norm /
    head (``block=None``).  Returns the new tensors under their original names."""
    part = restrict(action, cfg, el, block)
    if part is None:
        return dict(params)
    one = cfg.with_(n_layers=1)
    if block is None:
        return action.apply(one, params, part)
    new = action.apply(one, {_renamed(k, block, 0): v for k, v in params.items()}, part)
    return {_renamed(k, 0, block): v for k, v in new.items()}


def apply_blockwise(action: Action, cfg: Config, params: Params, el: Element) -> Params:
    """The whole model, transformed block by block (equal to ``action.apply``); an action whose
    element couples blocks (layout "whole") at once."""
    if action.element_layout == "whole":
        return action.apply(cfg, dict(params), el)
    out: dict[str, torch.Tensor] = {}
    groups: dict[int | None, dict] = {}
    for k, v in params.items():
        groups.setdefault(block_of(k), {})[k] = v
    for b, group in groups.items():
        out.update(apply_block(action, cfg, group, el, b))
    return {k: out[k] for k in params}


class TransformedParams(LazyParams):
    """``action`` applied to lazily read parameters, one block at a time (see module docstring)."""

    def __init__(self, action: Action, cfg: Config, base: Mapping, el: Element):
        self.action, self.cfg, self.base, self.el = action, cfg, base, el
        self.names: dict[int | None, list[str]] = {}
        for k in base:
            self.names.setdefault(block_of(k), []).append(k)
        self._block: tuple[int | None, Params] | None = None
        self._globals: Params | None = None
        # an element that does not act on the embeddings / final norm / head leaves them as read:
        # passed through on access, never cached (an 8 B model's two are 8.4 GB in float64)
        self._globals_untouched = restrict(action, cfg, el, None) is None
        dtype = getattr(base, "dtype", torch.float64)
        device = getattr(base, "device", torch.device("cpu"))
        shapes = getattr(base, "shapes", None) or {k: tuple(v.shape) for k, v in base.items()}
        super().__init__(shapes, self._transformed, dtype, device)

    def _transformed(self, name: str) -> torch.Tensor:
        b = block_of(name)
        if b is None:
            # past the blocks (the final norm, the head) or before them: no block is needed now, and
            # an 8 B model's float64 block (1.75 GB) next to its head (4.2 GB) would double the peak
            self._block = None
            if self._globals_untouched:
                return self.base[name]
            if self._globals is None:
                self._globals = self._compute(None)
            return self._globals[name]
        if self._block is None or self._block[0] != b:
            self._block = None  # free the previous block before computing the next
            self._block = (b, self._compute(b))
        return self._block[1][name]

    def _compute(self, b: int | None) -> Params:
        return apply_block(self.action, self.cfg, {k: self.base[k] for k in self.names.get(b, [])}, self.el, b)


def transformed(action: Action, cfg: Config, params: Mapping, el: Element) -> Mapping:
    """``action.apply`` for in-memory parameters; block by block, on access, for lazy ones."""
    if isinstance(params, LazyParams):
        if action.element_layout == "whole":  # read in (float64, the whole model) and apply at once
            return action.apply(cfg, {k: params[k] for k in params}, el)
        return TransformedParams(action, cfg, params, el)
    return action.apply(cfg, params, el)
