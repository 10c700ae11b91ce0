"""Alignment of two models that are not equivalent: B' = g·B for an element g of B's gauge group
chosen to bring B' as close to A as the group allows (for merging and linear mode connectivity).

* :func:`align` — (Config, A, B) → :class:`Alignment`: B' (B's keys and dtypes), the composite
  element g (applicable with the actions: ``gauge-audit check --action composite --element``), the
  distance ‖A − B'‖/‖A‖ per tensor group before and after every stage.

Modules: :mod:`.assignment` (the linear assignment problem, budgeted), :mod:`.matching` (heads, KV
groups, units, experts), :mod:`.procrustes` (the continuous fits), :mod:`.continuous` (one element
builder per continuous action), :mod:`.translations` (the bias and offset translations, least
squares), :mod:`.activations` (matching by activations on data),
:mod:`.pipeline` (the stages and their alternation).
"""

from .pipeline import GROUPS, VO_GROUPS, Alignment, align, stage_names

__all__ = ["GROUPS", "VO_GROUPS", "Alignment", "align", "stage_names"]
