"""``check``, ``transform`` and ``compare`` on decoders without a family file: finite elements of
the group measured on transformers' own float64 forward.

The gauge copy that ``compare`` must see through is made here, on the checkpoint's files, by code
that shares nothing with the project's actions: norm weights folded into their readers and the
stream rotated (QuaRot's recipe), values mixed by N and outputs by N⁻¹, FFN units and experts
permuted and rescaled, query heads exchanged, a rotary plane turned a quarter with its QK-norm
weights exchanged.  Every verdict can fail: an element outside the flat part, a copy off by one
part in 10⁶, an independent seed."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from gauge_audit.cli import main
from gauge_audit.models.derived import tiny_checkpoint
from gauge_audit.testing import DECODER_EXAMPLES

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

F64 = torch.float64
GLM, GPT_OSS = "Glm4MoeForCausalLM", "GptOssForCausalLM"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("decoders")
    out = {a: tiny_checkpoint(a, base / a, 0, **over) for a, over in DECODER_EXAMPLES.items()}
    for a in (GLM, GPT_OSS):
        out[a + "-seed1"] = tiny_checkpoint(a, base / f"{a}-seed1", 1, **DECODER_EXAMPLES[a])
    return out


def run(*argv: str) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(argv))
    return rc, buf.getvalue()


# the families each decoder's group must contain (tests/test_derived_groups.py derives their sizes)
FAMILIES = {
    GPT_OSS: {"qk-gl", "vo-gl", "ffn-scale", "router-shift", "stream-gl", "norm-fold", "head-swap", "expert-swap"},
    "Qwen3_5ForCausalLM": {"mixer-scale", "qk-norm-scale", "vo-gl", "ffn-scale", "stream-gl", "norm-fold"},
    "Olmo3ForCausalLM": {"qk-norm-scale", "vo-gl", "ffn-scale", "norm-fold", "rotary-quarter-turn", "kv-group-swap"},
    "Llama4ForCausalLM": {"qk-gl", "vo-gl", "ffn-scale", "stream-gl", "norm-fold", "expert-swap"},
    GLM: {"qk-norm-scale", "vo-gl", "ffn-scale", "stream-gl", "norm-fold", "expert-swap", "rotary-quarter-turn"},
}


@pytest.mark.parametrize("arch", list(DECODER_EXAMPLES))
def test_check_every_measured_family_holds_as_a_finite_element(arch, dirs):
    rc, out = run("check", "--checkpoint", str(dirs[arch]), "--json")
    report = json.loads(out)
    rows = report["checks"]
    assert rc == 0 and report["nullity"] == report["explained"]
    assert FAMILIES[arch] | {"composite"} <= {r["family"] for r in rows}
    for r in rows:
        assert r["verdict"] in ("HOLDS", "HOLDS (worst-case bound only)"), r
        assert r["residual_eps"] < r["tolerance_eps"] / 2, r  # clear of the bound, not at it
    assert all(r["kappa"] >= 1 for r in rows)


def _measured(path: Path):
    from gauge_audit.measured import measured

    return measured(path, 0, 600.0, True, "check")


def test_an_element_outside_the_flat_part_fails_by_orders_of_magnitude(dirs):
    """GLM-4.5 with its per-head QK-norm keeps nothing of QK GL(d_k) (the norm's weights take the
    scalings): the measurement keeps no direction of it, and an element of the candidate changes
    the logits far beyond the tolerance of its κ."""
    from gauge_audit.actions.candidates import continuous
    from gauge_audit.measured import draw, tolerances
    from gauge_audit.runtime import generator

    m = _measured(dirs[GLM])
    assert not [f for f, _ in m.found.flat if f.name == "qk-gl"]
    fam = next(f for f in continuous(m.desc, m.model.params) if f.name == "qk-gl")
    c, k = draw(fam, torch.eye(len(fam.generators), dtype=F64), generator(1), 10.0)
    ids = torch.randint(0, m.model.vocab, (4, 6), generator=generator(2))
    with torch.no_grad():
        y0 = m.model.logits(m.model.params, ids)
        y = m.model.logits(fam.act(m.model.params, c), ids)
    err = float((y - y0).abs().max() / y0.abs().max())
    tol, _ = tolerances(m.desc, m.model.params, k, y0.numel(), F64)
    assert k > 5 and err > 1e6 * tol


def test_gpt_oss_up_branch_scales_about_minus_one(dirs):
    """gpt-oss computes (up + 1)·glu(gate): the measured FFN scaling moves the up bias as
    b ↦ s·(b + 1) − 1, and the plain scaling b ↦ s·b is no symmetry."""
    from gauge_audit.measured import draw, tolerances
    from gauge_audit.runtime import generator

    m = _measured(dirs[GPT_OSS])
    p = m.model.params
    fam, basis = next((f, b) for f, b in m.found.flat if f.name == "ffn-scale" and f.scope == "layer 0 experts")
    c, k = draw(fam, basis, generator(3), 10.0)
    new = fam.act(p, c)
    W, b = "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.gate_up_proj_bias"
    s = new[W][:, :, 1::2] / p[W][:, :, 1::2]  # the up columns (interleaved): one factor per unit
    s = s[:, 0, :]
    assert torch.allclose(new[W][:, :, 1::2], p[W][:, :, 1::2] * s[:, None, :], rtol=1e-13, atol=0)
    assert float((s - 1).abs().max()) > 0.1
    assert torch.allclose(new[b][:, 1::2], s * (p[b][:, 1::2] + 1) - 1, rtol=1e-12, atol=1e-14)
    assert torch.allclose(new[W][:, :, 0::2], p[W][:, :, 0::2], rtol=1e-9, atol=0)  # the gate is not scaled
    plain = dict(new)
    plain[b] = p[b].clone()
    plain[b][:, 1::2] = s * p[b][:, 1::2]
    ids = torch.randint(0, m.model.vocab, (4, 6), generator=generator(4))
    with torch.no_grad():
        y0 = m.model.logits(p, ids)
        good = float((m.model.logits(new, ids) - y0).abs().max() / y0.abs().max())
        bad = float((m.model.logits(plain, ids) - y0).abs().max() / y0.abs().max())
    tol, _ = tolerances(m.desc, p, k, y0.numel(), F64)
    assert good < tol / 2 and bad > 1e6 * tol


@pytest.mark.parametrize("arch", [GLM, GPT_OSS, "Olmo3ForCausalLM"])
def test_transform_is_certified_and_compare_finds_its_element(arch, dirs, tmp_path):
    """The composite: every measured family and held discrete map — for OLMo 3 the swap of its two
    KV groups with their full-width QK-norm entries and the stream's reflection too."""
    out = tmp_path / "moved"
    rc, text = run("transform", "--checkpoint", str(dirs[arch]), "--action", "composite", "--out", str(out), "--json")
    cert = json.loads(text)
    assert rc == 0 and cert["verdict"] == "HOLDS" and cert["residual_eps"] < cert["tolerance_eps"] / 100
    assert cert["kappa"] > 10 and json.loads((out / "certificate.json").read_text())["verdict"] == "HOLDS"
    rc, text = run("compare", str(dirs[arch]), str(out), "--json")
    report = json.loads(text)
    assert rc == 0 and report["verdict"] == "EQUIVALENT", report["why"]
    assert report["residual"] < report["residual_tolerance"]


# ----------------------------------------------------------------------------- a copy made on the files
def _orthogonal(n: int, g: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=F64))
    return q * torch.sign(torch.diagonal(r))


def glm_gauge_copy(src: Path, dst: Path, seed: int) -> None:
    """GLM-4.5 (2 layers: a dense one, then 4 experts and a shared one; 2 query heads on 1 KV head
    of 4, one rotary plane (0, 1), per-head QK-norm) moved by a gauge element, on its files."""
    from safetensors.torch import load_file, save_file

    t = {k: v.to(F64) for k, v in load_file(str(src / "model.safetensors")).items()}
    g = torch.Generator().manual_seed(seed)
    d, e, E = 8, 4, 4
    lay = [f"model.layers.{i}" for i in range(2)]
    ffn0 = [f"{lay[0]}.mlp"]
    experts = [f"{lay[1]}.mlp.experts.{j}" for j in range(E)]
    shared = f"{lay[1]}.mlp.shared_experts"
    dense = ffn0 + experts + [shared]
    # 1. fold every norm weight into the weights that read it, then rotate the stream by Q
    readers = {
        f"{lay[0]}.input_layernorm": [f"{lay[0]}.self_attn.{x}_proj" for x in "qkv"],
        f"{lay[1]}.input_layernorm": [f"{lay[1]}.self_attn.{x}_proj" for x in "qkv"],
        f"{lay[0]}.post_attention_layernorm": [f"{ffn0[0]}.{x}_proj" for x in ("gate", "up")],
        f"{lay[1]}.post_attention_layernorm": [f"{x}.{y}_proj" for x in experts + [shared] for y in ("gate", "up")]
        + [f"{lay[1]}.mlp.gate"],
        "model.norm": ["lm_head"],
    }
    Q = _orthogonal(d, g)
    for norm, rs in readers.items():
        for r in rs:
            t[f"{r}.weight"] = t[f"{r}.weight"] * t[f"{norm}.weight"] @ Q
        t[f"{norm}.weight"] = torch.ones(d, dtype=F64)
    t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"] @ Q
    for w in [f"{x}.self_attn.o_proj" for x in lay] + [f"{x}.down_proj" for x in dense]:
        t[f"{w}.weight"] = Q.T @ t[f"{w}.weight"]
    for x in lay:
        a = f"{x}.self_attn"
        # 2. values mixed by N, each head's output columns by N⁻¹
        N = torch.eye(e, dtype=F64) + 0.4 * torch.randn(e, e, generator=g, dtype=F64)
        t[f"{a}.v_proj.weight"] = N @ t[f"{a}.v_proj.weight"]
        o = t[f"{a}.o_proj.weight"]
        t[f"{a}.o_proj.weight"] = torch.cat([o[:, :e] @ torch.linalg.inv(N), o[:, e:] @ torch.linalg.inv(N)], 1)
        # 3. the two query heads exchanged
        q, o = t[f"{a}.q_proj.weight"], t[f"{a}.o_proj.weight"]
        t[f"{a}.q_proj.weight"] = torch.cat([q[e:], q[:e]])
        t[f"{a}.o_proj.weight"] = torch.cat([o[:, e:], o[:, :e]], 1)
        # 4. the rotary plane (0, 1) of every query and key head turned a quarter, the norms' entries exchanged
        for w, heads in (("q_proj", 2), ("k_proj", 1)):
            m = t[f"{a}.{w}.weight"].clone()
            for h in range(heads):
                m[h * e], m[h * e + 1] = -t[f"{a}.{w}.weight"][h * e + 1], t[f"{a}.{w}.weight"][h * e].clone()
            t[f"{a}.{w}.weight"] = m
        for n in ("q_norm", "k_norm"):
            t[f"{a}.{n}.weight"] = t[f"{a}.{n}.weight"][[1, 0, 2, 3]]
    # 5. the experts reordered (router rows and correction bias with them)
    order = torch.randperm(E, generator=g)
    old = {k: v for k, v in t.items() if ".mlp.experts." in k}
    for j in range(E):
        for w in ("gate_proj", "up_proj", "down_proj"):
            t[f"{experts[j]}.{w}.weight"] = old[f"{experts[int(order[j])]}.{w}.weight"]
    for k in (f"{lay[1]}.mlp.gate.weight", f"{lay[1]}.mlp.gate.e_score_correction_bias"):
        t[k] = t[k][order]
    # 6. every FFN's units permuted, each up row scaled by s and its down column by 1/s
    for f in dense:
        n = t[f"{f}.up_proj.weight"].shape[0]
        perm = torch.randperm(n, generator=g)
        s = torch.exp(torch.rand(n, generator=g, dtype=F64) * 2 - 1)
        t[f"{f}.gate_proj.weight"] = t[f"{f}.gate_proj.weight"][perm]
        t[f"{f}.up_proj.weight"] = t[f"{f}.up_proj.weight"][perm] * s[:, None]
        t[f"{f}.down_proj.weight"] = t[f"{f}.down_proj.weight"][:, perm] / s
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    save_file({k: v.contiguous() for k, v in t.items()}, str(dst / "model.safetensors"))


def test_compare_sees_through_a_copy_made_on_the_files(dirs, tmp_path):
    copy = tmp_path / "copy"
    glm_gauge_copy(dirs[GLM], copy, seed=5)
    rc, text = run("compare", str(dirs[GLM]), str(copy), "--json")
    r = json.loads(text)
    assert rc == 0 and r["verdict"] == "EQUIVALENT", r["why"]
    assert r["function_distance"] < r["function_tolerance"] / 100 and r["residual"] < r["residual_tolerance"]
    assert min(r["matches"].values()) > 1 - 1e-9  # every unit, expert and head found its partner
    assert any("quarter turn" in s for s in r["steps"])


def test_compare_an_independent_seed_and_a_near_copy_are_different(dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    rc, text = run("compare", str(dirs[GLM]), str(dirs[GLM + "-seed1"]), "--json")
    r = json.loads(text)
    assert rc == 1 and r["verdict"] == "DIFFERENT" and r["function_distance"] > 1e5 * r["function_tolerance"]
    near = tmp_path / "near"
    glm_gauge_copy(dirs[GLM], near, seed=6)
    t = load_file(str(near / "model.safetensors"))
    w = "model.layers.1.self_attn.k_proj.weight"
    t[w] = t[w] * (1 + 1e-6 * torch.randn(t[w].shape, generator=torch.Generator().manual_seed(0), dtype=F64))
    save_file(t, str(near / "model.safetensors"))
    rc, text = run("compare", str(dirs[GLM]), str(near), "--json")
    r = json.loads(text)
    assert rc == 1 and r["verdict"] == "DIFFERENT" and r["function_distance"] > 3 * r["function_tolerance"]
    assert not math.isnan(r["function_distance"])


MLA = "Glm4MoeLiteForCausalLM"


def mla_gauge_copy(src: Path, dst: Path, seed: int) -> None:
    """A copy of a multi-head latent attention checkpoint moved on its files, by hand: each latent
    rotated (its rows of the down-projection by Q, the readers' columns by Γ⁻¹·Q·Γ with Γ its
    RMSNorm's factor), each head's unrotated query and key rows mixed by M and M⁻ᵀ, its values
    and output columns by N and N⁻¹, and the heads of every layer exchanged."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    cfg = json.loads((src / "config.json").read_text())
    H, nope, rope, v = (cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    g = torch.Generator().manual_seed(seed)

    def gl(n: int) -> torch.Tensor:
        return torch.eye(n, dtype=F64) + 0.3 * torch.randn(n, n, generator=g, dtype=F64)

    t = {k: x.to(F64) for k, x in load_file(str(dst / "model.safetensors")).items()}
    for i in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn"
        for down, norm, reader in (
            ("q_a_proj", "q_a_layernorm", "q_b_proj"),
            ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj"),
        ):
            w, gamma = t[f"{a}.{down}.weight"], t[f"{a}.{norm}.weight"]
            r = gamma.numel()
            Q = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=F64))[0]
            w[:r] = Q.T @ w[:r]  # the latent y ↦ y·Q
            t[f"{a}.{reader}.weight"] = t[f"{a}.{reader}.weight"] @ (torch.diag(gamma) @ Q @ torch.diag(1 / gamma))
        q = t[f"{a}.q_b_proj.weight"].reshape(H, nope + rope, -1)
        kv = t[f"{a}.kv_b_proj.weight"].reshape(H, nope + v, -1)
        o = t[f"{a}.o_proj.weight"].reshape(-1, H, v)
        for h in range(H):
            M, N = gl(nope), gl(v)
            q[h, :nope] = M.T @ q[h, :nope]
            kv[h, :nope] = torch.linalg.inv(M) @ kv[h, :nope]
            kv[h, nope:] = N.T @ kv[h, nope:]
            o[:, h] = o[:, h] @ torch.linalg.inv(N).T
        pi = torch.arange(H).roll(1)
        t[f"{a}.q_b_proj.weight"] = q[pi].reshape(H * (nope + rope), -1)
        t[f"{a}.kv_b_proj.weight"] = kv[pi].reshape(H * (nope + v), -1)
        t[f"{a}.o_proj.weight"] = o[:, pi].reshape(o.shape[0], H * v)
    save_file({k: x.contiguous() for k, x in t.items()}, str(dst / "model.safetensors"))


def test_compare_sees_through_latent_attention_moved_on_the_files(tmp_path):
    """GLM-4.7-Flash's decoder (``Glm4MoeLiteForCausalLM``: multi-head latent attention, experts):
    a copy moved by hand (the latents rotated, per-head maps, the heads exchanged) is EQUIVALENT,
    every head found its partner; another seed is DIFFERENT by orders of magnitude."""
    a = tiny_checkpoint(MLA, tmp_path / "a", 0)
    copy = tmp_path / "copy"
    mla_gauge_copy(a, copy, seed=5)
    rc, text = run("compare", str(a), str(copy), "--json")
    r = json.loads(text)
    assert rc == 0 and r["verdict"] == "EQUIVALENT", r["why"]
    assert r["function_distance"] < r["function_tolerance"] / 100 and r["residual"] < r["residual_tolerance"]
    heads = {k: x for k, x in r["matches"].items() if k.startswith("latent-head-swap")}
    assert len(heads) == 2 and min(heads.values()) > 1 - 1e-9, r["matches"]
    rc, text = run("compare", str(a), str(tiny_checkpoint(MLA, tmp_path / "seed1", 1)), "--json")
    r = json.loads(text)
    assert rc == 1 and r["verdict"] == "DIFFERENT" and r["function_distance"] > 1e5 * r["function_tolerance"]


def test_bad_input_is_one_line(dirs, tmp_path, capsys):
    assert main(["compare", str(dirs[GLM]), str(dirs[GPT_OSS])]) == 2
    assert main(["check", "--checkpoint", str(dirs[GLM]), "--text", "hello"]) == 2
    assert main(["transform", "--checkpoint", str(dirs[GLM]), "--action", "qk-gl", "--out", str(tmp_path / "x")]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 3 and all(x.startswith("gauge-audit: ") for x in lines), lines
    assert "different architectures" in lines[0] and "no part of the group" in lines[2]


def test_compare_at_bfloat16_storage(dirs, tmp_path):
    """B stored in bfloat16: a gauge copy is within its rounding (EQUIVALENT), an independent
    model's logits stand outside the response to simulated bfloat16 roundings (DIFFERENT)."""
    from safetensors.torch import load_file, save_file

    rc, _ = run("transform", "--checkpoint", str(dirs[GLM]), "--action", "composite", "--kappa", "4",
                "--dtype", "bfloat16", "--out", str(tmp_path / "copy"))  # fmt: skip
    assert rc == 1  # its certificate: UNDECIDED, a worst-case tolerance ≥ 1 in bfloat16
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(dirs[GLM + "-seed1"] / "config.json", other / "config.json")
    t = load_file(str(dirs[GLM + "-seed1"] / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in t.items()}, str(other / "model.safetensors"))
    rc, text = run("compare", str(dirs[GLM]), str(tmp_path / "copy"), "--json")
    r = json.loads(text)
    assert rc == 0 and r["verdict"] == "EQUIVALENT" and r["residual"] < r["residual_tolerance"] / 2, r["why"]
    rc, text = run("compare", str(dirs[GLM]), str(other), "--json")
    r = json.loads(text)
    assert rc == 1 and r["verdict"] == "DIFFERENT" and r["function_distance"] > 2 * r["function_tolerance"], r["why"]


# ----------------------------------------------------------------------------- canonicalize
def _factor_names(m) -> set[str]:
    """The ``1 + w`` norm weights: their canonical value is w = 0, compared as the factor 1 + w."""
    norms = [r.norm for r in m.desc.readers if r.norm is not None] + list(m.desc.post_norms)
    norms += [n for h in m.desc.heads for n in (h.q_norm, h.k_norm) if n is not None]
    return {n.weight for n in norms if n.weight and n.kind == "rms1p"}


def _apart(a: dict, b: dict, factors: set[str]) -> tuple[float, str]:
    """The largest per-tensor ‖a − b‖/‖a‖ (a ``1 + w`` weight as its factor)."""
    out = []
    for n in a:
        x, y = a[n].to(F64), b[n].to(F64)
        ref = (1 + x).norm() if n in factors else x.norm()
        out.append((float((x - y).norm() / ref), n))
    return max(out)


def _one_per_orbit_tolerance(ra: dict, rb: dict) -> float:
    """Each canonical form carries its element's float64 rounding, κ·m·ε per entry, and the
    eigenvectors that fix the rotations amplify a perturbation by 1 / (their relative gap)."""
    gap = min(r["margins"].get("eigenvalue gap", 1.0) for r in (ra, rb))
    return 4 * (ra["kappa"] + rb["kappa"]) * ra["length"] * torch.finfo(F64).eps / gap


# beside the five: a LayerNorm stream (its rotations fix 1: so(1⊥), not a block of coordinates),
# NoPE layers under a per-head QK-norm (quarter turns of both plane pairings: signed permutations)
# and a weightless LayerNorm stream (the ones shifts in closed form; the scale of 1 acts trivially)
MORE = (
    "StableLmForCausalLM",
    "Exaone4ForCausalLM",
    "OlmoForCausalLM",
    "CohereForCausalLM",
    "GPTJForCausalLM",
    "PhiForCausalLM",
    "FalconForCausalLM",  # q, k and v fused per KV group: [queries | key | value]
    "Glm4MoeLiteForCausalLM",  # multi-head latent attention: the latents' rotations, heads permuted
    "MptForCausalLM",  # the FFN adds the residual itself
)


@pytest.mark.parametrize("arch", list(DECODER_EXAMPLES) + list(MORE))
def test_canonical_form_is_one_per_orbit(arch, dirs, tmp_path):
    """A and A moved by an element of every measured family and every held discrete map reach the
    same canonical form, which computes A's function."""
    import dataclasses

    from gauge_audit.actions.candidates import discrete
    from gauge_audit.gauge_fix.measured_canonical import canonical_form
    from gauge_audit.measured import composite, held_maps

    m = _measured(dirs[arch] if arch in dirs else tiny_checkpoint(arch, tmp_path / arch, 0))
    held = held_maps(m, discrete(m.desc, m.model.params))
    moved, _ = composite(m, 5, 10.0)
    state = {n: moved[n] for n in m.model.params}
    buffers = {n: moved[n] for n in m.model.buffers}
    ca = canonical_form(m.model, m.desc, m.found.flat, held)
    cb = canonical_form(dataclasses.replace(m.model, params=state, buffers=buffers), m.desc, m.found.flat, held)
    gap, worst = _apart(ca.params, cb.params, _factor_names(m))
    tol = _one_per_orbit_tolerance(ca.to_json(), cb.to_json())
    assert gap < tol, (worst, gap, tol)
    assert _apart(m.model.state, ca.params, _factor_names(m))[0] > 100 * tol  # it did move, far beyond rounding
    ids = torch.randint(0, m.model.vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y, yc = m.model.logits(m.model.state, ids), m.model.logits(ca.params, ids)
    rel = float((yc - y).abs().max() / y.abs().max())
    from gauge_audit.measured import tolerances

    assert rel < tolerances(m.desc, m.model.params, ca.kappa, y.numel(), F64)[0] / 10
    assert ca.gradient < 1e-12 and not ca.decisions_below_rounding


def test_canonicalize_sees_through_a_copy_made_on_the_files(dirs, tmp_path):
    """The copy made on the files by code that shares nothing with the actions (a stream rotation
    of either orientation, values mixed by N of either sign of det N, ...) and the original write
    the same canonical checkpoint; an independent seed's is far from it."""
    from safetensors.torch import load_file

    copy = tmp_path / "copy"
    glm_gauge_copy(dirs[GLM], copy, seed=8)  # det Q = −1, and layer 1's N has det < 0
    written, reports = {}, {}
    for name, src in (("a", dirs[GLM]), ("copy", copy), ("seed1", dirs[GLM + "-seed1"])):
        out = tmp_path / f"canonical-{name}"
        rc, text = run("canonicalize", "--checkpoint", str(src), "--out", str(out), "--json")
        reports[name] = json.loads(text)
        assert rc == 0 and reports[name]["certificate"]["verdict"] == "HOLDS"
        assert json.loads((out / "report.json").read_text())["kappa"] == reports[name]["kappa"]
        written[name] = load_file(str(out / "model.safetensors"))
    gap, worst = _apart(written["a"], written["copy"], set())
    tol = _one_per_orbit_tolerance(reports["a"], reports["copy"])
    assert gap < tol, (worst, gap, tol)
    assert _apart(written["a"], written["seed1"], set())[0] > 1e-2  # another orbit: O(1) apart
    rc, text = run("canonicalize", "--checkpoint", str(dirs[GLM]))
    assert rc == 0 and "same function: HOLDS" in text and "gauge conditions imposed" in text


def test_canonicalize_bad_input_is_one_line(dirs, tmp_path, capsys):
    assert main(["canonicalize", "--checkpoint", str(dirs[GLM]), "--by-runs"]) == 2
    (tmp_path / "taken").mkdir()
    assert main(["canonicalize", "--checkpoint", str(dirs[GLM]), "--out", str(tmp_path / "taken")]) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 2 and all(x.startswith("gauge-audit: ") for x in lines), lines


# ----------------------------------------------------------------------------- align
def test_align_lands_a_gauge_copy_on_a_and_brings_another_seed_closer(dirs, tmp_path):
    """B′ = g·B, g in B's measured group: for the copy made on the files (values mixed by N with
    det N < 0 in layer 0) it is A within rounding; for an independent seed it is closer to A than B
    was.  Both computes B's function (the certificate)."""
    copy = tmp_path / "copy"
    glm_gauge_copy(dirs[GLM], copy, seed=5)
    rc, text = run("align", str(dirs[GLM]), str(copy), "--out", str(tmp_path / "aligned"), "--json")
    r = json.loads(text)
    assert rc == 0 and r["certificate"]["verdict"] == "HOLDS"
    assert r["farthest_tensor_after"]["distance"] < r["copy_tolerance"] < 1e-6 < r["distance_before"]
    assert json.loads((tmp_path / "aligned" / "report.json").read_text())["distance_after"] == r["distance_after"]
    rc, text = run("align", str(dirs[GLM]), str(dirs[GLM + "-seed1"]), "--out", str(tmp_path / "other"), "--json")
    r = json.loads(text)
    assert rc == 0 and r["certificate"]["verdict"] == "HOLDS"
    assert (
        r["distance_after"] < r["distance_before"]
        and r["farthest_tensor_after"]["distance"] > 1e6 * r["copy_tolerance"]
    )
    assert main(["align", str(dirs[GLM]), str(copy), "--out", str(tmp_path / "x"), "--group", "permutation"]) == 2
