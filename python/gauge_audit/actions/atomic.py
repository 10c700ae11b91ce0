"""Every action but the composite, by name: the members a composite element is made of.

Its own module so that :mod:`.composite` reads its members from here while the package's
``ACTIONS`` (these plus the composite) is built above both.
"""

from __future__ import annotations

from . import attention, ffn, offsets, parallel, qk_norm, stream
from .base import Action

ATOMIC: dict[str, Action] = {
    a.name: a
    for a in (*attention.ACTIONS, *stream.ACTIONS, *ffn.ACTIONS, *offsets.ACTIONS, *parallel.ACTIONS, *qk_norm.ACTIONS)
}
