"""Gauge actions: each a named pure function ``params -> params`` (never mutating
its input), with its group, its preconditions and a seeded sampler."""

from __future__ import annotations

from ..errors import GaugeAuditError
from . import composite
from .atomic import ATOMIC
from .base import Action, Element

ACTIONS: dict[str, Action] = {**ATOMIC, **{a.name: a for a in composite.ACTIONS}}


def get_action(name: str | None) -> Action:
    if name is None or name not in ACTIONS:
        raise GaugeAuditError(f"unknown action {name!r}; known: {', '.join(ACTIONS)}")
    return ACTIONS[name]


__all__ = ["ACTIONS", "Action", "Element", "get_action"]
