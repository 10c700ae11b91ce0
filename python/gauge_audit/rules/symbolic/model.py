"""The symbolic block the rule checker decides on: one block of an architecture class at the
least size at which every declared group is non-trivial (:func:`arch_config`), every parameter and
every datum an independent SymPy symbol (:class:`SymModel`), read through the project layout
(:class:`SymView`); and the exact zero test every identity is decided with (:func:`is_zero`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import sympy as sp

from ...claims.rule import Element, Rule
from ...models import param_shapes
from ...models.config import Config, generic_sizes
from ...models.naming import PARAMS
from ..algebra import SympyOps
from ..engine import ProjectView, Shape, applicability
from ..solve import exact_value
from .elements import SPREAD

SYM = dict(d_model=3, d_head=2, d_ff=2, vocab=3, n_ctx=2)
# The second, larger size every statement is re-checked at (a statement that holds at one size and
# not at the other is size-dependent, never general): each dimension one step up — one more rotary
# plane —, the head and group counts as at the first.
LARGER = dict(d_model=1, d_head=1, d_ff=1, vocab=1)
SIZES = (0, 1)  # the first (generic) and the second (larger) symbolic size


LEAST_SIZE = {"SO1": 3, "O1": 3, "SO": 2, "permutation": 3}
_DIM_FIELD = {
    "d_model": "d_model",
    "d_k": "d_head",
    "d_v": "d_head",
    "d_ff": "d_ff",
    "vocab": "vocab",
    "n_ctx": "n_ctx",
    "n_experts": "experts",
}


_ROTATED = {"W_Q", "W_K", "b_Q", "b_K"}  # what RoPE rotates: a rule on these meets the rotary planes


def trivial_group(el: Element, n: int) -> bool:
    """Is the group {e} at size n (a rule on it is the identity map)?"""
    return el.dim is not None and n < {"SO1": 3, "O1": 2, "SO": 2, "permutation": 2}.get(el.group, 1)


def arch_config(cfg: Config, rule: Rule | None = None, size: int = 0) -> Config:
    """The architecture class of ``cfg`` at symbolic size: one block, d_model 3, d_k = d_v = 2,
    d_ff 2 — each dimension raised to the least size at which every structure the rule touches is
    generic: the rule's groups on it not trivial (d_k = d_v = 3 for SO1(d_v): at 2 it is {I}, and a
    rule would hold vacuously), RoPE with two planes of distinct frequencies (at one plane SO(2)
    commutes with every rotary rotation) and, for partial rotary, a pass-through block of two,
    grouped-query attention with two groups of two query heads.  ``size`` 1: the second, larger
    size (:data:`LARGER`: one more of each dimension, one more rotary plane)."""
    g = 2 if cfg.n_kv_heads < cfg.n_heads else 1  # query heads per KV head
    kv = 2 if g > 1 else 1
    over: dict = dict(d_model=SYM["d_model"], n_layers=1, n_heads=g * kv, n_kv_heads=kv, d_head=SYM["d_head"])
    over["n_ctx"] = SYM["n_ctx"]
    if not cfg.attention_only:
        over.update(d_ff=SYM["d_ff"], vocab=SYM["vocab"])
    if cfg.experts:
        over.update(experts=2, top_k=1)
    for el in rule.elements if rule is not None else ():
        need = LEAST_SIZE.get(el.group, 1)
        if el.dim in _DIM_FIELD and _DIM_FIELD[el.dim] in over:
            f = _DIM_FIELD[el.dim]
            over[f] = max(over[f], need)
        elif el.dim in ("n_heads", "n_kv_heads"):
            kv = max(over["n_kv_heads"], -(-need // (g if el.dim == "n_heads" else 1)))
            over.update(n_kv_heads=kv, n_heads=g * kv)
    if size:
        for k, step in LARGER.items():
            if k in over:
                over[k] += step
    if cfg.pos == "rope":
        # every rotary frequency is a free symbol here: the frequency table does not matter
        over.update(rope_type="default", rope_params=(), rotary_dim=0)
        if rule is None or rule.referenced & _ROTATED:
            # the rule reaches the rotated queries and keys: two rotary planes at the first size, three
            # at the second (a partial rotary keeps a pass-through block of two)
            generic = generic_sizes(cfg, planes=2 + size)
            over.update(rotary_dim=generic["rotary_dim"], d_head=max(over["d_head"], generic["d_head"]))
        over["d_head"] += over["d_head"] % 2  # rotary planes pair the head's coordinates
    return cfg.with_(**over)


def applying(rule: Rule, models: list[SymModel]) -> list[SymModel]:
    """The symbolic blocks the rule can act on."""
    return [m for m in models if applicability(rule, m.shape, SymView(m.cfg, m.params).has) is None]


def arch_label(cfg: Config) -> str:
    bits = [cfg.family]
    if not cfg.attention_only:
        bits += [cfg.norm + ("-post" if cfg.norm_placement == "post" else ""), cfg.act]
    if cfg.attn_bias:
        bits.append("qkv-bias")
    if cfg.pos == "rope":
        bits.append(f"rope-{cfg.rope_style}" + (f"-partial{cfg.rotary_dim}" if 0 < cfg.rotary_dim < cfg.d_head else ""))
    if cfg.qk_norm != "none":
        bits.append(f"qk-norm-{cfg.qk_norm}")
    if cfg.n_kv_heads < cfg.n_heads:
        bits.append("gqa")
    if cfg.tied:
        bits.append("tied")
    if cfg.experts:
        bits.append("moe")
    return " ".join(bits)


_ATTN_ONLY = {"W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"}
_FFN_ONLY = {"W_in", "b_in", "W_gate", "W_out", "b_out"}
_NOT_FOR_ATTN = (
    "act",
    "mlp_bias",
    "experts",
    "top_k",
    "d_ff",
    "tied",
    "unembed_bias",
    "n_types",
    "embed_norm",
    "vocab",
    "rope_base",
    "norm_eps",
)
_NOT_FOR_FFN = (
    "attn_bias",
    "out_bias",
    "pos",
    "rope_style",
    "rope_base",
    "n_heads",
    "n_kv_heads",
    "tied",
    "unembed_bias",
    "n_types",
    "embed_norm",
    "norm_eps",
)


def arch_key(cfg: Config, rule: Rule | None = None) -> tuple:
    """What distinguishes two architectures for this rule: a rule inside attention does not see the
    FFN or the embeddings, a rule inside the FFN does not see attention (both still see the norm
    feeding them); a rule on the stream sees everything.  (RoPE's half/interleaved pairing is the
    two layouts of the same planes; both are kept: a rule in the rotary groups is laid out by them.)"""
    c = arch_config(cfg, rule).__dict__.copy()
    touched = rule.referenced if rule is not None else set(PARAMS)
    drop = _NOT_FOR_ATTN if touched <= _ATTN_ONLY else _NOT_FOR_FFN if touched <= _FFN_ONLY else ("norm_eps",)
    for k in drop:
        c.pop(k, None)
    if touched <= _ATTN_ONLY or touched <= _FFN_ONLY:
        c["family"] = "attn" if cfg.attention_only else "block"
    return tuple(sorted(c.items()))


def _short(key: str) -> str:
    tail = key.split(".", 2)[-1] if key.startswith("blocks.") else key
    return "".join(ch for ch in tail.replace("ln_final", "lnf") if ch.isalnum())


def _symbolic_params(cfg: Config) -> dict:
    out = {}
    for key, (shape, role) in param_shapes(cfg).items():
        base = _short(key)
        kw = {"positive": True} if role == "norm_w" else {"real": True}

        def tree(prefix, dims, kw=kw):
            if len(dims) == 1:
                return [sp.Symbol(f"{prefix}_{i}", **kw) for i in range(dims[0])]
            return [tree(f"{prefix}{i}", dims[1:]) for i in range(dims[0])]

        out[key] = tree(base, list(shape))
    return out


class SymView(ProjectView):
    """The project layout with SymPy entries; values are ``sp.Matrix``."""

    def __init__(self, cfg: Config, params: dict):
        super().__init__(cfg, params, SympyOps())
        self.lists = True

    def raw(self, name, ctx):
        return sp.Matrix(super().raw(name, ctx))

    def same(self, a, b) -> bool:
        return all(is_zero(x) for x in (a - b))

    def updated(self, changes: dict) -> dict:
        return super().updated({k: v.tolist() for k, v in changes.items()})


_PROBE = random.Random(20260)


def is_zero(expr) -> bool:
    """Is the rational expression identically 0?  A random integer point first (a non-zero value
    there settles it at once); then the exact expansion of the numerator decides."""
    expr = sp.sympify(expr)
    free = sorted(expr.free_symbols, key=str)
    if free:
        point = {
            x: _PROBE.randint(1, SPREAD) if x.is_positive else (_PROBE.randint(-SPREAD, SPREAD) or 1) for x in free
        }
        try:
            exact = exact_value(expr, point)
            if exact is not None:  # a rational function: its exact value at the point
                if exact != 0:
                    return False
            else:
                val = expr.xreplace({x: sp.Integer(v) for x, v in point.items()})
                if not val.has(sp.Max, sp.erf, sp.exp) and val.is_number and val != 0 and val.is_finite:
                    return False
        except (ZeroDivisionError, TypeError):  # pragma: no cover - a pole at the probe point
            pass
        # a polynomial (no symbol in a denominator): exact, in the sparse polynomial ring over Q — no
        # gcd at each sum.  A rational function with symbols in its denominators (a norm weight
        # folded through the readers): reducing it in the field Q(free) costs seconds, so it is
        # tested like the group elements are drawn — exactly, at ZERO_POINTS further independent
        # random integer points (Schwartz–Zippel: a non-zero numerator of degree D vanishes at all
        # of them with probability ≤ (D/SPREAD)^ZERO_POINTS)
        if not _polynomial(expr):
            verdict = _zero_at_points(expr, free)
            if verdict is not None:
                return verdict
        domain = sp.QQ.poly_ring(*free) if _polynomial(expr) else sp.QQ.frac_field(*free)
        try:
            return domain.from_sympy(expr) == domain.zero
        except (sp.polys.polyerrors.CoercionFailed, sp.polys.polyerrors.PolynomialError, ValueError):
            pass  # not a rational function of its symbols over Q (an erf, a √2, …)
    num, _ = sp.fraction(sp.together(expr))
    return sp.expand(num) == 0


ZERO_POINTS = 3


def _zero_at_points(expr, free) -> bool | None:
    """Is the rational function zero at ZERO_POINTS random integer points (exact values)?  None when
    it is not a rational function over Q or a point hits a pole."""
    for _ in range(ZERO_POINTS):
        point = {
            x: _PROBE.randint(1, SPREAD) if x.is_positive else (_PROBE.randint(-SPREAD, SPREAD) or 1) for x in free
        }
        try:
            v = exact_value(expr, point)
        except ZeroDivisionError:  # pragma: no cover - a pole at the point
            return None
        if v is None:
            return None
        if v != 0:
            return False
    return True


def _polynomial(expr) -> bool:
    """Is ``expr`` a polynomial by its form: sums, products, rational numbers, symbols and
    non-negative integer powers of them only?"""
    if expr.is_Symbol or expr.is_Rational:
        return True
    if expr.is_Add or expr.is_Mul:
        return all(_polynomial(a) for a in expr.args)
    if expr.is_Pow:
        return expr.exp.is_Integer and int(expr.exp) >= 0 and _polynomial(expr.base)
    return False


def numerators(exprs) -> list:
    """Each expression's numerator, expanded (the non-zero ones).  A polynomial by its form is its
    own numerator: expanded in the sparse polynomial ring over ℚ (the same sum of terms as
    ``expand``, without ``together`` walking it first)."""
    out = []
    for e in exprs:
        num = _expanded_polynomial(e) if _polynomial(e) else None
        if num is None:
            num, _ = sp.fraction(sp.together(e))
            num = sp.expand(num)
        if num != 0:
            out.append(num)
    return out


def _expanded_polynomial(e):
    free = sorted(e.free_symbols, key=str)
    if not free:
        return e
    ring = sp.QQ.poly_ring(*free)
    try:
        return ring.to_sympy(ring.from_sympy(e))
    except (sp.polys.polyerrors.CoercionFailed, sp.polys.polyerrors.PolynomialError, ValueError):
        return None


def _free_row(name: str, n: int) -> sp.Matrix:
    return sp.Matrix(1, n, lambda i, j: sp.Symbol(f"{name}_{j}", real=True))


@dataclass
class SymModel:
    cfg: Config
    params: dict
    data: dict = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: Config, rule: Rule | None = None, size: int = 0) -> SymModel:
        c = arch_config(cfg, rule, size)
        return cls(c, _symbolic_params(c))

    @property
    def shape(self) -> Shape:
        return Shape.of(self.cfg)

    def row(self, name: str, n: int | None = None) -> sp.Matrix:
        if name not in self.data:
            self.data[name] = _free_row(name, n or self.cfg.d_model)
        return self.data[name]

    @property
    def ln(self) -> bool:
        return self.cfg.norm.startswith("layernorm")

    def normed(self, name: str) -> sp.Matrix:
        """A normalised stream row: x·P (mean removed) for LayerNorm, x otherwise."""
        x = self.row(name)
        if self.ln and self.cfg.norm != "none":
            d = self.cfg.d_model
            return x * (sp.eye(d) - sp.ones(d, d) / d)
        return x

    def data_symbols(self) -> list:
        return [s for m in self.data.values() for s in m]

    def param_symbols(self) -> list:
        from ...precision.linalg import flatten

        return [s for v in self.params.values() for s in flatten(v)]
