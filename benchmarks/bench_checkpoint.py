"""Checkpoint I/O on the real SmolLM2-135M-Instruct (GGUF Q4_1): time and peak memory of

* load + one action (qk-gl) checked in float64           (target ≤ 30 s on 2 CPU cores)
* transform + certificate (transformers' float64 logits)  (target ≤ 60 s)
* peak memory of both                                     (target ≤ 4 GB)
* the same on a synthetic 2×-deeper copy (60 layers: every block twice): block-by-block
  processing means the peak does not grow with the depth (target: same within 20 %).

Each measurement runs in a fresh subprocess (peak RSS = that process's ru_maxrss), as a user
would run the command; the numbers and ratios are printed, nothing is asserted.

    bash scripts/with-venv.sh python benchmarks/bench_checkpoint.py [--keep DIR]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
t = time.perf_counter()
from gauge_audit.cli import main
rc = main(sys.argv[1:])
r = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t, "cpu": r.ru_utime + r.ru_stime,
                  "peak_mib": r.ru_maxrss / 1024}))
"""


def run(args: list[str]) -> dict:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0 or not p.stdout.strip():
        raise SystemExit(f"failed: gauge-audit {' '.join(args)}\n{p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["wall"] = wall  # incl. interpreter start and imports
    return out


def deeper_copy(src: Path, dst: Path, times: int = 2) -> None:
    """The GGUF with every block repeated ``times`` times (quantized data copied as is)."""
    import gguf

    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    n = r.fields[f"{arch}.block_count"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", f"{arch}.block_count"):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    w.add_block_count(n * times)

    def add(name, t):
        w.add_tensor(name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)

    blocks = [t for t in r.tensors if t.name.startswith("blk.")]
    for t in r.tensors:
        if not t.name.startswith("blk."):
            add(t.name, t)
    for k in range(times):
        for t in blocks:
            _, i, rest = t.name.split(".", 2)
            add(f"blk.{int(i) + k * n}.{rest}", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    import torch

    from gauge_audit.models import smollm2

    keep = Path(sys.argv[sys.argv.index("--keep") + 1]) if "--keep" in sys.argv else None
    src = smollm2.path()
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}; {src.name} ({src.stat().st_size / 2**20:.0f} MiB); "
        f"load average {os.getloadavg()[0]:.1f} (other processes on these cores slow every number down)"
    )
    with tempfile.TemporaryDirectory(dir=keep) as tmp:
        tmp = Path(tmp)
        deep = tmp / "smollm2-x2.gguf"
        t = time.perf_counter()
        deeper_copy(src, deep)
        print(
            f"synthetic 2×-deeper copy (60 layers, {deep.stat().st_size / 2**20:.0f} MiB) written in "
            f"{time.perf_counter() - t:.1f} s"
        )
        rows = {}
        for name, path in (("SmolLM2 (30 layers)", src), ("2×-deeper copy (60 layers)", deep)):
            rows[name, "check"] = run(["check", "--checkpoint", str(path), "--action", "qk-gl", "--json"])
            rows[name, "transform"] = run(
                [
                    "transform",
                    "--checkpoint",
                    str(path),
                    "--action",
                    "qk-gl",
                    "--out",
                    str(tmp / f"out-{path.stem}"),
                    "--json",
                ]
            )
        print(f"\n{'':28s} {'step':24s} {'seconds':>8s} {'CPU s':>7s} {'peak MiB':>9s}")
        for (name, step), r in rows.items():
            label = "load + qk-gl check f64" if step == "check" else "transform + certificate"
            print(f"{name:28s} {label:24s} {r['seconds']:8.1f} {r['cpu']:7.1f} {r['peak_mib']:9.0f}")
        s, d = "SmolLM2 (30 layers)", "2×-deeper copy (60 layers)"
        print(f"\nSmolLM2 check / 30 s target:            {rows[s, 'check']['seconds'] / 30:.2f}")
        print(f"SmolLM2 transform / 60 s target:        {rows[s, 'transform']['seconds'] / 60:.2f}")
        peak = max(r["peak_mib"] for r in rows.values())
        print(f"largest peak / 4 GB target:             {peak / 4096:.2f}")
        for step in ("check", "transform"):
            print(
                f"peak memory 2×-deeper / SmolLM2 ({step}): {rows[d, step]['peak_mib'] / rows[s, step]['peak_mib']:.3f}"
                f"   (time ratio {rows[d, step]['seconds'] / rows[s, step]['seconds']:.2f})"
            )


if __name__ == "__main__":
    main()
