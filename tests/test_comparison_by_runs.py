"""compare one run of blocks at a time (gauge_fix/comparison_by_runs.py): the whole comparison's
report up to the rounding of sums taken in another order, one pass over A's runs, no vocabulary-sized
tensor of A's canonical form held, the same report at any thread count; the CLI takes that path where
a float64 copy does not fit, and refuses in one line where the architecture does not allow it."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gauge_audit.actions import composite, stream
from gauge_audit.cli import main
from gauge_audit.gauge_fix import by_runs, response
from gauge_audit.gauge_fix import comparison_by_runs as cbr
from gauge_audit.gauge_fix.comparison import EQUIVALENT, compare
from gauge_audit.gauge_fix.comparison_by_runs import compare_by_runs
from gauge_audit.gauge_fix.pipeline import canonicalize
from gauge_audit.gauge_fix.response import sq_distance
from gauge_audit.models import build, config_of
from gauge_audit.models.registry import build_config
from gauge_audit.runtime import eps, generator

U = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}
EPS64 = eps(torch.float64)


@pytest.fixture
def small_pieces(monkeypatch):
    """One block per run and a ragged number of vocabulary rows per chunk."""
    monkeypatch.setattr(response, "RUN_ENTRIES", 1)


def _pair(name: str, dtype: torch.dtype, tied: bool = False):
    """A (generic weights) and B = g·A for a random composite g, both stored in ``dtype``: both
    rounding responses are then at the storage precision, not at float64's arithmetic noise."""
    m = build_config(config_of(name).with_(tied=True), seed=1) if tied else build(name)
    a = {k: v.to(dtype) for k, v in m.params.items()}
    _, moved = composite.sample_applied(m.cfg, {k: v.to(torch.float64) for k, v in a.items()}, generator(11), 4.0)
    return m.cfg, a, {k: v.to(dtype) for k, v in moved.items()}


def _fit(c) -> float:
    """The Procrustes fit's conditioning in B's records (a comparison's, or B's canonical form
    against A's; 1 without a rotation)."""
    for r in getattr(c, "canonical_b", c).records:
        for d in r.decisions:
            if d.kind == "match" and "stream rotation" in d.where:
                return d.margin
    return 1.0


def _close(x: float, y: float, rel: float) -> bool:
    return abs(x - y) <= rel * max(abs(x), abs(y)) or x == y


@pytest.mark.parametrize(
    "name,dtype,tied",
    [
        ("llama-tiny-gqa", torch.bfloat16, False),
        ("llama-tiny-gqa", torch.float32, True),
        ("moe-tiny", torch.bfloat16, False),
        ("llama-tiny-noweight", torch.float32, False),
        ("gemma3-tiny", torch.bfloat16, False),
    ],
)
def test_by_runs_equals_the_whole_comparison(name, dtype, tied, small_pieces, monkeypatch):
    """Verdict, steps, decisions and ties equal; every distance, tolerance, κ and the element's
    residual equal up to (a) sums over chunks and tensors taken in another order — relative
    ≲ n·ε for n ≤ 10⁴ terms — and (b) the rotations' Procrustes fits formed as (xᵀ·W_E,A)·R_A
    instead of xᵀ·(W_E,A·R_A): a rotation moved by ≤ d·ε/fit moves a response of size u·‖θ‖ by
    ≤ d·ε·‖θ‖/fit, relatively d·ε/(u·fit).  Four vocabulary chunks, the last one ragged."""
    cfg, a, b = _pair(name, dtype, tied)
    monkeypatch.setattr(by_runs, "CHUNK", cfg.d_model * (cfg.vocab // 4 + 1))
    whole = compare(cfg, a, cfg, b)
    fast = compare_by_runs(cfg, a, cfg, b, storage_dtype_a=dtype, storage_dtype_b=dtype)
    rel = 8 * cfg.d_model * EPS64 / (U[dtype] * _fit(whole)) + 1e4 * EPS64
    jw, jf = whole.to_json(), fast.to_json()
    assert jf["verdict"] == jw["verdict"] == EQUIVALENT
    assert jf["unfixed"] == jw["unfixed"]
    for side in ("not_unique_a", "not_unique_b"):
        assert len(jf[side]) == len(jw[side])
        for tf, tw in zip(jf[side], jw[side]):
            assert {k: v for k, v in tf.items() if not isinstance(v, float)} == {
                k: v for k, v in tw.items() if not isinstance(v, float)
            }
            assert all(_close(tf[k], tw[k], rel) for k, v in tw.items() if isinstance(v, float)), (tf, tw)
    for k in ("raw_distance", "invariant_distance", "tolerance", "kappa", "element_residual"):
        assert _close(jf[k], jw[k], rel), (k, jf[k], jw[k], rel)
    for g in jw["groups"]:
        for k in ("raw_distance", "invariant_distance", "tolerance"):
            assert _close(jf["groups"][g][k], jw["groups"][g][k], rel), (g, k, jf["groups"][g][k], jw["groups"][g][k])
    assert jf["element_steps"] == jw["element_steps"]
    for ca, cf in ((whole.canonical_a, fast.canonical_a), (whole.canonical_b, fast.canonical_b)):
        assert [(r.family, r.action) for r in cf.records] == [(r.family, r.action) for r in ca.records]
        for rw, rf in zip(ca.records, cf.records):
            assert [(d.kind, d.where, d.n, d.n_ties) for d in rf.decisions] == [
                (d.kind, d.where, d.n, d.n_ties) for d in rw.decisions
            ]
    print(
        f"{name} {dtype} tied={tied}: invariant {jf['invariant_distance']:.6e} vs {jw['invariant_distance']:.6e}, "
        f"tolerance {jf['tolerance']:.6e} vs {jw['tolerance']:.6e} (rel bound {rel:.1e})"
    )


def test_by_runs_reads_a_once_and_never_forms_its_vocabulary_tensors(small_pieces, monkeypatch):
    """One pass over A's runs (each computed once) and A's canonical embeddings and head never
    formed whole (their chunks are); a perturbed copy of B's embedding never drawn whole."""
    cfg, a, b = _pair("llama-tiny-gqa", torch.bfloat16)
    monkeypatch.setattr(by_runs, "CHUNK", 2 * cfg.d_model)
    runs, outer = [], []
    run, load = by_runs.CanonicalByRuns.canonical_run, by_runs.CanonicalByRuns._outer
    monkeypatch.setattr(by_runs.CanonicalByRuns, "canonical_run", lambda self, j: runs.append(j) or run(self, j))
    monkeypatch.setattr(by_runs.CanonicalByRuns, "_outer", lambda self, k: outer.append(k) or load(self, k))
    drawn = []
    perturb = response.perturb_with

    def spy(v, u, g):
        drawn.append(v.shape[0])
        return perturb(v, u, g)

    monkeypatch.setattr(cbr, "perturb_with", spy)
    r = compare_by_runs(cfg, a, cfg, b, storage_dtype_a=torch.bfloat16, storage_dtype_b=torch.bfloat16)
    assert r.verdict == EQUIVALENT
    assert runs == list(range(cfg.n_layers)) and outer == []
    assert drawn and max(drawn) <= 2  # vocabulary chunks of two rows (W_U's drawn along its columns)


def test_by_runs_does_not_depend_on_the_thread_count(small_pieces):
    cfg, a, b = _pair("llama-tiny-gqa", torch.bfloat16)
    reports = []
    old = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            r = compare_by_runs(cfg, a, cfg, b, storage_dtype_a=torch.bfloat16, storage_dtype_b=torch.bfloat16)
            reports.append(json.dumps(r.to_json(), sort_keys=True))
    finally:
        torch.set_num_threads(old)
    assert reports[0] == reports[1]


def test_by_runs_tells_a_different_model_apart(small_pieces):
    """A copy with one FFN tensor moved by 0.3 (far above bfloat16's rounding response) is DIFFERENT,
    the moved group's ratio is the largest, and its invariant distance is the move carried through
    the gauge fixing: with D = ‖canon B' − canon B‖/√den (the canonical forms of the copy and of
    the unmoved B, each against A's), the triangle inequality puts it within the unmoved pair's own
    distance of D (each up to the by-runs rounding bound of the equality test)."""
    cfg, a, b = _pair("llama-tiny-gqa", torch.bfloat16)
    k = "blocks.1.mlp.W_in"
    d = torch.randn(b[k].shape, generator=generator(5), dtype=torch.float64)
    moved = dict(b)
    moved[k] = (b[k].double() + 0.3 * d * b[k].double().norm() / d.norm()).to(torch.bfloat16)
    r = compare_by_runs(cfg, a, cfg, moved, storage_dtype_a=torch.bfloat16, storage_dtype_b=torch.bfloat16)
    assert r.verdict == "DIFFERENT" and r.element is None
    assert max(r.groups, key=lambda g: r.groups[g]["ratio"]) == "ffn"
    ca = canonicalize(cfg, a, storage_dtype=torch.bfloat16)
    cb, cm = (canonicalize(cfg, p, reference=ca.params, storage_dtype=torch.bfloat16) for p in (b, moved))
    ffn = [n for n in ca.params if response.group_of(n) == "ffn"]
    den = sum(sq_distance(ca.params[n]) for n in ffn)
    expected = math.sqrt(sum(sq_distance(cm.params[n], cb.params[n]) for n in ffn) / den)
    slack = math.sqrt(sum(sq_distance(cb.params[n], ca.params[n]) for n in ffn) / den)
    rel = 8 * cfg.d_model * EPS64 / (U[torch.bfloat16] * _fit(cb)) + 1e4 * EPS64
    got = r.groups["ffn"]["invariant_distance"]
    print(f"ffn: {got:.4e} vs D = {expected:.4e} ± {slack:.1e}; tolerance {r.groups['ffn']['tolerance']:.3e}")
    assert abs(got - expected) <= slack + rel * (got + expected), (got, expected, slack)
    # the distance's lower bound is past the tolerance: the verdict does not rest on rounding
    assert expected - slack > r.groups["ffn"]["tolerance"], (expected, slack, r.groups["ffn"])


def test_cli_compares_by_runs_when_a_float64_copy_does_not_fit(tiny_hf, tmp_path, capsys, monkeypatch):
    """The float64 copy past the available memory: a Llama is compared one run of blocks at a time
    (said on stderr; the report as the whole comparison's, up to rounding), a BERT refused in one
    line; ``--by-runs`` asks for it."""
    import gauge_audit.cli.canonicalize as canon_cli
    from gauge_audit.cli.canonicalize import load_source

    llama = str(tiny_hf("llama"))
    b = tmp_path / "b"
    assert main(["transform", "--checkpoint", llama, "--action", "composite", "--seed", "3", "--out", str(b)]) == 0
    capsys.readouterr()
    assert main(["compare", llama, str(b), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(canon_cli, "available_memory", lambda: 1000)
    assert main(["compare", llama, str(b), "--json"]) == 0
    out, err = capsys.readouterr()
    fast = json.loads(out)
    assert "one run of blocks at a time" in err
    assert fast["verdict"] == whole["verdict"] == EQUIVALENT
    # the equality test's bound, at the checkpoints' storage precision and B's Procrustes fit
    sa, sb = load_source(llama), load_source(str(b))
    fit = _fit(
        compare(
            sa.cfg, sa.params, sb.cfg, sb.params, storage_dtype_a=sa.storage_dtype, storage_dtype_b=sb.storage_dtype
        )
    )
    u = max(torch.finfo(sa.storage_dtype).eps, torch.finfo(sb.storage_dtype).eps) / 2
    rel = 8 * sa.cfg.d_model * EPS64 / (u * fit) + 1e4 * EPS64
    for k in ("raw_distance", "invariant_distance", "tolerance", "element_residual"):
        assert _close(fast[k], whole[k], rel), (k, fast[k], whole[k], rel)
    bert = str(tiny_hf("bert"))
    assert main(["compare", bert, bert]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "float64" in err[0] and "not for a layernorm stream" in err[0], err
    monkeypatch.undo()
    assert main(["compare", bert, bert, "--by-runs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--by-runs" in err[0] and "layernorm" in err[0], err
    assert main(["compare", llama, str(b), "--by-runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == EQUIVALENT


def test_by_runs_lets_go_of_the_checkpoints_vocabulary_reads(tiny_hf, tmp_path, monkeypatch):
    """While the embeddings and head are swept chunk by chunk (the comparison's and the element
    residual's sweeps), neither checkpoint keeps its own read of the tensor beside the copy in use:
    the head is stored transposed, and its read held for the next access would double what the
    sweep holds (2 GB at Llama-3-8B's vocabulary in bfloat16)."""
    from gauge_audit.cli.canonicalize import load_source

    llama = str(tiny_hf("llama"))
    b = tmp_path / "b"
    assert main(["transform", "--checkpoint", llama, "--action", "composite", "--seed", "3", "--out", str(b)]) == 0
    sa, sb = (load_source(p, native=True, resident=False) for p in (llama, str(b)))
    assert "unembed.W_U" in sa.params
    held: list[tuple[str, bool]] = []
    applied = cbr.outer_applied

    def spy(cfg, small, name, chunk, steps):
        for p in (sa.params, sb.params):
            link = p._last[0]
            held.append((name, link is not None and name in link.params))
        return applied(cfg, small, name, chunk, steps)

    monkeypatch.setattr(cbr, "outer_applied", spy)
    monkeypatch.setattr(by_runs, "CHUNK", sa.cfg.d_model * (sa.cfg.vocab // 4 + 1))
    r = compare_by_runs(
        sa.cfg, sa.params, sb.cfg, sb.params, storage_dtype_a=sa.storage_dtype, storage_dtype_b=sb.storage_dtype
    )
    assert r.verdict == EQUIVALENT and r.element is not None
    assert {name for name, _ in held} == {"embed.W_E", "unembed.W_U"}
    assert not any(h for _, h in held), [x for x in held if x[1]][:4]


def test_two_rotations_applied_in_turn_are_validated_and_inverted_once(monkeypatch):
    """The element mapping A to B holds two stream rotations, applied in turn to every chunk of
    vocabulary rows and every block: each is validated and inverted once (at d = 4 096 that costs
    more than a chunk's product), and the results are the ones computed afresh, bit for bit."""
    cfg = config_of("llama-tiny-gqa")
    q = [
        torch.linalg.qr(torch.randn(cfg.d_model, cfg.d_model, generator=generator(s), dtype=torch.float64))[0]
        for s in (1, 2, 3)
    ]
    monkeypatch.setattr(stream, "_LAST_ROTATIONS", [])
    calls = []
    validate = stream._validate_rotation
    monkeypatch.setattr(stream, "_validate_rotation", lambda c, r: calls.append(r) or validate(c, r))
    got = [stream.rotation_and_inverse(cfg, q[i]) for i in (0, 1, 0, 1, 0, 1)]
    assert len(calls) == 2
    for i, (r, r_inv) in zip((0, 1), got[:2]):
        assert torch.equal(r, validate(cfg, q[i])) and torch.equal(r_inv, torch.linalg.inv(validate(cfg, q[i])))
    assert all(got[k][0] is got[k % 2][0] and got[k][1] is got[k % 2][1] for k in range(6))
    stream.rotation_and_inverse(cfg, q[2])  # a third evicts the one used longest ago
    stream.rotation_and_inverse(cfg, q[1])
    stream.rotation_and_inverse(cfg, q[0])
    assert len(calls) == 4


@pytest.mark.parametrize("layers", [2, 3])
def test_every_rotation_of_a_comparison_is_validated_and_inverted_once(layers, small_pieces, monkeypatch):
    """A comparison applies eight stream rotations (A's, B's, three probes' on each side) in every
    run of blocks and every sweep over the vocabulary, and the element A → B's two in its residual:
    each is validated and inverted once however many runs there are (before: once per run and
    rotation, since the stream keeps two), and the report is the one computed afresh, bit for bit."""
    cfg = config_of("llama-tiny-gqa").with_(n_layers=layers)
    m = build_config(cfg, seed=1)
    a = {k: v.to(torch.bfloat16) for k, v in m.params.items()}
    _, moved = composite.sample_applied(cfg, {k: v.to(torch.float64) for k, v in a.items()}, generator(11), 4.0)
    b = {k: v.to(torch.bfloat16) for k, v in moved.items()}
    calls = []
    validate = stream._validate_rotation
    monkeypatch.setattr(stream, "_validate_rotation", lambda c, r: calls.append(r) or validate(c, r))
    kept = compare_by_runs(cfg, a, cfg, b, storage_dtype_a=torch.bfloat16, storage_dtype_b=torch.bfloat16)
    assert len(calls) == 2 + 2 * 3 + 2, len(calls)
    monkeypatch.setattr(stream, "_hold", lambda *args: None)  # every use validates afresh
    monkeypatch.setattr(cbr, "remember_rotation", lambda *args: None)
    calls.clear()
    fresh = compare_by_runs(cfg, a, cfg, b, storage_dtype_a=torch.bfloat16, storage_dtype_b=torch.bfloat16)
    assert len(calls) > 2 + 2 * 3 + 2 * layers
    assert json.dumps(kept.to_json(), sort_keys=True) == json.dumps(fresh.to_json(), sort_keys=True)
