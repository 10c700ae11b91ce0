"""Gauge fixing on real checkpoint files: ``canonicalize --checkpoint`` writes a checkpoint of the
input's own architecture that transformers evaluates to the same logits; ``compare`` of a
checkpoint with a transformed copy written by ``transform`` (float32 and bfloat16, the way real
checkpoints are stored) is EQUIVALENT within a tolerance derived from the storage dtype, the saved
element reproduces the copy through ``transform --element``; perturbed copies are DIFFERENT; bad
input is one line, exit 2.  SmolLM2 (the real GGUF) in memory."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gauge_audit.cli import main
from gauge_audit.cli.canonicalize import load_source
from gauge_audit.gauge_fix import DIFFERENT, EQUIVALENT, canonicalize, compare, prepare
from gauge_audit.gauge_fix.comparison import FAILURE_PROBABILITY, relative_distances
from gauge_audit.models.checkpoint import open_checkpoint

UNIT = {"float32": 2.0**-24, "bfloat16": 2.0**-8}
KINDS = ["llama", "gpt2", "qwen", "mixtral", "bert"]  # tiny HF checkpoints: LLaMA-GQA (4 heads / 2 KV), …


def _json(capsys):
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def copies(tiny_hf, tmp_path_factory):
    """``copies(kind, dtype)`` → (A, B): B = g·A written by ``transform`` (a random composite of
    every action that applies, κ ≤ 4 per GL part) in ``dtype``."""
    made = {}

    def get(kind, dtype):
        if (kind, dtype) not in made:
            a = tiny_hf(kind)
            b = tmp_path_factory.mktemp(f"{kind}-{dtype}") / "B"
            assert (
                main(
                    [
                        "transform",
                        "--checkpoint",
                        str(a),
                        "--action",
                        "composite",
                        "--seed",
                        "3",
                        "--kappa",
                        "4",
                        "--dtype",
                        dtype,
                        "--out",
                        str(b),
                        "--json",
                    ]
                )
                == 0
            )
            made[kind, dtype] = (a, b)
        return made[kind, dtype]

    return get


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", KINDS)
def test_transformed_checkpoint_is_equivalent(copies, capsys, tmp_path, kind, dtype):
    a, b = copies(kind, dtype)
    capsys.readouterr()
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--json", "--out", str(out)]) == 0
    r = _json(capsys)
    u = UNIT[dtype]
    print(
        f"{kind} {dtype}: raw {r['raw_distance']:.3f}, invariant {r['invariant_distance']:.3e} "
        f"({r['invariant_distance'] / u:.2f} u), tolerance {r['tolerance']:.3e} ({r['tolerance'] / u:.2f} u), "
        f"element κ {r['kappa']:.3g}, ‖g·A − B‖/‖B‖ = {r['element_residual']:.3e}"
    )
    assert r["verdict"] == EQUIVALENT and r["storage_dtype_b"] == dtype
    assert r["raw_distance"] > 0.3  # B is far from A in raw parameters ...
    assert r["invariant_distance"] <= r["tolerance"]  # ... and not after canonicalisation,
    assert r["tolerance"] <= 20 * u  # a tolerance at the storage rounding level
    assert r["element_residual"] <= r["kappa"] * u  # B's rounding, amplified at most by κ of the element
    assert (out / "element.npz").is_file()


def test_compare_in_parallel_gives_the_serial_report(copies):
    """compare's CLI measures A's rounding probes and the raw distance in a forked helper while it
    canonicalises B: the report is that of the same work in one process, number for number."""
    a, b = copies("llama", "float32")
    sa = load_source(str(a), native=True, resident=False)
    sb = load_source(str(b), native=True, resident=False)
    kw = dict(storage_dtype_a=sa.storage_dtype, storage_dtype_b=sb.storage_dtype)
    serial = compare(sa.cfg, sa.params, sb.cfg, sb.params, parallel=False, **kw)
    forked = compare(sa.cfg, sa.params, sb.cfg, sb.params, parallel=True, **kw)
    assert serial.verdict == EQUIVALENT and serial.to_json() == forked.to_json()


@pytest.mark.parametrize("kind", ["llama", "mixtral", "bert"])
def test_compare_element_reproduces_b_through_transform(copies, capsys, tmp_path, kind):
    """compare --out element.npz, then transform --element: A is mapped onto B up to B's rounding."""
    a, b = copies(kind, "float32")
    cmp_dir, c = tmp_path / "cmp", tmp_path / "C"
    assert main(["compare", str(a), str(b), "--json", "--out", str(cmp_dir)]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "transform",
                "--checkpoint",
                str(a),
                "--action",
                "composite",
                "--element",
                str(cmp_dir / "element.npz"),
                "--dtype",
                "float32",
                "--out",
                str(c),
                "--json",
            ]
        )
        == 0
    )
    cert = _json(capsys)
    assert cert["verdict"] == "HOLDS"
    pb = {k: v for k, v in open_checkpoint(b).params().items()}
    pc = {k: v for k, v in open_checkpoint(c).params().items()}
    raw, _ = relative_distances(pb, pc)
    print(f"{kind}: ‖C − B‖/‖B‖ = {raw:.3e} = {raw / UNIT['float32']:.2f} u")
    # B and C are two float32 roundings of (nearly) the same float64 tensors: ≤ 1 ulp = 2u apart
    assert raw <= 2 * UNIT["float32"]


@pytest.mark.parametrize("rel", [1e-4, 1e-2])
def test_perturbed_checkpoint_is_different(tiny_hf, capsys, rel):
    a = tiny_hf("llama")
    assert (
        main(["compare", str(a), str(a), "--perturb", str(rel), "--perturb-tensor", "blocks.1.mlp.W_in", "--json"]) == 1
    )
    r = _json(capsys)
    assert r["verdict"] == DIFFERENT
    ffn = r["groups"]["ffn"]
    print(
        f"perturbed {rel:g}: ffn raw {ffn['raw_distance']:.3e}, invariant {ffn['invariant_distance']:.3e}, "
        f"{ffn['ratio']:.3g} × its tolerance"
    )
    # the invariant distance of the perturbed group tracks the raw change (the canonical form is a
    # well-conditioned map on this model), and is far above the tolerance
    assert 0.5 <= ffn["invariant_distance"] / ffn["raw_distance"] <= 2 and ffn["ratio"] > 10


def test_canonicalize_checkpoint_writes_a_certified_checkpoint(tiny_hf, capsys, tmp_path):
    out = tmp_path / "canon"
    assert main(["canonicalize", "--checkpoint", str(tiny_hf("qwen")), "--json", "--out", str(out)]) == 0
    report = _json(capsys)
    cert = json.loads((out / "certificate.json").read_text())
    print(
        f"qwen canonical: transformers' logits change {cert['residual_eps']:.3g} ε(float32), statistical "
        f"tolerance {cert['tolerance_statistical_eps']:.4g} ε (κ of the dense steps {cert['rounding_kappa']:.3g})"
    )
    assert report["function"]["verdict"] == "HOLDS" and cert["verdict"] == "HOLDS" and cert["dtype"] == "float32"
    assert {"config.json", "model.safetensors", "element.npz", "report.json"} <= {p.name for p in out.iterdir()}
    # The written canonical checkpoint is canonical: canonicalising it again moves it only by the
    # canonical form's response to its float32 rounding, measured by compare's probes (tolerance
    # λ·σ as in compare, λ the Gaussian tail for the groups compared).
    src = load_source(str(out))
    again = canonicalize(src.cfg, src.params, storage_dtype=src.storage_dtype)
    dist, _ = relative_distances(src.params, again.params)
    prep = prepare(src.cfg, src.params, probes=3, storage_dtype=src.storage_dtype)
    den = sum(float((v * v).sum()) for v in prep.canonical.params.values())
    lam = math.sqrt(2 * math.log(2 * (len(prep.response) + 1) / FAILURE_PROBABILITY))
    tol = lam * math.sqrt(sum(prep.response.values()) / den)
    print(f"re-canonicalised: moved {dist / UNIT['float32']:.2f} u ≤ {tol / UNIT['float32']:.2f} u")
    assert dist <= tol
    assert main(["canonicalize", "--checkpoint", str(tiny_hf("qwen")), "--out", str(out)]) == 2  # exists


def test_canonicalize_helpers_change_nothing(tiny_hf, capsys, tmp_path, monkeypatch):
    """canonicalize --out computes the tokenizer, the original's outputs and the certificate in
    helper processes: the files are byte for byte those of the same work done in this process
    (report.json up to its timing)."""
    import gauge_audit.cli.canonicalize as canon_cli

    ckpt = str(tiny_hf("llama"))
    assert main(["canonicalize", "--checkpoint", ckpt, "--out", str(tmp_path / "helpers")]) == 0
    capsys.readouterr()
    assert main(["canonicalize", "--checkpoint", ckpt, "--json"]) == 0  # without --out: the function check's helper
    helped = _json(capsys)
    monkeypatch.setattr(canon_cli, "CertificateAhead", lambda *args, **kwargs: None)
    assert main(["canonicalize", "--checkpoint", ckpt, "--out", str(tmp_path / "here")]) == 0
    capsys.readouterr()
    assert main(["canonicalize", "--checkpoint", ckpt, "--json"]) == 0
    alone = _json(capsys)
    assert helped.pop("seconds") > 0 and alone.pop("seconds") > 0 and helped == alone
    names = sorted(p.name for p in (tmp_path / "here").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "helpers").iterdir())
    for name in names:
        a, b = (tmp_path / d / name for d in ("helpers", "here"))
        if name == "report.json":
            ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
            assert ra.pop("seconds") > 0 and rb.pop("seconds") > 0
            assert ra == rb and ra["function"]["verdict"] == "HOLDS"
        else:
            assert a.read_bytes() == b.read_bytes(), name


def test_certificate_helper_ends_when_no_checkpoint_comes(tiny_hf):
    """A canonicalisation that fails before writing closes the helpers: the certifying one, which
    waits for the written checkpoint, ends with nothing (never a hang)."""
    from gauge_audit.cli.canonicalize import CertificateAhead

    src = load_source(str(tiny_hf("llama")), native=True, resident=False)
    ahead = CertificateAhead(src, 1, 0)
    ahead.close()
    assert ahead.cert.result() is None
    assert ahead.job.result()[1][0].shape[0] > 0  # the other helper's work was done all the same


def test_checkpoint_bad_input_is_one_line(tiny_hf, capsys, tmp_path):
    assert main(["compare", str(tiny_hf("llama")), str(tiny_hf("gpt2"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different architectures" in err[0]
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "nan"
    shutil.copytree(tiny_hf("llama"), bad)
    t = load_file(str(bad / "model.safetensors"))
    k = next(k for k in t if k.endswith("q_proj.weight"))
    t[k][0, 0] = float("nan")
    save_file(t, str(bad / "model.safetensors"))
    for argv in (["canonicalize", "--checkpoint", str(bad)], ["compare", str(tiny_hf("llama")), str(bad)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "NaN" in err[0] and "Traceback" not in err[0]


@pytest.mark.parametrize("command", ["canonicalize", "compare"])
def test_a_model_whose_float64_copy_does_not_fit_is_refused_before_any_work(
    tiny_hf, capsys, tmp_path, monkeypatch, command
):
    """compare and canonicalize of a model whose steps cannot go one run of blocks at a time
    (BERT's LayerNorm offsets; a Llama goes by runs: tests/test_by_runs.py,
    tests/test_comparison_by_runs.py), hold the model whole
    in float64: where that copy exceeds the memory available, one line says how much it needs and
    has, before anything is read or forked, instead of the kernel killing the process after minutes
    (an 8 B checkpoint on this machine).  The bound is the float64 copy itself (8 bytes a
    parameter), so a model that fits with room is not refused."""
    import gauge_audit.cli.canonicalize as canon_cli
    from gauge_audit.models import parameter_count
    from gauge_audit.runtime import size_text

    ckpt = str(tiny_hf("bert"))
    need = 8.0 * parameter_count(open_checkpoint(ckpt).cfg)
    out = tmp_path / "out"
    argv = (
        ["canonicalize", "--checkpoint", ckpt, "--out", str(out)]
        if command == "canonicalize"
        else [command, ckpt, ckpt]
    )
    forked = []
    monkeypatch.setattr(canon_cli, "CertificateAhead", lambda *a, **k: forked.append(1))
    monkeypatch.setattr(canon_cli, "available_memory", lambda: need / 2)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "float64" in err[0] and f"{size_text(need)} for" in err[0], err
    assert not out.exists() and not forked
    monkeypatch.undo()  # the helpers back
    monkeypatch.setattr(canon_cli, "available_memory", lambda: 2 * need)
    assert main([*argv, "--json"]) == 0  # past the check (compare of A with itself: EQUIVALENT)
    assert json.loads(capsys.readouterr().out)


def test_smollm2_transformed_copy_is_equivalent_in_float32():
    """The real SmolLM2 (GGUF Q4_1, 134.5 M parameters, RoPE, GQA 9/3, SwiGLU, tied): a composite
    copy stored in float32 is EQUIVALENT.  (That A's canonical form keeps the function, is
    idempotent and satisfies its conditions: tests/test_gauge_fix.py, its smollm2 cases.)"""
    from gauge_audit.actions import composite
    from gauge_audit.runtime import generator

    a = load_source("smollm2")
    prepared = prepare(a.cfg, a.params, probes=1, storage_dtype=a.storage_dtype)  # A's side, once
    _, moved = composite.sample_applied(a.cfg, a.params, generator(5), 4.0)  # = composite's apply(el)
    b = {k: v.to(torch.float32) for k, v in moved.items()}
    r = compare(a.cfg, a.params, a.cfg, b, probes=1, with_element=False, prepared=prepared)
    print(
        f"smollm2 float32 copy: raw {r.raw_distance:.3f}, invariant {r.invariant_distance:.3e}, "
        f"tolerance {r.tolerance:.3e}"
    )
    assert r.verdict == EQUIVALENT and r.raw_distance > 0.3 and r.tolerance <= 20 * UNIT["float32"]
