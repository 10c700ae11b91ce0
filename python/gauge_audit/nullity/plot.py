"""The singular-value spectrum with the rank gap and the theory's predicted rank marked."""

from __future__ import annotations

from ..errors import GaugeAuditError


def plot_spectrum(report, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report.singular_values
    if s is None:
        raise GaugeAuditError("no spectrum to plot (the matrix-free path does not compute one)")
    r = (s / s[0]).clamp_min(1e-300).numpy()
    P = len(r)
    rank = P - report.measured_nullity
    predicted = P - report.explained
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.semilogy(range(1, P + 1), r, ".", ms=2, color="tab:blue", label="σ_i / σ_1")
    ax.axvline(rank + 0.5, color="tab:red", lw=1, label=f"measured rank {rank} (gap ×{report.gap_ratio:.2g})")
    ax.axvline(predicted + 0.5, color="tab:green", lw=1, ls="--", label=f"predicted rank P − explained = {predicted}")
    ax.axhline(report.threshold_rel, color="gray", lw=0.8, ls=":", label="threshold (geometric mean at the gap)")
    ax.set_xlabel("index i")
    ax.set_ylabel("relative singular value")
    ax.set_title(f"{report.cfg.family}: P = {P}, nullity {report.measured_nullity}, explained {report.explained}")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise GaugeAuditError(f"cannot write plot {path}: {exc}") from None
    finally:
        plt.close(fig)
