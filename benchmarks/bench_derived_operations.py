"""``check``, ``transform``, ``compare`` and ``canonicalize`` on decoders the project has no family file for: the five
architectures of ``gauge_audit.testing.DECODER_EXAMPLES`` at their small configuration, written
offline by transformers.  Each command measures the group on transformers' own float64 forward
first, then acts with it.  Prints per command the wall time, the peak memory of its process and
its outcome (rows that hold; the certificate's residual against its tolerance; the verdict; how far
apart the canonical forms of the checkpoint and of its moved copy are, per tensor ‖Δ‖/‖A‖ — a
``1 + w`` norm weight, whose canonical value is 0, as ‖Δ‖/√n).

    bash scripts/with-venv.sh python benchmarks/bench_derived_operations.py [--only ARCH,...]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from safetensors.torch import load_file

from bench_groups_derived import run, selected  # one command in a child process: its JSON, wall time and peak memory
from gauge_audit.models.derived import tiny_checkpoint
from gauge_audit.testing import DECODER_EXAMPLES


def _apart(a, b) -> float:
    """‖a − b‖/‖a‖; a tensor the canonical form sets to 0 (a ``1 + w`` norm weight) as ‖a − b‖/√n."""
    ref = float(a.norm())
    return float((a - b).norm()) / (ref if ref > 1e-8 else a.numel() ** 0.5)


def main() -> None:
    archs = selected(__doc__.splitlines()[0], DECODER_EXAMPLES)
    print(f"{'architecture':22s} {'command':22s} {'wall s':>7s} {'peak GiB':>8s}  outcome")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            a = tiny_checkpoint(arch, Path(tmp) / arch, 0, **DECODER_EXAMPLES[arch])
            other = tiny_checkpoint(arch, Path(tmp) / f"{arch}-1", 1, **DECODER_EXAMPLES[arch])
            moved = Path(tmp) / f"{arch}-moved"
            out, wall, peak = run("check", "--checkpoint", str(a))
            rows = out["checks"]
            worst = max(r["residual_eps"] / r["tolerance_eps"] for r in rows)
            held = sum(r["verdict"].startswith("HOLDS") for r in rows)
            print(
                f"{arch:22s} {'check':22s} {wall:7.1f} {peak:8.2f}  {held}/{len(rows)} hold, worst residual/tol {worst:.2g}"
            )
            out, wall, peak = run("transform", "--checkpoint", str(a), "--action", "composite", "--out", str(moved))
            print(
                f"{'':22s} {'transform composite':22s} {wall:7.1f} {peak:8.2f}  {out['verdict']} "
                f"(κ {out['kappa']:.2g}: {out['residual_eps']:.3g} ε ≤ {out['tolerance_eps']:.3g} ε)"
            )
            for label, b in (("compare with it", moved), ("compare other seed", other)):
                out, wall, peak = run("compare", str(a), str(b))
                detail = (
                    f"residual {out['residual']:.2g} ≤ {out['residual_tolerance']:.2g}"
                    if out["residual"] is not None
                    else f"logits differ by {out['function_distance']:.2g}"
                )
                print(f"{'':22s} {label:22s} {wall:7.1f} {peak:8.2f}  {out['verdict']} ({detail})")
            forms = []
            for label, src in (("canonicalize", a), ("canonicalize moved", moved)):
                dst = Path(tmp) / f"{arch}-{label.replace(' ', '-')}"
                out, wall, peak = run("canonicalize", "--checkpoint", str(src), "--out", str(dst))
                forms.append(load_file(str(dst / "model.safetensors")))
                f = out["function"]
                print(
                    f"{'':22s} {label:22s} {wall:7.1f} {peak:8.2f}  {f['verdict']} (κ {out['kappa']:.2g}, "
                    f"{sum(out['conditions'].values())} conditions, {f['residual_eps']:.3g} ε ≤ {f['tolerance_eps']:.3g} ε)"
                )
            apart = max(_apart(forms[0][n], forms[1][n]) for n in forms[0])
            print(f"{'':22s} {'canonical forms apart':22s} {'':7s} {'':8s}  {apart:.2g}")


if __name__ == "__main__":
    main()
