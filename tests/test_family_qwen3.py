"""Qwen3 and Qwen3-MoE (QK-norm: one RMSNorm over d_head shared by the heads, before RoPE): the
project forward equals transformers' in float64 within L·K·ε; the gauge theory under the norm —
per-head qk-gl is refused with the reason and is not a symmetry (a commutant element changes the
function by a wide margin), the surviving qk-norm-scale holds, value/FFN/stream actions survive —
checked action by action on the checkpoints; transform works; gauge fixing refuses in one line."""

from __future__ import annotations

import json

import pytest
import torch

from gauge_audit.actions import get_action
from gauge_audit.actions.attention import qk_gl, random_commutant
from gauge_audit.actions.base import Element
from gauge_audit.cli import main
from gauge_audit.models import qwen3
from gauge_audit.models.checkpoint import open_checkpoint
from gauge_audit.models.registry import build_config

transformers = pytest.importorskip("transformers")
from hf_families import EPS32, EPS64, compare, hf_logits, inputs, rel, tol, transform_round_trip  # noqa: E402

KINDS = ["qwen3", "qwen3-moe", "qwen3-moe-unnormed"]


@pytest.mark.parametrize("kind", KINDS)
def test_forward_matches_transformers_float64(hf_family, kind):
    err, tol64, shipped, tol32 = compare(hf_family(kind))
    print(
        f"{kind}: {err / EPS64:.2f} ε64 (tol {tol64 / EPS64:.0f}); as shipped {shipped / EPS32:.3g} ε32 "
        f"(tol {tol32 / EPS32:.0f} ε32)"
    )
    assert err <= tol64 and shipped <= tol32


@pytest.mark.parametrize("kind,changes", [("qwen3", {"qk_norm": "none"}), ("qwen3-moe", {"router_renorm": False})])
def test_a_dropped_feature_fails_by_a_wide_margin(hf_family, kind, changes):
    path = hf_family(kind)
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
    assert "qk-gl" not in rows  # refused: no longer a symmetry
    for name in ("qk-norm-scale", "vo-gl", "head-perm", "stream-rotation", "swiglu-scaling"):
        assert rows[name]["verdict"] == "HOLDS"
    for r in rows.values():
        assert r["verdict"] == r["expected"], r


def test_qk_gl_is_refused_with_the_reason(hf_family, capsys):
    assert main(["check", "--checkpoint", str(hf_family("qwen3")), "--action", "qk-gl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "QK-norm" in err and "qk-norm-scale" in err


def test_commutant_qk_gl_changes_a_qk_normed_model():
    """The element that is a symmetry without the norm (RoPE commutant, per KV head) changes a
    Qwen3 model by far more than rounding: the norm sees x W_Q M, whose rms differs."""
    cfg = qwen3.config(n_kv_heads=2)
    m = build_config(cfg, seed=1, device="cpu")
    el = Element({"M": random_commutant(cfg, torch.Generator().manual_seed(0), 10.0, (cfg.n_layers, 2))}, 10.0)
    x = m.sample_inputs(0)
    before = m.forward(m.params, x)
    err = rel(m.forward(qk_gl(cfg, m.params, el), x), before)
    plain = cfg.with_(qk_norm="none")
    p0 = {k: v for k, v in m.params.items() if "_norm" not in k}
    same = rel(
        build_config(plain).family.forward(qk_gl(plain, p0, el), plain, x),
        build_config(plain).family.forward(p0, plain, x),
    )
    print(f"commutant qk-gl: with the QK-norm {err:.3g}, without it {same / EPS64:.2f} ε64")
    assert err > 1e6 * tol(cfg, 16, 10.0) and same <= tol(plain, 16, 10.0)


@pytest.mark.parametrize("changes", [{}, {"pos": "none"}, {"rotary_dim": 2, "d_head": 6}])
def test_qk_norm_scale_holds_on_every_unit(changes):
    """Per RoPE plane and per unrotated coordinate (no RoPE; partial rotary): function unchanged."""
    cfg = qwen3.config(n_kv_heads=2, **changes)
    m = build_config(cfg, seed=2, device="cpu")
    act = get_action("qk-norm-scale")
    el = act.sample(cfg, m.params, torch.Generator().manual_seed(0), 10.0)
    x = m.sample_inputs(0)
    err = rel(m.forward(act.apply(cfg, m.params, el), x), m.forward(m.params, x))
    assert err <= tol(cfg, 16, el.kappa)
    # ... and scaling the two coordinates of a plane differently is not a symmetry
    if cfg.pos == "rope":
        bad = dict(m.params)
        k = "blocks.0.attn.q_norm"
        bad[k] = bad[k] * torch.tensor([3.0, *[1.0] * (cfg.d_head - 1)], dtype=torch.float64)
        bad["blocks.0.attn.k_norm"] = bad["blocks.0.attn.k_norm"] / torch.tensor(
            [3.0, *[1.0] * (cfg.d_head - 1)], dtype=torch.float64
        )
        assert rel(m.forward(bad, x), m.forward(m.params, x)) > 1e6 * tol(cfg, 16, 3.0)


def test_transform_round_trip(hf_family, tmp_path, capsys):
    src, out = hf_family("qwen3"), tmp_path / "out"
    transform_round_trip(src, out, "qk-norm-scale", capsys)


def test_mixed_dense_sparse_stacks_are_refused(hf_family, tmp_path):
    import shutil

    from gauge_audit.errors import GaugeAuditError

    dst = tmp_path / "e"
    shutil.copytree(hf_family("qwen3-moe"), dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["mlp_only_layers"] = [1]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(GaugeAuditError, match="mlp_only_layers"):
        open_checkpoint(dst)
