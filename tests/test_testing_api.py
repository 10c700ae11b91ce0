"""gauge_audit.testing.assert_gauge_invariant on hand-written modules (nn.Module + functional_call),
and the documentation's example test, run verbatim."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
from torch import nn
from torch.func import functional_call

from gauge_audit.claims import ROOT
from gauge_audit.testing import assert_gauge_invariant, gauge_residual


class Attention(nn.Module):
    """Multi-head self-attention as people write it: fused nn.Linear projections, y = x·Wᵀ + b."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, n, d = x.shape
        split = lambda t: t.view(B, n, self.h, self.dk).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dk), dim=-1)
        return self.o((a @ v).transpose(1, 2).reshape(B, n, d))


def _names(h=2):
    lin = {"linear": True, "heads": h}
    return {
        "W_Q": {"key": "q.weight", **lin},
        "b_Q": {"key": "q.bias", "heads": h},
        "W_K": {"key": "k.weight", **lin},
        "b_K": {"key": "k.bias", "heads": h},
        "W_V": {"key": "v.weight", **lin},
        "b_V": {"key": "v.bias", "heads": h},
        "W_O": {"key": "o.weight", **lin},
        "b_O": "o.bias",
    }


QK = {
    "scope": "head",
    "elements": {"M": "GL(d_k)"},
    "maps": {"W_Q": "W_Q @ M", "b_Q": "b_Q @ M", "W_K": "W_K @ inv(transpose(M))", "b_K": "b_K @ inv(transpose(M))"},
}
VO = {
    "scope": "head",
    "elements": {"N": "GL(d_v)"},
    "maps": {"W_V": "W_V @ N", "b_V": "b_V @ N", "W_O": "inv(N) @ W_O"},
}
FOLD = {"scope": "head", "elements": {"c": "translation(d_v)"}, "maps": {"b_V": "b_V + c", "b_O": "b_O - c @ W_O"}}
SAME = {"scope": "head", "elements": {"M": "GL(d_k)"}, "maps": {"W_Q": "W_Q @ M", "W_K": "W_K @ M"}}


@pytest.fixture(scope="module")
def attention():
    torch.manual_seed(0)
    m = Attention().double()
    fwd = lambda p, x: functional_call(m, p, (x,))  # noqa: E731
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return fwd, dict(m.named_parameters()), x


@pytest.mark.parametrize("rule", [QK, VO, FOLD], ids=["qk", "vo", "value-fold"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_assert_gauge_invariant_passes_true_rules(attention, rule, dtype):
    fwd, params, x = attention
    res = assert_gauge_invariant(fwd, params, rule, inputs=x, names=_names(), dtype=dtype)
    assert res.residual_eps <= res.tolerance_statistical_eps <= res.tolerance_eps
    assert res.path_length == 8 + 4 + 5 + 2 * 4 and res.layers == 1  # d_model + d_k + n + h·d_v
    assert res.kappa >= 1 and res.touched


def test_assert_gauge_invariant_raises_with_residual_tolerance_and_kappa(attention):
    fwd, params, x = attention
    with pytest.raises(AssertionError) as exc:
        assert_gauge_invariant(fwd, params, SAME, inputs=x, names=_names())
    msg = str(exc.value)
    m = re.search(r"= ([\d.e+]+) ε; tolerance ([\d.e+]+) ε statistical .* ([\d.e+]+) ε worst case .* κ = ([\d.]+)", msg)
    assert m, msg
    residual, tol = float(m.group(1)), float(m.group(3))
    assert residual > 1e10 * tol and float(m.group(4)) >= 1  # fails by a large margin


def test_assert_gauge_invariant_never_passes_vacuously(attention):
    fwd, params, x = attention
    ffn = {"scope": "layer", "elements": {"s": "positive-diagonal(d_ff)"}, "maps": {"W_in": "W_in @ diag(s)"}}
    with pytest.raises(AssertionError, match="could not run: .*none of the rule's parameters"):
        assert_gauge_invariant(fwd, params, ffn, inputs=x, names=_names())
    ident = {"scope": "head", "elements": {"M": "GL(d_k)"}, "maps": {"W_Q": "W_Q @ eye(d_k)", "W_K": "W_K"}}
    with pytest.raises(AssertionError, match="M: declared but used in no map"):
        assert_gauge_invariant(fwd, params, ident, inputs=x, names=_names())
    ident["maps"]["W_K"] = "W_K @ M @ eye(d_k) - W_K @ M + W_K"  # (W_K·M − W_K·M) + W_K: bit-identical
    with pytest.raises(AssertionError, match="changed no parameter"):
        assert_gauge_invariant(fwd, params, ident, inputs=x, names=_names())
    with pytest.raises(AssertionError, match="could not run: names: unknown rule parameter"):
        assert_gauge_invariant(fwd, params, QK, inputs=x, names={"W_X": "q.weight"})


def test_gauge_residual_per_layer_keys_and_leading_head_axis():
    """Row-convention tensors with a leading head axis, two layers named with {layer}."""
    g = torch.Generator().manual_seed(2)
    h, d, e = 2, 6, 3
    params = {f"l{i}.{n}": torch.randn(h, d, e, generator=g, dtype=torch.float64) for i in range(2) for n in "QKV"}
    params.update({f"l{i}.O": torch.randn(h, e, d, generator=g, dtype=torch.float64) for i in range(2)})

    def fwd(p, x):
        for i in range(2):
            q, k, v = (torch.einsum("bnd,hde->bhne", x, p[f"l{i}.{n}"]) for n in "QKV")
            a = torch.softmax(q @ k.transpose(-1, -2), -1)
            x = x + torch.einsum("bhne,hed->bnd", a @ v, p[f"l{i}.O"])
        return x

    names = {"W_Q": "l{layer}.Q", "W_K": "l{layer}.K", "W_V": "l{layer}.V", "W_O": "l{layer}.O"}
    x = torch.randn(2, 4, d, generator=g, dtype=torch.float64)
    res = gauge_residual(
        fwd,
        params,
        {"scope": "layer", "elements": {"N": "GL(d_v)"}, "maps": {"W_V": "W_V @ N", "W_O": "inv(N) @ W_O"}},
        inputs=x,
        names=names,
    )
    assert res.layers == 2 and res.verdict == "HOLDS" and res.touched == ["l0.O", "l0.V", "l1.O", "l1.V"]
    bad = gauge_residual(
        fwd,
        params,
        {"scope": "layer", "elements": {"N": "GL(d_v)"}, "maps": {"W_V": "W_V @ N", "W_O": "N @ W_O"}},
        inputs=x,
        names=names,
    )
    assert bad.verdict == "FAILS" and bad.residual_eps > 1e6 * bad.tolerance_eps


def test_docs_example_test_runs_verbatim():
    page = ROOT / "docs" / "concepts" / "testing.md"
    text = page.read_text(encoding="utf-8")
    block = re.search(r"<!-- testing-example -->\s*```python\n(.*?)```", text, re.S)
    assert block, "the pytest API page must keep the assert_gauge_invariant example"
    ns: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(compile(block.group(1), str(page), "exec"), ns)  # the page's own code, not claim data
        tests = [f for n, f in ns.items() if n.startswith("test_")]
        assert tests
        for t in tests:
            t()


class RopeAttention(Attention):
    """The same attention with RoPE on the queries and keys (interleaved pairs, two planes per head)."""

    def forward(self, x):
        B, n, d = x.shape
        split = lambda t: t.view(B, n, self.h, self.dk).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        pos = torch.arange(n, dtype=x.dtype)[:, None] * torch.tensor([1.0, 0.1], dtype=x.dtype)[None, :]
        cos, sin = torch.cos(pos), torch.sin(pos)

        def rope(t):
            a, b = t[..., 0::2], t[..., 1::2]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)

        q, k = rope(q), rope(k)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dk), dim=-1)
        return self.o((a @ v).transpose(1, 2).reshape(B, n, d))


def test_rotary_groups_follow_the_given_planes_and_are_refused_without_them():
    """W_Q·R, W_K·R holds for R ∈ rotary-SO(d_k) laid out on the model's own planes, fails for a
    generic R ∈ SO(d_k) and for the same group laid out on the wrong planes; without the planes the
    rotary groups are refused in one line."""
    torch.manual_seed(3)
    m = RopeAttention().double()
    fwd = lambda p, x: functional_call(m, p, (x,))  # noqa: E731
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    params = dict(m.named_parameters())

    def same(group):
        maps = {"W_Q": "W_Q @ R", "b_Q": "b_Q @ R", "W_K": "W_K @ R", "b_K": "b_K @ R"}
        return {"scope": "head", "elements": {"R": f"{group}(d_k)"}, "maps": maps}

    kw = dict(inputs=x, names=_names(), dims={"d_model": 8})
    assert_gauge_invariant(fwd, params, same("rotary-SO"), rotary_planes=[(0, 1), (2, 3)], **kw)
    for wrong in (
        gauge_residual(fwd, params, same("SO"), **kw),
        gauge_residual(fwd, params, same("rotary-SO"), rotary_planes=[(0, 2), (1, 3)], **kw),
    ):  # false by a wide margin: ≥ 10¹⁰ times the derived worst-case tolerance κ·L·K·ε
        assert wrong.verdict == "FAILS" and wrong.residual_eps > 1e10 * wrong.tolerance_eps, wrong
    with pytest.raises(AssertionError, match="rotary planes"):
        assert_gauge_invariant(fwd, params, same("rotary-GL"), **kw)
