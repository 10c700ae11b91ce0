"""Gauge fixing: the canonical form computes the same function, is idempotent, is the same for
every point of an orbit, imposes exactly as many conditions as the orbit has dimensions (family by
family, transversally), reports every non-uniqueness; ``compare`` calls transformed copies (stored
in float64, float32, bfloat16) EQUIVALENT with the element that maps A to B, and perturbed copies
DIFFERENT with a distance that tracks the perturbation; bad input is one line, exit 2."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.func import jvp

from gauge_audit.actions import ACTIONS, composite
from gauge_audit.actions.algebra import compose, inverse
from gauge_audit.actions.elements import element_from_arrays
from gauge_audit.cli import main
from gauge_audit.errors import GaugeAuditError
from gauge_audit.gauge_fix import (
    DIFFERENT,
    EQUIVALENT,
    canonicalize,
    compare,
    comparison,
    conditions,
    function_check,
    prepare,
    response,
    unfixed,
)
from gauge_audit.gauge_fix.comparison import relative_distances, rounding_response, rounding_response_recanonicalised
from gauge_audit.models import attn, build, build_config, model_names
from gauge_audit.nullity.families import families
from gauge_audit.nullity.measure import EPS64, genericity, make_problem
from gauge_audit.numeric import HOLDS, check, tolerance
from gauge_audit.runtime import generator
from gauge_fix_cases import assert_b_by_runs_is_b_whole
from test_nullity import CONFIGS

# the gemma family's tiny models are tested with the other newer architectures
# (tests/test_gauge_fix_families.py); the real Gemma 3 270M is not canonicalised here
TINY = [m for m in model_names() if m != "minilm" and not m.startswith("gemma")]
SURVIVORS = ["gpt2-tiny", "llama-tiny-gqa", "qwen-tiny", "moe-tiny", "bert-tiny"]
UNIT = {torch.float64: EPS64 / 2, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}


def _transformed(model, seed: int, kappa: float = 4.0):
    # drawing the element applies it (each member drawn where the previous ones led): the same
    # tensors as ACTIONS["composite"].apply(cfg, params, el), bit for bit (tested below), computed once
    el, params = composite.sample_applied(model.cfg, model.params, generator(seed), kappa)
    return params, el


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny-gqa", "moe-tiny", "bert-tiny", "qwen-tiny"])
def test_composite_sample_applied_is_the_elements_apply_bit_for_bit(model, name):
    m = model(name)
    el, params = composite.sample_applied(m.cfg, m.params, generator(3), 4.0)
    again = ACTIONS["composite"].apply(m.cfg, m.params, el)
    assert el.parts.keys() == ACTIONS["composite"].sample(m.cfg, m.params, generator(3), 4.0).parts.keys()
    assert params.keys() == again.keys() and all(torch.equal(params[k], again[k]) for k in params)
    assert relative_distances(m.params, params)[0] >= 0.3  # it moved the model


# ----------------------------------------------------------------------------- conditions = orbit dimension
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_condition_count_equals_explained_nullity(name):
    """Family by family, the continuous steps impose as many conditions as the nullity theory's
    (exact) family has dimensions, the families left unfixed are exactly those `unfixed` names, and
    the conditions cut the orbit transversally: their derivative along the families' generators at
    the canonical point has full rank (a rank-deficient one would show σ_min at m·ε)."""
    cfg = CONFIGS[name]("A")
    problem = make_problem(cfg, seed=0)
    exact = {f.name: f.k for f in families(problem, genericity(problem)) if f.kind == "exact"}
    canon = canonicalize(cfg, problem.params())
    conds = conditions(cfg, canon.params)
    counts = {k: int(v.numel()) for k, v in conds.items()}
    left = {f for f, _ in unfixed(cfg)} & set(exact)
    print(f"{name}: conditions {counts}, nullity families {exact}, unfixed {sorted(left)}")
    assert counts == {k: v for k, v in exact.items() if k not in left}
    assert {f for f, _ in unfixed(cfg)} <= left | {"first-block", "router-top1"}

    problem.theta = problem.layout.flatten(canon.params)  # the orbit's tangent space at the canonical point
    gens = torch.cat([f.vectors for f in families(problem, genericity(problem)) if f.name in counts])
    assert gens.shape[0] == sum(counts.values())

    def flat_conditions(theta):
        c = conditions(cfg, problem.layout.unflatten(theta))
        return torch.cat([c[k].reshape(-1) for k in sorted(c)])

    d = torch.stack([jvp(flat_conditions, (problem.theta,), (v,))[1] for v in gens])
    sv = torch.linalg.svdvals(d)
    m = d.shape[0]
    print(f"  transversality: σ_min/σ_max = {float(sv[-1] / sv[0]):.2e} (rounding level {m * EPS64:.1e})")
    assert float(sv[-1] / sv[0]) >= 1e6 * m * EPS64


# ----------------------------------------------------------------------------- canonical form
@pytest.fixture(scope="module")
def canonical(model):
    """``canonical(name)`` -> canonicalize of the cached model, computed once for this module's
    tests (deterministic; treat as read-only): SmolLM2's untied copy is a 155 GFLOP pass."""
    made = {}

    def get(name):
        if name not in made:
            m = model(name)
            made[name] = canonicalize(m.cfg, m.params)
        return made[name]

    yield get
    made.clear()


@pytest.mark.parametrize("name", TINY)
def test_canonical_form_same_function_idempotent_and_conditions_hold(model, canonical, name):
    m = model(name)
    c = canonical(name)
    fn = function_check(m.cfg, m.params, c.params, c.rounding_kappa, element=c.element())
    print(
        f"{name}: function change {fn['residual_eps']:.3g} ε vs statistical tolerance "
        f"{fn['tolerance_statistical_eps']:.4g} ε (κ of the dense steps = {c.rounding_kappa:.3g}, of g = {c.kappa:.3g})"
    )
    assert fn["verdict"] == HOLDS
    again = canonicalize(m.cfg, c.params)
    dist, _ = relative_distances(c.params, again.params)
    tol, formula = tolerance(m, c.kappa, torch.float64, 16)
    print(f"  idempotent: {dist:.2e} ≤ {tol:.2e} ({formula})")
    assert dist <= tol
    # every imposed condition holds at rounding level: a condition is a sum of at most n products of
    # entries ≤ s (n the longest axis summed over), computed with error ≤ n·ε·n·s², amplified by κ
    n = max(m.cfg.vocab, m.cfg.d_ff, m.cfg.n_ctx, m.cfg.group_size * (m.cfg.d_model + 1))
    s2 = max(float(t.abs().max()) for t in c.params.values()) ** 2
    for fam, res in conditions(m.cfg, c.params).items():
        assert float(res.abs().max()) <= c.kappa * n * n * EPS64 * s2, fam
    assert not c.ties() and not c.unfixed


@pytest.mark.parametrize("name", TINY)
def test_canonical_form_is_the_same_on_the_whole_orbit(model, canonical, name):
    """canon(g·θ) = canon(θ) for a random g of every action that applies — by the rules alone (no
    reference), within κ(g)·κ(canon)·L·K·ε."""
    m = model(name)
    b, el = _transformed(m, seed=3)
    ca, cb = canonical(name), canonicalize(m.cfg, b)
    raw, _ = relative_distances(m.params, b)
    dist, _ = relative_distances(ca.params, cb.params)
    tol, _ = tolerance(m, el.kappa * ca.kappa, torch.float64, 16)
    print(f"{name}: raw {raw:.2f}, canonical {dist:.2e} ≤ {tol:.2e} (κ(g) = {el.kappa:.3g})")
    assert raw >= 0.3 and dist <= tol


@pytest.mark.parametrize("name", ["llama-tiny-gqa", "qwen-tiny"])
def test_the_stream_step_reuses_the_embedding_product_bit_for_bit(model, name, monkeypatch):
    """The stream rotation's W_E·R is the product the axes' third moments were computed from
    (W_E·V, signed): the canonical form is the same bit for bit as with the product formed again,
    the kept product is used by the rotation (nothing left to forget), and nothing stays held."""
    import gauge_audit.gauge_fix.base as gauge_base
    import gauge_audit.gauge_fix.stream as gauge_stream
    from gauge_audit import runtime

    m = model(name)
    kept, left = [], []
    remember = gauge_base.remember_product
    monkeypatch.setattr(gauge_base, "remember_product", lambda *a: (kept.append(a[0].shape), remember(*a)))
    forget = gauge_stream.forget_products
    monkeypatch.setattr(gauge_stream, "forget_products", lambda: (left.append(len(runtime._KNOWN_PRODUCT)), forget()))
    reused = canonicalize(m.cfg, m.params)
    assert kept == [m.params["embed.W_E"].shape] and left == [0] and not runtime._KNOWN_PRODUCT
    monkeypatch.setattr(gauge_base, "remember_product", lambda *a: None)
    again = canonicalize(m.cfg, m.params)
    assert reused.params.keys() == again.params.keys()
    assert all(torch.equal(reused.params[k], again.params[k]) for k in again.params)


def test_a_lazy_model_is_read_once_by_canonicalize(model):
    """canonicalize reads parameters held on disk (a GGUF: dequantized on every access) once, into
    its float64 copy — not a second time to learn their dtype, which a LazyParams declares; parameters
    returned as stored (each its own dtype) are still looked at, the coarsest being the storage dtype."""
    from gauge_audit.gauge_fix.pipeline import storage_dtype_of
    from gauge_audit.models.lazy import LazyParams

    m = model("llama-tiny-gqa")
    reads: list[str] = []

    def load(name: str) -> torch.Tensor:
        reads.append(name)
        return m.params[name].to(torch.float32)

    lazy = LazyParams({k: tuple(v.shape) for k, v in m.params.items()}, load, torch.float32)
    c = canonicalize(m.cfg, lazy)
    assert sorted(reads) == sorted(m.params) and c.storage_dtype == torch.float32

    class AsStored(LazyParams):  # bfloat16 for one tensor, float32 for the others
        def __getitem__(self, name):
            t = load(name)
            return t.to(torch.bfloat16) if name == "embed.W_E" else t

    reads.clear()
    assert storage_dtype_of(AsStored(lazy.shapes, load, torch.float32)) == torch.bfloat16
    assert sorted(reads) == sorted(m.params)


def test_every_true_action_is_in_the_composite_and_has_a_group_law(model):
    for name in ("gpt2-tiny", "llama-tiny-gqa", "moe-tiny", "bert-tiny"):
        m = model(name)
        for a in ACTIONS.values():
            if a.name == "composite" or a.applies(m.cfg) or not a.expected_holds(m.cfg):
                continue
            g = generator(5)
            x, y = a.sample(m.cfg, m.params, g, 4.0), a.sample(m.cfg, m.params, g, 4.0)
            there = a.apply(m.cfg, m.params, x)
            back = a.apply(m.cfg, there, inverse(a.name, x))
            both = a.apply(m.cfg, a.apply(m.cfg, m.params, x), y)
            once = a.apply(m.cfg, m.params, compose(a.name, x, y))
            d_inv, d_comp = relative_distances(m.params, back)[0], relative_distances(both, once)[0]
            k = 4 * max(m.cfg.d_model, m.cfg.d_ff) * EPS64  # two products of length ≤ max(d, d_ff) per entry
            assert d_inv <= k * x.kappa and d_comp <= k * x.kappa * y.kappa, (name, a.name, d_inv, d_comp)


# ----------------------------------------------------------------------------- non-uniqueness
def _ties(c):
    return {(t["step"], t["kind"]) for t in c.ties()}


def test_non_uniqueness_is_reported(model):
    # two zero heads: their order is a tie and their GL is not fixed
    m = model("attn-tiny")
    p = dict(m.params)
    for k in ("W_Q", "W_V", "W_O", "b_Q", "b_V"):
        t = p[f"blocks.0.attn.{k}"].clone()
        t[1] = t[2] = 0
        p[f"blocks.0.attn.{k}"] = t
    c = canonicalize(m.cfg, p)
    assert ("head-perm", "order") in _ties(c)
    assert sum("rank-deficient" in n for n in c.report()["notes"]) == 4
    assert function_check(m.cfg, p, c.params, c.kappa, element=c.element())["verdict"] == HOLDS
    # repeated singular values: W_Q[0] = W_K[0] with orthonormal columns (σ = 1, 1, 1, 1)
    m = build_config(attn.config(attn_bias=False, out_bias=False), device="cpu")
    p = dict(m.params)
    q, _ = torch.linalg.qr(torch.randn(16, 4, generator=generator(1), dtype=torch.float64))
    for k in ("W_Q", "W_K"):
        t = p[f"blocks.0.attn.{k}"].clone()
        t[0] = q
        p[f"blocks.0.attn.{k}"] = t
    c = canonicalize(m.cfg, p)
    assert ("qk-gl", "spectrum") in _ties(c)
    assert [t for t in c.ties() if t["step"] == "qk-gl"][0]["not_unique"] == 3
    # dead ReLU units: their scale is left and their order ties
    m = model("gpt2-tiny-relu")
    p = dict(m.params)
    t = p["blocks.0.mlp.W_out"].clone()
    t[3] = t[7] = 0
    p["blocks.0.mlp.W_out"] = t
    c = canonicalize(m.cfg, p)
    assert ("ffn-perm", "order") in _ties(c) and any("2 dead units" in n for n in c.report()["notes"])
    # two identical heads: a tie in the sort key
    m = model("attn-tiny")
    p = dict(m.params)
    for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
        t = p[f"blocks.0.attn.{k}"].clone()
        t[1] = t[0]
        p[f"blocks.0.attn.{k}"] = t
    assert ("head-perm", "order") in _ties(canonicalize(m.cfg, p))
    # a bfloat16 input: decisions within its rounding of a tie are flagged, not silently taken
    m = model("llama-tiny")
    c = canonicalize(m.cfg, {k: v.to(torch.bfloat16) for k, v in m.params.items()})
    assert c.ties() and c.storage_dtype == torch.bfloat16


def test_unfixed_families_are_reported():
    cfg = CONFIGS["gpt2-nonorm"]("A")
    c = canonicalize(cfg, make_problem(cfg).params())
    assert [f for f, _ in c.unfixed] == ["stream-gl"] and c.report()["unfixed"][0]["reason"]


# ----------------------------------------------------------------------------- compare
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", SURVIVORS)
def test_compare_transformed_copy_is_equivalent(model, name, dtype):
    """B = g·A for a random g of every action that applies, stored in ``dtype``: EQUIVALENT, raw
    distance O(1), invariant distance within the derived tolerance (and at the storage rounding
    level), and the returned element maps A to B (its function check HOLDS)."""
    m = model(name)
    b, el = _transformed(m, seed=11)
    stored = {k: v.to(dtype) for k, v in b.items()}
    r = compare(m.cfg, m.params, m.cfg, stored)
    u = UNIT[dtype]
    print(
        f"{name} {dtype}: raw {r.raw_distance:.3f}, invariant {r.invariant_distance:.3e} = "
        f"{r.invariant_distance / u:.3g} u, tolerance {r.tolerance:.3e} = {r.tolerance / u:.3g} u; "
        f"element κ {r.kappa:.3g} (g: {el.kappa:.3g}), ‖g·A − B‖/‖B‖ = {r.element_residual:.2e}"
    )
    assert r.verdict == EQUIVALENT
    assert r.raw_distance >= 0.3
    assert r.invariant_distance <= r.tolerance
    assert r.invariant_distance <= el.kappa * 64 * u  # rounding level of the storage dtype
    assert r.element_residual <= r.kappa * u + 64 * EPS64
    assert check(m, "composite", element=r.element).verdict == HOLDS


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", SURVIVORS)
def test_fast_rounding_response_equals_the_recanonicalised_one(model, name, dtype, monkeypatch):
    """compare's probes (one run of blocks at a time, here one block per run, with the rotation of
    the first run; or whole and in place; no re-validation) measure the same response as the plain
    definition (each probe through canonicalize with the whole-model rules), on both sides of every
    survival case: the same draws and the same arithmetic, so per group the two squared responses
    agree to the rounding of summing them (relative 64·ε), far below the factor λ ≈ 5.7 that turns
    a response into a tolerance."""
    monkeypatch.setattr(response, "RUN_ENTRIES", 1)
    m = model(name)
    assert response.blockwise(m.cfg, m.params) == (name != "bert-tiny")
    b, _ = _transformed(m, seed=11)
    stored = {k: v.to(dtype) for k, v in b.items()}
    ca = canonicalize(m.cfg, m.params)
    cb = canonicalize(m.cfg, stored, reference=ca.params)
    for params, c, seed in ((m.params, ca, 0), (stored, cb, 1)):
        fast = rounding_response(m.cfg, params, c, ca.params, 3, seed)
        slow = rounding_response_recanonicalised(m.cfg, params, c, ca.params, 3, seed)
        assert set(fast) == set(slow)
        factors = {
            g: math.sqrt(fast[g] / slow[g]) if slow[g] > 0 else (1.0 if fast[g] == 0 else math.inf) for g in slow
        }
        print(f"{name} {dtype} seed {seed}: fast/plain response per group {factors}")
        assert all(abs(f - 1.0) <= 64 * EPS64 for f in factors.values())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_probe_drawn_in_chunks_equals_one_draw(dtype, monkeypatch):
    """A probe's perturbation drawn and applied a chunk at a time is, entry for entry, the one
    draw θ + 2u·(w − ½)·|θ| of the whole tensor (chunk boundaries anywhere, a ragged last chunk)."""
    monkeypatch.setattr(response, "CHUNK", 1000)
    v = torch.randn(33, 97, generator=generator(3), dtype=torch.float64).to(dtype)
    u = 2.0**-24
    w = torch.rand(v.shape, generator=generator(8), dtype=torch.float64) - 0.5
    v64 = v.to(torch.float64)
    assert torch.equal(response.perturbed(v, u, 8), v64 + 2.0 * u * w * v64.abs())
    # squared distances in chunks: the one dot product up to the rounding of summing 4 partial sums
    d = v64 - w
    assert abs(response.sq_distance(v, w) - float(d.reshape(-1) @ d.reshape(-1))) <= 8 * EPS64 * float((d * d).sum())
    assert response.sq_distance(v) == response.sq_distance(v64, torch.zeros_like(v64))


def test_spilled_tensor_gives_the_same_squared_distance(monkeypatch):
    """A float64 tensor kept in a temporary file (B's canonical embeddings while its first run's
    probes run) is read back a chunk at a time: the squared distance to it is the in-memory one,
    bit for bit (a ragged last chunk included)."""
    monkeypatch.setattr(response, "CHUNK", 1000)
    a = torch.randn(33, 97, generator=generator(4), dtype=torch.float64)
    b = torch.randn(33, 97, generator=generator(5), dtype=torch.float64)
    spilled = response.Spilled(b)
    assert response.sq_distance(a, spilled) == response.sq_distance(a, b)
    assert response.sq_distance(a, spilled) == response.sq_distance(a, b)  # read again for the next probe
    spilled.close()


@pytest.mark.parametrize("name", ["llama-tiny-gqa", "qwen-tiny", "moe-tiny"])
def test_compare_with_b_runs_shared_with_the_helper_gives_the_serial_report(model, name, monkeypatch):
    """In parallel the helper takes B's last runs of blocks once A's probes are done (and B's
    canonical embeddings wait in a file during the first run's probes): the report and the
    element are those of the serial comparison, number for number."""
    from gauge_audit.gauge_fix import streamed

    monkeypatch.setattr(response, "RUN_ENTRIES", 1)
    monkeypatch.setattr(streamed, "SPILL", 0)
    claim = streamed.SharedRuns.claim
    helper_runs = []

    def first_run_only(self, last):  # this process takes the first run, the helper all the others
        return claim(self, last) if last or self._next[0] == 0 else None

    def add(self, other, add=streamed.BRuns.add):
        helper_runs.extend(other["records"])
        add(self, other)

    monkeypatch.setattr(streamed.SharedRuns, "claim", first_run_only)
    monkeypatch.setattr(streamed.BRuns, "add", add)
    m = model(name)
    b, _ = _transformed(m, seed=11)
    stored = {k: v.to(torch.float32) for k, v in b.items()}
    serial = compare(m.cfg, m.params, m.cfg, stored)
    forked = compare(m.cfg, m.params, m.cfg, stored, parallel=True)
    assert sorted(helper_runs) == list(range(1, m.cfg.n_layers))
    assert json.dumps(serial.to_json(), sort_keys=True) == json.dumps(forked.to_json(), sort_keys=True)
    assert serial.element is not None and forked.element is not None
    assert all(torch.equal(serial.element.parts[k], forked.element.parts[k]) for k in serial.element.parts)


@pytest.mark.parametrize("name", ["llama-tiny-gqa", "qwen-tiny"])
def test_element_residual_in_parallel_is_the_serial_one(model, name, monkeypatch):
    """compare's CLI maps A's last blocks by the element in a forked helper: ‖g·A − B‖/‖B‖ is the
    serial value to the last bit (the squared distances are added in parameter order), and the
    helper really took blocks (this process mapped fewer than all)."""
    m = model(name)
    b, _ = _transformed(m, seed=5)
    stored = {k: v.to(torch.float32) for k, v in b.items()}
    r = compare(m.cfg, m.params, m.cfg, stored)
    assert r.verdict == EQUIVALENT and r.element is not None
    mapped_here = []
    terms = comparison.block_terms

    def recorded(cfg, pa, pb, steps, runs):
        mapped_here.append(len(runs))
        return terms(cfg, pa, pb, steps, runs)

    monkeypatch.setattr(comparison, "block_terms", recorded)
    serial = comparison.element_residual(m.cfg, m.params, stored, r.element)
    forked = comparison.element_residual(m.cfg, m.params, stored, r.element, parallel=True)
    n_blocks = m.cfg.n_layers + 1  # the layers and the outer tensors
    assert mapped_here == [n_blocks, mapped_here[1]] and 0 < mapped_here[1] < n_blocks
    assert forked == serial == r.element_residual
    assert 0 < serial <= r.kappa * 2 * torch.finfo(torch.float32).eps  # B's rounding, amplified at most by κ


def test_compare_error_in_b_first_run_leaves_no_helper_waiting(model, monkeypatch):
    """An error in B's first run (before the helper could be sent what it needs for B's other runs)
    reaches the caller, and the helpers end: none waits for the first run or to send its result."""
    import multiprocessing
    import signal

    from gauge_audit.gauge_fix import streamed

    monkeypatch.setattr(response, "RUN_ENTRIES", 1)
    run = streamed.BRuns.run

    def failing(self, j, *args):
        if j == 0:
            raise GaugeAuditError("injected failure in B's first run")
        run(self, j, *args)

    monkeypatch.setattr(streamed.BRuns, "run", failing)
    m = model("llama-tiny-gqa")
    b, _ = _transformed(m, seed=11)

    def stuck(signum, frame):
        raise AssertionError("compare did not return within 120 s")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(120)
    try:
        with pytest.raises(GaugeAuditError, match="injected failure"):
            compare(m.cfg, m.params, m.cfg, {k: v.to(torch.float32) for k, v in b.items()}, parallel=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", SURVIVORS)
def test_compare_with_b_by_runs_equals_b_whole(model, name, dtype, monkeypatch):
    """compare canonicalises B one run of blocks at a time (here one block per run: the runs'
    records merged into the whole model's, the LayerNorm ones families of gpt2-tiny keyed by
    tensor), and as one run of every block where a bias chain joins the blocks (bert-tiny)."""
    monkeypatch.setattr(response, "RUN_ENTRIES", 1)
    m = model(name)
    b, _ = _transformed(m, seed=11)
    stored = {k: v.to(dtype) for k, v in b.items()}
    assert_b_by_runs_is_b_whole(m, stored, monkeypatch, 1 if name == "bert-tiny" else m.cfg.n_layers)


@pytest.mark.parametrize("name", SURVIVORS)
def test_compare_perturbed_copy_is_different_and_tracks_the_size(model, name):
    m = model(name)
    prep = prepare(m.cfg, m.params)
    key = "blocks.0.attn.W_Q"
    g = generator(7)
    ratios = []
    for rel in (1e-6, 1e-4, 1e-2):
        p = dict(m.params)
        d = torch.randn(p[key].shape, generator=g, dtype=torch.float64)
        p[key] = p[key] + rel * d * p[key].norm() / d.norm()
        r = compare(m.cfg, m.params, m.cfg, p, prepared=prep, with_element=False)
        grp = r.groups["attention.qk"]
        print(
            f"{name} {rel:g}: invariant {r.invariant_distance:.3e}, attention.qk {grp['invariant_distance']:.3e} "
            f"(raw {grp['raw_distance']:.3e}) = {grp['ratio']:.3g}× its tolerance"
        )
        assert r.verdict == DIFFERENT and grp["ratio"] >= 1e3
        ratios.append(grp["invariant_distance"] / grp["raw_distance"])
    assert all(0.3 <= x <= 1.5 for x in ratios)  # tracks the perturbation
    assert max(ratios) / min(ratios) <= 1.5  # linearly, over four decades


def test_compare_minilm_real_weights(model):
    minilm = model("minilm")
    prep = prepare(minilm.cfg, minilm.params, probes=2)
    b, el = _transformed(minilm, seed=2)
    for dtype in (torch.float32, torch.bfloat16):
        r = compare(
            minilm.cfg,
            minilm.params,
            minilm.cfg,
            {k: v.to(dtype) for k, v in b.items()},
            probes=2,
            prepared=prep,
            with_element=dtype == torch.float32,
        )
        print(
            f"minilm {dtype}: raw {r.raw_distance:.3f}, invariant {r.invariant_distance:.3e}, "
            f"tolerance {r.tolerance:.3e}, element κ {r.kappa}, residual {r.element_residual}"
        )
        assert r.verdict == EQUIVALENT and r.raw_distance >= 0.3
        if r.element_residual is not None:
            assert r.element_residual <= r.kappa * UNIT[dtype]
    p = dict(minilm.params)
    key = "blocks.3.attn.W_V"
    d = torch.randn(p[key].shape, generator=generator(1), dtype=torch.float64)
    p[key] = p[key] + 1e-6 * d * p[key].norm() / d.norm()
    r = compare(minilm.cfg, minilm.params, minilm.cfg, p, probes=2, prepared=prep, with_element=False)
    assert r.verdict == DIFFERENT and r.groups["attention.vo"]["ratio"] >= 1e3


# ----------------------------------------------------------------------------- bad input
def test_compare_bad_input_is_one_line(model):
    a, b = model("gpt2-tiny"), model("llama-tiny")
    with pytest.raises(GaugeAuditError, match="different architectures"):
        compare(a.cfg, a.params, b.cfg, b.params)
    wide = model("gpt2-tiny").cfg.with_(d_model=20)
    with pytest.raises(GaugeAuditError, match="different architectures: d_model"):
        compare(a.cfg, a.params, wide, a.params)
    bad = dict(a.params)
    bad["blocks.0.attn.W_Q"] = bad["blocks.0.attn.W_Q"][:, :, :2]
    with pytest.raises(GaugeAuditError, match="shape"):
        compare(a.cfg, a.params, a.cfg, bad)
    nan = dict(a.params)
    nan["blocks.1.mlp.W_in"] = nan["blocks.1.mlp.W_in"].clone()
    nan["blocks.1.mlp.W_in"][0, 0] = float("nan")
    for call in (lambda: canonicalize(a.cfg, nan), lambda: compare(a.cfg, a.params, a.cfg, nan)):
        with pytest.raises(GaugeAuditError, match="NaN") as exc:
            call()
        assert len(exc.value.lines) == 1


@pytest.mark.parametrize(
    "argv,match",
    [
        (["compare", "gpt2-tiny", "llama-tiny"], "different architectures"),
        (["compare", "gpt2-tiny", "no-such-model"], "unknown model"),
        (["compare", "gpt2-tiny", "ckpt/model.safetensors"], "no such checkpoint"),
        (["canonicalize", "--checkpoint", "ckpt"], "no such checkpoint"),
        (["canonicalize", "--model", "smollm2.gguf"], "no such checkpoint"),
        (["compare", "gpt2-tiny", "gpt2-tiny", "--perturb", "nan"], "perturb"),
    ],
)
def test_cli_bad_input_one_line_exit_2(capsys, argv, match):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]


def test_cli_canonicalize_and_compare(tmp_path, capsys):
    out = tmp_path / "canon"
    assert main(["canonicalize", "--model", "llama-tiny-gqa", "--json", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["function"]["verdict"] == HOLDS and report["conditions_total"] == 344
    from safetensors.torch import load_file

    saved = load_file(str(out / "model.safetensors"))
    m = build("llama-tiny-gqa", device="cpu")
    expected = canonicalize(m.cfg, m.params).params
    assert set(saved) == set(expected) and all(torch.equal(saved[k], expected[k]) for k in saved)
    assert json.loads((out / "report.json").read_text())["conditions"] == report["conditions"]
    assert main(["canonicalize", "--model", "llama-tiny-gqa", "--out", str(out)]) == 2  # exists: refused
    capsys.readouterr()

    cmp_dir = tmp_path / "cmp"
    code = main(
        [
            "compare",
            "gpt2-tiny",
            "gpt2-tiny",
            "--transform",
            "4",
            "--store-dtype",
            "float32",
            "--json",
            "--out",
            str(cmp_dir),
        ]
    )
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["verdict"] == EQUIVALENT and r["raw_distance"] > 0.3
    assert set(r["groups"]) >= {"embeddings", "attention.qk", "attention.vo", "norms", "ffn", "unembedding"}
    el = element_from_arrays(dict(np.load(cmp_dir / "element.npz")))
    assert math.isclose(el.kappa, r["kappa"], rel_tol=1e-6)
    assert (
        main(["check", "--model", "gpt2-tiny", "--action", "composite", "--element", str(cmp_dir / "element.npz")]) == 0
    )
    capsys.readouterr()
    assert main(["compare", "gpt2-tiny", "gpt2-tiny", "--seed-b", "1"]) == 1
    assert "DIFFERENT" in capsys.readouterr().out
