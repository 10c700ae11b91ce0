"""GPT-NeoX / Pythia (parallel residual, partial rotary, per-head interleaved query_key_value): the
project forward equals transformers' in float64 within L·K·ε; a sequential reading of a parallel model
or a whole-head rotary fails by a wide margin; every action's verdict agrees with the theory (the
parallel residual keeps the pre-norm stream actions); transform writes the fused tensor back."""

from __future__ import annotations

import json

import pytest

from gauge_audit.cli import main
from gauge_audit.models.checkpoint import open_checkpoint

transformers = pytest.importorskip("transformers")
from hf_families import EPS32, EPS64, compare, hf_logits, inputs, rel, tol, transform_round_trip  # noqa: E402

KINDS = ["neox", "neox-sequential-linear"]


@pytest.mark.parametrize("kind", KINDS)
def test_forward_matches_transformers_float64(hf_family, kind):
    err, tol64, shipped, tol32 = compare(hf_family(kind))
    print(
        f"{kind}: {err / EPS64:.2f} ε64 (tol {tol64 / EPS64:.0f}); as shipped {shipped / EPS32:.3g} ε32 "
        f"(tol {tol32 / EPS32:.0f} ε32)"
    )
    assert err <= tol64 and shipped <= tol32


@pytest.mark.parametrize(
    "kind,changes",
    [
        ("neox", {"parallel_residual": False}),
        ("neox", {"rotary_dim": 0}),
        ("neox-sequential-linear", {"parallel_residual": True}),
    ],
)
def test_a_misread_option_fails_by_a_wide_margin(hf_family, kind, changes):
    path = hf_family(kind)
    ckpt = open_checkpoint(path)
    cfg = ckpt.cfg.with_(**changes)
    x = inputs(cfg)
    err = rel(ckpt.model().family.forward(ckpt.params(), cfg, x), hf_logits(path, ckpt, x, True))
    assert err > 1e6 * tol(cfg, 12)


@pytest.mark.parametrize("kind", KINDS)
def test_check_all_agrees_with_theory(hf_family, kind, capsys):
    assert main(["check", "--checkpoint", str(hf_family(kind)), "--all", "--json"]) == 0
    rows = {json.loads(line)["action"]: json.loads(line) for line in capsys.readouterr().out.splitlines()}
    # key-bias-shift: on the unrotated coordinates of the partial rotary
    for name in ("qk-gl", "stream-rotation", "norm-shift", "writer-ones", "value-bias-fold", "key-bias-shift"):
        assert rows[name]["verdict"] == "HOLDS"
    # the b_O ↔ b_out trade: a symmetry of the parallel block, not applied to a sequential one
    assert rows["parallel-bias-trade"]["verdict"] == "HOLDS" if kind == "neox" else "parallel-bias-trade" not in rows
    for r in rows.values():
        assert r["verdict"] == r["expected"], r


def test_key_bias_shift_refuses_the_rotated_coordinates():
    """Under a partial rotary only the unrotated key-bias coordinates shift: a shift on a rotated one
    is refused in one line (it would change the scores position by position)."""
    import torch

    from gauge_audit.actions import ACTIONS
    from gauge_audit.actions.base import Element
    from gauge_audit.errors import GaugeAuditError
    from gauge_audit.models import build_config, neox

    cfg = neox.config(d_model=8, n_heads=2, n_kv_heads=2, d_head=4, rotary_dim=2, n_layers=1)
    m = build_config(cfg, seed=0)
    c = torch.zeros(1, 2, 4, dtype=torch.float64)
    c[0, 0, 0] = 0.1
    with pytest.raises(GaugeAuditError, match="unrotated coordinates 2..3"):
        ACTIONS["key-bias-shift"].apply(cfg, m.params, Element({"c": c}, 1.0))


def test_transform_round_trip_writes_query_key_value(hf_family, tmp_path, capsys):
    src, out = hf_family("neox"), tmp_path / "out"
    transform_round_trip(src, out, "stream-rotation", capsys)
    a, b = open_checkpoint(src).params(), open_checkpoint(out).params()
    assert float((a["blocks.0.attn.W_Q"] - b["blocks.0.attn.W_Q"]).abs().max()) > 1e-3


def test_parallel_bias_trade_is_refused_in_one_line_on_a_sequential_model(capsys):
    """In sequence the FFN reads the attention's output, b_O included: the trade is refused."""
    assert main(["check", "--model", "gpt2-tiny", "--action", "parallel-bias-trade"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sequential residual" in err


def test_parallel_bias_trade_changes_a_sequential_model_by_a_wide_margin():
    """Why the refusal: applied to the same block in sequence, the constant moved out of b_O reaches
    the FFN's input, and the logits move far beyond the tolerance (on the parallel block they stay)."""
    from gauge_audit.actions import ACTIONS
    from gauge_audit.models import build_config, neox
    from gauge_audit.runtime import generator

    act = ACTIONS["parallel-bias-trade"]
    for parallel in (True, False):
        m = build_config(neox.config(parallel_residual=parallel), seed=0, device="cpu")
        el = act.sample(m.cfg, m.params, generator(0), 1.0)
        x = inputs(m.cfg)
        before = m.family.forward(m.params, m.cfg, x)
        err = rel(m.family.forward(act.apply(m.cfg, m.params, el), m.cfg, x), before)
        print(f"parallel={parallel}: {err:.3g} (tol {tol(m.cfg, 12):.3g})")
        assert (err <= tol(m.cfg, 12)) if parallel else (err > 1e6 * tol(m.cfg, 12))
