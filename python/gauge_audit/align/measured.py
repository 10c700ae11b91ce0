"""``align`` for a decoder without a family file: B′ = g·B for an element g of the group measured
on B's own forward, as close to A as the search of :func:`gauge_fix.measured.fit` brings it.

The search is compare's, run from B towards A: the stream from the embeddings (reflected first
where the orientations differ), the norm folds, units, experts, KV groups and query heads matched
(greedy on normalised rows and columns — Git Re-Basin's weight matching, plus heads), rotary quarter
turns, each other flat family read off its own tensors, then every flat coefficient polished
together (Levenberg–Marquardt on the per-tensor relative residual ‖g·B − A‖/‖A‖).  For a gauge copy
it lands on A; for an independently trained model it is the alignment that merging starts from.
B′ computes B's function: it is written with ``save_pretrained`` and certified by transformers'
float64 logits of the written files, as ``transform`` does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch

from ..actions.candidates import discrete
from ..errors import GaugeAuditError
from ..gauge_fix.measured import BUDGET_S, fit, same_shapes
from ..measured import Measured, described, held_maps, stored_dtype, write_moved
from ..models.checkpoint.writer import refuse_existing
from ..models.derived import load
from ..nullity.found import measure
from ..runtime import reproducible

Params = dict[str, torch.Tensor]


def distance(a: Params, b: Params) -> tuple[float, str, float]:
    """‖A − B‖/‖A‖ over every tensor; the tensor farthest apart and its own relative distance."""
    num = sum(float(((a[n] - b[n]) ** 2).sum()) for n in a)
    den = sum(float((a[n] ** 2).sum()) for n in a)
    per = {n: float((a[n] - b[n]).norm() / a[n].norm().clamp_min(1e-300)) for n in a}
    worst = max(per, key=per.__getitem__)
    return math.sqrt(num / den), worst, per[worst]


def align_checkpoints(
    a: Path,
    b: Path,
    out: Path,
    *,
    seed: int = 0,
    budget_s: float = BUDGET_S,
    say: Callable[[str], None] = lambda line: None,
) -> dict:
    """Measure B's group on its own forward, search g bringing g·B closest to A, write g·B to
    ``out`` with its certificate and report.json; the report."""
    refuse_existing(out)
    with reproducible():  # small models: one thread, the same report whatever the thread count
        say(f"align: measuring the group of {b} on transformers' own forward ...")
        mb, desc = described(b, seed, "align")
        ma = load(a, seed)
        if ma.name != mb.name:
            raise GaugeAuditError(f"different architectures: {ma.name} vs {mb.name}")
        same_shapes(ma.state, mb.state)
        m = Measured(mb, desc, measure(mb, desc, seed, quiet=True))
        held = held_maps(m, discrete(desc, mb.params))
        say("align: searching the element ...")
        r = fit(mb, desc, m.found.flat, held, ma.state, stored_dtype(a), budget_s, search_always=True)
        assert r.params is not None and r.kappa is not None
        before, after = distance(ma.state, mb.state), distance(ma.state, r.params)
        about = {"action": f"aligned to {a}", "families": [f"{f.name} {f.scope}" for f, _ in m.found.flat]}
        cert = write_moved(m, b, r.params, r.kappa, out, stored_dtype(b), about, seed, say)
        report = {
            "a": str(a),
            "b": str(b),
            "architecture": mb.name,
            "derived": True,
            "group": {"nullity": m.found.nullity, "explained": m.found.explained, "converged": m.found.converged},
            "distance_before": before[0],
            "distance_after": after[0],
            "farthest_tensor_after": {"name": after[1], "distance": after[2]},
            # what a copy of A reaches: A's storage rounding and g·B's float64 rounding, 4·(ε_A/2 + κ·m·ε₆₄)
            "copy_tolerance": r.residual_tolerance,
            "kappa": r.kappa,
            "matches": r.matches,
            "steps": r.steps,
            "seconds": r.seconds,
            "certificate": cert,
        }
        (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def format_report(report: dict) -> str:
    c = report["certificate"]
    far = report["farthest_tensor_after"]
    return "\n".join(
        [
            f"A: {report['a']}",
            f"B: {report['b']} ({report['architecture']}, derived; its group measured on its own forward: "
            f"nullity {report['group']['nullity']}, explained {report['group']['explained']})",
            *(f"  {s}" for s in report["steps"]),
            f"‖A − B‖/‖A‖ {report['distance_before']:.4g} → ‖A − g·B‖/‖A‖ {report['distance_after']:.4g} "
            f"(farthest: {far['name']} {far['distance']:.3g}); κ(g) = {report['kappa']:.4g}",
            f"same function: {c['verdict']} — transformers' float64 logits of the written checkpoint change by "
            f"{c['residual_eps']:.3g} ε({c['dtype']}); statistical tolerance {c['tolerance_statistical_eps']:.4g} ε, "
            f"worst case {c['tolerance_eps']:.4g} ε",
        ]
    )
