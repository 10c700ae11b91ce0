"""``gauge-audit groups DIR`` on decoders the project has no family file for: five architectures
of 2025–26 (``gauge_audit.testing.DECODER_EXAMPLES``), each at two small configurations, written
offline by transformers and measured on transformers' own float64 forward.  Prints per run the
wall time, the peak memory of the measuring process, the rows the nullity took to converge, and
measured = explained.

    bash scripts/with-venv.sh python benchmarks/bench_groups_derived.py [--only ARCH,...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gauge_audit.models.derived import tiny_checkpoint
from gauge_audit.testing import DECODER_EXAMPLES, DECODER_WIDER

CHILD = (
    "import resource, sys; from gauge_audit.cli import main; rc = main(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)"
)


def child(*argv: str) -> tuple[subprocess.CompletedProcess, float]:
    """``gauge-audit ARGV --json`` in a child process on one thread (its last stderr line: its peak
    resident memory in KiB), and its wall seconds."""
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *argv, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return out, time.time() - t0


def run(*argv: str) -> tuple[dict, float, float]:
    """One command's JSON, its wall seconds and its process's peak resident memory (GiB)."""
    out, wall = child(*argv)
    if out.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)}: {out.stderr.strip()}")
    return json.loads(out.stdout), wall, int(out.stderr.split()[-1]) / 2**20


def selected(description: str, names) -> list[str]:
    """The architectures ``--only A,B`` keeps of ``names`` (all without it); prints the machine."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--only", default="", help="comma-separated architectures")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; one thread per run")
    return [a for a in names if not args.only or a in args.only.split(",")]


def main() -> None:
    archs = selected(__doc__.splitlines()[0], DECODER_EXAMPLES)
    head = f"{'architecture':22s} {'config':7s} {'P':>6s} {'rows':>7s} {'rows/P':>6s} {'nullity':>7s} {'explained':>9s} {'wall s':>7s} {'peak GiB':>8s}"
    print(head)
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            for label, extra in (("small", {}), ("wider", DECODER_WIDER)):
                path = tiny_checkpoint(arch, Path(tmp) / f"{arch}-{label}", 0, **{**DECODER_EXAMPLES[arch], **extra})
                out, wall, peak = run("groups", str(path))
                print(
                    f"{arch:22s} {label:7s} {out['parameters']:6d} {out['rows']:7d} "
                    f"{out['rows'] / out['parameters']:6.1f} {out['nullity']:7d} {out['explained']:9d} "
                    f"{wall:7.1f} {peak:8.2f}" + ("" if out["agrees"] else "  UNEXPLAINED or not converged")
                )


if __name__ == "__main__":
    main()
