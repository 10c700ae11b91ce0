"""Decoders without a family file: described from transformers' modules, their gauge group
measured on transformers' own float64 forward (``gauge-audit groups DIR``).

Each family's flat dimension is compared with the dimension derived by hand for its switches
(RoPE planes, partial rotary, QK-norm kind, output gate, GLU kind, router), every kept and every
rejected direction must stand clear of the Jacobian's gap threshold, and the measured nullity
must equal the union of the flat families.  The checkpoints are tiny random ones written by
transformers, at a generic point (norm weights spread around 1, non-zero biases)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from gauge_audit.cli import main
from gauge_audit.models.derived import Heads, describe, load, tiny_checkpoint
from gauge_audit.testing import DECODER_EXAMPLES

pytest.importorskip("transformers")

# a kept direction this far below the gap threshold, a rejected one this far above: the gap is at
# least 1e4 (a narrower one is refused), so the threshold at its geometric middle leaves 100 a side
MARGIN = 30.0


def qk_flat(h: Heads) -> int:
    """dim of the QK GL(d_k) candidate's flat part, derived: no QK-norm — the rotary commutant
    (a scaled rotation per plane) × GL of the pass-through; a weightless (L2) QK-norm — its
    orthogonal part (a rotation per plane × O of the pass-through); a weighted QK-norm — none
    (its weights' scalings are the qk-norm-scale family)."""
    planes, rest = h.rotary // 2, h.head_dim - h.rotary
    if h.qk_norm == "none":
        return 2 * planes + rest * rest
    if h.qk_norm == "weightless":
        return planes + rest * (rest - 1) // 2
    return 0


def qk_norm_flat(h: Heads) -> int:
    """A scale per rotary plane and per pass-through coordinate, per KV group when the weights
    cover every head (full) and shared when they are one head's (head)."""
    per = h.rotary // 2 + h.head_dim - h.rotary
    return per * (h.n_kv if h.qk_norm == "full" else 1)


def clear_of_threshold(out: dict) -> None:
    """Every flatness decision clears the gap threshold by a wide margin, kept and rejected alike."""
    for f in out["families"]:
        if f["flat"]:
            assert f["largest_flat"] * MARGIN < out["threshold"], f
        if f["flat"] < f["generators"]:
            assert f["smallest_kept_out"] > MARGIN * out["threshold"], f


def explained(path, capsys) -> dict:
    """``groups DIR --json`` of a checkpoint whose measured nullity every candidate explains, with
    every flatness decision clear of the threshold: its report."""
    assert main(["groups", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nullity"] == out["explained"] and not out["unexplained"] and not out["unplaced"], out
    clear_of_threshold(out)
    return out


CASES = DECODER_EXAMPLES


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("decoders")
    return {a: tiny_checkpoint(a, base / a, 0, **over) for a, over in CASES.items()}


@pytest.fixture(scope="module")
def measured(checkpoints):
    """``groups DIR --json`` of each checkpoint, run once: (exit code, its JSON)."""
    cache: dict[str, tuple[int, dict]] = {}

    def get(arch: str) -> tuple[int, dict]:
        if arch not in cache:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                rc = main(["groups", str(checkpoints[arch]), "--json"])
            cache[arch] = (rc, json.loads(buf.getvalue()))
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", list(CASES))
def test_group_measured_equals_derived(arch, checkpoints, measured):
    path = checkpoints[arch]
    rc, out = measured(arch)
    assert rc == 0
    assert out["derived"] and out["converged"] and out["agrees"]
    assert out["nullity"] == out["explained"] and not out["unexplained"] and not out["unplaced"]
    model = load(path)
    desc = describe(model)
    heads = {h.layer: h for h in desc.heads}
    units = {hd.name: model.params[hd.writers[0][0]].shape[hd.writers[0][1]] * max(1, hd.experts) for hd in desc.hidden}
    for f in out["families"]:
        layer = int(f["scope"].split()[1]) if f["scope"].startswith("layer") else None
        if f["name"] == "qk-gl":
            assert f["flat"] == qk_flat(heads[layer]), f
        elif f["name"] == "qk-norm-scale":
            assert f["flat"] == qk_norm_flat(heads[layer]), f
        elif f["name"] == "vo-gl":  # an output gate before o_proj leaves the diagonal of GL(d_v)
            h = heads[layer]
            assert f["flat"] == (h.head_dim if h.gated else h.head_dim**2), f
        elif f["name"] == "stream-gl":  # O(d) behind RMSNorms; nothing past post-norms
            assert f["flat"] == (0 if desc.post_norms else desc.d_model * (desc.d_model - 1) // 2), f
        elif f["name"] == "ffn-scale":  # one scale per unit: the GLU's linear branch (gpt-oss: up + 1, shifted with it)
            assert f["flat"] == units[f["scope"]], f
        elif f["name"] == "norm-fold":
            assert f["flat"] == f["generators"] == desc.d_model, f
        elif f["name"] == "post-norm-diagonal":  # rms(y) kept on the writer's f-dim image: d − f(f+1)/2 left
            width = sum(model.params[w.param].shape[1 - w.axis] for w in desc.post_writers[f["scope"]])
            assert f["flat"] == max(0, desc.d_model - width * (width + 1) // 2), f
    clear_of_threshold(out)


def test_discrete_candidates_settled_on_the_forward(measured):
    """The rotary layout and the fused-expert layout are measured, not assumed: Llama 4 rotates
    interleaved pairs and fuses [gate | up]; gpt-oss rotates half-split pairs and interleaves gate
    and up.  OLMo 3's quarter turn holds only with its QK-norm entries exchanged."""
    held = {}
    for arch in ("Llama4ForCausalLM", "GptOssForCausalLM", "Olmo3ForCausalLM"):
        rc, out = measured(arch)
        assert rc == 0
        held[arch] = {(d["name"], d["what"]): (d["holds"], d["residual"], d["tolerance"]) for d in out["discrete"]}

    def get(arch, name, part):
        return next(v for (n, w), v in held[arch].items() if n == name and part in w)

    for arch, good, bad in (
        ("Llama4ForCausalLM", "interleaved", "half-split"),
        ("GptOssForCausalLM", "half-split", "interleaved"),
    ):
        ok, res, tol = get(arch, "rotary-half-turn", good)
        assert ok and res <= tol
        ok, res, tol = get(arch, "rotary-half-turn", bad)
        assert not ok and res > 1e10 * tol
    ok, res, tol = get("Llama4ForCausalLM", "unit-swap", "[gate | up]")
    assert ok and res <= tol
    ok, res, tol = get("GptOssForCausalLM", "unit-swap", "interleaved")
    assert ok and res <= tol
    ok, res, tol = get("Olmo3ForCausalLM", "rotary-quarter-turn", "half-split")
    assert ok and res <= tol


def test_bad_checkpoints_one_line_exit_2(tmp_path, capsys):
    src = tiny_checkpoint("Olmo3ForCausalLM", tmp_path / "ok", 0)
    cfg = json.loads((src / "config.json").read_text())
    cases = {
        "layers": {**cfg, "num_hidden_layers": 10**9},
        "width": {**cfg, "hidden_size": 12},
        "arch": {**cfg, "architectures": ["NoSuchModelForCausalLM"]},
    }
    for name, c in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(c))
        (d / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
        rc = main(["groups", str(d)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (name, err)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 10**9}))
    assert main(["groups", str(empty)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_what_the_measurement_cannot_take_is_one_line(tmp_path, capsys, monkeypatch):
    """A forward ``torch.func`` cannot differentiate (BLOOM's GELU, an ``autograd.Function``, as it
    would be were it not called through its forward — a Function from outside the model's own
    source stays one), a model beyond the dense measurement's size (here the limit lowered under
    the checkpoint's 1 356 parameters: before any Jacobian row), and a budget that ends before the
    rows reach the parameters: one line, exit 2."""
    from gauge_audit.models import derived
    from gauge_audit.nullity import found

    bloom = tiny_checkpoint("BloomForCausalLM", tmp_path / "bloom", 0)
    monkeypatch.setattr(derived, "plain_functions", lambda module: contextlib.nullcontext())
    assert main(["groups", str(bloom)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "torch.func cannot differentiate" in err, err
    monkeypatch.undo()
    neox = tiny_checkpoint("GPTNeoXForCausalLM", tmp_path / "neox", 0)
    monkeypatch.setattr(found, "MAX_PARAMS_MEASURED", 1000)
    assert main(["groups", str(neox), "--derive"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than the 1,000 a dense measurement takes" in err, err
    monkeypatch.undo()
    assert main(["groups", str(neox), "--derive", "--budget", "0"]) == 2  # the budget ends before P rows
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "of a 0 s budget" in err, err


def test_a_fresh_initialisation_is_recognised_as_a_special_point(tmp_path):
    """At transformers' own initialisation (every QK-norm weight 1) OLMo 3's QK-norm commutes with
    a rotation of each rotary plane: the group measured there is larger than the generic one, and
    the measurement says the point is special."""
    from gauge_audit.models.derived import build_module
    from gauge_audit.nullity.found import measure

    path = tiny_checkpoint("Olmo3ForCausalLM", tmp_path / "g", 0)
    generic = load(path)
    fresh = load(path)
    module = build_module(generic.name, generic.config, 0)
    fresh.params = {k: v.detach().clone() for k, v in module.named_parameters()}
    fresh.module = module
    f_gen = measure(generic, describe(generic), quiet=True)
    f_fresh = measure(fresh, describe(fresh), quiet=True)
    qk = lambda f: sum(x.flat for x in f.families if x.name == "qk-gl")  # noqa: E731
    assert qk(f_gen) == 0 and qk(f_fresh) > 0
    assert f_fresh.nullity > f_gen.nullity
    assert any("special point" in n for n in f_fresh.notes) and not any("special point" in n for n in f_gen.notes)
    assert torch.isfinite(torch.tensor(f_fresh.threshold))


@pytest.mark.parametrize("kind", ["qwen3", "olmo2"])
def test_derive_agrees_on_classes_with_a_family_file(hf_family, kind, capsys):
    """`--derive` takes the derived path for a class the project has a family file for: its group,
    measured on transformers' forward (a small copy: these checkpoints exceed the own-weights limit),
    is explained by the candidate families too."""
    assert main(["groups", str(hf_family(kind)), "--derive", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["derived"] and out["agrees"] and out["nullity"] == out["explained"], out


def test_fused_qkv_projection_is_split_by_rows(tmp_path, capsys):
    """Phi-3 keeps queries, keys and values in one ``qkv_proj`` ([queries | keys | values] rows)
    and gate and up in one ``gate_up_proj``: the description splits them, and the group measured
    on the forward is explained — QK's rotary commutant and VO GL per KV group, the stream's O(d)."""
    path = tiny_checkpoint("Phi3ForCausalLM", tmp_path / "phi3", 0)
    assert main(["groups", str(path), "--derive", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["agrees"] and not out["unplaced"], out
    flat = {(f["name"], f["scope"]): f["flat"] for f in out["families"]}
    d, e, planes = 8, 4, 2  # head_dim 4, all of it rotated: two planes, a scale and an angle each
    assert flat[("qk-gl", "layer 0 KV group 0")] == 2 * planes + (e - 2 * planes) ** 2
    assert flat[("vo-gl", "layer 0 KV group 0")] == e * e
    assert flat[("stream-gl", "stream")] == d * (d - 1) // 2


def test_a_weightless_layernorm_stream_is_explained(tmp_path, capsys):
    """OLMo's LayerNorm has neither weight nor bias and its ε is written into the forward (read
    off the probe, then confirmed). Every reader of the stream reads it centred, so 1 is seen by
    nobody: each vector a writer adds may gain a multiple of 1 (ln-writer-ones), each reader unit a
    multiple of 1 along the stream (ln-reader-ones), and the stream keeps O(d−1) on 1⊥ and the
    scale of its 1-component. Measured = explained, each ones family flat in full."""
    path = tiny_checkpoint("OlmoForCausalLM", tmp_path / "olmo", 0)
    out = explained(path, capsys)
    desc = describe(load(path))
    assert {n.kind for r in desc.readers if (n := r.norm) is not None} == {"layernorm-weightless"}
    fams = [f for f in out["families"] if f["name"] in ("ln-writer-ones", "ln-reader-ones")]
    assert len(fams) == 1 + len(desc.readers) and all(f["flat"] == f["generators"] for f in fams), fams
    d = desc.d_model
    stream = next(f for f in out["families"] if f["name"] == "stream-gl")
    assert stream["flat"] == (d - 1) * (d - 2) // 2 + 1, stream


@pytest.mark.parametrize("arch", ["Starcoder2ForCausalLM", "Glm4ForCausalLM"])
def test_biased_readers_are_explained(arch, tmp_path, capsys):
    """Biases beside the norms. Starcoder 2 (FFN named ``c_fc`` / ``c_proj``, affine LayerNorms,
    every projection biased): a LayerNorm's shift β ↦ β + δ taken back by its readers' biases
    (b ↦ b − W·δ, d per norm), each reader unit's ones shift along 1/γ with its bias taking back
    β·u, a constant value folded into o_proj's bias (d_v per KV group). GLM-4 (partial rotary, key
    bias): the key bias's unrotated coordinates shift. Measured = explained, each family in full."""
    path = tiny_checkpoint(arch, tmp_path / arch, 0)
    out = explained(path, capsys)
    desc = describe(load(path))
    d = desc.d_model
    flat = {(f["name"], f["scope"]): (f["flat"], f["generators"]) for f in out["families"]}
    for h in desc.heads:
        kv = range(h.n_kv)
        if arch.startswith("Starcoder2"):
            assert all(flat[("value-bias-fold", f"layer {h.layer} KV group {g}")] == (h.head_dim,) * 2 for g in kv)
        else:
            free = h.head_dim - h.rotary
            assert all(flat[("key-bias-shift", f"layer {h.layer} KV group {g}")] == (free, free) for g in kv)
    if arch.startswith("Starcoder2"):
        assert any(w.param.endswith("mlp.c_proj.weight") for w in desc.writers)
        shifts = [v for (name, _), v in flat.items() if name == "ln-bias-shift"]
        assert shifts and all(v == (d, d) for v in shifts), shifts


def test_a_parallel_block_is_explained_and_a_small_vocabulary_is_a_special_size(tmp_path, capsys):
    """Cohere's blocks are parallel: x + attn(n(x)) + ffn(n(x)), one LayerNorm (no bias) feeding
    both. The stream's candidates act on readers and writers as in a serial block. In the first
    block the FFN reads only n(W_E[t]): on a vocabulary of V tokens its output is a table, and
    where its parameters outnumber the V·(d − 1) entries a centring norm sees, directions that
    keep the table are flat beyond any group — recognised and named as a special size.  At a
    vocabulary whose entries seen are twice the FFN's parameters (what ``tiny_checkpoint``
    picks) measured = explained; the writers' ones
    shifts are flat except on the tied embedding's rows (the head reads them)."""
    small = tiny_checkpoint("CohereForCausalLM", tmp_path / "small", 0, vocab_size=11)
    desc = describe(load(small))
    assert desc.residual == "parallel"
    first = {r.norm for r in desc.readers if r.param.startswith("model.layers.0.")}
    assert len(first) == 1 and next(iter(first)) is not None  # one norm feeds the mixer and the FFN
    params = load(small).params
    table = desc.special_vocabulary(params)
    n = sum(params[p].numel() for h in desc.hidden if h.layer == 0 for p, _ in (*h.readers, *h.writers))
    assert table is not None and "parallel block" in table.what
    assert 11 * (desc.d_model - 1) < n and 2 * n <= table.safe * (desc.d_model - 1)
    assert main(["groups", str(small), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["converged"] and out["unexplained"] and any("special size" in n for n in out["notes"]), out

    path = tiny_checkpoint("CohereForCausalLM", tmp_path / "cohere", 0)
    assert main(["groups", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nullity"] == out["explained"] and not out["unexplained"] and not out["unplaced"], out
    assert not any("special" in n for n in out["notes"]), out["notes"]
    clear_of_threshold(out)
    desc = describe(load(path))
    assert desc.vocab == table.safe and desc.tied
    ones = next(f for f in out["families"] if f["name"] == "ln-writer-ones")
    assert ones["flat"] == ones["generators"] - desc.vocab, ones
    ffn = [f for f in out["families"] if f["name"] == "ffn-scale"]
    assert len(ffn) == desc.n_layers and all(f["flat"] == 6 for f in ffn), ffn  # one scale per unit, d_ff 6


def test_layernorm_shifts_without_reader_biases_are_explained(tmp_path, capsys):
    """StableLM: affine LayerNorms whose readers have no biases. β ↦ β + δ is taken back along each
    reader's ones direction (W ↦ W − u·(δW)/((β + δ)·u), u = 1/γ): d per norm, every one flat. A
    key unit's ones shift adds the constant β·u to that key coordinate: flat exactly where RoPE
    leaves the coordinate alone (transformers rotates int(head_dim · partial_rotary_factor) of them,
    here 1 of 4). And one direction per layer: value units shifted along u by c/(β·u), which adds
    the constant c to every value and W_O·E·c to the stream; without a bias to take it back it is
    still unseen where W_O·E·c is a multiple of 1, which every (centring) reader ignores — the null
    space of the centred W_O·E, n_kv·e − d + 1 = 1 wide here (c follows W_O: read where it acts)."""
    path = tiny_checkpoint("StableLmForCausalLM", tmp_path / "stablelm", 0)
    out = explained(path, capsys)
    model = load(path)
    desc = describe(model)
    d = desc.d_model
    affine = {r.norm.module for r in desc.readers if r.norm is not None and r.norm.bias}
    flat = {(f["name"], f["scope"]): (f["flat"], f["generators"]) for f in out["families"]}
    assert affine and all(flat[("ln-bias-into-ones", m)] == (d, d) for m in affine), flat
    rp = model.config.rope_parameters
    for h in desc.heads:
        rotated = int(h.head_dim * rp["partial_rotary_factor"])
        assert flat[("ln-reader-ones", h.k)][0] == h.n_kv * (h.head_dim - rotated)
        assert ("ln-reader-ones", h.v) not in flat and ("ln-reader-ones", h.q) not in flat
        assert h.n_kv * h.head_dim - d + 1 == 1 and flat[("value-constant-unseen", f"layer {h.layer}")] == (1, 1)


@pytest.mark.parametrize("arch", ["GPTJForCausalLM", "PhiForCausalLM"])
def test_older_parallel_decoders_are_placed_and_explained(arch, tmp_path, capsys):
    """GPT-J (``transformer.h``, ``wte``, ``out_proj``, ``fc_in``/``fc_out``, ``rotary_dim``) and Phi
    (``dense``, ``fc1``/``fc2``, ``final_layernorm``), both parallel blocks with a biased head. In a
    parallel block the mixer's and the FFN's outputs land together: only the sum of their biases is
    seen (Phi: d per block traded), and a constant value — a value unit's ones shift without a
    value bias (GPT-J) — is taken back by the FFN writer's bias (n_kv·head_dim per block)."""
    path = tiny_checkpoint(arch, tmp_path / arch, 0)
    out = explained(path, capsys)
    desc = describe(load(path))
    assert desc.residual == "parallel" and desc.readers[0].bias  # the head's bias is placed with it
    flat = {(f["name"], f["scope"]): (f["flat"], f["generators"]) for f in out["families"]}
    for h in desc.heads:
        if arch.startswith("GPTJ"):
            units = h.n_kv * h.head_dim
            assert flat[("value-ones-into-bias", f"layer {h.layer}")] == (units, units)
        else:
            assert flat[("parallel-bias-trade", f"layer {h.layer}")] == (desc.d_model, desc.d_model)


FALCON_PER_HEAD = {"multi_query": False, "num_kv_heads": 2, "num_key_value_heads": 2}


@pytest.mark.parametrize(
    "arch, over", [("GPTNeoXForCausalLM", {}), ("FalconForCausalLM", {}), ("FalconForCausalLM", FALCON_PER_HEAD)]
)
def test_fused_query_key_value_is_placed_and_explained(arch, over, tmp_path, capsys):
    """NeoX's and Falcon's ``query_key_value`` fuse the projections per KV group, [its queries |
    its key | its value] (NeoX: one head per group; Falcon's default: one group for all heads; with
    ``multi_query`` off, one per head). Through the derived path (NeoX has a family file too:
    ``--derive``), the measured nullity is what the candidates explain, every decision clear of the
    threshold. Falcon without biases, per head: a constant value c·(β·u) with W_O·E·c a multiple of 1
    (the null space of the centred W_O·E: n_kv·e − d + 1 = 1 per layer)."""
    path = tiny_checkpoint(arch, tmp_path / arch, 0, **over)
    desc = describe(load(path))
    h = desc.heads[0]
    G, e = h.group, h.head_dim
    assert h.q == h.k == h.v and h.q.endswith("query_key_value.weight")
    assert h.k_starts == tuple(g * (G + 2) * e + G * e for g in range(h.n_kv))
    assert main(["groups", str(path), "--derive", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nullity"] == out["explained"] and not out["unexplained"] and not out["unplaced"], out
    clear_of_threshold(out)
    unseen = {f["scope"]: f["flat"] for f in out["families"] if f["name"] == "value-constant-unseen"}
    wide = h.n_kv * e - desc.d_model + 1
    assert unseen == ({f"layer {i}": wide for i in range(desc.n_layers)} if over else {}), unseen


def test_query_key_value_rows_per_kv_group(tmp_path):
    """Falcon's new decoder layout with two KV groups of two heads: group g's rows are
    [queries of heads 2g, 2g + 1 | key | value].  A VO GL element of group 0 and the swap of the
    two groups leave transformers' logits unchanged within the derived tolerance; the same elements
    with the rows read as [all queries | all keys | all values] (Phi-3's layout) change them by
    orders of magnitude more."""
    import dataclasses

    from gauge_audit.actions.candidates import permute_kv_groups, vo_gl
    from gauge_audit.measured import tolerances
    from gauge_audit.runtime import generator

    over = dict(new_decoder_architecture=True, num_attention_heads=4, num_kv_heads=2, num_key_value_heads=2)
    model = load(tiny_checkpoint("FalconForCausalLM", tmp_path / "falcon", 0, hidden_size=16, **over))
    desc = describe(model)
    h = desc.heads[0]
    assert (h.q_starts, h.k_starts, h.v_starts) == ((0, 4, 16, 20), (8, 24), (12, 28))
    split = dataclasses.replace(h, q_starts=(0, 4, 8, 12), k_starts=(16, 20), v_starts=(24, 28))
    ids = torch.randint(0, model.vocab, (2, 12), generator=generator(3))
    p = model.params
    with torch.no_grad():
        y = model.logits(p, ids)
    tol, _ = tolerances(desc, p, 10.0, y.numel(), torch.float64)  # κ of the drawn element: below 10
    errors = {}
    for name, heads in (("per group", h), ("split", split)):
        fam = vo_gl(heads, p)[0]
        c = 0.2 * torch.randn(len(fam.generators), generator=generator(5), dtype=torch.float64)
        assert fam.kappa(c) < 10.0
        for what, moved in (("vo-gl", fam.act(p, c)), ("swap", permute_kv_groups(heads, p, torch.tensor([1, 0])))):
            with torch.no_grad():
                errors[name, what] = float((model.logits(moved, ids) - y).abs().max() / y.abs().max())
    print({k: f"{v:.2e}" for k, v in errors.items()}, f"tolerance {tol:.2e}")
    assert errors["per group", "vo-gl"] < tol and errors["per group", "swap"] < tol
    assert errors["split", "vo-gl"] > 1e6 * tol and errors["split", "swap"] > 1e6 * tol


def test_small_copy_keeps_one_layer_of_each_kind():
    """A config with two per-layer lists of type names (attention: sliding or full; FFN: dense or
    sparse): the small copy keeps the first layer of each combination that occurs, in order, and
    cuts every such list to those layers (a list left at the original depth fails the class's own
    validation)."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "ExaoneMoeConfig"):
        pytest.skip("this transformers has no ExaoneMoeConfig")
    from gauge_audit.models.derived import small_copy

    full = transformers.ExaoneMoeConfig()
    kinds = list(zip(full.layer_types, full.mlp_layer_types))
    firsts = sorted({k: i for i, k in reversed(list(enumerate(kinds)))}.values())
    small = small_copy(full)
    assert small.num_hidden_layers == len(firsts) >= 2
    assert list(zip(small.layer_types, small.mlp_layer_types)) == [kinds[i] for i in firsts]
    small.__class__.from_dict(small.to_dict())  # valid: the class's validators accept it


def test_a_fused_layout_read_off_a_name_is_checked_on_the_forward(tmp_path):
    """CodeGen's ``qkv_proj`` is not Phi-3's [queries | keys | values] (its rows come in four
    interleaved blocks): a value map of KV group 0 read in Phi-3's layout changes the logits by
    ~10⁻¹, so its heads are not described and every fused tensor is named with the reason, while
    Phi-3's, NeoX's and Falcon's layouts hold to rounding (the same map: below 10⁻¹²)."""
    from gauge_audit.models.derived import LAYOUT_CHECK, _value_map_change, value_map

    codegen = describe(load(tiny_checkpoint("CodeGenForCausalLM", tmp_path / "codegen", 0)))
    assert not codegen.heads
    fused = [(t, why) for t, why in codegen.unplaced if t.endswith("qkv_proj.weight")]
    assert len(fused) == codegen.n_layers and all("another layout" in why for _, why in fused), codegen.unplaced
    changes = [float(why.split("logits by ")[1].rstrip(")")) for _, why in fused]
    assert min(changes) > 1e4 * LAYOUT_CHECK, changes
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(0))
    eps = torch.finfo(torch.float64).eps
    for arch in ("Phi3ForCausalLM", "GPTNeoXForCausalLM", "FalconForCausalLM", "MptForCausalLM"):
        model = load(tiny_checkpoint(arch, tmp_path / arch, 0))
        desc = describe(model)
        assert len(desc.heads) == desc.n_layers
        for h in desc.heads:
            # the map's own rounding: κ(N) times the products it passes through (a head's e values
            # into d outputs, in every later layer), a factor 16 for the softmax and the norms
            tol = (
                16
                * float(torch.linalg.cond(value_map(h.head_dim, 0)))
                * (h.head_dim + desc.d_model)
                * desc.n_layers
                * eps
            )
            assert _value_map_change(model, h, ids % model.vocab, 0) < tol
            assert tol < 1e-3 * LAYOUT_CHECK  # the check's threshold is far above this rounding


def test_a_sublayer_that_adds_the_residual_itself_is_placed_and_explained(tmp_path, capsys):
    """MPT's FFN takes the residual as an argument and returns x + down(act(up(n(x)))); its
    attention fuses q, k and v as [queries | keys | values] (``Wqkv``, checked on the forward).
    The probe recognises the residual inside the sublayer by its writer's output (the FFN's output
    is the stream it was given plus what ``down_proj`` wrote), so the block is serial, every tensor
    is placed and the measured nullity is what the candidates explain."""
    path = tiny_checkpoint("MptForCausalLM", tmp_path / "mpt", 0)
    desc = describe(load(path))
    assert desc.residual == "serial" and not desc.unplaced, (desc.residual, desc.unplaced)
    assert all(h.q == h.k == h.v and h.q.endswith("Wqkv.weight") for h in desc.heads)
    assert main(["groups", str(path), "--derive", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nullity"] == out["explained"] and not out["unexplained"] and not out["unplaced"], out
    clear_of_threshold(out)


def test_another_projection_of_the_attention_input_is_a_stream_reader(tmp_path, capsys):
    """Lfm3's attention layers gate each head's output by sigmoid(g_proj(x)) — a projection of
    the attention's input beside q, k and v.  It is placed as a stream reader behind the same
    norm, so folding that norm's factors into its readers includes it: every attention layer's
    norm folds flat (without g_proj among the readers the fold would change the gate).  Its
    short-convolution layers keep directions no candidate explains (exit 1, named by tensor)."""
    path = tiny_checkpoint("Lfm3ForCausalLM", tmp_path / "lfm3", 0)
    desc = describe(load(path))
    gates = [r for r in desc.readers if r.param.endswith("self_attn.g_proj.weight")]
    assert len(gates) == len(desc.heads) >= 1 and not desc.unplaced, desc.unplaced
    assert main(["groups", str(path), "--derive", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    folds = {f["scope"]: (f["flat"], f["generators"]) for f in out["families"] if f["name"] == "norm-fold"}
    for r in gates:
        assert r.norm is not None
        flat, gens = folds[r.norm.module]
        assert flat == gens == desc.d_model, (r.norm.module, flat, gens)
    assert all(any(".conv." in t for t in u) for u in out["unexplained"]), out["unexplained"]


def test_left_singular_vectors_without_divide_and_conquer(monkeypatch):
    """Where LAPACK's SVD fails to converge (nearly equal singular values: the directions left
    once every flat one is explained), the left singular vectors and values come from aᵀa: the
    same values, descending, and the same column space, to rounding (ε·‖a‖² over the gap)."""
    from gauge_audit.nullity import found

    g = torch.Generator().manual_seed(3)
    a = torch.randn(40, 6, generator=g, dtype=torch.float64) @ torch.diag(
        torch.tensor([5.0, 3, 2, 1, 0.5, 0.0], dtype=torch.float64)
    )
    u0, s0 = found._left_singular(a)

    def refuses(*args, **kwargs):
        raise torch.linalg.LinAlgError("linalg.svd: The algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "svd", refuses)
    u1, s1 = found._left_singular(a)
    eps = torch.finfo(torch.float64).eps
    tol = 100 * eps * float(s0[0]) ** 2 / float(s0[4])
    assert torch.allclose(s1, s0, atol=tol * float(s0[0]))
    k = 5  # the nonzero ones: the same projector
    assert torch.allclose(u1[:, :k] @ u1[:, :k].T, u0[:, :k] @ u0[:, :k].T, atol=tol)


def test_latent_attention_is_described_and_explained(tmp_path, capsys):
    """Multi-head latent attention (GLM-4.7-Flash's ``Glm4MoeLiteForCausalLM``): the query and the
    key-value latents are small streams of their own — each written by its down-projection's rows,
    normed by an RMSNorm, read by the up-projection's columns — so a latent keeps its rotations
    (r(r − 1)/2) and its norm folds; per head GL(nope) on the unrotated query and key rows and GL(v)
    on the values; the rotary key shared by the heads keeps the rotary commutant (2 per plane); the
    heads may be exchanged.  On 11 tokens the first block's latents read only 11 vectors: more maps
    keep their rms than rotations — named as a special size; at the vocabulary tiny_checkpoint picks
    the measured nullity is what the candidates explain."""
    small = tiny_checkpoint("Glm4MoeLiteForCausalLM", tmp_path / "small", 0, vocab_size=11)
    assert main(["groups", str(small), "--derive", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert any("special size" in n and "latent" in n for n in out["notes"]), out["notes"]

    path = tiny_checkpoint("Glm4MoeLiteForCausalLM", tmp_path / "glm", 0)
    desc = describe(load(path))
    assert len(desc.latent_heads) == desc.n_layers and len(desc.latents) == 2 * desc.n_layers and not desc.unplaced
    assert desc.vocab >= max(lt.rank * (lt.rank + 1) for lt in desc.latents)
    out = explained(path, capsys)
    flat = {(f["name"], f["scope"]): f["flat"] for f in out["families"]}
    for lt in desc.latents:
        assert flat[("latent-gl", f"layer {lt.layer} {lt.name} latent")] == lt.rank * (lt.rank - 1) // 2
        assert flat[("norm-fold", lt.norm.module)] == lt.rank
    for mh in desc.latent_heads:
        assert flat[("mla-rope-gl", f"layer {mh.layer}")] == mh.rope  # a·I + b·J per plane
        for h in range(mh.n_heads):
            assert flat[("mla-nope-gl", f"layer {mh.layer} head {h}")] == mh.nope**2
            assert flat[("mla-vo-gl", f"layer {mh.layer} head {h}")] == mh.v**2
    swaps = [d for d in out["discrete"] if d["name"] == "latent-head-swap"]
    assert len(swaps) == desc.n_layers and all(d["holds"] for d in swaps), swaps


class _Cube(torch.autograd.Function):
    """x³ with a hand-written backward and no setup_context: torch.func refuses it as it stands."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x * x * g


class _Cubed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.5, -1.5], dtype=torch.float64))

    def forward(self, x):
        return _Cube.apply(self.w * x)


def test_a_custom_autograd_function_is_differentiated_through_its_forward():
    """BLOOM's GELU is such a Function: inside ``plain_functions`` torch.func differentiates its
    forward (the derivative exact: 3·(w·x)²·x), outside it refuses, and the class is restored."""
    from torch.func import functional_call, jacrev

    from gauge_audit.models.derived import plain_functions

    m, x = _Cubed(), torch.tensor([2.0, 3.0], dtype=torch.float64)

    def f(w):
        return functional_call(m, {"w": w}, (x,))

    w = m.w.detach()
    with plain_functions(m):
        J = jacrev(f)(w)
    # a product of four float64 numbers: a few ulps each
    assert torch.allclose(J, torch.diag(3 * (w * x) ** 2 * x), rtol=8 * torch.finfo(torch.float64).eps, atol=0)
    with pytest.raises(RuntimeError):
        jacrev(f)(w)


def test_alibi_and_an_embedding_norm_are_placed_and_explained(tmp_path, capsys):
    """BLOOM normalises the embedding before the stream starts (a norm of the embedding's output,
    beside the final one), its attention and MLP add the residual themselves (so the norm reading
    the attention's output reads the stream), its GELU is a custom autograd Function, and its
    positions are ALiBi biases, one slope per head: every tensor is placed, no head has rotary
    planes, the key bias shifts (a constant per query) are flat, swapping the KV groups is not a
    symmetry (their slopes differ), and every stream writer — that norm's shift too; not the
    embedding, which the tied unembedding reads — may gain multiples of 1 that every LayerNorm
    reader is blind to."""
    path = tiny_checkpoint("BloomForCausalLM", tmp_path / "bloom", 0)
    desc = describe(load(path))
    assert desc.unplaced == [] and desc.residual == "serial"
    (emb,) = [n for n in desc.post_norms if n.reads == "embed-out"]
    assert desc.post_writers[emb.module][0].param == desc.embed
    assert desc.final_norm is not None and desc.final_norm.module.endswith("ln_f")
    assert all(r.norm is not None for r in desc.readers) and all(h.rotary == 0 for h in desc.heads)
    out = explained(path, capsys)
    fams = {(f["name"], f["scope"]): f for f in out["families"]}
    e = desc.heads[0].head_dim
    assert all(f["flat"] == e for (name, _), f in fams.items() if name == "key-bias-shift")
    assert desc.tied
    writers = sum(_writer_vectors(desc, path, skip=desc.embed)) + 1  # + the embedding norm's shift
    assert fams[("ln-writer-ones", "stream")]["flat"] == writers
    swaps = [d for d in out["discrete"] if d["name"] == "kv-group-swap"]
    assert swaps and not any(d["holds"] for d in swaps)


def _writer_vectors(desc, path, skip: str):
    """The vectors each stream writer adds, one per slice along its non-stream axes, and its bias."""
    params = load(path).params
    for w in desc.writers:
        if w.param != skip:
            yield params[w.param].numel() // params[w.param].shape[w.axis] + (1 if w.bias else 0)
