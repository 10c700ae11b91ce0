"""``align``: B' = g·B for an element g of B's gauge group that brings B' close to A.

On B = g·A (g drawn from the group through the actions, B stored in float64, float32 or bfloat16)
alignment must recover A to the rounding of B's storage; with the permutation group on a permuted
copy exactly; on two independent models it must never raise the distance and never change B's
function."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gauge_audit.actions import ACTIONS, composite
from gauge_audit.align import align
from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.gauge_fix import function_check
from gauge_audit.gauge_fix.comparison import relative_distances
from gauge_audit.models import bert, gemma, gpt2, llama, moe, neox, olmo2, phi3, qwen, qwen3
from gauge_audit.models.registry import build_config
from gauge_audit.runtime import eps, generator

# every family the project reads, at its tiny size (one configuration each of the features that
# change the group: GQA, RoPE, sliding windows, QK-norms, output norms, partial rotary, parallel
# residual, sandwich norms, soft-capping)
FAMILIES = {
    "gpt2": gpt2.config(),
    "gpt2-relu-tied": gpt2.config(act="relu", tied=True),
    "bert": bert.config(),
    "llama-gqa": llama.config(n_kv_heads=2),
    "mistral": llama.config(n_kv_heads=2, window=5),
    "qwen2": qwen.config(n_kv_heads=2),
    "qwen3": qwen3.config(n_kv_heads=2),
    "olmo2": olmo2.config(n_kv_heads=2),
    "phi3": phi3.config(rotary_dim=2),
    "neox": neox.config(),
    "gemma3": gemma.config(n_kv_heads=2, window=5, sliding_pattern=2),
    "gemma2": gemma.gemma2_config(n_kv_heads=2, window=5),
}
# the factors of the full group align moves (each applied where it is a symmetry of the family)
FULL = (
    "head-perm",
    "qk-gl",
    "qk-norm-scale",
    "vo-gl",
    "norm-scale",
    "stream-rotation",
    "ffn-perm",
    "relu-scaling",
    "swiglu-scaling",
    "expert-perm",
)
PERMUTATIONS = ("head-perm", "ffn-perm", "expert-perm")
DENSE = ("qk-gl", "vo-gl", "stream-rotation")  # the factors that can amplify rounding
EPS64 = torch.finfo(torch.float64).eps


def transformed(cfg, params, actions, seed: int, kappa: float):
    """g·params for a random g of every action in ``actions`` that is a symmetry here (float64),
    and the κ of its dense factors."""
    g, p, dense = generator(seed), {k: v.to(torch.float64) for k, v in params.items()}, []
    for name in actions:
        act = ACTIONS[name]
        if act.applies(cfg) is None and act.expected_holds(cfg):
            el = act.sample(cfg, p, g, kappa)
            p = act.apply(cfg, p, el)
            if name in DENSE:
                dense.append(el.kappa)
    return p, dense


def tolerance(cfg, dtype, dense) -> float:
    """The rounding level of a recovered A.  Each tensor is moved by at most two dense factors of
    g (the stream rotation seen through the norm weights, and one per-KV-group map of qk-gl or
    vo-gl); undoing them amplifies the relative rounding of the stored B (u) and of the float64
    arithmetic (sums over d_model terms: d·ε) by at most the product of their κ.  Factor 2: each
    stage's fit is at most as far from A as the exact inverse on its tensors, which is itself
    that far."""
    kappa = math.prod(sorted(dense, reverse=True)[:2])
    return 2.0 * kappa * (eps(dtype) / 2 + cfg.d_model * EPS64)


def _stored(params, dtype):
    return {k: v.to(dtype) for k, v in params.items()}


def _orbit_case(name: str, dtype: torch.dtype):
    cfg = FAMILIES[name]
    a = _stored(build_config(cfg, seed=0).params, dtype)
    b64, dense = transformed(cfg, a, FULL, seed=5, kappa=2.0)
    b = _stored(b64, dtype)
    res = align(cfg, a, b)
    tol = tolerance(cfg, dtype, dense)
    print(f"{name} {dtype}: {res.total_before:.3f} → {res.total_after:.3e} ≤ {tol:.3e} ({res.iterations} iterations)")
    assert res.total_after <= tol
    assert res.total_before > 10 * tol  # unaligned, the same comparison fails by a wide margin
    # the element is an element of B's group: the actions applied to B give B'
    again = ACTIONS["composite"].apply(cfg, {k: v.to(torch.float64) for k, v in b.items()}, res.element)
    assert relative_distances(res.params, again)[0] <= eps(dtype)
    assert all(res.params[k].dtype == b[k].dtype and res.params[k].shape == b[k].shape for k in b)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_align_recovers_a_from_its_orbit_every_family(name):
    _orbit_case(name, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_align_recovers_a_from_its_orbit_stored_in_low_precision(name, dtype):
    _orbit_case(name, dtype)


TRANSLATIONS = ("writer-ones", "key-bias-shift", "value-bias-fold", "norm-shift")


def test_align_recovers_a_from_its_orbit_with_translations():
    """BERT with the bias translations in g too: their least-squares steps alternate with the
    GL fits (the biases are rows of the QK and VO pairs) and converge to A."""
    cfg = FAMILIES["bert"]
    a = build_config(cfg, seed=0).params
    b, dense = transformed(cfg, a, FULL + TRANSLATIONS, seed=5, kappa=2.0)
    res = align(cfg, a, b)
    assert res.total_after <= tolerance(cfg, torch.float64, dense) < res.total_before / 10


@pytest.mark.parametrize("name", ["llama-gqa", "bert", "olmo2"])
def test_permutation_group_recovers_a_permuted_copy_exactly(name):
    cfg = FAMILIES[name]
    a = build_config(cfg, seed=0).params
    b, _ = transformed(cfg, a, PERMUTATIONS, seed=3, kappa=1.0)
    res = align(cfg, a, b, group="permutation")
    assert all(torch.equal(res.params[k], a[k]) for k in a)  # permutations are exact: no rounding
    assert res.total_before > 0.1  # the permuted copy is far from A


def test_permutation_group_recovers_experts_and_units_exactly():
    cfg = moe.config()
    a = build_config(cfg, seed=0).params
    b, _ = transformed(cfg, a, PERMUTATIONS, seed=3, kappa=1.0)
    res = align(cfg, a, b, group="permutation")
    assert all(torch.equal(res.params[k], a[k]) for k in a)


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_orthogonal_group_recovers_an_orthogonally_transformed_copy(name):
    """κ = 1: qk-gl and vo-gl draw orthogonal maps (under RoPE: plane rotations), Zhang et al.'s
    group; the stream is not rotated."""
    cfg = FAMILIES[name]
    a = build_config(cfg, seed=0).params
    b, dense = transformed(cfg, a, ("head-perm", "qk-gl", "vo-gl", "ffn-perm"), seed=4, kappa=1.0)
    res = align(cfg, a, b, group="orthogonal")
    tol = tolerance(cfg, torch.float64, dense)
    assert res.total_after <= tol < res.total_before / 10


@pytest.mark.parametrize("group", ["permutation", "orthogonal", "full"])
@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_align_of_independent_models_never_raises_the_distance_nor_changes_the_function(name, group):
    cfg = FAMILIES[name]
    a, b = build_config(cfg, seed=0).params, build_config(cfg, seed=1).params
    res = align(cfg, a, b, group=group, max_seconds=60.0)
    totals = [d["total"] for _, d in res.stages]
    assert all(after <= before for before, after in zip(totals, totals[1:]))
    assert res.total_after < res.total_before  # every group lowers it on two random models
    fn = function_check(cfg, b, res.params, res.rounding_kappa, element=res.element)
    assert fn["verdict"] == "HOLDS", fn
    again = ACTIONS["composite"].apply(cfg, b, res.element)
    assert relative_distances(res.params, again)[0] <= 10 * EPS64


def test_vo_group_orthogonal_keeps_every_vo_map_orthogonal():
    cfg = FAMILIES["llama-gqa"]
    a, b = build_config(cfg, seed=0).params, build_config(cfg, seed=1).params
    res = align(cfg, a, b, vo_group="orthogonal")
    ns = [el.parts["N"] for action, el in composite.steps(res.element) if action == "vo-gl"]
    eye = torch.eye(cfg.d_head, dtype=torch.float64)
    assert ns and all(float((n.transpose(-1, -2) @ n - eye).abs().max()) <= 100 * EPS64 for n in ns)
    assert res.total_after < res.total_before


def test_larger_group_aligns_closer():
    """permutation ⊂ orthogonal ⊂ full: each larger group reaches a smaller distance here."""
    cfg = FAMILIES["llama-gqa"]
    a, b = build_config(cfg, seed=0).params, build_config(cfg, seed=1).params
    d = [align(cfg, a, b, group=g).total_after for g in ("permutation", "orthogonal", "full")]
    assert d[0] > d[1] > d[2]


@pytest.mark.parametrize("name", ["llama-gqa", "olmo2"])
def test_activation_matching_recovers_a_from_its_orbit(name):
    """Heads and units matched by the correlations of their activations on token ids."""
    cfg = FAMILIES[name]
    a = build_config(cfg, seed=0).params
    b, dense = transformed(cfg, a, FULL, seed=5, kappa=2.0)
    data = torch.randint(0, cfg.vocab, (4, 12), generator=generator(1))
    res = align(cfg, a, b, data=data)
    assert res.matching == "activations"
    assert res.total_after <= tolerance(cfg, torch.float64, dense) < res.total_before / 10


def test_activation_matching_refuses_what_it_cannot_read():
    cfg = FAMILIES["bert"]
    p = build_config(cfg, seed=0).params
    with pytest.raises(GaugeAuditError, match="activation matching"):
        align(cfg, p, p, data=torch.zeros(1, 4, dtype=torch.long))


# ----------------------------------------------------------------------------- CLI
def test_cli_align_writes_b_prime_element_and_distances(tmp_path, capsys):
    out = tmp_path / "aligned"
    assert main(["align", "llama-tiny-gqa", "llama-tiny-gqa", "--seed-b", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "stage" in text and "before" in text and "HOLDS" in text
    report = json.loads((out / "alignment.json").read_text())
    totals = [s["distances"]["total"] for s in report["stages"]]
    assert totals[-1] < totals[0] and all(y <= x for x, y in zip(totals, totals[1:]))
    assert report["function"]["verdict"] == "HOLDS"
    assert (out / "element.npz").is_file() and (out / "model.safetensors").is_file()
    # the element file is an element the check command applies
    assert main(["check", "--model", "llama-tiny-gqa", "--seed", "1", "--action", "composite",
                 "--element", str(out / "element.npz")]) == 0  # fmt: skip


def test_cli_align_with_data_file(tmp_path, capsys):
    import numpy as np

    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.arange(48, dtype=np.int64).reshape(3, 16) % 64)
    out = tmp_path / "aligned"
    argv = ["align", "gpt2-tiny", "gpt2-tiny", "--seed-b", "2", "--group", "permutation", "--data", str(tokens)]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["matching"] == "activations" and report["total_after"] <= report["total_before"]


def test_cli_align_checkpoints_certified_by_transformers(tmp_path, capsys, tiny_hf):
    """Two independently initialised LLaMA checkpoints: B' is written as a LLaMA checkpoint whose
    transformers float64 logits equal B's within the derived tolerance."""
    pytest.importorskip("transformers")
    from conftest import build_hf

    other = tmp_path / "b"
    build_hf("llama", seed=1).save_pretrained(str(other))
    out = tmp_path / "aligned"
    assert main(["align", str(tiny_hf("llama")), str(other), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["verdict"] == "HOLDS" and cert["max_rel_change"] <= cert["tolerance"]
    assert report["total_after"] < report["total_before"]
    assert (out / "config.json").is_file()


@pytest.mark.parametrize(
    "argv",
    [
        ["align", "gpt2-tiny", "llama-tiny", "--out", "{tmp}/x"],  # different architectures
        ["align", "llama-tiny", "llama-tiny-gqa", "--out", "{tmp}/x"],  # different shapes (KV heads)
        ["align", "gpt2-tiny", "{tmp}/missing/", "--out", "{tmp}/x"],  # no such checkpoint
        ["align", "gpt2-tiny", "gpt2-tiny", "--out", "{tmp}"],  # --out exists
        ["align", "gpt2-tiny", "gpt2-tiny", "--out", "{tmp}/x", "--data", "{tmp}/none.npy"],
        ["align", "gpt2-tiny", "gpt2-tiny", "--out", "{tmp}/x", "--data", "{tmp}/bad.txt"],
        ["align", "gpt2-tiny", "gpt2-tiny", "--out", "{tmp}/x", "--max-seconds", "0"],
        ["align", "gpt2-tiny", "gpt2-tiny", "--out", "{tmp}/x", "--group", "affine"],
        ["align", "no-such-model", "gpt2-tiny", "--out", "{tmp}/x"],
    ],
)
def test_cli_align_bad_input_is_one_line_exit_2(tmp_path, capsys, argv):
    (tmp_path / "bad.txt").write_text("1 2 x\n")
    capsys.readouterr()
    try:
        rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    except SystemExit as exc:  # a usage error: argparse's exit
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("gauge-audit: error:"), err
    assert not (tmp_path / "x").exists()
