"""An independent arbitrary-precision implementation of the reference transformers.

Written from the equations, not from the torch code: embeddings (token + learned
position + token type), pre-LN or post-LN blocks with multi-head / grouped-query
attention (softmax over the unmasked keys only — masked keys are *skipped*, not set
to −inf), optional RoPE (half or interleaved planes), LayerNorm (affine or not) /
RMSNorm (weighted or not), FFN with relu / gelu (erf form) / silu / SwiGLU, a top-k
softmax-gated mixture of experts, residual connections, final norm and unembedding.

Numbers come from a *context*: :data:`MP` (mpmath ``mpf`` at the precision active
when :func:`forward` is entered — callers wrap it in ``mp.workdps``) or :data:`IV`
(mpmath interval arithmetic; every operation returns an interval guaranteed to
contain the exact real result, used by :mod:`.certify`).

Parameters are the plain ``dict[str, nested list]`` produced by :func:`exact_params`
(same names and shapes as the torch dict of :mod:`gauge_audit.models.layers`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from fractions import Fraction

import mpmath
from mpmath import iv, mp

from ..errors import GaugeAuditError
from ..models.config import Config
from .linalg import dot, transpose

_COLS: dict[int, tuple[list, list]] = {}  # id(W) → (W, columns of W), valid during one forward()


def vecmat(x: list, w: list) -> list:
    """Row vector times matrix, with W's columns cached for the duration of a forward pass."""
    hit = _COLS.get(id(w))
    if hit is None or hit[0] is not w:
        hit = (w, transpose(w))
        _COLS[id(w)] = hit
    return [dot(x, col) for col in hit[1]]


_IVF = type(iv.mpf(0))
MIN_DPS, MAX_DPS = 20, 2000


@contextmanager
def workdps(dps: int) -> Iterator[None]:
    """Set the precision of both mpmath contexts (``mp`` and ``iv``) to ``dps`` decimal
    digits for the ``with`` body and restore the previous precisions afterwards, even
    on error: no global state leaks out of any function of this package."""
    if isinstance(dps, bool) or not isinstance(dps, int) or not MIN_DPS <= dps <= MAX_DPS:
        raise GaugeAuditError(
            f"dps must be an integer in {MIN_DPS}..{MAX_DPS} (float64 inputs need "
            f"at least 16 digits to be exact), got {dps!r}"
        )
    old_mp, old_iv = mp.prec, iv.prec
    try:
        mp.dps = dps
        iv.dps = dps
        yield
    finally:
        mp.prec = old_mp
        iv.prec = old_iv


# ----------------------------------------------------------------------------- contexts
class MpContext:
    """mpmath floating point at the caller's working precision."""

    name = "mp"

    def num(self, x):
        if isinstance(x, Fraction):
            return mp.mpf(x.numerator) / x.denominator
        return mp.mpf(x)  # a Python float is exact at prec >= 53

    exp = staticmethod(lambda x: mp.exp(x))
    sqrt = staticmethod(lambda x: mp.sqrt(x))
    cos = staticmethod(lambda x: mp.cos(x))
    sin = staticmethod(lambda x: mp.sin(x))
    erf = staticmethod(lambda x: mp.erf(x))

    @staticmethod
    def relu(x):
        return x if x > 0 else x * 0

    @staticmethod
    def power(base, exponent):
        return mp.power(base, exponent)

    @staticmethod
    def rank_key(x):
        return x


class IvContext:
    """mpmath interval arithmetic: every result encloses the exact value."""

    name = "iv"

    def num(self, x):
        if isinstance(x, Fraction):
            return iv.mpf(x.numerator) / iv.mpf(x.denominator)
        if isinstance(x, _IVF):
            return x
        return iv.mpf(x)

    exp = staticmethod(lambda x: iv.exp(x))
    sqrt = staticmethod(lambda x: iv.sqrt(x))
    cos = staticmethod(lambda x: iv.cos(x))
    sin = staticmethod(lambda x: iv.sin(x))

    @staticmethod
    def erf(x):
        return iv_erf(x)

    @staticmethod
    def relu(x):
        lo, hi = ends(x)
        return iv.mpf([lo if lo > 0 else 0, hi if hi > 0 else 0])

    @staticmethod
    def power(base, exponent):
        return base**exponent

    @staticmethod
    def rank_key(x):  # pragma: no cover - MoE routing is not certified
        raise GaugeAuditError("top-k routing on intervals is not decidable; certify a dense model")


def ends(x) -> tuple:
    """The endpoints of an interval as exact ``mpf`` numbers."""
    lo, hi = x._mpi_
    return mp.make_mpf(lo), mp.make_mpf(hi)


MP = MpContext()
IV = IvContext()


def iv_erf(x):
    """A rigorous enclosure of erf on an interval.

    erf is increasing, so erf([a, b]) ⊆ [lo(erf(a)), hi(erf(b))].  At a point t with
    |t| ≤ 6, erf(t) = (2/√π) Σ_n (−1)^n t^(2n+1) / (n!(2n+1)); once the terms decrease
    in magnitude the series alternates, so truncating it leaves an error no larger than
    the first omitted term, which is added as an interval [−T, T].  Every operation is
    itself an interval operation.
    """

    def at(t) -> iv.mpf:
        t = iv.mpf(t)  # a point (an endpoint of x)
        if ends(t)[0] >= 6:  # 0 < erfc(6) < 2.2e-17
            return iv.mpf([1 - mpmath.mpf(2) ** -55, 1])
        if ends(t)[1] <= -6:
            return iv.mpf([-1, -1 + mpmath.mpf(2) ** -55])
        t2 = t * t
        power = t  # (−1)^n t^(2n+1) / n!
        term = t  # power / (2n + 1)
        total = iv.mpf(0)
        n = 0
        tiny = mpmath.mpf(2) ** (-iv.prec - 10)
        while True:
            total += term
            n += 1
            power = -power * t2 / n
            term = power / (2 * n + 1)
            mag = max(abs(e) for e in ends(term))
            # Past n > t², |term| decreases monotonically and the series alternates.
            if n > ends(t2)[1] + 1 and mag < tiny:
                break
        total += iv.mpf([-mag, mag])
        return 2 / iv.sqrt(iv.pi) * total

    lo, hi = ends(x)
    return iv.mpf([ends(at(lo))[0], ends(at(hi))[1]])


# ----------------------------------------------------------------------------- params
def exact_params(params: Mapping, ctx=MP) -> dict:
    """torch float tensors → nested lists of exact context numbers (float64 → mpf is
    exact); already-converted nested lists of Fractions are converted too."""
    out = {}
    for k, v in params.items():
        data = v.detach().cpu().double().tolist() if hasattr(v, "detach") else v
        out[k] = _map(data, ctx.num)
    return out


def _map(a, fn):
    if isinstance(a, list):
        return [_map(x, fn) for x in a]
    return fn(a)


# ----------------------------------------------------------------------------- layers
def norm(ctx, cfg: Config, P: dict, prefix: str, x: list) -> list:
    """LayerNorm γ⊙(x−μ)/√(var+ε) + β or RMSNorm γ⊙x/√(mean(x²)+ε)."""
    if cfg.norm == "none":
        return x
    d = len(x)
    if cfg.norm.startswith("layernorm"):
        mu = sum(x[1:], x[0]) / d
        x = [xi - mu for xi in x]
    ms = dot(x, x) / d
    inv = 1 / ctx.sqrt(ms + ctx.num(cfg.norm_eps))
    y = [xi * inv for xi in x]
    if f"{prefix}.w" in P:
        y = [yi * g for yi, g in zip(y, P[f"{prefix}.w"])]
    if f"{prefix}.b" in P:
        y = [yi + b for yi, b in zip(y, P[f"{prefix}.b"])]
    return y


def _rope_tables(ctx, cfg: Config, n: int):
    half = cfg.d_head // 2
    base = ctx.num(cfg.rope_base)
    theta = [ctx.power(base, ctx.num(Fraction(-2 * i, cfg.d_head))) for i in range(half)]
    return [[(ctx.cos(p * th), ctx.sin(p * th)) for th in theta] for p in range(n)]


def _rope(cfg: Config, v: list, table_p: list) -> list:
    half = cfg.d_head // 2
    planes = (
        [(i, i + half) for i in range(half)] if cfg.rope_style == "half" else [(2 * i, 2 * i + 1) for i in range(half)]
    )
    out = list(v)
    for (i, j), (c, s) in zip(planes, table_p):
        out[i] = v[i] * c - v[j] * s
        out[j] = v[i] * s + v[j] * c
    return out


def attention(ctx, cfg: Config, P: dict, prefix: str, xs: list) -> list:
    """Per query head h (KV head j = h // group): softmax_u(q_t·k_u/√d_head) over the
    keys u the mask allows, z_t = Σ_u a_tu v_u, out_t = Σ_h z_t W_O[h] + b_O."""
    n = len(xs)
    W = {c: P[f"{prefix}.W_{c}"] for c in "QKVO"}
    b = {c: P.get(f"{prefix}.b_{c}") for c in "QKVO"}

    def proj(c, head, x):
        y = vecmat(x, W[c][head])
        bias = b[c]
        return y if bias is None else [yi + bi for yi, bi in zip(y, bias[head])]

    table = _rope_tables(ctx, cfg, n) if cfg.pos == "rope" else None
    keys, vals = [], []
    for j in range(cfg.n_kv_heads):
        k = [proj("K", j, x) for x in xs]
        if table:
            k = [_rope(cfg, kt, table[t]) for t, kt in enumerate(k)]
        keys.append(k)
        vals.append([proj("V", j, x) for x in xs])
    scale = 1 / ctx.sqrt(ctx.num(cfg.d_head))
    out = [[ctx.num(0)] * cfg.d_model for _ in range(n)]
    for h in range(cfg.n_heads):
        j = h // cfg.group_size
        for t, x in enumerate(xs):
            q = proj("Q", h, x)
            if table:
                q = _rope(cfg, q, table[t])
            allowed = range(t + 1) if cfg.causal else range(n)
            w = [ctx.exp(dot(q, keys[j][u]) * scale) for u in allowed]
            total = sum(w[1:], w[0])
            z = [dot(w, [vals[j][u][c] for u in allowed]) / total for c in range(cfg.d_head)]
            contrib = vecmat(z, W["O"][h])
            out[t] = [o + c for o, c in zip(out[t], contrib)]
    if b["O"] is not None:
        out = [[o + bo for o, bo in zip(row, b["O"])] for row in out]
    return out


def act(ctx, name: str, z):
    if name == "relu":
        return ctx.relu(z)
    if name == "gelu":
        return z * (1 + ctx.erf(z / ctx.sqrt(ctx.num(2)))) / 2
    if name == "silu":
        return z / (1 + ctx.exp(-z))
    raise GaugeAuditError(f"unknown activation {name!r}")


def mlp(ctx, cfg: Config, P: dict, prefix: str, x: list, e: int | None = None) -> list:
    def get(name):
        t = P.get(f"{prefix}.{name}")
        return t if t is None or e is None else t[e]

    def linear(wn, bn):
        y = vecmat(x, get(wn))
        bias = get(bn)
        return y if bias is None else [yi + bi for yi, bi in zip(y, bias)]

    if cfg.act == "swiglu":
        hidden = [act(ctx, "silu", g) * u for g, u in zip(linear("W_gate", "b_gate"), linear("W_in", "b_in"))]
    else:
        hidden = [act(ctx, cfg.act, z) for z in linear("W_in", "b_in")]
    y = vecmat(hidden, get("W_out"))
    bias = get("b_out")
    return y if bias is None else [yi + bi for yi, bi in zip(y, bias)]


def moe(ctx, cfg: Config, P: dict, prefix: str, x: list) -> list:
    """Top-k of p = softmax(x W_router), renormalised over the chosen experts."""
    logits = vecmat(x, P[f"{prefix}.W_router"])
    ex = [ctx.exp(v) for v in logits]
    total = sum(ex[1:], ex[0])
    probs = [v / total for v in ex]
    chosen = sorted(range(cfg.experts), key=lambda i: ctx.rank_key(probs[i]), reverse=True)[: cfg.top_k]
    norm_ = sum((probs[i] for i in chosen), ctx.num(0))
    out = [ctx.num(0)] * cfg.d_model
    for i in chosen:
        y = mlp(ctx, cfg, P, prefix, x, e=i)
        out = [o + probs[i] / norm_ * yi for o, yi in zip(out, y)]
    return out


def ffn(ctx, cfg: Config, P: dict, layer: int, x: list) -> list:
    if cfg.experts:
        return moe(ctx, cfg, P, f"blocks.{layer}.moe", x)
    return mlp(ctx, cfg, P, f"blocks.{layer}.mlp", x)


def block(ctx, cfg: Config, P: dict, layer: int, xs: list) -> list:
    """Pre-LN: x + Attn(LN1 x), then + FFN(LN2 x).  Post-LN: LN1(x + Attn x), LN2(x + FFN x)."""
    p = f"blocks.{layer}"
    if cfg.attention_only:
        a = attention(ctx, cfg, P, f"{p}.attn", xs)
        return [[u + v for u, v in zip(x, y)] for x, y in zip(xs, a)]
    if cfg.pre_norm:
        a = attention(ctx, cfg, P, f"{p}.attn", [norm(ctx, cfg, P, f"{p}.ln1", x) for x in xs])
        xs = [[u + v for u, v in zip(x, y)] for x, y in zip(xs, a)]
        return [[u + v for u, v in zip(x, ffn(ctx, cfg, P, layer, norm(ctx, cfg, P, f"{p}.ln2", x)))] for x in xs]
    a = attention(ctx, cfg, P, f"{p}.attn", xs)
    xs = [norm(ctx, cfg, P, f"{p}.ln1", [u + v for u, v in zip(x, y)]) for x, y in zip(xs, a)]
    return [norm(ctx, cfg, P, f"{p}.ln2", [u + v for u, v in zip(x, ffn(ctx, cfg, P, layer, x))]) for x in xs]


def embed(ctx, cfg: Config, P: dict, inputs: dict, i: int) -> list:
    """The stream entering block 0 for batch element ``i``."""
    if cfg.attention_only:
        return [[ctx.num(v) for v in row] for row in inputs["x"][i]]
    toks = inputs["tokens"][i]
    xs = [list(P["embed.W_E"][t]) for t in toks]
    if cfg.pos == "learned":
        xs = [[a + b for a, b in zip(x, P["embed.W_pos"][t])] for t, x in enumerate(xs)]
    if cfg.n_types:
        types = inputs["token_types"][i]
        xs = [[a + b for a, b in zip(x, P["embed.W_tt"][ty])] for x, ty in zip(xs, types)]
    if cfg.embed_norm:
        xs = [norm(ctx, cfg, P, "embed.ln", x) for x in xs]
    return xs


def unembed(ctx, cfg: Config, P: dict, x: list) -> list:
    if cfg.outputs_stream:
        return x
    x = norm(ctx, cfg, P, "ln_final", x)
    y = [dot(x, row) for row in P["embed.W_E"]] if cfg.tied else vecmat(x, P["unembed.W_U"])
    if "unembed.b_U" in P:
        y = [a + b for a, b in zip(y, P["unembed.b_U"])]
    return y


def plain_inputs(inputs: dict) -> dict:
    """torch input tensors → nested Python lists (ints for tokens, exact floats for x)."""
    return {k: (v.detach().cpu().tolist() if hasattr(v, "detach") else v) for k, v in inputs.items()}


def forward(cfg: Config, P: dict, inputs: dict, ctx=MP, progress: Callable[[int, int], None] | None = None) -> list:
    """Model output for every batch element: logits (decoders), last hidden state
    (BERT), or x + Attn(x) (the attention-only family).  Shape (batch, n, features)."""
    if cfg.experts and ctx is IV:
        raise GaugeAuditError("interval evaluation of top-k routing is not supported")
    for feature, used in (
        ("scaled RoPE", cfg.rope_type != "default"),
        ("partial rotary", cfg.rotary_dim),
        ("sliding-window attention", cfg.window),
        ("QK-norm", cfg.qk_norm != "none"),
        ("normed sublayer outputs", cfg.normed_outputs and not cfg.normed_inputs),
        ("a parallel residual", cfg.parallel_residual),
    ):
        if used:
            raise GaugeAuditError(f"exact evaluation does not implement {feature}")
    inputs = plain_inputs(inputs)
    batch = len(next(iter(inputs.values())))
    outs = []
    _COLS.clear()
    try:
        for i in range(batch):
            xs = embed(ctx, cfg, P, inputs, i)
            for layer in range(cfg.n_layers):
                xs = block(ctx, cfg, P, layer, xs)
            outs.append([unembed(ctx, cfg, P, x) for x in xs])
            if progress:
                progress(i + 1, batch)
    finally:
        _COLS.clear()
    return outs


__all__ = [
    "MP",
    "IV",
    "MpContext",
    "IvContext",
    "exact_params",
    "forward",
    "plain_inputs",
    "norm",
    "iv_erf",
    "transpose",
]
