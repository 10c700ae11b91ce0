"""Merging two models of one architecture: the straight path θ(t) = (1 − t)·θ_A + t·θ_B′ and the
loss barrier along it (linear mode connectivity), with B′ = B or B′ = g·B aligned to A by
:mod:`gauge_audit.align`.

    pair.py   open A and B, refuse pairs that do not share a configuration, align B (optional)
    path.py   the interpolation (exact at both ends) and the distance ‖A − B′‖/‖A‖
    loss.py   held-out tokens (text, byte-level, or .npy ids), mean cross-entropy, the barrier
    plot.py   the loss-along-the-path figure
"""

from .loss import BarrierCurve, barrier_curve, load_tokens, mean_loss
from .pair import Pair, align_pair, open_pair
from .path import distance, interpolate

__all__ = [
    "BarrierCurve",
    "Pair",
    "align_pair",
    "barrier_curve",
    "distance",
    "interpolate",
    "load_tokens",
    "mean_loss",
    "open_pair",
]
