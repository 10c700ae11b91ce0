"""Time the numeric core: `check --all` over every (model, action) pair, and the
MiniLM gauge checks (real weights, 22.6 M parameters; target ≤ 20 s on 2 CPU cores).

    bash scripts/with-venv.sh python benchmarks/bench_check.py
"""

from __future__ import annotations

import time

import torch

from gauge_audit.models import NAMED, build
from gauge_audit.numeric import check, pairs


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"device {'cuda' if torch.cuda.is_available() else 'cpu'}"
    )
    todo = pairs(list(NAMED))  # the tiny models (real checkpoints: bench_checkpoint.py; MiniLM below)

    def run_all():
        cache = {}
        for m, a in todo:
            cache.setdefault(m, build(m))
            check(cache[m], a, seed=0)

    _, t_all = timed(run_all)
    minilm, t_load = timed(lambda: build("minilm"))
    mini_pairs = [a for m, a in pairs(["minilm"])]
    _, t_mini = timed(lambda: [check(minilm, a, seed=0) for a in mini_pairs])
    _, t_one = timed(lambda: check(minilm, "qk-gl", seed=0))
    print(
        f"every tiny (model, action) pair: {len(todo)} pairs in {t_all:.2f} s ({1e3 * t_all / len(todo):.1f} ms/pair)"
    )
    print(
        f"MiniLM load: {t_load:.2f} s; {len(mini_pairs)} MiniLM checks: {t_mini:.2f} s; one qk-gl check: {t_one:.2f} s"
    )
    print(f"ratio MiniLM load+all checks / 20 s target: {(t_load + t_mini) / 20:.2f}")
    print(f"ratio one MiniLM check / one tiny check: {t_one / (t_all / len(todo)):.1f}")


if __name__ == "__main__":
    main()
