"""DeepSeek-V3 and V2 (multi-head latent attention, a sigmoid- or softmax-routed MoE with shared
experts): the project forward equals transformers' in float64 within L·K·ε on tiny random models
(query latent or none, attention biases, interleaved or rotate_half RoPE, yarn's mscale, V2's complex
RoPE and greedy or group-limited softmax routing); every action's verdict on the checkpoints agrees
with the theory; the measured nullity equals the explained dimension on several configurations (MLA
with MoE, a plain query projection with a dense FFN, biases with top-1 routing at ε = 0, V2's router,
unit norm weights); the group a naive reading would give (GL(r) on a latent, a RoPE commutant per
head) is not a symmetry; bad inputs are refused in one line.  (Gauge fixing: tests/test_gauge_fix_mla.py.)"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from torch.func import jvp

from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.models import deepseek
from gauge_audit.models.checkpoint import open_checkpoint
from gauge_audit.nullity import analyze
from gauge_audit.nullity.analysis import _analyze_dense
from gauge_audit.nullity.explain import generator_tolerance
from gauge_audit.nullity.families import theory
from gauge_audit.nullity.measure import make_problem

transformers = pytest.importorskip("transformers")
from hf_families import EPS32, EPS64, compare, hf_logits, inputs, rel, tol, transform_round_trip  # noqa: E402

KINDS = ["deepseek-v3", "deepseek-v3-noqlora-bias", "deepseek-v3-yarn", "deepseek-v2-lite", "deepseek-v2-grouped"]
MLA = {"latent-rotation", "latent-norm-scale", "mla-nope-gl", "mla-rope-commutant", "mla-vo-gl"}
DEEPSEEK_FFN = {"deepseek-swiglu-scaling", "deepseek-expert-perm", "deepseek-ffn-perm"}


@pytest.mark.parametrize("kind", KINDS)
def test_forward_matches_transformers_float64(hf_family, kind):
    err, tol64, shipped, tol32 = compare(hf_family(kind))
    print(f"{kind}: {err / EPS64:.2f} ε64 (tol {tol64 / EPS64:.0f}); as shipped {shipped / EPS32:.3g} ε32")
    assert err <= tol64 and shipped <= tol32


@pytest.mark.parametrize(
    "kind,changes",
    [
        ("deepseek-v3", {"routed_scale": 1.0}),
        ("deepseek-v3-noqlora-bias", {"rope_style": "interleaved"}),  # d_rope 4: two planes, paired apart
        ("deepseek-v3", {"topk_group": 2}),
        ("deepseek-v3-noqlora-bias", {"router_renorm": True}),
        ("deepseek-v3-yarn", {"rope_params": (("factor", 4.0), ("original_max_position_embeddings", 4.0))}),
        ("deepseek-v2-grouped", {"topk_group": 2}),
        ("deepseek-v2-lite", {"routed_scale": 2.0}),
    ],
)
def test_a_dropped_feature_fails_by_a_wide_margin(hf_family, kind, changes):
    """Each option read from config.json matters: reading it wrongly moves the logits far above L·K·ε."""
    path = hf_family(kind)
    ckpt = open_checkpoint(path)
    cfg = ckpt.cfg.with_(**changes)
    x = inputs(cfg)
    err = rel(ckpt.model().family.forward(ckpt.params(), cfg, x), hf_logits(path, ckpt, x, True))
    assert err > 1e6 * tol(cfg, 12)


@pytest.mark.parametrize("kind", ["deepseek-v3", "deepseek-v3-noqlora-bias", "deepseek-v2-grouped"])
def test_check_all_agrees_with_theory(hf_family, kind, capsys):
    assert main(["check", "--checkpoint", str(hf_family(kind)), "--all", "--json"]) == 0
    rows = {json.loads(line)["action"]: json.loads(line) for line in capsys.readouterr().out.splitlines()}
    assert not {"qk-gl", "vo-gl", "head-perm", "swiglu-scaling"} & set(rows)  # refused for MLA
    for name in (*MLA, *DEEPSEEK_FFN, "mla-head-perm", "stream-rotation", "norm-scale", "composite"):
        assert rows[name]["verdict"] == "HOLDS", name
    # V2's softmax router ignores a shift common to every expert's column, V3's sigmoid does not
    assert ("router-offset" in rows) == kind.startswith("deepseek-v2")
    assert rows["latent-gl"]["verdict"] == "FAILS" and rows["latent-gl"]["max_rel_error"] > 1e-3
    for r in rows.values():
        assert r["verdict"] == r["expected"], r


@pytest.mark.parametrize(
    "action,word", [("qk-gl", "mla-nope-gl"), ("vo-gl", "mla-vo-gl"), ("head-perm", "mla-head-perm")]
)
def test_per_head_actions_are_refused_with_the_reason(hf_family, capsys, action, word):
    assert main(["check", "--checkpoint", str(hf_family("deepseek-v3")), "--action", action]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and word in err


@pytest.mark.parametrize("name", sorted(MLA | DEEPSEEK_FFN | {"mla-head-perm"}))
def test_group_laws(name):
    """Inverse and product of two elements, as for the other families' actions."""
    from gauge_audit.actions import ACTIONS
    from gauge_audit.actions.algebra import compose, inverse
    from gauge_audit.gauge_fix.comparison import relative_distances
    from gauge_audit.models.registry import build_config

    cfg = deepseek.config()
    m, a = build_config(cfg, seed=3, device="cpu"), ACTIONS[name]
    g = torch.Generator().manual_seed(5)
    x, y = a.sample(cfg, m.params, g, 4.0), a.sample(cfg, m.params, g, 4.0)
    back = a.apply(cfg, a.apply(cfg, m.params, x), inverse(name, x))
    both = a.apply(cfg, a.apply(cfg, m.params, x), y)
    once = a.apply(cfg, m.params, compose(name, x, y))
    d_inv, d_comp = relative_distances(m.params, back)[0], relative_distances(both, once)[0]
    k = 4 * max(cfg.d_model, cfg.d_ff) * EPS64  # two products of length ≤ max(d, d_ff) per entry
    print(f"{name}: inverse {d_inv / EPS64:.3g} ε, product {d_comp / EPS64:.3g} ε")
    assert d_inv <= k * x.kappa and d_comp <= k * x.kappa * y.kappa


def test_mla_actions_refuse_other_families(capsys):
    assert main(["check", "--model", "llama-tiny", "--action", "latent-rotation"]) == 2
    assert "latent attention" in capsys.readouterr().err


def test_transform_round_trip(hf_family, tmp_path, capsys):
    transform_round_trip(hf_family("deepseek-v3"), tmp_path / "out", "latent-rotation", capsys)


@pytest.mark.parametrize(
    "key,value,word",
    [
        ("num_key_value_heads", 2, "num_key_value_heads"),
        ("scoring_func", "softmax", "scoring_func"),
        ("n_group", 3, "n_group"),
        ("rope_parameters", {"rope_type": "su", "rope_theta": 1e4}, "rope_type"),
    ],
)
def test_bad_configs_are_refused_in_one_line(hf_family, tmp_path, key, value, word):
    dst = tmp_path / "bad"
    shutil.copytree(hf_family("deepseek-v3"), dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(GaugeAuditError, match=word) as e:
        open_checkpoint(dst)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- nullity
_S = dict(d_model=6, n_heads=2, d_head=2, nope_dim=2, v_dim=2, kv_lora_rank=3, d_ff=6, moe_d_ff=3, vocab=12, n_ctx=8)
NULLITY = {
    "mla-moe-2layers": deepseek.config(**_S, q_lora_rank=3, n_layers=2),
    "plain-q-dense": deepseek.config(**_S, q_lora_rank=0, n_layers=1, experts=0, top_k=0, n_group=1, first_dense=0),
    "bias-half-top1-eps0": deepseek.config(
        **{**_S, "d_head": 4, "nope_dim": 1, "v_dim": 3, "kv_lora_rank": 4},
        q_lora_rank=4,
        n_layers=1,
        first_dense=0,
        attn_bias=True,
        out_bias=True,
        rope_style="half",
        top_k=1,
        n_group=1,
        norm_eps=0.0,
        latent_eps=0.0,
    ),
    "v2-softmax-grouped": deepseek.config(**_S, q_lora_rank=3, n_layers=2, router="softmax", router_renorm=False),
}


def expected_dims(cfg) -> dict[str, int]:
    """The group's dimension, factor by factor, from the derivation (nullity/families/deepseek.py)."""
    L, h, d = cfg.n_layers, cfg.n_heads, cfg.d_model
    ranks = [cfg.kv_lora_rank] + ([cfg.q_lora_rank] if cfg.q_lora_rank else [])
    moe = [i for i in range(L) if cfg.moe_layer(i)]
    units = sum(
        cfg.experts * cfg.moe_d_ff + cfg.n_shared * cfg.moe_d_ff if cfg.moe_layer(i) else cfg.d_ff for i in range(L)
    )
    out = {
        "latent-rotation": L * sum(r * (r - 1) // 2 for r in ranks),
        "latent-norm-scale": L * sum(ranks),
        "mla-nope-gl": L * h * cfg.nope_dim**2,
        "mla-rope-commutant": L * cfg.d_head,
        "mla-vo-gl": L * h * cfg.v_dim**2,
        "norm-scale": (2 * L + 1) * d,
        "stream-rotation": d * (d - 1) // 2,
        "swiglu-scaling": units,
        "router-bias-selection": len(moe) * cfg.experts if cfg.router == "sigmoid" else 0,
        "router-offset": len(moe) * d if cfg.router == "softmax" else 0,
    }
    if cfg.top_k == 1 and cfg.router_renorm:
        out["router-top1"] = len(moe) * d * cfg.experts
    if cfg.norm_eps == 0 and cfg.latent_eps == 0:
        out.update({"latent-input-scale": L * len(ranks), "stream-scale": 1})
    return {k: v for k, v in out.items() if v}


@pytest.fixture(scope="module")
def measured():
    return {name: analyze(cfg) for name, cfg in NULLITY.items()}


@pytest.mark.parametrize("name", sorted(NULLITY))
def test_measured_equals_explained(measured, name):
    r, cfg = measured[name], NULLITY[name]
    flat = {f.name: f.rank for f in r.families if f.flat}
    print(
        f"{name}: P = {r.params}, measured {r.measured_nullity}, explained {r.explained}, gap {r.gap_ratio:.3g}; {flat}"
    )
    assert r.rows >= 3 * r.params and r.gap_ratio >= 1e6 and r.genericity.clean
    assert r.generators_ok and r.overlap == 0 and r.unexplained == 0, r.unexplained_blocks
    assert flat == expected_dims(cfg)
    assert r.measured_nullity == r.explained == sum(expected_dims(cfg).values())


def test_unit_norm_weights_add_nothing(measured):
    """γ = 1 in every norm (transformers' initialisation): the latent rotation is conjugated by D_γ,
    not restricted by it, so no factor grows — the same nullity, all of it explained."""
    cfg = NULLITY["mla-moe-2layers"]
    pr = make_problem(cfg, 0)
    p = pr.params()
    for k in p:
        if k.endswith((".w", "q_norm", "kv_norm")):
            p[k] = torch.ones_like(p[k])
    pr.theta = pr.layout.flatten(p)
    gen, fams = theory(pr, True)
    r = _analyze_dense(pr, gen, fams, {}, True)
    assert r.unexplained == 0 and r.measured_nullity == r.explained == measured["mla-moe-2layers"].measured_nullity


def _relative_jv(pr, v: dict) -> float:
    theta, tangent = pr.theta, pr.layout.flatten(v)
    _, jv = jvp(pr.forward_flat, (theta,), (tangent,))
    J_fro = float(torch.func.jacrev(pr.forward_flat)(theta).norm())
    return float(jv.norm()) / (J_fro * float(tangent.norm()))


def test_the_naive_group_is_not_a_symmetry():
    """A symmetric (non-orthogonal) generator on c_KV, and the RoPE commutant on one head only, change
    the function by far more than an exact generator's L·K·ε·‖J‖_F."""
    cfg = NULLITY["plain-q-dense"]
    pr = make_problem(cfg, 0)
    p, a = pr.params(), "blocks.0.attn"
    tol_rel = generator_tolerance(pr, 1.0)[0]
    r = cfg.kv_lora_rank
    A = torch.zeros(r, r, dtype=torch.float64)
    A[0, 1] = A[1, 0] = 1.0  # in gl(r), not in so(r)
    g = p[f"{a}.kv_norm"]
    C = A * g[None, :] / g[:, None]
    latent = {f"{a}.W_DKV": p[f"{a}.W_DKV"] @ A, f"{a}.W_UK": -(C @ p[f"{a}.W_UK"]), f"{a}.W_UV": -(C @ p[f"{a}.W_UV"])}
    rope = {f"{a}.W_Q": torch.zeros_like(p[f"{a}.W_Q"]), f"{a}.W_KR": -p[f"{a}.W_KR"]}
    rope[f"{a}.W_Q"][0][:, cfg.nope_dim :] = p[f"{a}.W_Q"][0][:, cfg.nope_dim :]  # head 0 only: a·I on its plane
    for name, v in (("latent gl(r)", latent), ("per-head rope commutant", rope)):
        res = _relative_jv(pr, v)
        print(f"{name}: ‖Jv‖/(‖J‖_F‖v‖) = {res:.3g}, exact generators' tolerance {tol_rel:.3g}")
        assert res > 1e6 * tol_rel


@pytest.mark.parametrize(
    "args,word",
    [
        (["--d-head", "2"], "--rope-head-dim"),
        (["--kv-lora-rank", "9"], "wider than d_model"),
        (["--qk-nope-dim", "6"], "d_nope"),
        (["--experts", "3", "--top-k", "4"], "top_k"),
    ],
)
def test_bad_nullity_options_are_refused_in_one_line(capsys, args, word):
    base = ["nullity", "--family", "deepseek", "--d-model", "6", "--vocab", "12", "--quiet"]
    assert main(base + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and word in err


def test_mla_flags_need_the_deepseek_family(capsys):
    assert main(["nullity", "--family", "llama", "--q-lora-rank", "4"]) == 2
    assert "deepseek" in capsys.readouterr().err
