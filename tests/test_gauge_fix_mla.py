"""Gauge fixing of multi-head latent attention (DeepSeek-V2/V3): the latents' norm scales and
rotations, GL(d_nope) and GL(d_v) per head, one RoPE commutant element per layer on the shared key,
the stream, the scaling of every dense FFN, routed and shared expert, and V2's router offset.  Per
configuration (V3's sigmoid router with MoE and a dense first layer, V2's softmax router, a query
latent or none, biases, ε = 0 with top-1 routing): as many conditions as the nullity theory's exact
families have dimensions, family by family and transversally; the canonical form computes the same
function and is the same on the whole orbit (heads, experts within and by groups, and FFN units
permuted too); ``compare`` calls a transformed copy stored in float32
or bfloat16 EQUIVALENT and an independent model DIFFERENT; special points are reported as not
unique; transformers checkpoints are canonicalised with a certificate."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from torch.func import jvp

from gauge_audit.actions import ACTIONS
from gauge_audit.cli import main
from gauge_audit.gauge_fix import EQUIVALENT, canonicalize, compare, conditions, function_check, unfixed
from gauge_audit.gauge_fix.comparison import relative_distances
from gauge_audit.models import build_config, deepseek
from gauge_audit.nullity.families import families
from gauge_audit.nullity.measure import EPS64, genericity, make_problem
from gauge_audit.numeric import HOLDS, check, tolerance
from gauge_audit.runtime import generator
from gauge_fix_cases import (
    assert_b_by_runs_is_b_whole,
    assert_independent_model_is_different,
    assert_transformed_copy_survives_storage,
    transformed,
)

# small configurations for the condition count (the nullity theory builds dense generators)
_S = dict(d_model=6, n_heads=2, d_head=2, nope_dim=2, v_dim=2, kv_lora_rank=3, d_ff=6, moe_d_ff=3, vocab=12, n_ctx=8)
SMALL = {
    "v3-qlatent-moe-dense-first": lambda: deepseek.config(**_S, q_lora_rank=3, n_layers=2),
    "v3-plain-q-moe-bias": lambda: deepseek.config(
        **{**_S, "d_head": 4, "nope_dim": 1, "v_dim": 3, "kv_lora_rank": 4},
        q_lora_rank=0,
        n_layers=2,
        attn_bias=True,
        out_bias=True,
        rope_style="half",
    ),
    "v3-dense-plain-q": lambda: deepseek.config(
        **_S, q_lora_rank=0, n_layers=1, experts=0, top_k=0, n_group=1, first_dense=0
    ),
    "v3-top1-eps0": lambda: deepseek.config(
        **_S,
        q_lora_rank=3,
        n_layers=1,
        first_dense=0,
        top_k=1,
        n_group=1,
        router_renorm=True,
        norm_eps=0.0,
        latent_eps=0.0,
    ),
    "v2-softmax-grouped": lambda: deepseek.config(
        **_S, q_lora_rank=3, n_layers=2, router="softmax", router_renorm=False
    ),
    "v2-lite-plain-q": lambda: deepseek.config(
        **_S, q_lora_rank=0, n_layers=2, router="softmax", router_renorm=False, n_group=1, topk_group=1
    ),
}
# families with no group action (or one only at ε = 0): reported unfixed
NOT_GROUPS = {"router-bias-selection", "router-top1", "latent-input-scale", "stream-scale"}
# the tiny models (d_model 16, 2 layers: one dense, one MoE layer with 4 experts in 2 groups)
TINY = {
    "v3": lambda: deepseek.config(n_layers=2),
    "v3-plain-q-bias": lambda: deepseek.config(n_layers=2, q_lora_rank=0, attn_bias=True, out_bias=True, d_head=4),
    "v2-softmax": lambda: deepseek.config(n_layers=2, router="softmax", router_renorm=False),
}


@functools.cache
def tiny(name: str, seed: int = 0):
    return build_config(TINY[name](), seed=seed, device="cpu", name=name)


# ----------------------------------------------------------------------------- conditions = orbit dimension
@pytest.mark.parametrize("name", sorted(SMALL))
def test_condition_count_equals_explained_nullity(name):
    """Family by family, as many conditions as the theory's exact family has dimensions, and their
    derivative along the families' generators at the canonical point of full rank (transversal).
    The families without a group action are the only ones reported unfixed, exactly where the
    theory finds them."""
    cfg = SMALL[name]()
    problem = make_problem(cfg, seed=0)
    exact = {f.name: f.k for f in families(problem, genericity(problem)) if f.kind == "exact"}
    canon = canonicalize(cfg, problem.params())
    counts = {k: int(v.numel()) for k, v in conditions(cfg, canon.params).items()}
    skip = {f for f, _ in unfixed(cfg)}
    print(
        f"{name}: conditions {counts} (total {sum(counts.values())}), nullity families {exact}, unfixed {sorted(skip)}"
    )
    assert skip <= NOT_GROUPS and skip == NOT_GROUPS & set(exact)
    assert counts == {k: v for k, v in exact.items() if k not in skip}
    assert {"latent-rotation", "latent-norm-scale", "mla-rope-commutant", "mla-vo-gl", "swiglu-scaling"} <= set(counts)

    problem.theta = problem.layout.flatten(canon.params)
    gens = torch.cat([f.vectors for f in families(problem, genericity(problem)) if f.name in counts])
    assert gens.shape[0] == sum(counts.values())

    def flat_conditions(theta):
        c = conditions(cfg, problem.layout.unflatten(theta))
        return torch.cat([c[k].reshape(-1) for k in sorted(c)])

    d = torch.stack([jvp(flat_conditions, (problem.theta,), (v,))[1] for v in gens])
    sv = torch.linalg.svdvals(d)
    print(f"  transversality: σ_min/σ_max = {float(sv[-1] / sv[0]):.2e} (rounding level {d.shape[0] * EPS64:.1e})")
    assert float(sv[-1] / sv[0]) >= 1e6 * d.shape[0] * EPS64


# ----------------------------------------------------------------------------- canonical form
@pytest.mark.parametrize("name", sorted(TINY))
def test_canonical_form_same_function_idempotent_and_orbit_invariant(name):
    m = tiny(name)
    c = canonicalize(m.cfg, m.params)
    fn = function_check(m.cfg, m.params, c.params, c.rounding_kappa, element=c.element())
    assert fn["verdict"] == HOLDS and not c.ties()
    assert {f for f, _ in c.unfixed} == ({"router-bias-selection"} if m.cfg.router == "sigmoid" else set())
    again = canonicalize(m.cfg, c.params)
    dist, _ = relative_distances(c.params, again.params)
    tol, _ = tolerance(m, c.kappa, torch.float64, 16)
    # every condition at rounding level: sums of ≤ n products of entries ≤ s, error ≤ n·ε·n·s², times κ
    cfg = m.cfg
    n = max(cfg.vocab, cfg.d_ff, cfg.n_ctx, cfg.d_model + 1, cfg.n_heads * max(cfg.q_lora_rank, cfg.d_model))
    s2 = max(float(t.abs().max()) for t in c.params.values()) ** 2
    worst = max(float(r.abs().max()) for r in conditions(cfg, c.params).values())
    # the same canonical form for g·θ, g a random element of every action that applies (rules only)
    b, el = transformed(m, seed=3)
    raw, _ = relative_distances(m.params, b)
    orbit, _ = relative_distances(c.params, canonicalize(cfg, b).params)
    tol_orbit, _ = tolerance(m, el.kappa * c.kappa, torch.float64, 16)
    print(
        f"{name}: function {fn['residual_eps']:.3g} ε (tol {fn['tolerance_statistical_eps']:.4g} ε); "
        f"idempotent {dist:.2e} ≤ {tol:.2e}; conditions {worst:.2e}; orbit raw {raw:.2f} → {orbit:.2e} ≤ {tol_orbit:.2e}"
        f" ({el.note})"
    )
    steps = set(el.note.split(" → "))
    assert {"latent-rotation", "mla-rope-commutant", "deepseek-swiglu-scaling", "mla-head-perm"} <= steps
    assert {"deepseek-expert-perm", "deepseek-ffn-perm"} <= steps
    assert dist <= tol
    assert worst <= c.kappa * n * n * EPS64 * s2
    assert raw >= 0.3 and orbit <= tol_orbit


# ----------------------------------------------------------------------------- compare
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(TINY))
def test_compare_transformed_copy_survives_storage(name, dtype):
    assert_transformed_copy_survives_storage(name, tiny(name), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["v3", "v2-softmax"])
def test_compare_with_b_by_runs_equals_b_whole(name, dtype, monkeypatch):
    """compare canonicalises B one block at a time (a dense block and an MoE block: the same steps,
    the elements keyed by FFN merged) and measures the rounding response by runs: the same report,
    number for number, and the same element as B as one run of every block."""
    from gauge_audit.gauge_fix import response

    monkeypatch.setattr(response, "RUN_ENTRIES", 1)
    m = tiny(name)
    b, _ = transformed(m, seed=11)
    stored = {k: v.to(dtype) for k, v in b.items()}
    assert_b_by_runs_is_b_whole(m, stored, monkeypatch, m.cfg.n_layers)
    assert compare(m.cfg, m.params, m.cfg, stored).verdict == EQUIVALENT


@pytest.mark.parametrize("name", sorted(TINY))
def test_compare_independent_model_is_different(name):
    assert_independent_model_is_different(name, tiny(name), tiny(name, seed=1))


# ----------------------------------------------------------------------------- special points
def _ties(c) -> set:
    return {(t["step"], t["kind"]) for t in c.ties()}


def test_equal_latent_norm_weights_are_not_special():
    """γ ∝ 1 on every latent norm (Hugging Face's initialisation): the latent rotation is conjugated
    by D_γ, not restricted by it, so nothing grows — a unique canonical form, the same function,
    and the same canonical form for a transformed copy."""
    m = tiny("v3")
    p = {k: torch.full_like(v, 0.7) if k.endswith(("q_norm", "kv_norm")) else v for k, v in m.params.items()}
    c = canonicalize(m.cfg, p)
    assert not c.ties() and not any(r.notes for r in c.records)
    assert function_check(m.cfg, p, c.params, c.rounding_kappa, element=c.element())["verdict"] == HOLDS
    el = ACTIONS["composite"].sample(m.cfg, p, generator(5), 4.0)
    b = ACTIONS["composite"].apply(m.cfg, p, el)
    dist, _ = relative_distances(c.params, canonicalize(m.cfg, b).params)
    assert dist <= tolerance(m, el.kappa * c.kappa, torch.float64, 16)[0]


def test_special_points_are_reported_not_unique():
    """Where a step's choice is not determined it is reported, and the function is kept: a latent
    whose down-projection has a Gram ∝ I (its rotation's eigenvectors are free), a zero RoPE key
    plane (its commutant scalar is free), a head whose value map has equal singular values, a zero
    latent norm weight (its scale is free)."""
    m = tiny("v3")
    assert not canonicalize(m.cfg, m.params).ties()
    cfg, a = m.cfg, "blocks.1.attn"
    p = dict(m.params)
    q, _ = torch.linalg.qr(p[f"{a}.W_DKV"])
    p[f"{a}.W_DKV"] = 0.3 * q  # orthonormal columns of one length: Gram = 0.09·I
    p[f"{a}.W_KR"] = p[f"{a}.W_KR"].clone()
    p[f"{a}.W_KR"][:, :2] = 0.0  # RoPE plane 0 of the shared key
    u, _ = torch.linalg.qr(p[f"{a}.W_UV"][0])
    w, _ = torch.linalg.qr(p[f"{a}.W_O"][0].T)
    p[f"{a}.W_UV"] = p[f"{a}.W_UV"].clone()
    p[f"{a}.W_O"] = p[f"{a}.W_O"].clone()
    p[f"{a}.W_UV"][0], p[f"{a}.W_O"][0] = u, w.T  # head 0's value map U·Wᵀ: singular values all 1
    p[f"{a}.kv_norm"] = torch.ones_like(p[f"{a}.kv_norm"])  # (folding γ_KV would rescale W_UV's rows)
    p[f"{a}.q_norm"] = p[f"{a}.q_norm"].clone()
    p[f"{a}.q_norm"][0] = 0.0
    c = canonicalize(cfg, p)
    ties = _ties(c)
    print(sorted(ties), [n for r in c.records for n in r.notes])
    assert {("latent-rotation", "spectrum"), ("mla-rope-commutant", "phase"), ("mla-vo-gl", "spectrum")} <= ties
    notes = [n for r in c.records for n in r.notes]
    assert any("q_norm" in n and "zero weight" in n for n in notes) and any("plane 0" in n for n in notes)
    assert function_check(cfg, p, c.params, c.rounding_kappa, element=c.element())["verdict"] == HOLDS


def test_equal_heads_and_experts_are_reported_not_unique():
    """Two identical heads (block 0) and two identical experts in one group (block 1): their order
    is a tie, reported; the function is kept."""
    m = tiny("v3")
    p = dict(m.params)
    for name in ("W_UQ", "W_UK", "W_UV", "W_O"):
        t = p[f"blocks.0.attn.{name}"].clone()
        t[1] = t[0]
        p[f"blocks.0.attn.{name}"] = t
    for name in ("W_in", "W_gate", "W_out"):
        t = p[f"blocks.1.moe.{name}"].clone()
        t[1] = t[0]
        p[f"blocks.1.moe.{name}"] = t
    w = p["blocks.1.moe.W_router"].clone()
    w[:, 1] = w[:, 0]
    p["blocks.1.moe.W_router"] = w
    c = canonicalize(m.cfg, p)
    ties = {t["step"]: t for t in c.ties() if t["kind"] == "order"}
    print(sorted(ties))
    assert {"mla-head-perm", "deepseek-expert-perm"} <= set(ties)
    assert ties["mla-head-perm"]["not_unique"] == 1 and ties["deepseek-expert-perm"]["not_unique"] >= 1
    assert function_check(m.cfg, p, c.params, c.rounding_kappa, element=c.element())["verdict"] == HOLDS


def test_an_expert_permutation_across_groups_is_refused_in_one_line():
    """Group-limited routing ranks the groups: whole groups may be swapped (HOLDS), a permutation
    mixing two groups is no symmetry (refused)."""
    from gauge_audit.actions.base import Element
    from gauge_audit.errors import GaugeAuditError

    m = tiny("v3")
    a = ACTIONS["deepseek-expert-perm"]
    swap = Element({"blocks.1.moe": torch.tensor([3, 2, 1, 0])}, 1.0)  # the groups swapped, and within them
    # block 1 is the model's only MoE block (block 0 is dense): its routing is compared under its own label
    assert check(m, "deepseek-expert-perm", element=swap).verdict == HOLDS
    with pytest.raises(GaugeAuditError, match="groups onto groups") as e:
        a.apply(m.cfg, m.params, Element({"blocks.1.moe": torch.tensor([0, 2, 1, 3])}, 1.0))
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("kind", ["deepseek-v3", "deepseek-v3-noqlora-bias", "deepseek-v2-grouped"])
def test_cli_canonicalizes_checkpoints_with_a_certificate(hf_family, kind, tmp_path, capsys):
    """canonicalize --out on a transformers DeepSeek checkpoint: the written canonical copy's
    certificate (transformers' float64 logits) HOLDS and compare calls it EQUIVALENT to the input;
    only V3's router bias (selection only, no group action) is left unfixed."""
    pytest.importorskip("transformers")
    src, out = hf_family(kind), tmp_path / "canon"
    assert main(["canonicalize", "--checkpoint", str(src), "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["function"]["verdict"] == HOLDS and rep["certificate"]["verdict"] == HOLDS
    sigmoid = not kind.startswith("deepseek-v2")
    assert not rep["not_unique"] and {u["family"] for u in rep["unfixed"]} == (
        {"router-bias-selection"} if sigmoid else set()
    )
    assert main(["compare", str(src), str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    print(
        f"{kind}: conditions {rep['conditions']}, certificate {rep['certificate']['residual_eps']:.3g} ε; compare "
        f"with the input: {r['verdict']}, invariant {r['invariant_distance']:.3g} ≤ {r['tolerance']:.3g}"
    )
    assert r["verdict"] == EQUIVALENT


@pytest.mark.parametrize("name", sorted(TINY))
def test_ffn_actions_block_by_block_equal_the_whole_model_rule(name):
    """DeepSeek's per-FFN scaling and unit permutation (keyed by FFN: dense and MoE blocks differ),
    its grouped expert permutation, the MLA head permutation and V2's router offset (none in the
    dense first block) give the same tensors block by block as on the whole model, and keep the
    function."""
    from gauge_audit.actions.blockwise import apply_blockwise

    m = tiny(name)
    names = ["deepseek-swiglu-scaling", "deepseek-ffn-perm", "deepseek-expert-perm", "mla-head-perm"]
    names += ["router-offset"] if m.cfg.router == "softmax" else []
    assert (ACTIONS["router-offset"].applies(m.cfg) is None) == (m.cfg.router == "softmax")
    for a in (ACTIONS[n] for n in names):
        el = a.sample(m.cfg, m.params, torch.Generator().manual_seed(1), 10.0)
        full, blocks = a.apply(m.cfg, m.params, el), apply_blockwise(a, m.cfg, m.params, el)
        assert set(full) == set(blocks) and all(torch.equal(full[k], blocks[k]) for k in full), a.name
        assert check(m, a.name, seed=2).verdict == HOLDS
