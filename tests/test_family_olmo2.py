"""OLMo 2 (no pre-norms: x + n(f(x)); a QK-norm over the full width): the project forward equals
transformers' in float64 within L·K·ε; the gauge theory — the stream rotation is blocked by the
output norms' weights (and returns where they are all 1), per-head qk-gl is refused, qk-norm-scale
holds per KV head and group but not per query head — checked on the checkpoints and on random models."""

from __future__ import annotations

import json

import pytest
import torch

from gauge_audit.actions import get_action
from gauge_audit.actions.base import random_orthogonal
from gauge_audit.cli import main
from gauge_audit.models import olmo2
from gauge_audit.models.checkpoint import open_checkpoint
from gauge_audit.models.registry import build_config

transformers = pytest.importorskip("transformers")
from hf_families import EPS32, EPS64, compare, hf_logits, inputs, rel, tol, transform_round_trip  # noqa: E402

KINDS = ["olmo2", "olmo2-bias-yarn"]


@pytest.mark.parametrize("kind", KINDS)
def test_forward_matches_transformers_float64(hf_family, kind):
    err, tol64, shipped, tol32 = compare(hf_family(kind))
    print(
        f"{kind}: {err / EPS64:.2f} ε64 (tol {tol64 / EPS64:.0f}); as shipped {shipped / EPS32:.3g} ε32 "
        f"(tol {tol32 / EPS32:.0f} ε32)"
    )
    assert err <= tol64 and shipped <= tol32


@pytest.mark.parametrize("changes", [{"norm_placement": "pre"}, {"qk_norm": "none"}])
def test_a_misread_layout_fails_by_a_wide_margin(hf_family, changes):
    path = hf_family("olmo2")
    ckpt = open_checkpoint(path)
    cfg = ckpt.cfg.with_(**changes)
    params = {k: v for k, v in ckpt.params().items() if "_norm" not in k or cfg.qk_norm != "none"}
    x = inputs(cfg)
    err = rel(ckpt.model().family.forward(params, cfg, x), hf_logits(path, ckpt, x, True))
    assert err > 1e6 * tol(cfg, 12)


@pytest.mark.parametrize("kind", KINDS)
def test_check_all_agrees_with_theory(hf_family, kind, capsys):
    assert main(["check", "--checkpoint", str(hf_family(kind)), "--all", "--json"]) == 0
    rows = {json.loads(line)["action"]: json.loads(line) for line in capsys.readouterr().out.splitlines()}
    assert not {"qk-gl", "stream-rotation"} & set(rows)  # refused: not symmetries here
    # norm-scale: the final norm alone (untied unembedding); the output norms write into the stream
    for name in ("qk-norm-scale", "vo-gl", "head-perm", "ffn-perm", "swiglu-scaling", "norm-scale"):
        assert rows[name]["verdict"] == "HOLDS"
    for r in rows.values():
        assert r["verdict"] == r["expected"], r


def test_stream_rotation_is_refused_with_the_reason(hf_family, capsys):
    assert main(["check", "--checkpoint", str(hf_family("olmo2")), "--action", "stream-rotation"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "D_γ·R = R·D_γ'" in err


def _rotated(cfg, params, r):
    """The stream rotated by R everywhere a pre-norm model would need it: W_E·R, readers Rᵀ·W, the
    sublayer outputs (the output norms' inputs) W·R, and the final norm's weight folded as usual."""
    p = dict(params)
    p["embed.W_E"] = params["embed.W_E"] @ r
    for i in range(cfg.n_layers):
        b = f"blocks.{i}"
        for k in ("attn.W_Q", "attn.W_K", "attn.W_V"):
            p[f"{b}.{k}"] = torch.einsum("de,hdf->hef", r, params[f"{b}.{k}"])
        for k in ("mlp.W_in", "mlp.W_gate"):
            p[f"{b}.{k}"] = r.T @ params[f"{b}.{k}"]
        p[f"{b}.attn.W_O"] = params[f"{b}.attn.W_O"] @ r
        p[f"{b}.mlp.W_out"] = params[f"{b}.mlp.W_out"] @ r
    g = params["ln_final.w"]
    p["ln_final.w"] = torch.ones_like(g)
    p["unembed.W_U"] = r.T @ (g[:, None] * params["unembed.W_U"])
    return p


def test_stream_rotation_fails_under_generic_output_norms_and_holds_where_they_are_one():
    """The theory's reason, measured: n(y·R)·diag(γ) = n(y)·diag(γ)·R needs R to commute with diag(γ)
    — false for generic γ (a wide failure), true when every output norm's γ is 1 (the group grows)."""
    cfg = olmo2.config(n_kv_heads=2)
    m = build_config(cfg, seed=3, device="cpu")
    r = random_orthogonal(cfg.d_model, torch.Generator().manual_seed(0))
    x = m.sample_inputs(0)
    err = rel(m.forward(_rotated(cfg, m.params, r), x), m.forward(m.params, x))
    ones = {k: (torch.ones_like(v) if k.endswith((".ln1.w", ".ln2.w")) else v) for k, v in m.params.items()}
    held = rel(m.forward(_rotated(cfg, ones, r), x), m.forward(ones, x))
    print(f"stream rotation under OLMo 2's output norms: generic γ {err:.3g}, γ = 1 {held / EPS64:.2f} ε64")
    assert err > 1e6 * tol(cfg, 16) and held <= tol(cfg, 16)


def test_qk_norm_scale_is_per_kv_group_not_per_query_head():
    cfg = olmo2.config(n_kv_heads=2)
    m = build_config(cfg, seed=4, device="cpu")
    act = get_action("qk-norm-scale")
    el = act.sample(cfg, m.params, torch.Generator().manual_seed(0), 10.0)
    assert el.parts["c"].shape == (cfg.n_layers, cfg.n_kv_heads, cfg.d_head // 2)
    x = m.sample_inputs(0)
    base = m.forward(m.params, x)
    assert rel(m.forward(act.apply(cfg, m.params, el), x), base) <= tol(cfg, 16, el.kappa)
    # scaling query head 0's plane 0 without its group partner head 1 (whose key it shares)
    bad = dict(m.params)
    e, planes = cfg.d_head, cfg.d_head // 2
    fq = torch.ones(cfg.n_heads * e, dtype=torch.float64)
    fq[[0, planes]] = 3.0
    fk = torch.ones(cfg.n_kv_heads * e, dtype=torch.float64)
    fk[[0, planes]] = 1 / 3.0
    bad["blocks.0.attn.q_norm"] = bad["blocks.0.attn.q_norm"] * fq
    bad["blocks.0.attn.k_norm"] = bad["blocks.0.attn.k_norm"] * fk
    assert rel(m.forward(bad, x), base) > 1e6 * tol(cfg, 16, 3.0)


def test_transform_round_trip(hf_family, tmp_path, capsys):
    src, out = hf_family("olmo2-bias-yarn"), tmp_path / "out"
    transform_round_trip(src, out, "qk-norm-scale", capsys)
