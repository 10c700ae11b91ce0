"""Decoders of transformers as a new user meets them, each through the derived path (its group
measured on transformers' own float64 forward, whether or not the project has a family file for
it): at its config class's defaults made small (``tiny_checkpoint``: d 8, two heads, one layer of
each layer type) at a generic point, written offline by transformers.  Per architecture: the
transform of an element of every measured family and held discrete map, then the canonical form of
the checkpoint and of the moved copy (each written and certified), and how far apart the two
canonical checkpoints are (per tensor ‖Δ‖/‖A‖; a tensor the canonical form sets to 0, a ``1 + w``
norm weight, as ‖Δ‖/√n) against the derived bound 4·(κ_A + κ_B)·m·ε / (smallest relative
eigenvalue gap).  A refusal is printed with its one-line reason.

    bash scripts/with-venv.sh python benchmarks/bench_derived_sweep.py [--only ARCH,...]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from bench_groups_derived import selected
from gauge_audit.errors import GaugeAuditError
from gauge_audit.gauge_fix.measured_canonical import canonicalize_checkpoint
from gauge_audit.measured import transform
from gauge_audit.models.derived import tiny_checkpoint
from gauge_audit.runtime import one_thread

ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Olmo2ForCausalLM",
    "Olmo3ForCausalLM",
    "Phi3ForCausalLM",
    "Glm4ForCausalLM",
    "Glm4MoeForCausalLM",
    "GptOssForCausalLM",
    "Llama4ForCausalLM",
    "Exaone4ForCausalLM",
    "SmolLM3ForCausalLM",
    "Ernie4_5ForCausalLM",
    "GraniteForCausalLM",
    "GraniteMoeForCausalLM",
    "ArceeForCausalLM",
    "SeedOssForCausalLM",
    "StableLmForCausalLM",
    "CohereForCausalLM",
    "Starcoder2ForCausalLM",
    "OlmoForCausalLM",
    "GPTNeoXForCausalLM",
    "GPTJForCausalLM",
    "PhiForCausalLM",
    "FalconForCausalLM",
    "MptForCausalLM",
    "BloomForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "Mistral4ForCausalLM",
)


def _apart(a: torch.Tensor, b: torch.Tensor) -> float:
    ref = float(a.norm())
    return float((a - b).norm()) / (ref if ref > 1e-8 else a.numel() ** 0.5)


def main() -> None:
    archs = selected(__doc__.splitlines()[0], ARCHITECTURES)
    print(f"{'architecture':24s} {'wall s':>7s}  outcome")
    held = 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            t0 = time.time()
            try:
                a = tiny_checkpoint(arch, Path(tmp) / arch, 0)
            except GaugeAuditError as e:
                print(f"{arch:24s} {time.time() - t0:7.1f}  refused: {e}")
                continue
            moved, ca, cb = (Path(tmp) / f"{arch}-{x}" for x in ("moved", "canon", "canon-moved"))
            try:
                with one_thread():
                    transform(a, "composite", moved)
                    reports = [canonicalize_checkpoint(src, dst)[1] for src, dst in ((a, ca), (moved, cb))]
            except GaugeAuditError as e:
                print(f"{arch:24s} {time.time() - t0:7.1f}  refused: {e}")
                continue
            ra, rb = reports
            A, B = load_file(str(ca / "model.safetensors")), load_file(str(cb / "model.safetensors"))
            apart = max(_apart(A[n].double(), B[n].double()) for n in A)
            gap = min(r["margins"].get("eigenvalue gap", 1.0) for r in reports)
            bound = 4 * (ra["kappa"] + rb["kappa"]) * ra["length"] * torch.finfo(torch.float64).eps / gap
            one = apart < bound
            verdicts = [r["certificate"]["verdict"] for r in reports]
            held += one and all(v == "HOLDS" for v in verdicts)
            unexplained = ra["group"]["nullity"] - ra["group"]["explained"]
            print(
                f"{arch:24s} {time.time() - t0:7.1f}  {'one canonical form' if one else 'TWO FORMS'}: apart "
                f"{apart:.1e} ≤ {bound:.1e}; nullity {ra['group']['nullity']}"
                + (f" ({unexplained} unexplained)" if unexplained else "")
                + "; function "
                + ", ".join(
                    f"{r['certificate']['residual_eps']:.3g} ε ≤ {r['certificate']['tolerance_eps']:.3g} ε {v}"
                    for r, v in zip(reports, verdicts)
                )
            )
    print(f"{held} of {len(archs)}: one canonical form for the checkpoint and its moved copy, both certified")


if __name__ == "__main__":
    main()
