"""The nullity theory of the QK-norm (Qwen3: per head, shared weights; OLMo 2: full width), of
normed sublayer outputs without pre-norms (OLMo 2) and of a partial rotary (Phi-3): at generic points
the measured nullity of the Jacobian equals the explained dimension, family by family, on several
configurations of each feature — and the pre-QK-norm theory (qk-gl) would over-count by a wide margin.
A tied GPT-NeoX whose parallel block 0 reads d_model < vocab points has tied-table-rotation, of the
dimension its formula gives, and nothing unexplained at any vocab around it, tied or not, parallel
or sequential."""

from __future__ import annotations

import pytest

from gauge_audit.models import llama, neox, olmo2, phi3, qwen3
from gauge_audit.nullity.families.token_tables import tied_table_dimension

A = dict(d_model=6, n_heads=2, n_kv_heads=2, d_head=2, d_ff=6, n_ctx=5, vocab=8)
B = dict(d_model=8, n_heads=2, n_kv_heads=2, d_head=4, d_ff=7, n_ctx=4, vocab=11)
CONFIGS = {
    "qwen3-A": lambda: qwen3.config(**A, n_layers=1),
    "qwen3-B": lambda: qwen3.config(**B, n_layers=1),
    "qwen3-B-gqa-2layers": lambda: qwen3.config(**{**B, "n_heads": 4}, n_layers=2),
    "qwen3-B-partial-rotary": lambda: qwen3.config(**B, n_layers=1, rotary_dim=2),
    "olmo2-A": lambda: olmo2.config(**A, n_layers=1),
    "olmo2-A-2layers": lambda: olmo2.config(**A, n_layers=2),
    "olmo2-A-mqa": lambda: olmo2.config(**{**A, "n_kv_heads": 1}, n_layers=1),
    # partial rotary without a QK-norm: qk-gl's commutant gains GL on the unrotated coordinates
    "llama-B-partial-rotary": lambda: llama.config(**B, n_layers=1, rotary_dim=2),
    "phi3-B-gqa-2layers-partial-rotary": lambda: phi3.config(**{**B, "n_heads": 4}, n_layers=2, rotary_dim=2),
}


# GPT-NeoX (parallel residual, LayerNorm, partial rotary) at small vocabularies; d_ff 32 lets block
# 0's FFN set its stream table at will up to vocab 24 (the formula's regime)
NX = dict(n_heads=2, n_kv_heads=2, d_head=4, d_ff=32, n_ctx=4, n_layers=1)
NEOX = {
    **{
        f"neox-d8-v{v}-tied": (lambda v=v: neox.config(**NX, d_model=8, vocab=v, tied=True))
        for v in (9, 11, 13, 16, 24)
    },
    "neox-d8-v11-untied": lambda: neox.config(**NX, d_model=8, vocab=11),
    "neox-d8-v11-tied-sequential": lambda: neox.config(**NX, d_model=8, vocab=11, tied=True, parallel_residual=False),
    "neox-d12-v16-tied": lambda: neox.config(**{**NX, "n_heads": 3, "n_kv_heads": 3}, d_model=12, vocab=16, tied=True),
}


def _assert_fully_explained(r) -> None:
    """A well-resolved measurement (enough rows, a wide gap, generic weights) that the theory
    explains exactly: measured = explained, nothing left over, every family at its formula."""
    assert r.rows >= 3 * r.params and r.gap_ratio >= 1e6
    assert r.generators_ok and r.overlap == 0 and r.genericity.clean
    assert r.unexplained == 0, r.unexplained_blocks
    assert r.measured_nullity == r.explained == sum(r.family_dims().values())
    for f in r.families:
        assert f.rank == f.expected, (f.name, f.rank, f.expected)


@pytest.mark.parametrize("name", sorted(NEOX))
def test_neox_small_vocab_measured_equals_explained(analyzed, name):
    """Measured nullity = explained, nothing unexplained, every family at its formula; tied with a
    parallel block 0, tied-table-rotation at (d−1)(d−2)/2 + 2d − min((d−1)(V−d), d+V−2)."""
    cfg = NEOX[name]()
    r = analyzed(cfg, seed=0)
    ranks = {f.name: f.rank for f in r.families if f.flat}
    print(f"{name}: P = {r.params}, measured {r.measured_nullity}, explained {r.explained}, {ranks}")
    _assert_fully_explained(r)
    if cfg.tied and cfg.parallel_residual:
        assert ranks["tied-table-rotation"] == tied_table_dimension(cfg.d_model, cfg.vocab) > 0
    else:  # untied, W_E's two roles are separate parameters; in sequence the FFN reads the attention
        assert "tied-table-rotation" not in ranks


def test_tied_table_dimension_counts_both_regimes():
    """Just above d the affine condition on n₁ costs (d−1)·(V−d); from V = d + 2 on, 1·A·P = 0 and
    n_t·A·n_tᵀ constant cost (d−1) + (V−1); gone at V ≥ (d−1)(d−2)/2 + d + 2."""
    assert [tied_table_dimension(8, v) for v in (9, 10, 11, 13, 16, 24, 30, 31, 40)] == [30, 23, 20, 18, 15, 7, 1, 0, 0]
    assert tied_table_dimension(12, 16) == 55 + 24 - 26
    with pytest.raises(ValueError):
        tied_table_dimension(8, 8)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_measured_equals_explained(analyzed, name):
    cfg = CONFIGS[name]()
    r = analyzed(cfg, seed=0)
    print(
        f"{name}: P = {r.params}, measured {r.measured_nullity}, explained {r.explained}, gap {r.gap_ratio:.3g}; "
        + ", ".join(f"{f.name} {f.rank}" for f in r.families if f.flat)
    )
    _assert_fully_explained(r)
    names = {f.name for f in r.families if f.flat}
    if cfg.qk_norm != "none":
        assert "qk-norm-scale" in names and "qk-gl" not in names
    else:  # per KV head: R rotated coordinates (R/2 planes × 2) + (d_k − R)² on the unrotated ones
        e, rot = cfg.d_head, cfg.rotary_dim
        assert {f.name: f.rank for f in r.families}["qk-gl"] == cfg.n_layers * cfg.n_kv_heads * (rot + (e - rot) ** 2)
    if cfg.norm_placement == "output":
        assert "stream-rotation" not in names and "norm-scale" not in names


def test_the_qk_norm_scale_count_per_feature(analyzed):
    """L·(R/2 + d_k − R) per layer for a shared norm; ×n_kv for a full-width one — and qk-gl's
    L·n_kv·d_k (what a model without the norm has) is not what is measured."""
    fam = {n: {f.name: f for f in analyzed(CONFIGS[n](), seed=0).families} for n in CONFIGS}
    assert fam["qwen3-B"]["qk-norm-scale"].rank == 2  # 2 planes, shared by the heads
    assert fam["qwen3-B-partial-rotary"]["qk-norm-scale"].rank == 3  # 1 plane + 2 unrotated coordinates
    assert fam["qwen3-B-gqa-2layers"]["qk-norm-scale"].rank == 4
    assert fam["olmo2-A"]["qk-norm-scale"].rank == 2  # 1 plane × 2 KV heads
    # measured on LLaMA of the same size (no QK-norm): qk-gl's L·n_kv·d_k = 8 replaces the 2
    plain = analyzed(llama.config(**B, n_layers=1), seed=0)
    assert plain.measured_nullity - analyzed(CONFIGS["qwen3-B"](), seed=0).measured_nullity == 8 - 2


@pytest.mark.parametrize(
    "args",
    [
        [
            "--family",
            "qwen3",
            "--d-model",
            "8",
            "--n-heads",
            "2",
            "--d-head",
            "4",
            "--d-ff",
            "7",
            "--n-ctx",
            "4",
            "--vocab",
            "11",
            "--layers",
            "1",
            "--rotary-dim",
            "2",
        ],
        [
            "--family",
            "llama",
            "--d-model",
            "6",
            "--n-heads",
            "2",
            "--d-head",
            "2",
            "--d-ff",
            "6",
            "--n-ctx",
            "5",
            "--vocab",
            "8",
            "--layers",
            "1",
            "--qk-norm",
            "full",
            "--norm-placement",
            "output",
        ],
    ],
)
def test_nullity_cli_takes_the_new_features(args, capsys):
    import json

    from gauge_audit.cli import main

    assert main(["nullity", *args, "--quiet", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["measured_nullity"] == r["explained"] and r["unexplained"] == 0 and "qk-norm-scale" in r["families"]


@pytest.mark.parametrize(
    "args,match",
    [
        (["--family", "qwen3", "--rotary-dim", "3"], "rotary_dim"),
        (["--family", "llama", "--qk-norm", "head", "--norm", "layernorm"], "QK-norm"),
    ],
)
def test_nullity_cli_refuses_bad_features_in_one_line(args, match, capsys):
    from gauge_audit.cli import main

    assert main(["nullity", *args, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err
