"""The shell examples of README.md and docs/ whose output is shown, run as a user runs them.

A page marks each ```console block it shows with its output by an HTML comment on the line
before it (invisible in the rendered page):

    <!-- run -->                   executed and compared (a cheap example)
    <!-- run: slow -->             executed and compared, but expensive
    <!-- run: catalog -->          ``gauge-audit audit [--only …]``: compared with the test session's
                                   audit of the catalog, which the suite runs anyway
    <!-- not-run: REASON -->       shown, not executed; tests/test_docs.py lists it with the reason

Inside a block, a line starting with ``$ `` is a command (``gauge-audit …`` only: run in this
process through ``gauge_audit.cli.main``, so no interpreter start-up per example), the lines
up to the next command are its output (stdout and stderr together).  A ```toml block preceded by
``<!-- file: NAME -->`` is written to NAME in the examples' working directory before any command
runs, so the claim file a page shows is the file its commands read.  Outputs are compared after
:func:`normalise` (wall times and the working directory vary between runs) with
:func:`same_output`: the seeds are fixed and the audit is reproducible whatever the thread count,
but the last digits of rounding-level numbers are the processor's BLAS kernels', so decimals are
compared within a factor and everything else exactly.

    python tests/docs_examples.py --write [PAGE ...]   # rerun the executed examples, rewrite the outputs
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_BLOCK = re.compile(
    r"^<!-- (run|run: slow|run: catalog|not-run: (?P<reason>[^>]*?)) -->\n```console\n(?P<body>.*?)^```$", re.M | re.S
)
_ANY_CONSOLE = re.compile(r"^```console\n(?P<body>.*?)^```$", re.M | re.S)
_FILE = re.compile(r"^<!-- file: (?P<name>[\w./-]+) -->\n```toml\n(?P<body>.*?)^```$", re.M | re.S)
#: the terminal width the examples run at (tables adapt to it)
COLUMNS = 120
_TIME = re.compile(r"\b\d+(?:\.\d+)? ?(?:s|ms|min)\b")


@dataclass
class Example:
    page: Path
    mode: str  # "run", "slow" or "not-run"
    reason: str
    commands: list[tuple[str, str]] = field(default_factory=list)  # (command, shown output)
    span: tuple[int, int] = (0, 0)  # the block body in the page text


def normalise(text: str, cwd: str | Path = "", times: bool = True) -> str:
    """The working directory → ``.``, times → ``<t>`` (unless ``times=False``), trailing blanks dropped."""
    if cwd:
        text = text.replace(str(cwd) + "/", "").replace(str(cwd), ".")
    if times:
        text = _TIME.sub("<t>", text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


# A number in printed output: digits with optional thousands separators, decimals and exponent.
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")
#: how far a rounding-level number may move between machines: residuals at the rounding level,
#: gap ratios and fitted κ bounds follow the last bits of the BLAS kernels, which differ between
#: processors (2.851 ε on an AMD EPYC, 3.11 ε on an Intel Xeon; a dps-100 residual 5.09e-100
#: against 1.29e-99, an error-study point 3.77e+03 ε against 8.18e+03 ε); the factor is wide for
#: those and still tells an ε-level residual from a failing one (≥ 10⁶ ε) or a changed tolerance
#: by an order of magnitude
ROUNDING_FACTOR = 4.0


def _numbers(text: str) -> tuple[list[str], list[tuple[str, bool]]]:
    """The text as whitespace-separated tokens with every number replaced by ``#``, and the numbers,
    each with whether it is a measurement in units of ε (``8 ε``: a rounding-level residual even
    where it prints without decimals)."""
    nums = [(m.group(0), text[m.end() : m.end() + 2].lstrip().startswith("ε")) for m in _NUMBER.finditer(text)]
    return _NUMBER.sub("#", text).split(), nums


def _close(a: str, b: str, measured: bool = False) -> bool:
    if a == b:
        return True
    # counts, sizes, nullities: no slack (a number of ε is a measurement, not a count)
    exact = not measured and not any(c in x for x in (a, b) for c in ".eE")
    if exact:
        return False
    x, y = float(a.replace(",", "")), float(b.replace(",", ""))
    if x == 0.0 or y == 0.0 or (x < 0) != (y < 0):
        return False
    return 1.0 / ROUNDING_FACTOR <= x / y <= ROUNDING_FACTOR


def same_output(shown: str, got: str) -> bool:
    """Shown and printed output (both through :func:`normalise`) agree: the same words, verdicts,
    integers and table layout up to white space, and every decimal number within
    :data:`ROUNDING_FACTOR` of the shown one (its last digits are the processor's)."""
    if shown == got:
        return True
    (ws, ns), (wg, ng) = _numbers(shown), _numbers(got)
    return ws == wg and len(ns) == len(ng) and all(_close(a, b, m) for (a, m), (b, _) in zip(ns, ng))


def _parse(body: str) -> list[tuple[str, str]]:
    out: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            out.append((line[2:].strip(), []))
        elif out:
            out[-1][1].append(line)
    return [(cmd, "\n".join(lines)) for cmd, lines in out]


def examples(page: Path) -> list[Example]:
    text = page.read_text(encoding="utf-8")
    found = []
    for m in _BLOCK.finditer(text):
        mode = {"run": "run", "run: slow": "slow", "run: catalog": "catalog"}.get(m.group(1), "not-run")
        found.append(Example(page, mode, (m.group("reason") or "").strip(), _parse(m.group("body")), m.span("body")))
    return found


def unmarked(page: Path) -> list[str]:
    """Console blocks that show output but carry no marker: each must be marked one way or the other."""
    text = page.read_text(encoding="utf-8")
    marked = {m.span("body") for m in _BLOCK.finditer(text)}
    return [
        m.group("body").splitlines()[0]
        for m in _ANY_CONSOLE.finditer(text)
        if m.span("body") not in marked and any(out.strip() for _, out in _parse(m.group("body")))
    ]


def files(pages=PAGES) -> dict[str, str]:
    out: dict[str, str] = {}
    for page in pages:
        for m in _FILE.finditer(page.read_text(encoding="utf-8")):
            out[m.group("name")] = m.group("body")
    return out


def prepare(cwd: Path, pages=PAGES) -> None:
    """The working directory the examples run in: the repository's claims/ and every page's file."""
    (cwd / "claims").symlink_to(ROOT / "claims")
    for name, body in files(pages).items():
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_text(body, encoding="utf-8")


def run(command: str, cwd: Path) -> tuple[int, str]:
    """One ``gauge-audit`` command in this process; (exit status, stdout + stderr)."""
    from gauge_audit.cli import main

    argv = shlex.split(command)
    if argv[:1] != ["gauge-audit"]:
        raise ValueError(f"only gauge-audit commands are executed: {command}")
    buf = io.StringIO()
    old = Path.cwd()
    os.chdir(cwd)
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)  # tables fit the terminal: the pages show them at this width
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                rc = main(argv[1:])
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(old)
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return rc, buf.getvalue()


def run_all(cwd: Path, pages=PAGES, modes=("run", "slow")) -> dict[str, tuple[int, str]]:
    """Every executed command of every page once (a command shown twice runs once)."""
    results: dict[str, tuple[int, str]] = {}
    for page in pages:
        for ex in examples(page):
            if ex.mode not in modes:
                continue
            for cmd, _ in ex.commands:
                if cmd not in results:
                    results[cmd] = run(cmd, cwd)
    return results


def _write(cwd: Path, pages=PAGES) -> None:
    results = run_all(cwd, pages, modes=("run", "slow", "catalog"))
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for ex in reversed(examples(page)):
            if ex.mode == "not-run":
                continue
            body = "".join(
                f"$ {cmd}\n" + (normalise(results[cmd][1], cwd, times=False) + "\n").lstrip("\n")
                for cmd, _ in ex.commands
            )
            text = text[: ex.span[0]] + body + text[ex.span[1] :]
        page.write_text(text, encoding="utf-8")
        print(f"wrote {page.relative_to(ROOT)}")


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:2] != ["--write"]:
        sys.exit(__doc__)
    chosen = [ROOT / a for a in sys.argv[2:]] or PAGES  # --write [PAGE ...]: only these pages
    with tempfile.TemporaryDirectory() as tmp:
        prepare(Path(tmp))
        _write(Path(tmp), chosen)
    shutil.rmtree(ROOT / "site", ignore_errors=True)
