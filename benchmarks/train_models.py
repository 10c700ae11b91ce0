"""Train the model pairs of the merging experiments (two seeds per architecture) into a cache
directory, skipping any model already there.

    python benchmarks/train_models.py --cache ~/.cache/gauge-audit/merge-models

Each model: byte-level Shakespeare (see gauge_audit.training.corpus), d 128, 4 layers, context
128, 400 steps of 16 windows, one thread — about 2 CPU-minutes on a 2-core x86 laptop-class CPU.
The directory is not part of the repository; bench_merge.py reads it.  It also receives
heldout.txt, the held-out plays as one text file (for `gauge-audit barrier --data`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gauge_audit.training import corpus
from gauge_audit.training import train as T

SEEDS = (0, 1)


def model_dir(cache: Path, arch: str, seed: int) -> Path:
    return cache / f"{arch}-seed{seed}"


def ensure(cache: Path, archs=T.ARCHS, seeds=SEEDS, max_seconds: float = 720.0) -> dict:
    """Train every (arch, seed) missing from cache; returns {(arch, seed): record}."""
    out = {}
    for arch in archs:
        for seed in seeds:
            d = model_dir(cache, arch, seed)
            rec = d / "training.json"
            if rec.is_file() and (d / "model.safetensors").is_file():
                out[arch, seed] = json.loads(rec.read_text())
                continue
            out[arch, seed] = T.train(arch, seed, d, max_seconds=max_seconds, log=lambda s: print(s, flush=True))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", required=True, type=Path, help="directory of the trained models")
    ap.add_argument("--arch", choices=T.ARCHS, action="append", help="only this architecture (repeatable)")
    ap.add_argument("--max-seconds", type=float, default=720.0, help="CPU-second budget per model")
    a = ap.parse_args(argv)
    try:
        recs = ensure(a.cache, tuple(a.arch or T.ARCHS), max_seconds=a.max_seconds)
    except FileNotFoundError as exc:
        print(f"train_models: {exc}", file=sys.stderr)
        return 2
    # the held-out plays as one text file, for `gauge-audit barrier --data`
    (a.cache / "heldout.txt").write_bytes(bytes(corpus.tokens("heldout").astype("uint8")))
    for (arch, seed), r in recs.items():
        print(
            f"{arch} seed {seed}: {r['steps_done']} steps ({r['stopped_by']}), held-out {r['heldout_loss']:.4f} "
            f"nats/byte, {r['cpu_seconds']:.0f} CPU-s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
