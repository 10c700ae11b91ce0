"""Figures and tables for the report, from what the checkers computed in this run."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

from .checkers import Context

# The report's name for each figure (the file name is where it is stored, not what it shows).
FIGURE_TITLES = {
    "error_vs_kappa.png": "Float error of the true gauge actions against the condition number κ of the element",
    "nullity_spectra.png": "Jacobian singular values per configuration: the gap marks the symmetry dimension",
}


def _plotted(key) -> bool:
    """Is this ``Context.cache`` entry something the report plots (the error study, a nullity report)?"""
    return key == "error_study" or (isinstance(key, tuple) and key[0] == "nullity")


def report_state(cache: dict) -> dict:
    """The entries of a ``Context.cache`` that the figures and tables below read (what a worker
    process of the audit hands back)."""
    return {k: v for k, v in cache.items() if _plotted(k)}


def error_study_plot(ctx: Context) -> bytes | None:
    """The error-vs-κ plot of the float error study (if the audit ran it)."""
    study = ctx.cache.get("error_study")
    if study is None:
        return None
    from ..precision.error_study import plot_study

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "error_vs_kappa.png"
        plot_study(study, path)
        return path.read_bytes()


def nullity_reports(ctx: Context) -> list:
    return [v for k, v in sorted(ctx.cache.items(), key=lambda kv: str(kv[0])) if _plotted(k) and k != "error_study"]


def nullity_spectra_plot(ctx: Context) -> bytes | None:
    """One panel per analysed configuration: σ_i/σ_1 with the measured and predicted rank."""
    reports = [r for r in nullity_reports(ctx) if r.singular_values is not None]
    if not reports:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..nullity.analysis import describe

    cols = 3
    rows = (len(reports) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, r in zip(axes.flat, reports):
        s = (r.singular_values / r.singular_values[0]).clamp_min(1e-300).numpy()
        P = len(s)
        ax.semilogy(range(1, P + 1), s, ".", ms=2)
        ax.axvline(P - r.measured_nullity + 0.5, color="tab:red", lw=1, label=f"rank {P - r.measured_nullity}")
        ax.axvline(P - r.explained + 0.5, color="tab:green", lw=1, ls="--", label="P − explained")
        ax.set_title(f"{r.cfg.family}: P={P}, nullity {r.measured_nullity}, gap ×{r.gap_ratio:.1e}", fontsize=9)
        ax.set_xlabel(f"singular value index i\n{describe(r.cfg)}", fontsize=7)
        ax.set_ylabel("σ_i / σ_1", fontsize=8)
        ax.legend(fontsize=7, loc="lower left")
    for ax in list(axes.flat)[len(reports) :]:
        ax.axis("off")
    fig.suptitle("Jacobian singular values (relative); the gap marks the symmetry dimension", fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def nullity_table(ctx: Context) -> dict | None:
    """Measured symmetry dimension per configuration next to each paper's count."""
    reports = nullity_reports(ctx)
    if not reports:
        return None
    from ..nullity.analysis import describe

    rows = []
    for r in reports:
        j = r.to_json()
        pc = j["paper_counts"]
        rows.append(
            [
                f"{r.cfg.family} {describe(r.cfg)}",
                j["params"],
                r.measured_nullity,
                r.explained,
                r.unexplained,
                f"{j['gap_ratio']:.2g}",
                pc["mgs"],
                pc["mgs-variant"],
                pc["van-nierop"],
                pc["wiki-gqa"],
                round(pc["wiki-log-hfact"], 2),
                r.functional_dimension,
                round(r.fdof_bound, 1),
                ", ".join(f"{k} {v}" for k, v in r.family_dims().items()),
            ]
        )
    return {
        "title": "Symmetry dimension: measured (Jacobian nullity) vs the papers' counts",
        "note": "Each row is one small configuration at a generic point (seeded). mgs = Σ_l h(d_k²+d_v²); "
        "mgs-variant = the paper's RoPE/GQA variant; van-nierop = eq. (17); wiki-gqa = n_q·d_k² + "
        "n_kv·d_v²; wiki-log-hfact = h(d_k²+d_v²) + log h!. fdof = P − nullity vs the wiki's P/log P.",
        "columns": [
            "configuration",
            "P",
            "nullity",
            "explained",
            "unexplained",
            "gap",
            "mgs",
            "mgs-variant",
            "van-nierop",
            "wiki-gqa",
            "wiki-log-hfact",
            "fdof",
            "P/log P",
            "families (dimension)",
        ],
        "rows": rows,
    }


def counts_table() -> dict:
    """The papers' redundancy counts for real architectures next to the corrected count."""
    from ..symbolic import counts

    rows = []
    for a in counts.ARCHITECTURES.values():
        b = counts.corrected_count(a)
        dv = a.d_v or a.d_k
        g = a.n_kv_heads or a.n_heads
        rows.append(
            [
                a.name,
                int(counts.mgs_model_dim(a.n_layers, a.n_heads, a.d_k, dv)),
                int(a.n_layers * counts.mgs_gqa_layer_dim(g, a.d_k, dv, rope=a.rope)),
                int(counts.nierop_redundancy(a.n_layers, a.n_heads, a.d_k, a.d_model)),
                int(b.established),
                int(b.total),
            ]
        )
    return {
        "title": "Redundancy counts at scale: the papers' formulas vs the corrected count",
        "note": "corrected = every continuous family the theory establishes for the architecture (biases, "
        "norms, stream rotation only where it exists — not with tied embeddings and an affine final "
        "norm); total adds the parts marked conjecture in gauge_audit.symbolic.counts.",
        "columns": [
            "architecture",
            "mgs G_Model",
            "mgs variant (RoPE/GQA)",
            "van Nierop eq. 17",
            "corrected (established)",
            "corrected (total)",
        ],
        "rows": rows,
    }


def collect(ctx: Context) -> tuple[dict[str, bytes], dict]:
    plots, extras = {}, {}
    for name, fn in (("error_vs_kappa.png", error_study_plot), ("nullity_spectra.png", nullity_spectra_plot)):
        png = fn(ctx)
        if png:
            plots[name] = png
    table = nullity_table(ctx)
    if table:
        extras["nullity"] = table
    extras["counts"] = counts_table()
    return plots, extras
