"""``gauge-audit audit``: settle every claim of a catalog four ways and write the report."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

from ..audit.checkers import Context
from ..audit.evidence import CORRECTED, FAILS, HOLDS, UNDECIDED
from ..audit.parallel import MAX_JOBS
from ..audit.run import audit
from ..claims import load_catalog
from ..errors import GaugeAuditError
from ..progress import bar
from ..runtime import keep_freed_memory, reproducible, resolve_device
from .output import new_dir, refuse_existing

VERDICTS = (HOLDS, FAILS, CORRECTED, UNDECIDED)


def register(sub) -> None:
    p = sub.add_parser(
        "audit",
        help="audit claims (default: the built-in catalog) and write a report",
        description="Run every applicable checker (Lean, SymPy, mpmath, torch, nullity) on each "
        "claim, combine the evidence into a verdict and write report.md/json/html.",
    )
    p.add_argument("files", nargs="*", metavar="CLAIMS.toml", help="claim files (default: claims/*.toml)")
    p.add_argument("--only", help="comma-separated claim ids")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (models, elements, inputs)")
    p.add_argument(
        "--device",
        default="cpu",
        choices=("auto", "cpu", "cuda"),
        help="where the torch checks run (auto: CUDA when visible)",
    )
    p.add_argument("--out", default="reports/latest", help="report directory; must not exist (see --force)")
    p.add_argument(
        "--force", action="store_true", help="replace an existing --out directory (once the new report is complete)"
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="also run the heavy parts (large κ sweeps, larger nullity runs, 4 sequences per real checkpoint, not 2)",
    )
    p.add_argument(
        "--fail-on", metavar="VERDICT", help=f"exit 1 if any claim gets this verdict ({', '.join(VERDICTS)})"
    )
    p.add_argument("--json", action="store_true", help="print report.json instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bar (it is drawn only when stderr is a terminal)")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        metavar="M",
        help="bound the whole run: checks not started within M minutes are NOT-RUN (and say so), "
        "the rule checkers' searches get at most what is left (default 0: no limit)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=0,
        metavar="N",
        help="worker processes for the checks (default 0: one per usable core, at most "
        f"{MAX_JOBS}, when the claims repay it; 1: this process only); the report does not depend on it",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..audit.plots import collect
    from ..report import terminal_table, write
    from ..report.documents import counts_table

    if args.fail_on and args.fail_on not in VERDICTS:
        raise GaugeAuditError(f"--fail-on must be one of {', '.join(VERDICTS)}")
    if not (args.max_minutes >= 0 and math.isfinite(args.max_minutes)):
        raise GaugeAuditError("--max-minutes must be a finite number >= 0 (0: no limit)")
    resolve_device(args.device)
    catalog = load_catalog(args.files or None)
    claims = list(catalog.values())
    if args.only:
        wanted = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = [x for x in wanted if x not in catalog]
        if unknown:
            raise GaugeAuditError(f"unknown claim id(s): {', '.join(unknown)}")
        claims = [catalog[x] for x in wanted]
    if args.jobs < 0:
        raise GaugeAuditError("--jobs must be >= 0 (0: one per usable core)")
    refuse_existing(Path(args.out), args.force)  # before minutes of work, after the inputs' errors
    ctx = Context(seed=args.seed, device=args.device, full=args.full)
    keep_freed_memory()
    with _AuditBar(sum(len(c.checkers) for c in claims), args.quiet) as progress:
        report = audit(claims, ctx, progress=progress, max_minutes=args.max_minutes or None, jobs=args.jobs)
    with reproducible():  # the plots' data, in report.json: as reproducible as the audit
        plots, extras = collect(ctx)
    report.extras.update(extras)
    report.extras["documents"] = counts_table(report.results)
    with new_dir(Path(args.out), args.force) as tmp:
        paths = write(report, tmp, plots)
    paths = {name: Path(args.out) / p.name for name, p in paths.items()}
    if args.json:
        sys.stdout.write(paths["report.json"].read_text(encoding="utf-8"))
    else:
        # a terminal's own width (at least 100 columns); captured output keeps 140, so it reads the same everywhere
        width = shutil.get_terminal_size((140, 24)).columns if sys.stdout.isatty() else 140
        print(terminal_table(report, width=max(100, width)))
        print(f"report: {paths['report.md']}, {paths['report.html']}, {paths['report.json']}")
    if args.fail_on and any(r.verdict.verdict == args.fail_on for r in report.results):
        return 1
    return 0


class _AuditBar:
    """A bar over every (claim, checker) step, naming the running step, with one line per
    finished step above it — on a terminal only (quiet in pipes, logs and under --json)."""

    def __init__(self, total: int, off: bool):
        self.bar = bar(total=total, desc="audit", unit="check", disable=off or None)

    def __enter__(self):
        return self if not self.bar.disable else None

    def __exit__(self, *exc):
        self.bar.close()

    def start(self, claim_id: str, checker: str) -> None:
        self.bar.set_postfix_str(f"{claim_id} / {checker}")

    def done(self, line: str) -> None:
        self.bar.update(1)
        self.bar.write(line, file=sys.stderr)
