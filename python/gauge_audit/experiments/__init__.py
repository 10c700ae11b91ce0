"""Numeric experiments that settle claims no single gauge action can: enumerations of discrete
groups, losses before and after every applicable action, several actions on several models.

Each experiment is registered under the claim id it decides (:data:`EXPERIMENTS`) and returns a
:class:`Finding` computed from the measurements; the torch checker turns it into evidence.
Every experiment is deterministic for a seed and bounded in size (its docstring says how).
"""

from __future__ import annotations

from . import alignment, discrete, moe_losses, multi, sharpness  # noqa: F401  (register)
from .registry import EXPERIMENTS, Finding

__all__ = ["EXPERIMENTS", "Finding"]
