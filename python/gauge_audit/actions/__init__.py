"""Gauge actions: each a named pure function ``params -> params`` (never mutating
its input), with its group, its preconditions and a seeded sampler."""

from __future__ import annotations

from ..errors import GaugeAuditError
from . import attention, composite, ffn, offsets, qk_norm, stream
from .base import Action, Element

ACTIONS: dict[str, Action] = {a.name: a for a in (*attention.ACTIONS, *qk_norm.ACTIONS, *stream.ACTIONS, *ffn.ACTIONS,
                                                  *offsets.ACTIONS, *composite.ACTIONS)}


def get_action(name: str) -> Action:
    try:
        return ACTIONS[name]
    except KeyError:
        raise GaugeAuditError(f"unknown action {name!r}; known: {', '.join(ACTIONS)}") from None


__all__ = ["ACTIONS", "Action", "Element", "get_action"]
