"""The checkpoint commands at a real model's scale: each step's wall time, CPU time and peak memory on a
synthetic Llama-3-8B-shaped checkpoint (``benchmarks/synth_checkpoint.py``), against the time to read
the files once and the step's float64 flops at the measured matrix-product peak.

    python benchmarks/synth_checkpoint.py /data/llama3-8b-synth            # 16 GB, ~2 min of disk writing
    python benchmarks/bench_scale.py /data/llama3-8b-synth [--steps read,check,transform,canonicalize,compare]
        [--work DIR] [--max-rss-gb 6] [--timeout 3600] [--warm]

Steps, each a fresh process as a user runs it:

* ``read``: every shard read once, 64 MiB at a time into one buffer (the I/O floor R; safetensors'
  ``safe_open`` maps the file, and the mapped pages of a 5 GB shard would count as resident);
* ``check --action vo-gl`` (two float64 forwards of the project's model, streamed block by block);
* ``transform --action qk-gl --out`` with its certificate (transformers' float64 logits of the
  original and the written checkpoint, one decoder layer at a time);
* ``canonicalize --out`` (the 14 gauge steps, the canonical checkpoint and its certificate);
* ``compare --by-runs`` the checkpoint with the transformed copy (one run of blocks at a time, as it
  goes by itself where a float64 copy exceeds the available memory; reads: A's runs twice, B's once,
  both embeddings and heads twice, and both models once more for the element's residual).

Peak memory is the process's maximum resident set (``wait4``'s ru_maxrss).  A watchdog polls the
resident set and kills a step that passes ``--max-rss-gb`` (the machine may be shared); the step is
then reported as killed, with the time it ran.  Before each step the checkpoint's pages are dropped
from the page cache (``posix_fadvise DONTNEED`` on these files only), so every step — like ``read`` —
starts from disk; ``--warm`` skips that.

Ratio printed per step: time / (R·reads + F/peak), where ``reads`` is how many times the step must
read the checkpoint's bytes (the forwards each stream the weights; writing counts as one read) and F
the dominant float64 flops of the step (model below, printed); the goal is ≤ 4 and a peak ≤ 6 GB.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
t = time.perf_counter()
from gauge_audit.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t}), file=sys.stderr)
sys.exit(rc)
"""

READ = r"""
import json, sys, time
from pathlib import Path
t, nbytes = time.perf_counter(), 0
buf = bytearray(1 << 26)
for shard in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with open(shard, "rb", buffering=0) as f:
        while (n := f.readinto(buf)):
            nbytes += n
print(json.dumps({"bytes": nbytes, "seconds": time.perf_counter() - t}), file=sys.stderr)
"""


def drop_cache(directory: Path) -> None:
    """Evict these files' pages from the page cache (only these files)."""
    for p in directory.glob("*.safetensors"):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def run(code: str, args: list[str], max_rss_gb: float, timeout: float, log: Path) -> dict:
    """One step in a fresh process: wall, CPU, peak RSS; killed above ``max_rss_gb`` or ``timeout``."""
    env = dict(
        os.environ,
        PYTHONPATH=f"{HERE.parent / 'python'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    with open(log, "w") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        killed, watch = [], {"max": 0}

        def watchdog():
            while p.returncode is None:
                r = rss_kib(p.pid)
                watch["max"] = max(watch["max"], r)
                why = (
                    f"killed: resident set {r / 2**20:.2f} GiB > {max_rss_gb} GiB"
                    if r > max_rss_gb * 2**20
                    else f"killed: over {timeout:.0f} s"
                    if time.perf_counter() - t0 > timeout
                    else None
                )
                if why:
                    killed.append(why)
                    p.kill()
                    return
                time.sleep(0.05)

        th = threading.Thread(target=watchdog, daemon=True)
        th.start()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        th.join()
    text = log.read_text(errors="replace")
    res = {
        "wall": wall,
        "cpu": ru.ru_utime + ru.ru_stime,
        "peak_gib": ru.ru_maxrss / 2**20,
        "rc": p.returncode,
        "killed": killed[0] if killed else None,
        "log": str(log),
    }
    for line in reversed(text.splitlines()):
        if line.startswith("{") and line.endswith("}"):
            try:
                res["child"] = json.loads(line)
                break
            except ValueError:
                pass
    return res


def refusal(r: dict) -> str:
    """A failed step's one-line refusal (exit 2: the command's last line, not the child's timing),
    or where its log is."""
    said = [line for line in Path(r["log"]).read_text(errors="replace").splitlines() if line.strip()]
    said = [line for line in said if not line.startswith("{")]
    return f": {said[-1]}" if r["rc"] == 2 and said else f" (see {r['log']})"


def flops(cfg, step: str, probes: int = 3) -> tuple[float, str]:
    """Dominant float64 flops of a step (documented terms; small factorisations left out)."""
    d, L, h, kv, e, f, V = cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_ff, cfg.vocab
    layer = d * e * (2 * h + 2 * kv) + 3 * d * f  # weights of one layer (matrices)
    P = L * layer + V * d * (1 if cfg.tied else 2)

    def forward(batch: int, n: int) -> float:
        T = batch * n
        return 2 * T * (L * layer + V * d) + L * 4 * batch * n * n * h * e

    gl = 2 * d * e * e * (h + kv) * L  # an M or N applied to every head of every layer
    rotation = 2 * d * P + 4 * V * d * d  # R applied to every stream-side matrix; W_E Gram
    canon = rotation + 2 * gl + forward(4, 16) * 2  # + qk/vo balancing, the canonical form's function check
    if step == "check":
        return 2 * forward(4, 16) + gl, "2 forwards of 4×16 tokens + N on every head"
    if step == "transform":
        return 2 * forward(2, 16) + gl, "2 transformers forwards of 2×16 tokens + M on every head"
    if step == "canonicalize":
        return canon + 2 * forward(2, 16), (
            "2·d·P (stream rotation) + 4·V·d² (Gram) + qk/vo + 2 forwards 4×16 + certificate 2 forwards 2×16"
        )
    if step == "compare":  # one run of blocks at a time (comparison_by_runs)
        blocks, vocab = L * layer, V * d * (1 if cfg.tied else 2)
        runs = 2 * (1 + probes) * (2 * d * blocks + 2 * gl)  # A, B and every probe on each run
        # A's Gram and third moments, B's and every probe's Procrustes products (chunks of W_E)
        rotations = 2 * V * d * d * (2 + 1 + 2 * probes)
        # each model's and probe's elements on the embeddings and head, A's canonical Gram
        vocabulary = 2 * d * vocab * (2 + 2 * probes) + 2 * V * d * d
        residual = 2 * d * (blocks + vocab)  # ‖g·A − B‖ with the merged rotation
        return runs + rotations + vocabulary + residual, (
            f"2 models × (1 + {probes} probes) × 2·d·P on the runs, the embeddings' Procrustes products and "
            "rotations, the element's residual"
        )
    return 0.0, ""


def main() -> None:
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "python"))
    from bench_nullity import peak_gflops
    from gauge_audit.models.checkpoint import open_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--steps", default="read,check,transform,canonicalize,compare")
    ap.add_argument(
        "--work",
        type=Path,
        help="where the outputs go (default: a temporary directory next to the checkpoint, removed at the end)",
    )
    ap.add_argument("--max-rss-gb", type=float, default=6.0)
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--warm", action="store_true", help="do not drop the checkpoint from the page cache")
    a = ap.parse_args()
    steps = a.steps.split(",")
    ckpt = open_checkpoint(a.checkpoint)
    cfg = ckpt.cfg
    nbytes = sum(p.stat().st_size for p in a.checkpoint.glob("*.safetensors"))
    import torch

    peak = peak_gflops(2048)
    print(
        f"{ckpt.describe()}\n{ckpt.float64_bytes() / 8 / 1e9:.3f} G parameters, {nbytes / 1e9:.2f} GB on disk; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, float64 matmul peak {peak:.0f} GFLOP/s; "
        f"load average {os.getloadavg()[0]:.1f}; page cache {'kept' if a.warm else 'dropped before each step'}",
        flush=True,
    )
    work = a.work or Path(tempfile.mkdtemp(prefix=".bench-scale.", dir=a.checkpoint.parent))
    work.mkdir(parents=True, exist_ok=True)
    c = str(a.checkpoint)
    commands = {
        "read": (READ, [c]),
        "check": (CHILD, ["check", "--checkpoint", c, "--action", "vo-gl", "--json"]),
        "transform": (
            CHILD,
            ["transform", "--checkpoint", c, "--action", "qk-gl", "--out", str(work / "qk"), "--json"],
        ),
        "canonicalize": (CHILD, ["canonicalize", "--checkpoint", c, "--out", str(work / "canon"), "--json"]),
        "compare": (CHILD, ["compare", c, str(work / "qk"), "--by-runs", "--json"]),
    }
    reads = {"read": 1, "check": 2, "transform": 4, "canonicalize": 4, "compare": 6}  # see the docstring
    rows = {}
    try:
        for s in steps:
            if not a.warm:
                drop_cache(a.checkpoint)
                if (work / "qk").is_dir():
                    drop_cache(work / "qk")
            r = run(*commands[s], a.max_rss_gb, a.timeout, work / f"{s}.log")
            rows[s] = r
            state = r["killed"] or ("ok" if r["rc"] == 0 else f"exit {r['rc']}{refusal(r)}")
            print(
                f"{s:13s} {r['wall']:8.1f} s wall {r['cpu']:8.1f} s CPU  peak {r['peak_gib']:6.2f} GiB  {state}",
                flush=True,
            )
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    R = rows["read"].get("child", {}).get("seconds") if "read" in rows else None
    print(
        f"\n{'step':13s} {'wall s':>8s} {'CPU s':>8s} {'peak GiB':>9s} {'reads':>5s} {'GFLOP':>9s} "
        f"{'floor s':>8s} {'time/floor':>10s}  peak/6 GB  flops counted"
    )
    for s, r in rows.items():
        F, what = flops(cfg, s)
        floor = (R * reads[s] if R else 0.0) + F / (peak * 1e9)
        ratio = f"{r['wall'] / floor:10.2f}" if floor and not r["killed"] and r["rc"] == 0 else f"{'—':>10s}"
        print(
            f"{s:13s} {r['wall']:8.1f} {r['cpu']:8.1f} {r['peak_gib']:9.2f} {reads[s]:5d} {F / 1e9:9.0f} "
            f"{floor:8.1f} {ratio}  {r['peak_gib'] * 2**30 / 6e9:9.2f}  {what}"
            f"{'  ' + r['killed'] if r['killed'] else ''}"
        )


if __name__ == "__main__":
    main()
