"""Every action but the composite, by name: the members a composite element is made of.

Its own module so that :mod:`.composite` reads its members from here while the package's
``ACTIONS`` (these plus the composite) is built above both.
"""

from __future__ import annotations

from . import attention, ffn, mla, offsets, parallel, qk_norm, stream
from .base import Action

# every action refuses a multi-head latent attention model with its reason unless it carries over (mla.gated)
ATOMIC: dict[str, Action] = {
    a.name: mla.gated(a)
    for a in (
        *attention.ACTIONS,
        *stream.ACTIONS,
        *ffn.ACTIONS,
        *offsets.ACTIONS,
        *parallel.ACTIONS,
        *qk_norm.ACTIONS,
        *mla.ACTIONS,
    )
}
