"""The nullity cost model: estimates from the parameter count and the machine's rate, and
up-front refusal (one line with the estimate, exit 2, nothing built) of what cannot fit."""

from __future__ import annotations

import math

import pytest

from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.models import build_config, gpt2, llama, moe
from gauge_audit.nullity import analyze, cost

BIG = [
    "nullity",
    "--family",
    "gpt2",
    "--d-model",
    "512",
    "--n-heads",
    "8",
    "--d-head",
    "64",
    "--d-ff",
    "2048",
    "--layers",
    "4",
    "--vocab",
    "1000",
    "--n-ctx",
    "64",
]


@pytest.mark.parametrize("cfg", [gpt2.config(), llama.config(n_kv_heads=2), moe.config()])
def test_parameter_count_without_building(cfg):
    m = build_config(cfg, device="cpu")
    assert cost.parameter_count(cfg) == sum(t.numel() for t in m.params.values())


def test_estimate_follows_the_cost_model():
    cfg = gpt2.config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_head=8, d_ff=64, n_ctx=12, vocab=40)
    P = cost.parameter_count(cfg)
    assert P == 20096
    e = cost.estimate(cfg, "matrix-free", gflops=100.0)
    n, m = P, 1.05 * P
    assert e.flops == pytest.approx(m * n * n + n**3 / 3 + 6 * m * P, rel=1e-12)
    assert e.seconds == pytest.approx((m * n * n + n**3 / 3) / 1e11 + 6 * m * P / 1e10, rel=1e-12)
    assert e.bytes >= 16 * n * n  # the Gram and its Cholesky factor
    d = cost.estimate(cfg, "dense", gflops=100.0)
    assert d.bytes >= 2 * 8 * 3 * P * P and d.flops == pytest.approx(4 * 3 * P**3 + 8 * P**3, rel=1e-12)
    assert "20,096" in e.describe() and "GFLOP/s" in e.describe()


def test_require_feasible_refuses_on_memory_or_time_and_says_the_estimate():
    cfg = gpt2.config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, d_head=8, d_ff=64, n_ctx=12, vocab=40)
    e = cost.estimate(cfg, "matrix-free", gflops=100.0)  # ≈ 6.5 GB, ≈ 1.5 min
    cost.require_feasible(e, max_minutes=10, free=64e9)
    with pytest.raises(GaugeAuditError, match=r"more than the .* of free memory"):
        cost.require_feasible(e, max_minutes=10, free=1e9)
    with pytest.raises(GaugeAuditError, match=r"longer than the --max-minutes budget of 0.5 min"):
        cost.require_feasible(e, max_minutes=0.5, free=64e9)
    cost.require_feasible(e, max_minutes=None, free=64e9)  # no time limit


def test_machine_rate_and_free_memory_are_measured():
    assert cost.matmul_gflops() > 0.1
    free = cost.available_memory()
    assert free > 0 and (math.isinf(free) or free < 1e16)


def test_over_large_nullity_is_refused_before_any_work(monkeypatch, capsys):
    """The issue's example (P ≈ 13.7 M): exit 2 with one line giving the estimate; the model is
    never built (make_problem would raise)."""
    import gauge_audit.nullity.analysis as an
    import gauge_audit.nullity.matrixfree as mf

    def boom(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(an, "make_problem", boom)
    monkeypatch.setattr(mf, "make_problem", boom)
    for argv in (BIG + ["--method", "matrix-free"], BIG):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "13,667,328" in err and "PB" in err, err
    assert main(BIG + ["--method", "matrix-free"]) == 2
    assert "refusing before starting" in capsys.readouterr().err
    # a modest size under a tiny budget: refused on time alone, the memory fits
    small = [
        "nullity",
        "--family",
        "gpt2",
        "--d-model",
        "64",
        "--n-heads",
        "4",
        "--d-head",
        "16",
        "--d-ff",
        "128",
        "--layers",
        "2",
        "--vocab",
        "100",
        "--n-ctx",
        "16",
        "--method",
        "matrix-free",
        "--max-minutes",
        "0.001",
    ]
    assert main(small) == 2
    err = capsys.readouterr().err
    assert "--max-minutes budget of 0.001 min" in err
    assert main(small[:-2] + ["--max-minutes", "-1"]) == 2
    assert "--max-minutes must be" in capsys.readouterr().err


def test_analyze_refuses_with_the_estimate():
    with pytest.raises(GaugeAuditError, match="above the dense limit .* matrix-free would need"):
        analyze(gpt2.config(d_model=64, n_heads=4, d_head=16, d_ff=128, n_layers=2, vocab=100, n_ctx=16))


def test_user_claim_out_of_reach_gets_an_error_evidence_with_the_estimate(tmp_path, capsys):
    claim = tmp_path / "big.toml"
    claim.write_text(
        """[document]
title = "T"
authors = ["A"]
reference = "R"

[[claim]]
id = "big-nullity"
location = "eq. 1"
statement = "the symmetry dimension of a large GPT-2"
kind = "count"
checkers = ["nullity"]
formula = "L*h*(d_k^2 + d_v^2)"
params = { family = "gpt2", d_model = 512, n_heads = 8, d_head = 64, d_ff = 2048, n_layers = 4, vocab = 1000, n_ctx = 64, L = 4, h = 8, d_k = 64, d_v = 64 }
""",
        encoding="utf-8",
    )
    import json

    assert main(["audit", str(claim), "--out", str(tmp_path / "r"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ev = data["claims"][0]["evidence"]["nullity"]
    assert ev["outcome"] == "ERROR" and "dense limit" in ev["summary"] and "PB" in ev["summary"], ev
