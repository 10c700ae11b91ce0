"""Composite group elements: several actions applied one after the other, as one element.

File format (an ``.npz``, like every element): one array per part, named
``NNN.ACTION.PART`` — ``NNN`` the step's position (applied in increasing order), ``ACTION`` the
action's name, ``PART`` the part's name in that action's own element (``M``, ``perm``,
``blocks.0.ln1`` …).  Nothing else is needed to apply it:

    gauge-audit check --model gpt2-tiny --action composite --element g.npz

κ of a composite is the product of its steps' κ (each rounding can be amplified by every step).
"""

from __future__ import annotations

import math
import re

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from .algebra import kappa_of
from .atomic import ATOMIC
from .base import Action, Element, Params

NAME = "composite"
_KEY = re.compile(r"^(\d+)\.([a-z0-9-]+)\.(.+)$")


def is_composite(parts: dict) -> bool:
    return bool(parts) and all(_KEY.match(k) for k in parts)


def make(steps: list[tuple[str, Element]]) -> Element:
    """One element from (action, element) steps in application order."""
    parts = {}
    for i, (action, el) in enumerate(steps):
        if action == NAME:
            raise GaugeAuditError("a composite step cannot itself be composite")
        for k, v in el.parts.items():
            parts[f"{i:03d}.{action}.{k}"] = v
    kappa = math.prod(el.kappa for _, el in steps)
    return Element(parts, kappa, note=" → ".join(a for a, _ in steps))


def steps(el: Element) -> list[tuple[str, Element]]:
    """The (action, element) steps of a composite element, in application order; κ of a step read
    from a file is recomputed from its parts."""
    grouped: dict[int, tuple[str, dict]] = {}
    for key, value in el.parts.items():
        m = _KEY.match(key)
        if not m:
            raise GaugeAuditError(f"composite element part {key!r} is not named STEP.ACTION.PART")
        idx, action, part = int(m.group(1)), m.group(2), m.group(3)
        prev = grouped.setdefault(idx, (action, {}))
        if prev[0] != action:
            raise GaugeAuditError(f"composite step {idx} names two actions ({prev[0]}, {action})")
        prev[1][part] = value
    return [(a, Element(p, kappa_of(a, p))) for _, (a, p) in sorted(grouped.items())]


def kappa(parts: dict) -> float:
    """κ of a composite element read from a file: the product over its steps."""
    return math.prod(e.kappa for _, e in steps(Element(parts, 1.0)))


def _members(cfg: Config) -> list[Action]:
    return [a for a in ATOMIC.values() if a.applies(cfg) is None and a.expected_holds(cfg)]


def sample_applied(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> tuple[Element, Params]:
    """A random composite element and the parameters it maps ``params`` to: each member's element
    is drawn at the point the previous ones reached, so the sampling applies them anyway — the
    same steps, in the same order, as :func:`apply` of the element (equal bit for bit), once."""
    out = []
    for act in _members(cfg):
        try:
            el = act.sample(cfg, params, g, kappa)
        except GaugeAuditError:  # nothing to draw here (e.g. no norm with biased readers)
            continue
        params = act.apply(cfg, params, el)
        out.append((act.name, el))
    return make(out), params


def _sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    return sample_applied(cfg, params, g, kappa)[0]


def apply(cfg: Config, params: Params, el: Element) -> Params:
    """Group: the whole symmetry group the actions know for this architecture (every true action
    that applies), as a product of elements.

    Acts: each step's action on the result of the previous steps, in step order.

    Why: each step preserves the function, so their composition does.  Sampled, it is one random
    element of every true action that applies (each with the requested κ where it has one).
    """
    for action, step in steps(el):
        if action not in ATOMIC:
            raise GaugeAuditError(f"composite step names unknown action {action!r}")
        act = ATOMIC[action]
        reason = act.applies(cfg)
        if reason:
            raise GaugeAuditError(f"composite step {action} does not apply here: {reason}")
        if not act.expected_holds(cfg):
            raise GaugeAuditError(f"composite step {action} is not a symmetry of this architecture")
        params = act.apply(cfg, params, step)
    return params


def _relabel(el: Element, layer: int, idx: torch.Tensor) -> torch.Tensor:
    """Expert labels after the composite → labels before it (through every expert-perm step)."""
    for action, step in reversed(steps(el)):
        relabel = ATOMIC[action].expert_relabel if action in ATOMIC else None
        if relabel is not None:
            idx = relabel(step, layer, idx)
    return idx


ACTIONS = [
    Action(
        NAME,
        "every true action that applies, composed",
        True,
        lambda cfg: None,
        _sample,
        apply,
        generic_kappa=False,
        expert_relabel=_relabel,
        element_layout="whole",
    ),
]
