"""Scaled RoPE (linear, dynamic, yarn, llama3, longrope) and Mistral's sliding window, read from
Hugging Face checkpoints: the project forward equals transformers' in float64 within L·K·ε, the
frequency tables equal transformers' own, a misread option fails by a wide margin, every action's
verdict agrees with the theory (the scaling changes the angles, not the RoPE commutant), and a
transform round-trips."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.models.checkpoint import open_checkpoint
from gauge_audit.models.rope import inverse_frequencies

transformers = pytest.importorskip("transformers")
from hf_families import EPS32, EPS64, compare, hf_logits, inputs, rel, tol, transform_round_trip  # noqa: E402

ROPES = ["llama-linear", "llama-dynamic", "llama-yarn", "llama-llama3", "llama-longrope"]


@pytest.mark.parametrize("kind", [*ROPES, "mistral-window"])
def test_forward_matches_transformers_float64(hf_family, kind):
    err, tol64, shipped, tol32 = compare(hf_family(kind))
    print(
        f"{kind}: {err / EPS64:.2f} ε64 (tol {tol64 / EPS64:.0f}); as shipped {shipped / EPS32:.3g} ε32 "
        f"(tol {tol32 / EPS32:.0f} ε32)"
    )
    assert err <= tol64 and shipped <= tol32


@pytest.mark.parametrize("kind", ROPES)
@pytest.mark.parametrize("n", [5, 12])
def test_frequency_table_equals_transformers_own(hf_family, kind, n):
    """θ_i and the cos/sin factor against transformers' ROPE_INIT_FUNCTIONS (which compute in float32:
    a few ε32 apart, far below the 1e-2 a wrong formula or a wrong length switch gives)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ckpt = open_checkpoint(hf_family(kind))
    hf_cfg = transformers.AutoConfig.from_pretrained(str(hf_family(kind)))
    want, want_factor = ROPE_INIT_FUNCTIONS[ckpt.cfg.rope_type](hf_cfg, "cpu", seq_len=n)
    got, factor = inverse_frequencies(ckpt.cfg, n)
    assert rel(got, want.to(torch.float64)) <= 8 * EPS32
    assert factor == pytest.approx(want_factor, rel=8 * EPS32)


@pytest.mark.parametrize(
    "kind,changes",
    [
        ("llama-llama3", {"rope_type": "default", "rope_params": ()}),
        (
            "llama-yarn",
            {"rope_params": (("factor", 2.0), ("original_max_position_embeddings", 4.0), ("attention_factor", 1.0))},
        ),  # the attention factor dropped
        ("llama-dynamic", {"rope_type": "linear"}),  # the right factor, the wrong type
        ("llama-longrope", {"n_ctx": 12}),  # the short factors at 12 positions
        ("mistral-window", {"window": 0}),
    ],
)
def test_a_misread_option_fails_by_a_wide_margin(hf_family, kind, changes):
    path = hf_family(kind)
    ckpt = open_checkpoint(path)
    cfg = ckpt.cfg.with_(**changes)
    if kind == "llama-longrope":  # 12 positions ≤ a claimed original length of 12: short factors
        cfg = cfg.with_(
            rope_params=tuple((k, 12.0 if k == "original_max_position_embeddings" else v) for k, v in cfg.rope_params)
        )
    model = ckpt.model()
    x = inputs(cfg)
    wrong = model.family.forward(model.params, cfg, x)
    err = rel(wrong, hf_logits(path, ckpt, x, True))
    print(f"{kind} read with {changes}: {err:.3g} vs tol {tol(cfg, 12):.3g}")
    assert err > 1e6 * tol(cfg, 12)


@pytest.mark.parametrize("kind", ["llama-llama3", "mistral-window"])
def test_check_all_agrees_with_theory(hf_family, kind, capsys):
    assert main(["check", "--checkpoint", str(hf_family(kind)), "--all", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {"qk-gl", "stream-rotation", "qk-gl-rope-generic"} <= {r["action"] for r in rows}
    for r in rows:
        assert r["verdict"] == r["expected"], r


def test_transform_round_trip_on_llama3(hf_family, tmp_path, capsys):
    src, out = hf_family("llama-llama3"), tmp_path / "out"
    transform_round_trip(src, out, "qk-gl", capsys)
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_type"] == "llama3"


def _edited(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(
    "kind,changes,match",
    [
        ("llama-linear", {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0}}, "needs factor"),
        (
            "llama-linear",
            {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": -1}},
            "non-negative",
        ),
        (
            "llama-llama3",
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 500.0,
                    "factor": 8.0,
                    "low_freq_factor": 4.0,
                    "high_freq_factor": 1.0,
                    "original_max_position_embeddings": 16,
                }
            },
            "high_freq_factor >",
        ),
        (
            "llama-longrope",
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 500.0,
                    "short_factor": [1.0],
                    "long_factor": [1.0, 2.0],
                    "original_max_position_embeddings": 6,
                }
            },
            "one per rotated plane",
        ),
        (
            "llama-yarn",
            {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 500.0,
                    "factor": "big",
                    "original_max_position_embeddings": 4,
                }
            },
            "not a number",
        ),
        ("llama-linear", {"rope_parameters": {"rope_type": "ntk-by-parts", "rope_theta": 500.0}}, "unknown RoPE"),
        ("llama-linear", {"partial_rotary_factor": 0.5}, "rotates the whole head"),
        ("mistral-window", {"sliding_window": 0}, "sliding_window"),
    ],
)
def test_bad_rope_options_are_refused_in_one_line(hf_family, tmp_path, capsys, kind, changes, match):
    path = _edited(hf_family(kind), tmp_path / "edited", **changes)
    with pytest.raises(GaugeAuditError, match=match):
        open_checkpoint(path)
    capsys.readouterr()
    assert main(["check", "--checkpoint", str(path), "--action", "qk-gl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and match.split()[0] in err


def test_dynamic_table_is_default_up_to_the_trained_length():
    """NTK-aware dynamic scaling leaves the table alone for n ≤ max_position_embeddings and
    raises the base beyond it (the table is fixed per input length)."""
    from gauge_audit.models import llama

    cfg = llama.config(n_ctx=8, rope_type="dynamic", rope_params=(("factor", 3.0),))
    default = inverse_frequencies(cfg.with_(rope_type="default", rope_params=()), 8)[0]
    assert torch.equal(inverse_frequencies(cfg, 8)[0], default)
    longer = inverse_frequencies(cfg, 16)[0]
    base = cfg.rope_base * (3.0 * 16 / 8 - 2.0) ** (cfg.d_head / (cfg.d_head - 2))
    assert longer[1] == pytest.approx(base ** (-2 / cfg.d_head), rel=4 * EPS64) and longer[1] < default[1]
    assert math.isclose(float(longer[0]), 1.0)
