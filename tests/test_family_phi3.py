"""Phi-3 (fused qkv_proj / gate_up_proj files, partial rotary, longrope, sliding window): the project
forward equals transformers' in float64 within L·K·ε; under a partial rotary the RoPE commutant is the
planes ⊕ GL on the unrotated coordinates — qk-gl samples it and holds, an element mixing rotated and
unrotated coordinates is refused and changes the function; transform writes the fused tensors back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gauge_audit.actions.attention import _inv_t, _qk_transform, qk_gl, random_commutant
from gauge_audit.actions.base import Element
from gauge_audit.cli import main
from gauge_audit.models.checkpoint import open_checkpoint

transformers = pytest.importorskip("transformers")
from hf_families import EPS32, EPS64, compare, hf_logits, inputs, rel, tol, transform_round_trip  # noqa: E402

KINDS = ["phi3-partial", "phi3-longrope-window"]


@pytest.mark.parametrize("kind", KINDS)
def test_forward_matches_transformers_float64(hf_family, kind):
    err, tol64, shipped, tol32 = compare(hf_family(kind))
    print(
        f"{kind}: {err / EPS64:.2f} ε64 (tol {tol64 / EPS64:.0f}); as shipped {shipped / EPS32:.3g} ε32 "
        f"(tol {tol32 / EPS32:.0f} ε32)"
    )
    assert err <= tol64 and shipped <= tol32


def test_a_whole_head_rotary_fails_by_a_wide_margin(hf_family):
    path = hf_family("phi3-partial")
    ckpt = open_checkpoint(path)
    assert ckpt.cfg.rotary_dim == ckpt.cfg.d_head // 2
    cfg = ckpt.cfg.with_(rotary_dim=0)
    x = inputs(cfg)
    err = rel(ckpt.model().family.forward(ckpt.params(), cfg, x), hf_logits(path, ckpt, x, True))
    assert err > 1e6 * tol(cfg, 12)


@pytest.mark.parametrize("kind", KINDS)
def test_check_all_agrees_with_theory(hf_family, kind, capsys):
    assert main(["check", "--checkpoint", str(hf_family(kind)), "--all", "--json"]) == 0
    rows = {json.loads(line)["action"]: json.loads(line) for line in capsys.readouterr().out.splitlines()}
    for name in ("qk-gl", "stream-rotation", "vo-gl"):
        assert rows[name]["verdict"] == "HOLDS"
    for r in rows.values():
        assert r["verdict"] == r["expected"], r


def test_partial_commutant_holds_and_mixing_fails(hf_family, tmp_path, capsys):
    ckpt = open_checkpoint(hf_family("phi3-partial"))
    cfg, params = ckpt.cfg, dict(ckpt.params())
    m = random_commutant(cfg, torch.Generator().manual_seed(0), 10.0, (cfg.n_layers, cfg.n_kv_heads))
    r = cfg.rotary_dim
    assert torch.linalg.matrix_rank(m[0, 0, r:, r:]) == cfg.d_head - r  # a GL block on the unrotated part
    x = inputs(cfg)
    model = ckpt.model()
    base = model.forward(params, x)
    assert rel(model.forward(qk_gl(cfg, params, Element({"M": m}, 10.0)), x), base) <= tol(cfg, 12, 10.0)
    # a rotation between a rotated and an unrotated coordinate: refused, and not a symmetry
    mix = m.clone()
    c, s = np.cos(0.7), np.sin(0.7)
    g = torch.eye(cfg.d_head, dtype=torch.float64)
    g[0, r], g[r, 0], g[0, 0], g[r, r] = s, -s, c, c
    mix = mix @ g
    np.savez(tmp_path / "mix.npz", M=mix.numpy())
    assert (
        main(
            [
                "check",
                "--checkpoint",
                str(hf_family("phi3-partial")),
                "--action",
                "qk-gl",
                "--element",
                str(tmp_path / "mix.npz"),
            ]
        )
        == 2
    )
    assert "outside the RoPE commutant" in capsys.readouterr().err
    changed = _qk_transform(cfg, params, mix.repeat_interleave(cfg.group_size, dim=1), _inv_t(mix))
    assert rel(model.forward(changed, x), base) > 1e6 * tol(cfg, 12, 10.0)


def test_transform_round_trip_writes_the_fused_tensors(hf_family, tmp_path, capsys):
    src, out = hf_family("phi3-longrope-window"), tmp_path / "out"
    transform_round_trip(src, out, "qk-gl", capsys)
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "model.layers.0.self_attn.qkv_proj.weight" in f.keys()
