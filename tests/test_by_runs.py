"""Gauge fixing one run of blocks at a time (gauge_fix/by_runs.py): the same canonical form, report
and checkpoint as the whole-model pipeline, at any thread count, holding one run; refused in one
line where a step would read the embeddings or couple blocks."""

from __future__ import annotations

import json

import pytest
import torch

from gauge_audit.cli import main
from gauge_audit.gauge_fix import by_runs, canonicalize, response
from gauge_audit.gauge_fix.base import Decision
from gauge_audit.gauge_fix.streamed import _merge_decisions
from gauge_audit.models import build, config_of
from gauge_audit.models.config import Config
from gauge_audit.models.registry import build_config
from gauge_audit.runtime import eps

STREAMED = [
    "llama-tiny-gqa",
    "llama-tiny-mqa",
    "llama-tiny-noweight",
    "llama-tiny-interleaved",
    "moe-tiny",
    "gemma2-tiny",
    "gemma3-tiny",
]
REFUSED = {
    "gpt2-tiny": "layernorm",
    "bert-tiny": "layernorm",
    "qwen-tiny": "biases",
    "attn-tiny": "none stream",
}
HF_STREAMED = ["qwen3", "qwen3-moe", "olmo2", "phi3-partial", "mistral-window", "llama-llama3"]


@pytest.fixture
def small_pieces(monkeypatch):
    """One block per run and two vocabulary rows per chunk: every merge and every chunk boundary
    is exercised on the tiny models."""
    monkeypatch.setattr(response, "RUN_ENTRIES", 1)
    monkeypatch.setattr(by_runs, "CHUNK", 1)


def _rotation_gap(report: dict) -> float:
    """The stream rotation's smallest relative eigenvalue gap (1 without a rotation): the chunked
    Gram's rounding moves the eigenvectors by at most its relative error over this gap."""
    for step in report["steps"]:
        if step["family"] == "stream-rotation":
            return next(d["min_margin"] for d in step["decisions"] if d["kind"] == "spectrum")
    return 1.0


def assert_same_canonical_form(cfg: Config, whole, canon, params_of) -> None:
    """``canon`` (by runs) against ``whole``: every step, decision count and tie equal; κ,
    thresholds, margins, parameters and condition residuals equal up to the rounding of the
    embedding's Gram and third moments summed in chunks (a sum of V terms: relative error ≤ V·ε, moved into the
    eigenvectors by at most 1/gap, amplified by the dense steps' κ)."""
    rw, rv = whole.report(), canon.report()
    gap = _rotation_gap(rw)
    tol = 8 * cfg.vocab * eps(torch.float64) * whole.rounding_kappa / gap
    assert rv["kappa"] == pytest.approx(rw["kappa"], rel=tol)
    assert rv["rounding_kappa"] == pytest.approx(rw["rounding_kappa"], rel=tol)
    assert rv["conditions"] == rw["conditions"] and rv["unfixed"] == rw["unfixed"] and rv["notes"] == rw["notes"]
    assert [t["not_unique"] for t in rv["not_unique"]] == [t["not_unique"] for t in rw["not_unique"]]
    assert len(rv["steps"]) == len(rw["steps"])
    for a, b in zip(rw["steps"], rv["steps"]):
        assert {k: a[k] for k in ("family", "action", "condition", "notes")} == {
            k: b[k] for k in ("family", "action", "condition", "notes")
        }
        assert b["kappa"] == pytest.approx(a["kappa"], rel=tol)
        assert len(a["decisions"]) == len(b["decisions"])
        for x, y in zip(a["decisions"], b["decisions"]):
            assert {k: x[k] for k in ("kind", "where", "n", "not_unique")} == {
                k: y[k] for k in ("kind", "where", "n", "not_unique")
            }
            assert y["threshold"] == pytest.approx(x["threshold"], rel=tol)
            assert y["min_margin"] == pytest.approx(x["min_margin"], rel=tol, abs=tol)
    worst = max(rw["condition_residual_max"].values())
    for family, r in rv["condition_residual_max"].items():
        assert r <= 4 * worst + tol, family  # the conditions hold as tightly as the whole model's
    for k, w in whole.params.items():
        v = params_of(k)
        assert v.shape == w.shape and v.dtype == torch.float64
        scale = float(w.abs().max()) or 1.0
        assert float((v - w).abs().max()) <= tol * scale, k


@pytest.mark.parametrize("name", STREAMED)
def test_by_runs_equals_the_whole_pipeline(name, small_pieces):
    m = build(name, seed=3, device="cpu")
    whole = canonicalize(m.cfg, m.params)
    view = by_runs.CanonicalByRuns(m.cfg, m.params, torch.float64)
    canon = view.canonical()
    assert len(view.runs) == m.cfg.n_layers and len(view.vocabulary_chunks()) > 1
    assert_same_canonical_form(m.cfg, whole, canon, view.__getitem__)
    # the input is read, never changed (the embeddings are transformed in a copy of their own)
    again = build(name, seed=3, device="cpu")
    assert all(torch.equal(m.params[k], again.params[k]) for k in m.params)


@pytest.mark.parametrize("kind", HF_STREAMED)
def test_by_runs_equals_the_whole_pipeline_on_checkpoints(kind, hf_family, small_pieces):
    from gauge_audit.models.checkpoint import open_checkpoint

    ckpt = open_checkpoint(hf_family(kind))
    params = ckpt.params()
    whole = canonicalize(ckpt.cfg, params, storage_dtype=ckpt.storage_dtype)
    view = by_runs.CanonicalByRuns(ckpt.cfg, ckpt.params(), ckpt.storage_dtype, owned=True)
    assert_same_canonical_form(ckpt.cfg, whole, view.canonical(), view.__getitem__)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_by_runs_refuses_steps_that_read_the_embeddings_or_couple_blocks(name):
    why = by_runs.streamable(config_of(name))
    assert why is not None and REFUSED[name] in why
    m = build(name, seed=0, device="cpu")
    with pytest.raises(Exception, match="one run of blocks at a time does not support"):
        by_runs.CanonicalByRuns(m.cfg, m.params, torch.float64)


def test_by_runs_holds_one_run_and_computes_each_once_per_pass(small_pieces, monkeypatch):
    m = build_config(config_of("llama-tiny-gqa").with_(n_layers=4), seed=1, device="cpu")
    calls = []
    real = by_runs.canonicalize_owned
    monkeypatch.setattr(
        by_runs, "canonicalize_owned", lambda cfg, *a, **k: calls.append(cfg.n_layers) or real(cfg, *a, **k)
    )
    view = by_runs.CanonicalByRuns(m.cfg, m.params, torch.float64)
    for i in range(4):
        view[f"blocks.{i}.attn.W_Q"], view[f"blocks.{i}.mlp.W_out"]
        assert view._run is not None and view._run[0] == i and set(view._run[1]) == set(view.blocks[i])
    assert calls == [1, 1, 1, 1]
    view["unembed.W_U"]
    assert view._run is None  # no run is held beside the head
    view.canonical()  # the records of the pass above: nothing computed again
    assert calls == [1, 1, 1, 1]


def test_by_runs_does_not_depend_on_the_thread_count(monkeypatch):
    """The stream rotation's products run on every thread (runtime.wide_products; here from 512
    rows and columns, where BLAS already splits them): the canonical form is the same bit for bit
    on one thread."""
    from gauge_audit import runtime

    monkeypatch.setattr(runtime, "DENSE_KERNEL_MIN", 512)
    cfg = Config(
        family="llama",
        d_model=512,
        n_layers=2,
        n_heads=8,
        n_kv_heads=2,
        d_head=64,
        d_ff=1024,
        vocab=1024,
        norm="rmsnorm",
        act="swiglu",
        attn_bias=False,
        out_bias=False,
        mlp_bias=False,
        pos="rope",
    )
    m = build_config(cfg, seed=5, device="cpu")
    out = []
    for n in (1, 2):
        monkeypatch.setattr(runtime, "DEFAULT_THREADS", n)
        view = by_runs.CanonicalByRuns(cfg, m.params, torch.float64)
        report = view.canonical().report()
        out.append((json.dumps({k: v for k, v in report.items() if k != "seconds"}), {k: view[k] for k in view}))
    assert out[0][0] == out[1][0]
    assert all(torch.equal(out[0][1][k], out[1][1][k]) for k in out[0][1])


def test_runs_decisions_are_judged_again_at_the_whole_models_threshold():
    # a margin above its run's threshold (κ of that run) but below the whole model's is a tie
    a = Decision.of("sign", "units", [5e-16, 0.5], 1e-16, 1.0)
    b = Decision.of("sign", "units", [0.3], 2e-16, 2.0)
    (merged,) = _merge_decisions([[a], [b]], lambda s: s * 1e-15)
    assert (a.n_ties, b.n_ties) == (0, 0)
    assert (merged.n, merged.n_ties, merged.margin, merged.threshold) == (3, 1, 5e-16, 2e-15)
    # a joint decision (one special point all blocks must meet) is as far from it as the farthest part
    c = Decision.of("spectrum", "post-norms", [0.1, 0.4], 1e-16, 2.0, joint=True)
    d = Decision.of("spectrum", "post-norms", [0.2], 1e-16, 2.0, joint=True)
    (joint,) = _merge_decisions([[c], [d]], lambda s: s * 1e-16)
    assert (joint.n, joint.margin) == (1, 0.4)
    (joint,) = _merge_decisions([[c], [d]])
    assert (joint.n, joint.margin) == (1, 0.4)


def _report(path) -> dict:
    r = json.loads((path / "report.json").read_text())
    r.pop("seconds")
    return r


@pytest.mark.parametrize("kind", ["qwen3-moe", "olmo2"])
def test_cli_by_runs_writes_the_same_certified_checkpoint(kind, hf_family, tmp_path, capsys):
    from safetensors.torch import load_file

    src = hf_family(kind)
    assert main(["canonicalize", "--checkpoint", str(src), "--out", str(tmp_path / "whole")]) == 0
    assert main(["canonicalize", "--checkpoint", str(src), "--out", str(tmp_path / "runs"), "--by-runs"]) == 0
    capsys.readouterr()
    whole, runs = _report(tmp_path / "whole"), _report(tmp_path / "runs")
    assert runs["certificate"]["verdict"] == "HOLDS" and runs["function"]["verdict"] == "HOLDS"
    for key in ("conditions", "kappa", "rounding_kappa", "unfixed", "not_unique"):
        assert runs[key] == whole[key], key
    a, b = (
        load_file(str(tmp_path / "whole" / "model.safetensors")),
        load_file(str(tmp_path / "runs" / "model.safetensors")),
    )
    assert a.keys() == b.keys()
    for k in a:  # float32 files: equal but where the float64 forms round to neighbours
        assert a[k].dtype == b[k].dtype and float((a[k] - b[k]).abs().max()) <= 2 * eps(a[k].dtype) * float(
            a[k].abs().max()
        ), k


def test_cli_canonicalizes_by_runs_when_the_float64_copy_does_not_fit(
    hf_family, tiny_hf, tmp_path, capsys, monkeypatch
):
    import gauge_audit.cli.canonicalize as cli

    monkeypatch.setattr(cli, "available_memory", lambda: 1000)
    assert main(["canonicalize", "--checkpoint", str(hf_family("qwen3")), "--json"]) == 0
    out, err = capsys.readouterr()
    assert "canonicalising one run of blocks at a time" in err
    assert json.loads(out)["function"]["verdict"] == "HOLDS"
    # a model whose steps cannot go by runs: the one-line refusal says both
    assert main(["canonicalize", "--checkpoint", str(tiny_hf("bert"))]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "holds the whole model in float64" in err and "not for a layernorm stream" in err
    monkeypatch.undo()
    assert main(["canonicalize", "--checkpoint", str(tiny_hf("bert")), "--by-runs"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--by-runs" in err and "layernorm" in err
