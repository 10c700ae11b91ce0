"""High-precision cross-check: the independent mpmath model, dps-scaled
residuals of the true actions, certified counterexamples of the false rules, the
referee's concrete test and the floating-point error study.

Bounds are derived, not tuned: a true action's residual at ``dps`` digits must be
≤ κ·L·K·u(dps) (u = 2^(1−prec), K the summed inner-product lengths of one block,
see :mod:`gauge_audit.precision.residual`), and torch float64 must agree with mpmath
to L·K·ε64.  False rules must fail by a large margin: a certified |y'−y| that is a
sizeable fraction of the output scale.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from mpmath import iv, mp

from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.models import build_config, config_of
from gauge_audit.precision import (
    CERTIFIABLE,
    certify_rule,
    check_action,
    claim_verdict,
    eps24_verdict,
    plot_study,
    referee_test,
    run_study,
    torch_agreement,
    true_actions,
    value_g3_residuals,
    wiki_1e12_verdict,
    workdps,
)
from gauge_audit.precision.block import MP, exact_params, forward
from gauge_audit.precision.error_study import Point, fit_points, least_squares
from gauge_audit.precision.residual import unit_roundoff
from gauge_audit.runtime import eps

DPS = (30, 50, 100)


def assert_scales_with_dps(r):
    """Every residual within κ·L·K·u(dps), ≤ 1e-45 at dps 50, and the envelope shrinking."""
    assert r.verdict == "HOLDS" and r.expected == "HOLDS", r
    for x in r.residuals:
        assert x.residual <= x.bound, (x.dps, x.residual, x.bound)
        assert x.bound <= 10.0 ** (5 - x.dps)  # the derived bound is inside the claimed 10^(5−dps)
        print(
            f"{r.action} on {r.model}: dps {x.dps}: residual {x.residual:.3e} = "
            f"{x.residual / unit_roundoff(x.dps):.3g} u   (bound {x.bound / unit_roundoff(x.dps):.3g} u)"
        )
    by = {x.dps: x.residual for x in r.residuals}
    assert by[50] <= 1e-45
    assert r.shrinks
    # More digits really buy more accuracy: 50 more digits cut the residual by ≥ 40 orders (or it is below u).
    assert by[100] <= max(by[50], unit_roundoff(50)) * 1e-40


# ----------------------------------------------------------------------------- mpmath vs torch
@pytest.mark.parametrize(
    "name",
    [
        "gpt2-tiny",
        "bert-tiny",
        "llama-tiny",
        "llama-tiny-interleaved",
        "llama-tiny-gqa",
        "moe-tiny",
        "attn-tiny-rope",
        "gpt2-tiny-relu",
        "gpt2-tiny-tied",
    ],
)
def test_precision_matches_torch(name):
    a = torch_agreement(name, seed=0, dps=30)
    print(
        f"{name}: |torch − mpmath| / max|y| = {a.rel_diff:.3e} = {a.diff_eps:.3g} ε64  (bound L·K·ε = "
        f"{a.bound / eps(torch.float64):.3g} ε)"
    )
    assert a.within and a.rel_diff <= a.bound


def test_precision_matches_torch_detects_a_perturbation():
    """The agreement test can fail: perturbing one weight by 1e-9 relative to the torch
    run is far outside L·K·ε64 in the mpmath output."""
    m = build_config(config_of("gpt2-tiny").with_(n_layers=1), 0, "cpu", torch.float64)
    inputs = m.sample_inputs(0, batch=1, n=4)
    with torch.no_grad():
        y_t = m.forward(m.params, inputs).flatten().tolist()
    bad = dict(m.params)
    bad["blocks.0.mlp.W_in"] = bad["blocks.0.mlp.W_in"] * (1 + 1e-9)
    with workdps(30):
        y_m = [v for s in forward(m.cfg, exact_params(bad, MP), inputs, MP) for row in s for v in row]
        diff = float(max(abs(u - mp.mpf(v)) for u, v in zip(y_m, y_t)) / max(abs(u) for u in y_m))
    assert diff > 1e3 * 104 * eps(torch.float64)


def test_precision_restores_dps():
    mp.dps, iv.dps = 23, 19
    try:
        before = (mp.prec, iv.prec)
        check_action("qk-gl", dps=(30, 100))
        certify_rule("qk-same-action")
        value_g3_residuals((40,))
        assert (mp.prec, iv.prec) == before
        with pytest.raises(GaugeAuditError):
            with workdps(60):
                assert mp.dps == 60 and iv.dps == 60
                raise GaugeAuditError("boom")
        assert (mp.prec, iv.prec) == before
        for bad in (5, 10**6, 30.5, True):
            with pytest.raises(GaugeAuditError):
                with workdps(bad):
                    pass
        assert (mp.prec, iv.prec) == before
    finally:
        mp.dps, iv.dps = 15, 15


# ----------------------------------------------------------------------------- true actions
def test_qk_gl_residual_scales_with_dps():
    assert_scales_with_dps(check_action("qk-gl", dps=DPS))


def test_qk_gl_rope_commutant_residual_scales_with_dps():
    assert_scales_with_dps(check_action("qk-gl", "llama-tiny", dps=DPS))


def test_vo_gl_residual_scales_with_dps():
    assert_scales_with_dps(check_action("vo-gl", dps=DPS))


def test_vo_gl_gqa_residual_scales_with_dps():
    assert_scales_with_dps(check_action("vo-gl", "llama-tiny-gqa", dps=DPS))


def test_qk_gl_ill_conditioned_residual_tracks_kappa():
    """κ = 1e8: still within κ·L·K·u, i.e. about 8 digits lost, not more."""
    r = check_action("qk-gl", dps=(30, 50), kappa=1e8)
    assert_scales_with_dps_partial(r)


def assert_scales_with_dps_partial(r):
    assert r.verdict == "HOLDS"
    for x in r.residuals:
        assert x.residual <= x.bound


@pytest.mark.parametrize("action", [a for a in true_actions() if a not in ("qk-gl", "vo-gl")])
def test_true_action_residual_scales_with_dps(action):
    assert_scales_with_dps(check_action(action, dps=DPS))


def test_true_action_list_is_complete():
    assert set(true_actions()) == {
        "qk-gl",
        "vo-gl",
        "head-perm",
        "key-bias-shift",
        "value-bias-fold",
        "norm-scale",
        "norm-shift",
        "stream-rotation",
        "ffn-perm",
        "relu-scaling",
        "swiglu-scaling",
        "expert-perm",
    }


# ----------------------------------------------------------------------------- false rules
def assert_certified(c, claim=None):
    print(c.render())
    assert c.excludes_zero and c.verdict == "FAILS"
    # Large margin: the certified change is a sizeable fraction of the output, and the
    # enclosure is ~25 orders of magnitude narrower than the change it certifies.
    assert c.lower_magnitude >= 1e-2 * c.output_scale
    assert c.width <= 1e-20 * c.lower_magnitude
    assert c.entries_excluding_zero >= 1
    assert c.control_contains_zero and c.control_max_abs <= 1e-20
    if claim:
        assert c.claim == claim


def test_qk_same_action_certified():
    assert_certified(certify_rule("qk-same-action"), "qk-same-action")
    r = check_action("qk-same-action", dps=(30, 100))
    assert r.verdict == "FAILS" and all(x.residual > 1e-2 for x in r.residuals)


def test_value_g3_eq_g0_certified():
    c = certify_rule("value-g3-eq-g0")
    assert_certified(c, "value-g3-eq-g0")
    rows = value_g3_residuals(DPS)
    for row in rows:
        assert row["paper"] > 0.1
        assert row["corrected"] <= 10 * unit_roundoff(row["dps"])
    assert claim_verdict("value-g3-eq-g0").verdict == "FAILS"


def test_ln_affine_rotation_paper_rule_certified():
    assert_certified(certify_rule("stream-rotation-paper"), "ln-affine-rotation")


def test_rope_commutant_generic_certified():
    assert_certified(certify_rule("qk-gl-rope-generic"), "rope-commutant")


def test_gqa_tied_untied_certified():
    assert_certified(certify_rule("qk-gl-untied-gqa"), "gqa-tied")


def test_relu_forces_identity_gelu_scaling_certified():
    assert_certified(certify_rule("gelu-scaling"), "relu-forces-identity")


@pytest.mark.parametrize("rule", ["qk-gl-rope-generic", "qk-gl-untied-gqa", "stream-rotation-paper", "gelu-scaling"])
def test_false_rule_residual_stays_order_one(rule):
    r = check_action(rule, dps=(30, 100))
    assert r.verdict == "FAILS" == r.expected
    assert min(x.residual for x in r.residuals) > 1e-2
    assert abs(r.residuals[0].residual - r.residuals[1].residual) <= 1e-20  # the same number at every precision


def test_certify_all_rules_listed():
    assert set(CERTIFIABLE) == {
        "qk-same-action",
        "value-g3-eq-g0",
        "stream-rotation-paper",
        "qk-gl-rope-generic",
        "qk-gl-untied-gqa",
        "gelu-scaling",
    }
    with pytest.raises(GaugeAuditError):
        certify_rule("qk-gl")


def test_certificate_is_deterministic():
    assert certify_rule("qk-gl-untied-gqa", seed=3).to_json() == certify_rule("qk-gl-untied-gqa", seed=3).to_json()


# ----------------------------------------------------------------------------- referee test
@pytest.fixture(scope="module")
def referee():
    return referee_test(seed=0, dps=50)


def test_ln_affine_rotation_referee_test(referee):
    r = referee
    print(r.render())
    assert r.sequences == 100 and r.seq_len == 4
    assert r.rotation_orthogonality <= 1e-45 and r.rotation_fixes_ones <= 1e-45
    # The paper's rule: an O(1) change, in mpmath and in torch alike.
    assert r.paper_rel > 0.1 and r.ln_token_paper > 0.1
    assert abs(r.torch_paper_max_abs - r.paper_max_abs) <= 1e-10 * r.paper_max_abs
    # The corrected rule: exact to the working precision.
    assert r.corrected_rel <= 1e-40 and r.ln_token_corrected <= 1e-40
    assert r.torch_corrected_rel_eps <= 104  # L·K·ε with K of this block
    assert r.verdict == "HOLDS-WITH-CORRECTION"


def test_ln_affine_rotation_claim_verdict():
    assert claim_verdict("ln-affine-rotation").verdict == "HOLDS-WITH-CORRECTION"


# ----------------------------------------------------------------------------- error study
@pytest.fixture(scope="module")
def study():
    return run_study(
        seeds=(0, 1, 2), dtypes=["float64", "float32"], minilm=True, minilm_kappas=(1.0, 1e4), device="cpu"
    )


def test_eps_24_error_grows_linearly_with_kappa(study):
    print(study.render())
    for f in study.fits:
        # Rounding of W·M and M⁻¹·W is amplified by κ(M): slope ≈ 1 in log–log (the κ = 1
        # floor pulls the least-squares slope a little below 1).
        assert 0.6 <= f.b <= 1.2, f
        assert f.kappa_24eps is not None and 1 < f.kappa_24eps < 1e4
        assert f.min_kappa_beyond_24eps is not None and f.min_kappa_beyond_24eps <= 1e4
    for d in ("float64", "float32"):
        e = eps(getattr(torch, d))
        for a in ("qk-gl", "vo-gl"):
            assert study.worst(a, d, 1.0) <= 24 * e  # well-conditioned: within 24 ε
            assert study.worst(a, d, 1e6) >= 1e3 * 24 * e  # κ = 1e6: far beyond
    f32 = study.fit("qk-gl", "float32")
    assert f32.saturated_from is not None and f32.saturated_from <= 1e10


def test_eps_24_verdict(study):
    v = eps24_verdict(study)
    print(v.render())
    assert v.verdict == "HOLDS-WITH-CORRECTION"
    assert v.evidence["worst_error_eps_at_min_kappa"] <= 24
    assert v.evidence["points_over_24eps"] > 0


def test_eps_24_minilm(study):
    mini = {(p.action, p.dtype, p.kappa): p.error_eps for p in study.minilm}
    assert len(mini) == 2 * 2 * 2
    for (a, d, k), v in mini.items():
        print(f"MiniLM {a} {d} κ={k:.0e}: {v:.4g} ε")
        if k == 1.0:
            assert v <= 24
        else:
            assert v >= 24 * 10  # κ = 1e4 on real weights: two orders above the claim


def test_wiki_1e_12_verdict(study):
    v = wiki_1e12_verdict(study)
    print(v.render())
    assert v.verdict == "HOLDS-WITH-CORRECTION"
    assert v.evidence["worst_rel_error_at_min_kappa"]["float32"] > 1e-12  # float32 cannot meet it
    assert v.evidence["worst_rel_error_at_min_kappa"]["float64"] <= 1e-12
    k = v.evidence["float64_kappa_at_1e-12"]
    assert 1e2 < k < 1e6


def test_wiki_1e_12_float64_crossing_matches_measurement(study):
    f = study.fit("qk-gl", "float64")
    assert study.worst("qk-gl", "float64", 1e2) <= 1e-12 <= study.worst("qk-gl", "float64", 1e6)
    assert 1e2 <= f.kappa_1e12 <= 1e6


def test_error_study_is_deterministic():
    kw = dict(models=("attn-tiny",), kappas=(1.0, 1e6), seeds=(4,), dtypes=["float32"], minilm=False, device="cpu")
    assert run_study(**kw).to_json() == run_study(**kw).to_json()


def test_error_study_fit_recovers_known_slope():
    """The fit is checked on synthetic points err = 3 ε κ^0.5, with a saturated point excluded."""
    e = eps(torch.float64)
    ks = [1.0, 1e2, 1e4, 1e6, 1e30]
    pts = [Point("m", "qk-gl", "float64", k, 0, min(3 * e * k**0.5, 1.0), 0.0) for k in ks]
    f = fit_points(pts, "qk-gl", "float64", ks)
    assert f.n_points == 4 and f.saturated_from == 1e30
    assert math.isclose(f.b, 0.5, rel_tol=1e-9) and math.isclose(f.a, math.log10(3), rel_tol=1e-9)
    assert math.isclose(f.kappa_24eps, 64.0, rel_tol=1e-9)
    with pytest.raises(GaugeAuditError):
        least_squares([1.0], [2.0])


def test_error_study_plot(study, tmp_path):
    path = plot_study(study, tmp_path / "sub" / "err.png")
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    with pytest.raises(GaugeAuditError):
        plot_study(study, tmp_path / "err.svg")


# ----------------------------------------------------------------------------- CLI
def test_cli_precision_action_table(capsys):
    assert main(["precision", "vo-gl", "--dps", "50"]) == 0
    out = capsys.readouterr().out
    assert "vo-gl on gpt2-tiny" in out and "verdict: HOLDS" in out and " 50 " in out


def test_cli_precision_certify_json(capsys):
    assert main(["precision", "qk-same-action", "--certify", "--json", "--dps", "30"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["verdict"] == "FAILS" and obj["certificate"]["excludes_zero"] is True


def test_cli_precision_value_g3(capsys):
    assert main(["precision", "value-g3-eq-g0", "--dps", "40"]) == 0
    out = capsys.readouterr().out
    assert "excludes 0: yes" in out and "dps   40" in out


def test_cli_precision_referee_json(capsys):
    assert main(["precision", "--referee-test", "--json", "--sequences", "5", "--dps", "40"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["paper_rel"] > 0.1 and obj["corrected_rel"] <= 1e-30 and obj["sequences"] == 5


def test_cli_precision_plot(tmp_path, capsys):
    path = tmp_path / "plot.png"
    assert main(["precision", "--plot", str(path), "--no-minilm", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert path.exists() and "eps-24" in out and "plot written" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["precision", "nope"],
        ["precision", "qk-gl", "--dps", "5"],
        ["precision"],
        ["precision", "qk-gl", "--model", "nope"],
        ["precision", "gelu-scaling", "--model", "llama-tiny"],
        ["precision", "eps-24", "--model", "gpt2-tiny"],
        ["precision", "--referee-test", "--sequences", "0"],
    ],
)
def test_cli_precision_errors_are_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gauge-audit: error: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("prec", [53, 200, 700])
def test_mpf_dot_is_mpmaths_exact_sum_of_exact_products_bit_for_bit(prec):
    """The working-precision dot product forms its products in the summing loop: the raw result
    equals mpmath's mpf_sum of the exact products (rounded once) for every vector — zeros,
    infinities, NaNs and exponents so far apart that mpf_sum drops or restarts the sum included."""
    import random

    from mpmath.libmp import mpf_mul, mpf_sum

    from gauge_audit.precision.linalg import _mpf_dot

    rng = random.Random(prec)
    with mp.workprec(prec):

        def draw():
            r = rng.random()
            if r < 0.1:
                return mp.mpf(0)
            if r < 0.13:
                return mp.inf * rng.choice([1, -1])
            if r < 0.14:
                return mp.nan
            shift = rng.choice([0, 0, 0, rng.randint(-3000, 3000), rng.randint(-3 * prec, 3 * prec)])
            return mp.mpf(rng.gauss(0, 1)) * mp.mpf(2) ** shift

        for _ in range(2000):
            n = rng.randint(1, 12)
            a, b = [draw() for _ in range(n)], [draw() for _ in range(n)]
            want = mpf_sum([mpf_mul(x._mpf_, y._mpf_) for x, y in zip(a, b)], prec, "n")
            got = _mpf_dot(a, b, prec)
            assert got == want or (mp.isnan(mp.make_mpf(got)) and mp.isnan(mp.make_mpf(want))), (a, b)
