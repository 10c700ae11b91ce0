"""Special points: where a false contrast's generic obstruction vanishes and its rule really holds.

Freshly initialised checkpoints (norm weights exactly 1, biases 0, as transformers' ``from_config``
leaves them) sit on the stratum where van Nierop's stream rotation is function-preserving; zeroed
heads, silent units and one-position inputs are the strata of the other contrasts.  On each the
check predicts HOLDS and says why; off them (generic weights, or a perturbation well above the
tolerance) the contrast is predicted to FAIL and FAILS; a point within the tolerance of a stratum
is reported as unresolved; and a prediction that is wrong still exits 1.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from conftest import HF_TINY, randomize
from gauge_audit.actions import ACTIONS, get_action
from gauge_audit.actions.base import Special
from gauge_audit.cli import main
from gauge_audit.models import build
from gauge_audit.models.registry import Model
from gauge_audit.numeric import FAILS, HOLDS, check

transformers = pytest.importorskip("transformers")

EPS64 = torch.finfo(torch.float64).eps
FRESH = ("llama", "qwen", "gpt2")
PAPER = "stream-rotation-paper"


def _hf(kind: str, fresh: bool, perturb: float = 0.0, seed: int = 0):
    """A transformers model of HF_TINY ``kind`` as from_config leaves it (fresh) or with generic weights,
    in float64 (so a perturbation of the norm weights below float32's resolution survives saving)."""
    conf, arch, kw = HF_TINY[kind]
    model = getattr(transformers, arch)(getattr(transformers, conf)(**kw)).eval().to(torch.float64)
    if not fresh:
        randomize(model, seed)
    if perturb:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1 and name.endswith("weight") and ("norm" in name or "ln_" in name):
                    p.add_(perturb * (2 * torch.rand(p.shape, generator=g, dtype=torch.float64) - 1))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``saved(kind, fresh=True, perturb=0.0)`` -> a checkpoint directory (cached)."""
    transformers.utils.logging.disable_progress_bar()
    made = {}

    def get(kind: str, fresh: bool = True, perturb: float = 0.0):
        key = (kind, fresh, perturb)
        if key not in made:
            out = tmp_path_factory.mktemp(f"strata-{kind}")
            _hf(kind, fresh, perturb).save_pretrained(str(out))
            made[key] = out
        return made[key]

    return get


def _rows(capsys) -> dict[str, dict]:
    return {r["action"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}


# ----------------------------------------------------------------------------- fresh checkpoints
@pytest.mark.parametrize("kind", FRESH)
def test_fresh_checkpoint_holds_at_the_special_point_and_exits_0(saved, capsys, kind):
    path = str(saved(kind))
    assert main(["check", "--checkpoint", path, "--all"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if f" {PAPER} " in line)
    assert "HOLDS (special point) — holds here because γ ∝ 1" in row
    assert "commutes with R" in row and "differs" not in out
    assert main(["check", "--checkpoint", path, "--all", "--json"]) == 0
    rows = _rows(capsys)
    r = rows[PAPER]
    assert r["expected"] == HOLDS and r["verdict"] == HOLDS and r["special"]
    # The rule is exact there: within the statistical tolerance by more than a factor 10.
    assert r["residual_eps"] < 0.1 * r["tolerance_statistical_eps"]
    # The qk contrasts are not at a special point of theirs on a fresh checkpoint (random W_Q, W_K):
    # predicted to fail, and they fail far above the worst-case tolerance.
    cfg = _cfg(path)
    for name, res in rows.items():
        if not ACTIONS[name].expected_holds(cfg) and name != PAPER:
            assert res["special"] == "" and res["verdict"] == FAILS == res["expected"]
            assert res["residual_eps"] > 1e6 * res["tolerance_eps"]


def _cfg(path):
    from gauge_audit.models.checkpoint import open_checkpoint

    return open_checkpoint(path).cfg


@pytest.mark.parametrize("kind", FRESH)
def test_generic_weights_keep_the_prediction_and_fail(saved, capsys, kind):
    path = str(saved(kind, fresh=False))
    assert main(["check", "--checkpoint", path, "--action", PAPER, "--json"]) == 0
    r = _rows(capsys)[PAPER]
    assert r["expected"] == FAILS and r["verdict"] == FAILS and r["special"] == "" and r["unresolved"] == ""
    assert r["max_rel_error"] > 1e-2  # an O(1) change: the referee's objection
    assert r["residual_eps"] > 1e10 * r["tolerance_eps"]


# ----------------------------------------------------------------------------- near the stratum
def test_a_perturbation_well_above_the_tolerance_is_not_special(saved, capsys):
    """γ = 1 + 10⁻⁶·u: a spread 10⁹ times ε and 10⁷ times the tolerance — generic, predicted and
    measured to FAIL."""
    assert main(["check", "--checkpoint", str(saved("llama", perturb=1e-6)), "--action", PAPER, "--json"]) == 0
    r = _rows(capsys)[PAPER]
    assert r["expected"] == FAILS and r["verdict"] == FAILS and r["special"] == "" and r["unresolved"] == ""
    assert r["max_rel_error"] > 1e3 * r["tolerance_eps"] * EPS64


def test_a_perturbation_within_the_tolerance_is_unresolved_not_a_contradiction(saved, capsys):
    """γ = 1 + 10⁻¹⁴·u: off the stratum (spread ≈ 90 ε > ε), yet a defect below the worst-case
    tolerance: the failure it predicts cannot be resolved, so HOLDS does not contradict it."""
    path = str(saved("llama", perturb=1e-14))
    assert main(["check", "--checkpoint", path, "--action", PAPER, "--json"]) == 0
    r = _rows(capsys)[PAPER]
    assert r["expected"] == FAILS and r["special"] == "" and r["unresolved"]
    assert r["verdict"] == HOLDS
    assert main(["check", "--checkpoint", path, "--action", PAPER]) == 0
    assert "near a special point" in capsys.readouterr().out


def test_a_spread_below_one_rounding_is_the_special_point(saved, capsys):
    """γ = 1 + 10⁻¹⁶·u: the stored entries differ by at most one ulp of 1 — on the stratum."""
    assert main(["check", "--checkpoint", str(saved("llama", perturb=1e-16)), "--action", PAPER, "--json"]) == 0
    r = _rows(capsys)[PAPER]
    assert r["expected"] == HOLDS and r["special"] and r["verdict"] == HOLDS


# ----------------------------------------------------------------------------- contradictions survive
def test_a_wrong_prediction_is_still_a_contradiction(saved, capsys, monkeypatch):
    """Without the special-point test the fresh checkpoint's HOLDS contradicts the generic prediction
    (the bug this replaces); with one that claims a special point on generic weights, the measured
    FAILS contradicts it.  Both exit 1."""
    paper = ACTIONS[PAPER]
    monkeypatch.setitem(ACTIONS, PAPER, dataclasses.replace(paper, special=None))
    assert main(["check", "--checkpoint", str(saved("gpt2")), "--action", PAPER]) == 1
    assert "<-- differs from theory" in capsys.readouterr().out
    monkeypatch.setitem(ACTIONS, PAPER, dataclasses.replace(paper, special=lambda cfg, p, n, e: Special("claimed")))
    assert main(["check", "--checkpoint", str(saved("gpt2", fresh=False)), "--action", PAPER]) == 1
    out = capsys.readouterr().out
    assert "predicted to hold here (special point) because claimed" in out and "<-- differs from theory" in out


# ----------------------------------------------------------------------------- the other contrasts' strata
def _with(name: str, **changes) -> Model:
    """Built-in model ``name`` (seed 0, generic) with some tensors replaced by fn(tensor)."""
    m = build(name, seed=0, device="cpu")
    params = dict(m.params)
    for pattern, fn in changes.items():
        for k in params:
            if k.endswith(pattern.replace("__", ".")):
                params[k] = fn(params[k].clone())
    return Model(m.name, m.cfg, params, m.family)


def _zero(t):
    return torch.zeros_like(t)


def _assert_special(r, word: str):
    assert r.expected == HOLDS and word in r.special and r.verdict == HOLDS and r.agrees
    assert r.residual_eps < 0.1 * r.tolerance_statistical_eps


def _assert_generic(r):
    assert r.expected == FAILS and not r.special and not r.unresolved and r.verdict == FAILS and r.agrees
    assert r.max_rel_error > 1e6 * r.tolerance


def test_gelu_scaling_holds_only_where_every_unit_is_silent():
    _assert_special(check(_with("gpt2-tiny", mlp__W_out=_zero), "gelu-scaling"), "silent")
    _assert_special(check(_with("gpt2-tiny", mlp__W_in=_zero, mlp__b_in=_zero), "gelu-scaling"), "silent")
    _assert_generic(check(_with("gpt2-tiny"), "gelu-scaling"))

    def one_live(t):  # every row of W_out zero but one
        t[..., 1:, :] = 0
        return t

    _assert_generic(check(_with("gpt2-tiny", mlp__W_out=one_live), "gelu-scaling"))
    # Zero input weights with a bias b ≠ 0 is a constant unit, not a silent one: gelu(s·b)/s ≠ gelu(b).
    _assert_generic(check(_with("gpt2-tiny", mlp__W_in=_zero), "gelu-scaling"))


@pytest.mark.parametrize("action", ["qk-same-action", "qk-gl-rope-generic", "qk-gl-untied-gqa"])
def test_qk_contrasts_hold_where_no_changed_score_reaches_the_output(action):
    name = "llama-tiny-gqa"
    _assert_generic(check(_with(name), action))
    _assert_special(check(_with(name, attn__W_O=_zero), action), "W_O = 0 or W_V = 0")
    _assert_special(check(_with(name, attn__W_V=_zero), action), "W_O = 0 or W_V = 0")
    _assert_special(check(_with(name, attn__W_Q=_zero), action), "zero queries")
    _assert_special(check(_with(name, attn__W_K=_zero), action), "constant keys")
    m = _with(name)
    _assert_special(check(m, action, m.sample_inputs(0, n=1)), "single position")


def test_a_constant_key_is_special_without_rope_and_not_under_it():
    """Keys b_K at every position: constant per query without RoPE (softmax ignores it); under RoPE
    b_K is rotated by its position, so the scores change."""
    _assert_special(check(_with("gpt2-tiny", attn__W_K=_zero), "qk-same-action"), "constant keys")
    _assert_generic(check(_with("qwen-tiny", attn__W_K=_zero), "qk-same-action"))
    _assert_generic(check(_with("qwen-tiny", attn__W_K=_zero), "qk-gl-rope-generic"))


def test_untied_gqa_under_rope_is_special_plane_by_plane():
    """Under RoPE the untied contrast's A = M_h·M_first⁻¹ is in the commutant and acts per frequency
    plane: a head is safe when no plane carries both its query and its key.  One shared plane breaks it."""
    from gauge_audit.models.layers import rope_planes

    m = build("llama-tiny-gqa", seed=0, device="cpu")
    planes = rope_planes(m.cfg)

    def keep(t, chosen):
        mask = torch.zeros(t.shape[-1], dtype=torch.bool)
        for i, j in chosen:
            mask[[i, j]] = True
        return t * mask

    half = len(planes) // 2
    p = dict(m.params)
    for k in p:
        if k.endswith("attn.W_Q"):
            p[k] = keep(p[k], planes[:half])
        if k.endswith("attn.W_K"):
            p[k] = keep(p[k], planes[half:])
    r = check(Model(m.name, m.cfg, p, m.family), "qk-gl-untied-gqa")
    _assert_special(r, "no RoPE plane with both a query and a key")
    for k in p:
        if k.endswith("attn.W_K"):
            p[k] = keep(m.params[k], planes[half - 1 :])
    _assert_generic(check(Model(m.name, m.cfg, p, m.family), "qk-gl-untied-gqa"))


def test_paper_rotation_holds_where_the_other_norms_are_not_read():
    """ln1 generic, ln2 and the final norm with γ = 1, and every attention writing a constant
    (W_O = 0): nothing sees ln1's output, so the paper's rule holds; with W_O back it fails."""
    ones = torch.ones_like
    m = _with("llama-tiny", ln2__w=ones, ln_final__w=ones, attn__W_O=_zero)
    _assert_special(check(m, PAPER), "the attention writes a constant")
    _assert_generic(check(_with("llama-tiny", ln2__w=ones, ln_final__w=ones), PAPER))


def test_rank_deficiency_and_equal_rotary_pairs_are_not_special():
    """Strata that look special but are not: W_Q·W_Kᵀ of rank 1 (the generic obstruction u·A·v ≠ 0
    needs only u, v ≠ 0), equal weights across every RoPE pair, and a vocabulary smaller than d_model
    (W_U of rank < d still sees R·D_γ·Rᵀ ≠ D_γ).  Each contrast is predicted to fail and fails."""

    def rank_one(t):
        return t[..., :, :1] * torch.ones(t.shape[-1], dtype=t.dtype)

    _assert_generic(check(_with("gpt2-tiny", attn__W_Q=rank_one, attn__W_K=rank_one), "qk-same-action"))

    from gauge_audit.models.layers import rope_planes

    def paired(t):
        for i, j in rope_planes(build("llama-tiny", seed=0).cfg):
            t[..., j] = t[..., i]
        return t

    for action in ("qk-gl-rope-generic", "qk-same-action", "qk-gl-untied-gqa"):
        _assert_generic(check(_with("llama-tiny-gqa", attn__W_Q=paired, attn__W_K=paired), action))

    from gauge_audit.models import build_config, config_of

    small = build_config(config_of("llama-tiny").with_(vocab=8), seed=0, device="cpu", name="llama-vocab8")
    assert small.cfg.vocab < small.cfg.d_model
    _assert_generic(check(small, PAPER))


def test_true_actions_have_no_special_points():
    """Only the contrasts carry a special-point test: a true symmetry holds at every point."""
    for a in ACTIONS.values():
        if a.special is not None:
            assert a.symmetry is False or callable(a.symmetry), a.name
    assert {a.name for a in ACTIONS.values() if a.special} == {
        PAPER,
        "qk-same-action",
        "qk-gl-rope-generic",
        "qk-gl-untied-gqa",
        "gelu-scaling",
    }
    assert get_action(PAPER).expected_at(build("gpt2-tiny-noaffine").cfg, {}, 4, EPS64) == (True, None)


def test_tied_router_logits_cannot_test_an_expert_relabelling():
    """A zero router ties every expert's logit: top-k then picks by label, so relabelling the experts
    changes the chosen ones — a point where the invariance is not predicted (not a contradiction).
    With a generic router the same action holds, and nothing is excused."""
    tied = check(_with("moe-tiny", moe__W_router=_zero), "expert-perm")
    assert tied.expected == HOLDS and tied.verdict == FAILS and tied.routing_changed == 0
    assert tied.extra["routing_ties"] > 0 and "tie of router logits" in tied.unresolved and tied.agrees
    generic = check(_with("moe-tiny"), "expert-perm")
    assert generic.verdict == HOLDS and generic.extra["routing_ties"] == 0 and not generic.unresolved


def test_layernorm_shift_must_be_fixed_by_the_rotations():
    """With γ = 1 the paper's rule still moves a generic β (the reader sees β·Rᵀ): it fails.  A β ∝ 1
    is fixed by every rotation of a LayerNorm stream (R·1 = 1), so γ = 1, β = 0.3·1 is special."""
    ones = torch.ones_like
    _assert_generic(check(_with("gpt2-tiny", ln1__w=ones, ln2__w=ones, ln_final__w=ones), PAPER))
    r = check(
        _with(
            "gpt2-tiny",
            ln1__w=ones,
            ln2__w=ones,
            ln_final__w=ones,
            ln1__b=lambda t: torch.full_like(t, 0.3),
            ln2__b=lambda t: torch.full_like(t, 0.3),
            ln_final__b=lambda t: torch.full_like(t, 0.3),
        ),
        PAPER,
    )
    _assert_special(r, "β ∝ 1")


def test_bare_decoder_check_all_runs_every_applicable_action(saved, capsys):
    """A GPT2Model (no unembedding) has no LayerNorm reader without a bias: norm-shift-absorbed does
    not apply (it used to be listed and then abort --all with an error)."""
    path = str(saved("gpt2-bare"))
    assert ACTIONS["norm-shift-absorbed"].applies(_cfg(path)) is not None
    assert main(["check", "--checkpoint", path, "--all", "--json"]) == 0
    rows = _rows(capsys)
    assert "norm-shift-absorbed" not in rows and "composite" in rows
    assert all(r["verdict"] == r["expected"] for r in rows.values())
