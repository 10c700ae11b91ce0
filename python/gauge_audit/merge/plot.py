"""The loss-along-the-path figure of ``gauge-audit barrier``."""

from __future__ import annotations

from pathlib import Path

from .loss import BarrierCurve

FIGURE_TITLE = "Held-out loss along the linear path between two models"


def plot_curves(curves: dict[str, BarrierCurve], out: str | Path, subtitle: str = "") -> None:
    """One line per curve (label → curve), the chord of each dashed, barrier in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, c in curves.items():
        (line,) = ax.plot(c.ts, c.losses, "o-", ms=3, label=f"{label}: barrier {c.barrier:.4g}")
        ax.plot([0, 1], [c.losses[0], c.losses[-1]], "--", lw=0.8, color=line.get_color())
    ax.set_xlabel("interpolation t  (θ = (1 − t)·θ_A + t·θ_B)")
    ax.set_ylabel("mean token cross-entropy (nats)")
    ax.set_title(FIGURE_TITLE + (f"\n{subtitle}" if subtitle else ""), fontsize=9)
    ax.legend(fontsize=8, loc="upper left")  # the ends are low, the peak is in the middle
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
