"""The gemma family (Gemma 2 / Gemma 3): the project forward equals transformers' float64 forward on
tiny random checkpoints of Gemma2ForCausalLM, Gemma3ForCausalLM and the text part of
Gemma3ForConditionalGeneration (generic (1 + w) norm weights: w in [0.6, 1.4], away from the special
point w = 0); a read without the +1 fails by a wide margin; options the family cannot represent are
refused in one line; every action's verdict agrees with the theory; and the real Gemma 3 270M GGUF
(norm weights stored with the 1 folded in) predicts sensibly only when read as stored."""

from __future__ import annotations

import json

import pytest
import torch

from gauge_audit.actions import get_action
from gauge_audit.errors import GaugeAuditError
from gauge_audit.models import build, config_of, gemma
from gauge_audit.models.checkpoint import ARCHS, open_checkpoint
from gauge_audit.models.registry import FAMILIES, Model
from gauge_audit.numeric import check, tolerance

transformers = pytest.importorskip("transformers")
from gauge_audit.reference import exact_attention, float64_internals  # noqa: E402

EPS64 = torch.finfo(torch.float64).eps


def _tol(cfg, n):
    return tolerance(Model("x", cfg, {}, FAMILIES[cfg.family]), 1.0, torch.float64, n)[0]


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def _inputs(cfg, n=12, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"tokens": torch.randint(0, cfg.vocab, (batch, n), generator=g)}


def _hf(model, x):
    with torch.no_grad():
        return model(input_ids=x["tokens"], attention_mask=torch.ones_like(x["tokens"])).logits.to(torch.float64)


def _reference(path, arch):
    """transformers' loader and model, float64, its float32 steps (Gemma's norms, Gemma 3's RoPE
    tables, Gemma 2's eager softmax) evaluated in float64."""
    cls = getattr(transformers, arch)
    m = cls.from_pretrained(str(path), dtype=torch.float64, attn_implementation=exact_attention(ARCHS[arch])).eval()
    assert float64_internals(m) > 0
    return m


def _without_offset(params):
    """The project tensors with every norm weight read as w instead of 1 + w."""
    return {k: (v - 1 if k.endswith((".w",)) else v) for k, v in params.items()}


@pytest.fixture(scope="module")
def multimodal(tmp_path_factory):
    """A tiny Gemma3ForConditionalGeneration (SigLIP tower of one layer), generic weights, saved."""
    from conftest import HF_TINY, randomize

    # its forward applies no final soft-cap (the reader refuses a text_config that names one)
    text = {**HF_TINY["gemma3"][2], "final_logit_softcapping": None}
    vision = dict(
        hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    model = transformers.Gemma3ForConditionalGeneration(
        transformers.Gemma3Config(
            text_config=text, vision_config=vision, mm_tokens_per_image=4, tie_word_embeddings=False
        )
    ).eval()
    randomize(model, 1)
    out = tmp_path_factory.mktemp("hf-gemma3-mm")
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(str(out))
    return out


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_gemma_matches_transformers_float64(tiny_hf, kind):
    path = tiny_hf(kind)
    ckpt = open_checkpoint(path)
    assert ckpt.cfg.family == "gemma"
    model = ckpt.model()
    x = _inputs(ckpt.cfg)
    ours = model.forward(model.params, x)
    want = _hf(_reference(path, ckpt.arch.name), x)
    err, tol = _rel(ours, want), _tol(ckpt.cfg, x["tokens"].shape[1])
    print(
        f"{kind}: project vs transformers (float64 internals) {err / EPS64:.2f} ε64, tol L·K·ε = {tol / EPS64:.0f} ε64"
    )
    assert err <= tol
    # the (1 + w) offset matters: the stored w taken as the weight is far off
    off = _rel(model.forward(_without_offset(dict(model.params)), x), want)
    assert off > 1e6 * tol


def test_gemma3_features_are_read(tiny_hf):
    cfg = open_checkpoint(tiny_hf("gemma3")).cfg
    assert (cfg.qk_norm, cfg.window, cfg.query_pre_attn_scalar, cfg.final_softcap) == ("head", 5, 10.0, 3.0)
    assert [cfg.layer_type(i) for i in range(3)] == ["sliding", "full", "sliding"]
    assert (cfg.rope_base, cfg.rope_local_base, cfg.rope_scale) == (700.0, 50.0, 3.0)
    cfg2 = open_checkpoint(tiny_hf("gemma2")).cfg
    assert (cfg2.qk_norm, cfg2.attn_softcap, cfg2.final_softcap) == ("none", 2.0, 3.0)
    assert [cfg2.layer_type(i) for i in range(3)] == ["sliding", "full", "sliding"]


def test_gemma3_multimodal_text_part_matches_transformers(multimodal):
    ckpt = open_checkpoint(multimodal)
    assert ckpt.passthrough() and all("vision_tower" in n or "multi_modal_projector" in n for n in ckpt.passthrough())
    model = ckpt.model()
    x = _inputs(ckpt.cfg)
    want = _hf(_reference(multimodal, "Gemma3ForConditionalGeneration"), x)
    err, tol = _rel(model.forward(model.params, x), want), _tol(ckpt.cfg, 12)
    print(f"gemma3 multimodal text part: {err / EPS64:.2f} ε64, tol {tol / EPS64:.0f} ε64")
    assert err <= tol
    hf = json.loads((multimodal / "config.json").read_text())
    hf["text_config"]["final_logit_softcapping"] = 30.0
    with pytest.raises(GaugeAuditError, match="final_logit_softcapping"):
        ARCHS["Gemma3ForConditionalGeneration"].config("Gemma3ForConditionalGeneration", hf)


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        (
            {
                "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                    "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6},
                }
            },
            "yarn",
        ),
        ({"layer_types": ["sliding_attention"]}, "layer_types"),
        ({"hidden_activation": "relu"}, "hidden_activation"),
        ({"sliding_window": "wide"}, "sliding_window"),
    ],
)
def test_unsupported_gemma_options_are_refused_in_one_line(tiny_hf, tmp_path, change, needle):
    src = tiny_hf("gemma3")
    hf = json.loads((src / "config.json").read_text())
    hf.update(change)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "model.safetensors").symlink_to(src / "model.safetensors")
    with pytest.raises(GaugeAuditError) as exc:
        open_checkpoint(tmp_path)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


# ----------------------------------------------------------------------------- actions and the theory
# vo-gl acts inside a head (W_V·N, N⁻¹·W_O: the sublayer output, the post-norm's input, is unchanged),
# so the post-attention norm does not touch it; qk-gl needs M to pass the QK-norm (Gemma 3: refused);
# the stream rotation must commute with every post-norm weight (refused under sandwich norms).
HOLD = {
    "gemma3-tiny": {"vo-gl", "head-perm", "norm-scale", "ffn-perm", "swiglu-scaling", "composite", "qk-norm-scale"},
    "gemma2-tiny": {"qk-gl", "vo-gl", "head-perm", "norm-scale", "ffn-perm", "swiglu-scaling", "composite"},
}


@pytest.mark.parametrize("name", sorted(HOLD))
def test_gemma_action_verdicts_follow_the_theory(model, name):
    m = model(name)
    applicable = {
        a
        for a in (
            "qk-gl",
            "vo-gl",
            "head-perm",
            "norm-scale",
            "ffn-perm",
            "swiglu-scaling",
            "composite",
            "qk-norm-scale",
            "qk-same-action",
            "qk-gl-rope-generic",
            "qk-gl-untied-gqa",
            "stream-rotation",
        )
        if get_action(a).applies(m.cfg) is None
    }
    assert HOLD[name] <= applicable and "stream-rotation" not in applicable
    for a in sorted(applicable):
        r = check(m, a, None, seed=0, dtype=torch.float64, kappa=10.0)
        assert r.agrees, (a, r.verdict, r.max_rel_error)
        assert r.holds == (a in HOLD[name]), (a, r.verdict)
        if not r.holds:
            assert r.max_rel_error > 1e6 * r.tolerance_eps * EPS64


def test_qk_norm_scale_needs_one_factor_per_rope_plane(model):
    """The scaling with one factor constant on each RoPE plane keeps the function (and has its group law); the
    same weights scaled by a factor that differs inside a plane change it by a wide margin."""
    from gauge_audit.actions.algebra import compose, inverse
    from gauge_audit.runtime import generator

    m = model("gemma3-tiny")
    act = get_action("qk-norm-scale")
    assert "no QK-norm" in act.applies(config_of("gemma2-tiny"))
    x, y = act.sample(m.cfg, m.params, generator(1), 10.0), act.sample(m.cfg, m.params, generator(2), 10.0)
    back = act.apply(m.cfg, act.apply(m.cfg, m.params, x), inverse(act.name, x))
    assert all(torch.allclose(back[k], m.params[k], rtol=1e-14, atol=0) for k in m.params)
    both = act.apply(m.cfg, act.apply(m.cfg, m.params, x), y)
    once = act.apply(m.cfg, m.params, compose(act.name, x, y))
    assert all(torch.allclose(both[k], once[k], rtol=1e-14, atol=0) for k in m.params)
    tokens = m.sample_inputs(0)
    y0 = m.forward(m.params, tokens)
    kept = _rel(m.forward(act.apply(m.cfg, m.params, x), tokens), y0)
    p = dict(m.params)
    inside = torch.linspace(0.5, 2.0, m.cfg.d_head, dtype=torch.float64)  # differs within every plane
    for l in range(m.cfg.n_layers):
        p[f"blocks.{l}.attn.q_norm"] = p[f"blocks.{l}.attn.q_norm"] * inside
        p[f"blocks.{l}.attn.k_norm"] = p[f"blocks.{l}.attn.k_norm"] / inside
    broken = _rel(m.forward(p, tokens), y0)
    tol = _tol(m.cfg, tokens["tokens"].shape[1]) * x.kappa
    print(f"qk-norm-scale: per plane {kept / EPS64:.3g} ε (tol {tol / EPS64:.3g} ε), within a plane {broken:.3g}")
    assert kept <= tol and broken > 1e6 * tol


def test_gemma_refusals_name_the_feature():
    g3 = config_of("gemma3-tiny")
    assert "QK-norm" in get_action("qk-gl").applies(g3)
    assert "post-norm" in get_action("stream-rotation").applies(g3)
    assert get_action("qk-gl").applies(config_of("gemma2-tiny")) is None


def test_gemma_config_refuses_bad_values():
    for bad in (
        dict(qk_norm="full"),
        dict(window=0),
        dict(rope_scale=0.5),
        dict(attn_softcap=-1.0),
        dict(layer_types=("sliding",)),
    ):
        with pytest.raises(GaugeAuditError):
            gemma.config(**bad)


# ----------------------------------------------------------------------------- the real Gemma 3 270M
# Token ids of "The capital of France is" (bos first) and of " Paris" in the GGUF's vocabulary, as its
# own tokenizer gives them (reference.tokenizer; converting the 262 144-token vocabulary takes a minute).
PROMPT = [2, 818, 5279, 529, 7001, 563]
PARIS = 9079


@pytest.fixture(scope="session")
def gemma3_270m():
    from gauge_audit.models import gemma3

    try:
        gemma3.path()
    except GaugeAuditError as exc:
        pytest.skip(str(exc))
    return build("gemma3", device="cpu")


def test_gemma3_270m_norm_weights_are_stored_with_the_one_folded_in(gemma3_270m):
    from gauge_audit.models import gemma3

    m = gemma3_270m
    # Q4_K (and Q5_0, Q6_K, Q8_0) blocks, dequantized by the gguf package: a wrong dequantization would
    # not leave the prediction below intact
    assert {"Q4_K", "Q5_0", "Q6_K", "Q8_0"} <= set(gemma3.checkpoint().source.quant_types())
    assert m.cfg.qk_norm == "head" and m.cfg.window == 512
    assert [m.cfg.layer_type(i) for i in range(6)] == ["sliding"] * 5 + ["full"]
    x = {"tokens": torch.tensor([PROMPT])}
    with torch.no_grad():
        as_stored = torch.log_softmax(m.forward(m.params, x)[0, -1], -1)
        plus_one = torch.log_softmax(
            m.forward({k: (v + 1 if k.endswith(".w") else v) for k, v in m.params.items()}, x)[0, -1], -1
        )
    rank = int((as_stored > as_stored[PARIS]).sum())
    print(
        f"log p(' Paris'): as stored {float(as_stored[PARIS]):.2f} (rank {rank}), "
        f"with 1 added again {float(plus_one[PARIS]):.2f}"
    )
    assert rank < 5
    assert float(as_stored[PARIS] - plus_one[PARIS]) > 5.0  # e⁵ ≈ 150× likelier


# one symmetry and one contrast on the real weights (every action's verdict is tested on the tiny models)
@pytest.mark.parametrize("action", ["vo-gl", "qk-same-action"])
def test_gemma3_270m_checks_agree_with_theory(gemma3_270m, action):
    r = check(gemma3_270m, action, {"tokens": torch.tensor([PROMPT])}, seed=0, dtype=torch.float64, kappa=10.0)
    print(f"gemma3 {action}: {r.max_rel_error:.3g} relative, {r.residual_eps:.3g} ε, tol {r.tolerance_eps:.3g} ε")
    assert r.agrees and r.holds == (action != "qk-same-action")


# ----------------------------------------------------------------------------- nullity: measured = explained
_SMALL = dict(d_model=6, n_heads=2, n_kv_heads=1, d_head=4, d_ff=6, n_ctx=5, vocab=8, n_layers=1, window=3)
NULLITY = {
    "gemma3-1layer": gemma.config(**_SMALL, sliding_pattern=2),
    "gemma3-2layers-untied-eps0": gemma.config(
        **{**_SMALL, "n_layers": 2, "n_kv_heads": 2, "d_head": 2, "d_ff": 4, "vocab": 7},
        sliding_pattern=2,
        tied=False,
        norm_eps=0.0,
    ),
    "gemma2-1layer": gemma.gemma2_config(**_SMALL),
    "gemma2-2layers-gqa-untied": gemma.gemma2_config(
        **{**_SMALL, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_head": 2, "d_ff": 4, "d_model": 4}, tied=False
    ),
}


@pytest.mark.parametrize("name", sorted(NULLITY))
def test_gemma_nullity_measured_equals_explained(name):
    from gauge_audit.nullity import analyze

    cfg = NULLITY[name]
    r = analyze(cfg)
    fams = {f.name: f for f in r.families}
    print(
        f"{name}: P={cost_P(cfg)} measured {r.measured_nullity}, explained {r.explained}, "
        + ", ".join(f"{f.name} {f.expected}{'' if f.flat else ' (not flat)'}" for f in r.families)
    )
    assert r.measured_nullity == r.explained and r.unexplained == 0
    assert "stream-rotation-special" not in fams and "qk-plane-rotation-special" not in fams  # generic weights
    assert ("qk-norm-scale" in fams) == (cfg.qk_norm == "head") and ("qk-gl" in fams) == (cfg.qk_norm == "none")
    # the ε-broken scales are flat exactly when ε = 0
    for f in ("post-norm-scale", "stream-scale") + (("qk-norm-input-scale",) if cfg.qk_norm == "head" else ()):
        assert fams[f].flat == (cfg.norm_eps == 0), f


def cost_P(cfg):
    from gauge_audit.nullity.cost import parameter_count

    return parameter_count(cfg)


def test_gemma_special_point_w0_is_recognised():
    """Every post-norm, final and QK-norm weight at γ = 1 (Gemma's w = 0, Hugging Face's initialisation):
    the stream rotation so(d) and a rotation per RoPE plane and KV group appear, and are counted."""
    from gauge_audit.nullity.analysis import _analyze_dense
    from gauge_audit.nullity.families import theory
    from gauge_audit.nullity.measure import make_problem

    cfg = NULLITY["gemma3-1layer"]
    pr = make_problem(cfg, 0)
    p = pr.params()
    for k in p:
        if k.endswith(("_post.w", "q_norm", "k_norm")) or k == "ln_final.w":
            p[k] = torch.ones_like(p[k])
    pr.theta = pr.layout.flatten(p)
    gen, fams = theory(pr, True)
    r = _analyze_dense(pr, gen, fams, {}, True)
    by = {f.name: f for f in r.families}
    generic = __import__("gauge_audit.nullity", fromlist=["analyze"]).analyze(cfg).measured_nullity
    d, planes = cfg.d_model, cfg.d_head // 2
    print(f"w = 0: measured {r.measured_nullity} (generic {generic}), explained {r.explained}")
    assert by["stream-rotation-special"].expected == d * (d - 1) // 2
    assert by["qk-plane-rotation-special"].expected == cfg.n_kv_heads * planes
    assert r.measured_nullity == r.explained == generic + d * (d - 1) // 2 + cfg.n_kv_heads * planes
