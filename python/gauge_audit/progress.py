"""Progress bars for long phases (nullity sketch and certificate, the error study, the
audit, checkpoint loading).

Bars go to stderr and appear only when stderr is a terminal and the command is not
writing JSON: a pipe, a log file, CI and ``--json`` output stay byte-for-byte quiet.
The bars are tqdm's; nothing here writes carriage returns by hand.

Usage::

    from gauge_audit.progress import bar, quiet
    for item in bar(items, desc="audit", unit="claim"):
        ...
    with bar(total=n_rows, desc="sketch", unit="row") as b:
        b.update(k)

The CLI wraps JSON-producing runs in ``with quiet():``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tqdm import tqdm

_quiet_depth = 0


def enabled() -> bool:
    """True when a bar would be drawn: stderr is a terminal and no ``quiet()`` is active."""
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        tty = False
    return tty and _quiet_depth == 0


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Suppress every bar inside the block (used for ``--json``)."""
    global _quiet_depth
    _quiet_depth += 1
    try:
        yield
    finally:
        _quiet_depth -= 1


def bar(
    iterable: Iterable | None = None,
    *,
    total: float | None = None,
    desc: str | None = None,
    unit: str = "it",
    leave: bool = False,
    disable: bool | None = None,
    **kw,
) -> tqdm:
    """A tqdm bar on stderr, disabled (a no-op wrapper) unless :func:`enabled`; ``disable=True``
    turns it off regardless."""
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        leave=leave,
        file=sys.stderr,
        disable=bool(disable) or not enabled(),
        dynamic_ncols=True,
        **kw,
    )


def ticker(desc: str, unit: str = "it") -> Callable[[int, int], None] | None:
    """A ``progress(i, n)`` callback for library code that reports counts (i of n done),
    drawing one bar; ``None`` when bars are off, so callers skip the call entirely."""
    if not enabled():
        return None
    state: dict = {}

    def tick(i: int, n: int) -> None:
        b = state.get("bar")
        if b is None or b.total != n:
            if b is not None:
                b.close()
            b = state["bar"] = bar(total=n, desc=desc, unit=unit)
        b.update(i - b.n)
        if i >= n:
            b.close()
            state.pop("bar")

    return tick


def note(text: str) -> None:
    """A status line on stderr, above any active bar — only where bars are drawn."""
    if enabled():
        tqdm.write(text, file=sys.stderr)


def echo(text: str) -> None:
    """Print a line to stdout without tearing an active bar (tqdm.write clears and redraws it)."""
    if enabled():
        tqdm.write(text, file=sys.stdout)
        sys.stdout.flush()
    else:
        print(text, flush=True)


def timed_call(
    fn: Callable[..., Any], *args, expected_seconds: float, desc: str, disable: bool = False, **kwargs
) -> Any:
    """``fn(*args, **kwargs)`` — one long library call (a LAPACK factorisation) that reports no
    progress of its own — with a bar that advances with the elapsed time against the cost
    model's ``expected_seconds`` (shown as such: "s" units, never past 99 % before it returns).
    Without a terminal it is a plain call.  Torch releases the GIL in such calls, so the bar
    runs on this thread while ``fn`` runs on a worker; exceptions are re-raised here."""
    if disable or not enabled():
        return fn(*args, **kwargs)
    out: dict = {}

    def work():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised on the caller's thread
            out["error"] = exc

    total = max(0.1, float(expected_seconds))
    worker = threading.Thread(target=work, daemon=True)
    t0 = time.perf_counter()
    worker.start()
    with bar(
        total=round(total, 1),
        desc=desc,
        unit="s",
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s (estimated) [{elapsed}]",
    ) as b:
        while worker.is_alive():
            worker.join(0.25)
            b.update(min(time.perf_counter() - t0, 0.99 * total) - b.n)
        b.update(total - b.n)
    if "error" in out:
        raise out["error"]
    return out["value"]
