"""The symbolic checker on a rule: SymPy decides invariance for a generic group element, and when
the rule is wrong it solves for the correction.

The model is one block of each architecture class the claim applies to, every parameter and
every datum an independent symbol (d_model = 3, d_k = d_v = 2, d_ff = 2; one query head per KV
head, or two for GQA; one expert and a two-way router for MoE), each dimension raised to the least
size at which every declared group on it is non-trivial and not special (SO1(n) and
permutation(n) need n ≥ 3 — every permutation of 2 is a symmetric involution —, SO(n) n ≥ 2); a
group that is trivial at its stated size is NOT-APPLICABLE, not a vacuous HOLDS.  The group element is *generic*:
an exact random rational point of every connected component of the declared group (a random
integer matrix for GL and its reflection for the other determinant sign; the Cayley transform
(I − A)(I + A)⁻¹ of a random rational skew A for SO, with A·1 = 0 for SO1, and its reflection
for O; every sign pattern of a diagonal; every permutation), drawn twice independently.  An
identity that holds at such a point holds for the generic element up to the Schwartz–Zippel
probability D/2²⁰ per draw (D the degree of the residual in the group's parameters): the
decision is exact arithmetic at the point, in the data and parameters fully symbolic.

The rule is applied by the same engine as the torch checker (:mod:`.engine` on SymPy matrices),
and invariance is decided interface by interface, each a polynomial identity in the data (token
rows, attention weights, activation values, RoPE cos/sin) and the parameters, whose coefficients
must vanish identically in the element's symbols:

* **attention scores** (q·R_Δ·kᵀ per query head, up to a constant per query — softmax ignores it);
* **attention output** Σ_h Σ_j a_hj·v_j·W_O[h] + b_O with the attention weights unchanged
  (Σ_j a_hj = 1), which must become the original output times the stream map S;
* **block output**: the above and everything else a block and the model's ends compute — the
  FFN (its pre-activations z must map as z·T with T monomial and act(t·u) = t·act(u) for its
  entries, checked by SymPy on the activation itself; SwiGLU's gate by permutations only), the
  MoE router (up to a constant per token), post-LN norms, the embeddings (S is *solved* from the
  embedding's map W_E ↦ W_E·S; identity when W_E is not mapped or there are no token embeddings),
  the norm core (n(x·S) = n(x)·S: ‖x·P·S‖ = ‖x·P‖ and x·S·P ∥ x·P·S, P the mean-removing
  projector for LayerNorm), and the output (logits, or the stream itself for BERT and a single
  attention layer).  Normed rows are x·P for LayerNorm, so identities that rely on the mean
  being removed are decided correctly.

When an interface fails, the checker *solves* for a correction: the rule with one parameter's
map replaced by an unknown factor (``B @ W``, ``W @ B``, ``b + t``) — or, for rotations of the
stream through an affine norm, the shared reader factor and the norm's shift — is made to vanish
identically; a unique solution is named in the rule language when it matches a candidate built
from the elements and the norm weights (``inv(transpose(M))``, ``inv(diag(norm1.w)) @ transpose(R)
@ diag(norm1.w)``, ...), and the corrected rule is re-checked from scratch.  Otherwise the checker
reports the largest tried subgroup on which the stated rule holds (e.g. M orthogonal) and a
concrete rational counterexample.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import sympy as sp

from ..claims.matexpr import parse_expression
from ..claims.rule import Element, Rule, parse_rule, symbols_for
from ..errors import GaugeAuditError
from ..models import FAMILIES
from ..models.config import Config
from ..models.layers import rope_planes
from ..models.naming import PARAMS
from .algebra import SympyOps, evaluate
from .budget import RESERVE, SEARCH_SHARE, Budget, BudgetSpent, unlimited
from .engine import Ctx, NotApplicable, ProjectView, Shape, applicability, apply, factors, units
from .solve import solve_sampled, unique_linear

SYM = dict(d_model=3, d_head=2, d_ff=2, vocab=3, n_ctx=2)
MAX_SOLVES = 40


# ----------------------------------------------------------------------------- the symbolic model
# The smallest size at which a group is neither trivial nor special: SO1(n) ≅ SO(n−1) is {I} for n ≤ 2,
# SO(1) = {1}; permutation(2) = {I, swap} is non-trivial but every element is a symmetric involution, so a
# rule needing M² = I or Mᵀ = M would hold there vacuously — permutations need n ≥ 3.  GL, O, diagonals,
# translations and scalars are non-trivial at n = 1.
LEAST_SIZE = {"SO1": 3, "SO": 2, "permutation": 3}
_DIM_FIELD = {"d_model": "d_model", "d_k": "d_head", "d_v": "d_head", "d_ff": "d_ff", "vocab": "vocab",
              "n_ctx": "n_ctx", "n_experts": "experts"}


def trivial_group(el: Element, n: int) -> bool:
    """Is the group {e} at size n (a rule on it is the identity map)?"""
    return el.dim is not None and n < {"SO1": 3, "SO": 2, "permutation": 2}.get(el.group, 1)


def arch_config(cfg: Config, rule: Rule | None = None) -> Config:
    """The architecture class of ``cfg`` at symbolic size: one block, d_model 3, d_k = d_v = 2,
    d_ff 2 — each dimension raised to the least size at which the rule's groups on it are not
    trivial (d_k = d_v = 3 for SO1(d_v): at 2 it is {I}, and a rule would hold vacuously)."""
    g = 2 if cfg.n_kv_heads < cfg.n_heads else 1
    over = dict(d_model=SYM["d_model"], n_layers=1, n_heads=g, n_kv_heads=1, d_head=SYM["d_head"],
                n_ctx=SYM["n_ctx"])
    if cfg.family != "attn":
        over.update(d_ff=SYM["d_ff"], vocab=SYM["vocab"])
    if cfg.experts:
        over.update(experts=2, top_k=1)
    for el in (rule.elements if rule is not None else ()):
        need = LEAST_SIZE.get(el.group, 1)
        if el.dim in _DIM_FIELD and _DIM_FIELD[el.dim] in over:
            f = _DIM_FIELD[el.dim]
            over[f] = max(over[f], need)
        elif el.dim in ("n_heads", "n_kv_heads"):
            kv = max(over["n_kv_heads"], -(-need // (g if el.dim == "n_heads" else 1)))
            over.update(n_kv_heads=kv, n_heads=g * kv)
    if cfg.pos == "rope" and over["d_head"] % 2:
        over["d_head"] += 1         # rotary planes pair the head's coordinates
    return cfg.with_(**over)


def arch_label(cfg: Config) -> str:
    bits = [cfg.family]
    if cfg.family != "attn":
        bits += [cfg.norm + ("-post" if cfg.norm_placement == "post" else ""), cfg.act]
    if cfg.attn_bias:
        bits.append("qkv-bias")
    if cfg.pos == "rope":
        bits.append(f"rope-{cfg.rope_style}")
    if cfg.n_kv_heads < cfg.n_heads:
        bits.append("gqa")
    if cfg.tied:
        bits.append("tied")
    if cfg.experts:
        bits.append("moe")
    return " ".join(bits)


_ATTN_ONLY = {"W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"}
_FFN_ONLY = {"W_in", "b_in", "W_gate", "W_out", "b_out"}
_NOT_FOR_ATTN = ("act", "mlp_bias", "experts", "top_k", "d_ff", "tied", "unembed_bias", "n_types", "embed_norm",
                 "vocab", "rope_base", "norm_eps")
_NOT_FOR_FFN = ("attn_bias", "out_bias", "pos", "rope_style", "rope_base", "n_heads", "n_kv_heads", "tied",
                "unembed_bias", "n_types", "embed_norm", "norm_eps")


def arch_key(cfg: Config, rule: Rule | None = None) -> tuple:
    """What distinguishes two architectures for this rule: a rule inside attention does not see the
    FFN or the embeddings, a rule inside the FFN does not see attention (both still see the norm
    feeding them); a rule on the stream sees everything.  (RoPE's half/interleaved pairing is the
    same single plane at d_k = 2, and only there.)"""
    c = arch_config(cfg, rule).__dict__.copy()
    if c["d_head"] == 2:
        c["rope_style"] = "half"
    touched = rule.referenced if rule is not None else set(PARAMS)
    drop = _NOT_FOR_ATTN if touched <= _ATTN_ONLY else _NOT_FOR_FFN if touched <= _FFN_ONLY else ("norm_eps",)
    for k in drop:
        c.pop(k, None)
    if touched <= _ATTN_ONLY or touched <= _FFN_ONLY:
        c["family"] = "attn" if cfg.family == "attn" else "block"
    return tuple(sorted(c.items()))


def _short(key: str) -> str:
    tail = key.split(".", 2)[-1] if key.startswith("blocks.") else key
    return "".join(ch for ch in tail.replace("ln_final", "lnf") if ch.isalnum())


def _symbolic_params(cfg: Config) -> dict:
    out = {}
    for key, (shape, role) in FAMILIES[cfg.family].param_shapes(cfg).items():
        base = _short(key)
        kw = {"positive": True} if role == "norm_w" else {"real": True}

        def tree(prefix, dims):
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
        return all(_zero(x) for x in (a - b))

    def updated(self, changes: dict) -> dict:
        return super().updated({k: v.tolist() for k, v in changes.items()})


_PROBE = random.Random(20260)


def _zero(expr) -> bool:
    """Is the rational expression identically 0?  A random integer point first (a non-zero value
    there settles it at once); then the exact expansion of the numerator decides."""
    expr = sp.sympify(expr)
    free = sorted(expr.free_symbols, key=str)
    if free:
        point = {x: sp.Integer(_PROBE.randint(1, SPREAD)) if x.is_positive else
                 sp.Integer(_PROBE.randint(-SPREAD, SPREAD) or 1) for x in free}
        try:
            val = expr.xreplace(point)
            if not val.has(sp.Max, sp.erf, sp.exp) and val.is_number and val != 0 and val.is_finite:
                return False
        except (ZeroDivisionError, TypeError):  # pragma: no cover - a pole at the probe point
            pass
    num, _ = sp.fraction(sp.together(expr))
    return sp.expand(num) == 0


def _numerators(exprs) -> list:
    out = []
    for e in exprs:
        num, _ = sp.fraction(sp.together(e))
        num = sp.expand(num)
        if num != 0:
            out.append(num)
    return out


def _free_row(name: str, n: int) -> sp.Matrix:
    return sp.Matrix(1, n, lambda i, j: sp.Symbol(f"{name}_{j}", real=True))


# ----------------------------------------------------------------------------- generic elements
SPREAD = 2 ** 20        # random integers in [1, SPREAD]: a non-zero polynomial of degree D vanishes at a
DRAWS = 2               # random point with probability ≤ D/SPREAD (Schwartz–Zippel); two independent draws
MAX_ASSIGNMENTS = 32


def _rint(rng: random.Random, signed: bool = True) -> int:
    v = rng.randint(1, SPREAD)
    return -v if signed and rng.random() < 0.5 else v


def _rational_skew(n: int, rng: random.Random) -> sp.Matrix:
    a = sp.zeros(n, n)
    for i in range(n):
        for j in range(i + 1, n):
            v = sp.Rational(_rint(rng), rng.randint(1, SPREAD))
            a[i, j], a[j, i] = v, -v
    return a


def _cayley(a: sp.Matrix) -> sp.Matrix:
    n = a.shape[0]
    return (sp.eye(n) - a) * (sp.eye(n) + a).inv()


def group_points(el: Element, n: int, rng: random.Random) -> list[sp.Matrix]:
    """One random exact point of every connected component of the group (both determinant signs of
    GL and O, every sign pattern of a diagonal), every permutation of permutation(n) (n ≤ 4)."""
    grp = el.group
    if grp == "GL":
        while True:
            m = sp.Matrix(n, n, lambda i, j: _rint(rng))
            if m.det() != 0:
                break
        flip = sp.diag(-1, *([1] * (n - 1)))
        return [m, flip * m] if n > 0 else [m]
    if grp in ("O", "SO", "SO1"):
        if n == 1:
            return [sp.eye(1)] if grp != "O" else [sp.eye(1), -sp.eye(1)]
        a = _rational_skew(n, rng)
        if grp == "SO1":
            p = sp.eye(n) - sp.ones(n, n) / n
            a = p * a * p
        r = _cayley(a)
        return [r, sp.diag(-1, *([1] * (n - 1))) * r] if grp == "O" else [r]
    if grp in ("diagonal", "positive-diagonal"):
        mags = [_rint(rng, signed=False) for _ in range(n)]
        signs = [(1,) * n] if grp == "positive-diagonal" else list(itertools.product((1, -1), repeat=n))
        return [sp.Matrix([[m * s for m, s in zip(mags, sg)]]) for sg in signs]
    if grp == "translation":
        return [sp.Matrix([[_rint(rng) for _ in range(n)]])]
    if grp == "scalar":
        c = _rint(rng, signed=False)
        return [sp.Matrix([[c]]), sp.Matrix([[-c]])]
    if grp == "permutation":
        perms = list(itertools.permutations(range(n))) if n <= 4 else \
            [tuple(rng.sample(range(n), n)) for _ in range(6)]
        return [sp.eye(n)[list(p), :] for p in perms]
    raise GaugeAuditError(f"unknown group {grp!r}")  # pragma: no cover


def element_assignments(rule: Rule, shape: Shape, seed: int = 0, draws: int = DRAWS,
                        override: dict | None = None) -> list[dict]:
    """Exact group elements for every unit: every component combination, ``draws`` independent
    random points each (at most MAX_ASSIGNMENTS, a deterministic sample beyond that).  ``override``
    maps a symbol to the list of values to use instead (a subgroup's points)."""
    out = []
    us = units(rule, shape)
    probe = random.Random(0)
    if all(len(group_points(el, _size(el, shape.dims), probe)) > 1 for el in rule.elements):
        draws = 1       # every element already takes ≥ 2 independent random points (its components)
    for k in range(draws):
        rng = random.Random(1000 * seed + k)
        per_unit = []
        for u in us:
            choices = []
            for el in rule.elements:
                vals = (override or {}).get(el.symbol)
                vals = vals[k % len(vals)] if vals else group_points(el, _size(el, shape.dims), rng)
                choices.append([(el.symbol, v) for v in vals])
            per_unit.append([(u, dict(c)) for c in itertools.product(*choices)])
        combos = [dict(c) for c in itertools.product(*per_unit)]
        if len(combos) > MAX_ASSIGNMENTS // draws:
            combos = random.Random(seed + k).sample(combos, MAX_ASSIGNMENTS // draws)
        out += combos
    return out


def _size(el: Element, dims: dict) -> int:
    if el.dim is None:
        return 1
    return dims[el.dim] if isinstance(el.dim, str) else el.dim


# ----------------------------------------------------------------------------- interfaces
@dataclass
class Interface:
    name: str
    quantity: str                 # scores | attention | block
    residual: list                # expressions that must vanish identically in the data and parameters
    params: tuple                 # paper names whose maps enter it (for the correction search)
    ok: bool | None = None
    note: str = ""


@dataclass
class SymModel:
    cfg: Config
    params: dict
    data: dict = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: Config, rule: Rule | None = None) -> "SymModel":
        c = arch_config(cfg, rule)
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
        from ..precision.linalg import flatten
        return [s for v in self.params.values() for s in flatten(v)]


def _norm_in(m: SymModel, view: SymView, norm: str, rowname: str, S: sp.Matrix) -> sp.Matrix:
    """What a norm's readers read: (n·S)⊙γ + β for a pre-norm, the stream row x·S otherwise."""
    if m.cfg.norm_placement == "pre" and m.cfg.norm != "none":
        n = m.normed(rowname) * S
        gamma = view.value(f"{norm}.w", Ctx(0) if norm != "norm_f" else Ctx())
        beta = view.value(f"{norm}.b", Ctx(0) if norm != "norm_f" else Ctx())
        return n.multiply_elementwise(gamma) + beta
    return m.row(rowname) * S


def _rope(m: SymModel) -> sp.Matrix:
    e = m.cfg.d_head
    if m.cfg.pos != "rope":
        return sp.eye(e)
    r = sp.zeros(e, e)
    for k, (i, j) in enumerate(rope_planes(m.cfg)):
        c, s = sp.symbols(f"cos{k} sin{k}", real=True)
        m.data[f"rope{k}"] = sp.Matrix([[c, s]])
        r[i, i], r[j, j], r[i, j], r[j, i] = c, c, s, -s
    return r


_ATTN_PARAMS = frozenset({"W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V", "W_O", "b_O", "norm1.w", "norm1.b"})
_FFN_PARAMS = frozenset({"W_in", "b_in", "W_gate", "W_out", "b_out", "W_router", "norm2.w", "norm2.b"})
_END_PARAMS = frozenset({"W_E", "W_pos", "W_U", "b_U", "norm_f.w", "norm_f.b"})


def _untouched(name: str, quantity: str, params) -> Interface:
    return Interface(name, quantity, [], tuple(params), ok=True, note="no parameter of it is changed")


def interfaces(m: SymModel, P: SymView, Q: SymView, S: sp.Matrix | None, s_note: str,
               changed: set | None = None) -> list[Interface]:
    """Every identity invariance needs (see the module doc).  ``changed``: the parameter names the
    rule changed — a part of the block none of whose parameters changed, with the stream map the
    identity, is unchanged by construction and not recomputed."""
    cfg = m.cfg
    d = cfg.d_model
    eye = sp.eye(d)
    out: list[Interface] = []
    S_ = S if S is not None else eye
    still = S is not None and S_ == eye and changed is not None

    def skip(params) -> bool:
        return still and not (changed & params)
    if skip(_ATTN_PARAMS):
        out += [_untouched(f"attention scores (head {h})", "scores", _ATTN_PARAMS) for h in range(cfg.n_heads)]
        out.append(_untouched("attention output (attention weights unchanged)", "attention", _ATTN_PARAMS))
    else:
        out += _attention_interfaces(m, P, Q, S_)
    # ---- post-LN norms
    if cfg.norm_placement == "post" and cfg.norm != "none":
        for norm in ("norm1", "norm2"):
            params = {f"{norm}.w", f"{norm}.b"}
            if skip(params):
                out.append(_untouched(f"post-LN {norm} (its output is the stream)", "block", params))
                continue
            y = m.normed(f"y_{norm}")
            res = ((y * S_).multiply_elementwise(Q.value(f"{norm}.w", Ctx(0))) + Q.value(f"{norm}.b", Ctx(0))
                   - (y.multiply_elementwise(P.value(f"{norm}.w", Ctx(0))) + P.value(f"{norm}.b", Ctx(0))) * S_)
            out.append(Interface(f"post-LN {norm} (its output is the stream)", "block", list(res),
                                 tuple(params)))
    # ---- FFN and router
    if cfg.family != "attn":
        out += [_untouched("FFN output", "block", _FFN_PARAMS)] if skip(_FFN_PARAMS) else \
            _ffn_interfaces(m, P, Q, S_)
    # ---- ends of the model
    out += [_untouched("logits", "block", _END_PARAMS)] if skip(_END_PARAMS) and cfg.family not in ("attn", "bert") \
        else _end_interfaces(m, P, Q, S, S_, s_note)
    return out


def _attention_interfaces(m: SymModel, P: SymView, Q: SymView, S_: sp.Matrix) -> list[Interface]:
    cfg = m.cfg
    eye = sp.eye(cfg.d_model)
    out: list[Interface] = []
    R = _rope(m)
    g = cfg.group_size
    u = {k: (_norm_in(m, P, "norm1", k, eye), _norm_in(m, Q, "norm1", k, S_)) for k in ("xq", "xk1", "xk2")}
    key_vars = list(m.row("xk1")) + [s for k, v in m.data.items() if k.startswith("rope") for s in v]
    o0 = P.value("b_O", Ctx(0))
    o1 = Q.value("b_O", Ctx(0))
    for h in range(cfg.n_heads):
        c = Ctx(0, h // g, h)
        ck = c.at(2)

        def score(view, uq, uk):
            q = uq * view.value("W_Q", c) + view.value("b_Q", c)
            k = uk * view.value("W_K", ck) + view.value("b_K", ck)
            return (q * R * k.T)[0, 0]
        r = score(Q, u["xq"][1], u["xk1"][1]) - score(P, u["xq"][0], u["xk1"][0])
        r_mod = r - r.subs({v: 0 for v in key_vars})   # a constant per query is no change for softmax
        out.append(Interface(f"attention scores (head {h})", "scores", [r_mod],
                             ("W_Q", "b_Q", "W_K", "b_K", "norm1.w", "norm1.b")))
        a = sp.Symbol(f"a{h}", real=True)
        m.data[f"a{h}"] = sp.Matrix([[a]])
        for view, idx in ((P, 0), (Q, 1)):
            v1 = u["xk1"][idx] * view.value("W_V", ck) + view.value("b_V", ck)
            v2 = u["xk2"][idx] * view.value("W_V", ck) + view.value("b_V", ck)
            z = a * v1 + (1 - a) * v2
            if idx == 0:
                o0 = o0 + z * view.value("W_O", c)
            else:
                o1 = o1 + z * view.value("W_O", c)
    out.append(Interface("attention output (attention weights unchanged)", "attention", list(o1 - o0 * S_),
                         ("W_V", "b_V", "W_O", "b_O", "norm1.w", "norm1.b")))
    return out


def _ffn_interfaces(m: SymModel, P: SymView, Q: SymView, S: sp.Matrix) -> list[Interface]:
    cfg = m.cfg
    out = []
    c = Ctx(0, expert=0 if cfg.experts else None)
    u0, u1 = _norm_in(m, P, "norm2", "x2", sp.eye(cfg.d_model)), _norm_in(m, Q, "norm2", "x2", S)
    names = ("W_in", "b_in", "W_gate", "W_out", "b_out", "norm2.w", "norm2.b")
    if cfg.experts:
        l0 = u0 * P.value("W_router", Ctx(0))
        l1 = u1 * Q.value("W_router", Ctx(0))
        diff = l1 - l0
        out.append(Interface("MoE router logits (up to a constant per token)", "block",
                             [diff[0, e] - diff[0, 0] for e in range(1, diff.shape[1])],
                             ("W_router", "norm2.w", "norm2.b")))
    z0 = u0 * P.value("W_in", c) + P.value("b_in", c)
    z1 = u1 * Q.value("W_in", c) + Q.value("b_in", c)
    f = cfg.d_ff
    t_up, why = _solve_linear_image(m, z0, z1, f)
    if t_up is None:
        return out + [Interface("FFN pre-activations", "block", list(z1 - z0), names, ok=False,
                                note=f"x·W_in + b_in does not map to (x·W_in + b_in)·T for any matrix T ({why})")]
    if cfg.act == "swiglu":
        zg0 = u0 * P.value("W_gate", c)
        zg1 = u1 * Q.value("W_gate", c)
        t_gate, why = _solve_linear_image(m, zg0, zg1, f)
        if t_gate is None:
            return out + [Interface("FFN gate pre-activations", "block", list(zg1 - zg0), names, ok=False,
                                    note=f"the gate input does not map linearly ({why})")]
        bad = _commutes_with_activation("silu", t_gate)
        if bad:
            return out + [Interface("FFN gate: silu(z·T) = silu(z)·T", "block", [bad[1]], names, ok=False,
                                    note=bad[0])]
        gv = m.row("silu", f)
        h1 = (gv * t_gate).multiply_elementwise(z0 * t_up)
        h0 = gv.multiply_elementwise(z0)
    else:
        bad = _commutes_with_activation(cfg.act, t_up)
        if bad:
            return out + [Interface(f"FFN activation: {cfg.act}(z·T) = {cfg.act}(z)·T", "block", [bad[1]], names,
                                    ok=False, note=bad[0])]
        hv = m.row("act", f)
        h1, h0 = hv * t_up, hv
    y0 = h0 * P.value("W_out", c) + P.value("b_out", c)
    y1 = h1 * Q.value("W_out", c) + Q.value("b_out", c)
    out.append(Interface("FFN output", "block", list(y1 - y0 * S), names))
    return out


def _solve_linear_image(m: SymModel, z0: sp.Matrix, z1: sp.Matrix, f: int):
    """T with z1 ≡ z0·T identically in the data and parameters (unique), or (None, why)."""
    T = sp.Matrix(f, f, lambda i, j: sp.Symbol(f"T_{i}{j}"))
    generic = set(m.data_symbols()) | set(m.param_symbols())
    eqs = []
    for e in _numerators(list(z1 - z0 * T)):
        gens = [s for s in e.free_symbols if s in generic]
        eqs += sp.Poly(e, *gens).coeffs() if gens else [e]
    sol = unique_linear(eqs, list(T)) if eqs else None
    if sol is None:
        return None, "no unique solution"
    return T.subs(sol), ""


_ACT = {"relu": lambda u: sp.Max(0, u), "gelu": lambda u: u * (1 + sp.erf(u / sp.sqrt(2))) / 2,
        "silu": lambda u: u / (1 + sp.exp(-u))}


def _commutes_with_activation(act: str, T: sp.Matrix):
    """None when act(z·T) = act(z)·T for every z (T monomial, act(t·u) = t·act(u) for each entry t,
    checked by SymPy at u = ±r, r > 0); else (why, a non-zero residual)."""
    f = T.shape[0]
    nz = [[j for j in range(f) if not _zero(T[i, j])] for i in range(f)]
    cols = [[i for i in range(f) if not _zero(T[i, j])] for j in range(f)]
    if any(len(r) != 1 for r in nz) or any(len(cl) != 1 for cl in cols):
        return (f"the hidden units are mixed (T = {sp.sstr(sp.simplify(T))} is not a scaled permutation), "
                f"which an element-wise {act} does not commute with", sum(T[i, j] for i in range(f)
                                                                        for j in range(f) if i != j))
    r = sp.Symbol("r", positive=True)
    fn = _ACT[act]
    for i in range(f):
        t = sp.simplify(T[i, nz[i][0]])
        for u in (r, -r):
            res = fn(t * u) - t * fn(u)
            if res == 0:            # SymPy's automatic evaluation settles ReLU with t > 0, and t = 1
                continue
            # a non-zero value at some r > 0 (50 digits) refutes homogeneity without simplify()
            if any(abs(sp.N(res.subs(r, v), 50)) > sp.Float("1e-40") for v in (1, 2, sp.Rational(3, 7))):
                return (f"{act}(t·u) ≠ t·{act}(u) for the hidden scaling t = {t} (u = {u}): {act} is not "
                        f"homogeneous there", res)
            if sp.simplify(res) != 0:   # pragma: no cover - zero at three points, non-zero elsewhere
                return (f"{act}(t·u) ≠ t·{act}(u) for t = {t}", res)
    return None


def _end_interfaces(m: SymModel, P: SymView, Q: SymView, S, S_: sp.Matrix, s_note: str) -> list[Interface]:
    cfg = m.cfg
    out = []
    d = cfg.d_model
    if cfg.family != "attn":
        if S is None:
            out.append(Interface("token embedding W_E ↦ W_E·S", "block", [sp.Integer(1)], ("W_E",), ok=False,
                                 note=s_note))
        if P.has("W_pos"):
            out.append(Interface("position embedding W_pos ↦ W_pos·S", "block",
                                 list(Q.value("W_pos", Ctx()) - P.value("W_pos", Ctx()) * S_), ("W_pos",)))
        if cfg.n_types:
            tt = sp.Matrix(m.params["embed.W_tt"])
            out.append(Interface("token-type embedding (not a rule parameter) ↦ ·S", "block", list(tt - tt * S_),
                                 ()))
        if cfg.embed_norm:
            y = m.normed("y_embed")
            w, b = sp.Matrix([m.params["embed.ln.w"]]), sp.Matrix([m.params["embed.ln.b"]])
            res = (y * S_).multiply_elementwise(w) + b - (y.multiply_elementwise(w) + b) * S_
            out.append(Interface("embedding LayerNorm (not a rule parameter; its output is the stream)", "block",
                                 list(res), ()))
    if S_ != sp.eye(d) and cfg.norm != "none":
        out.append(_norm_core(m, S_))
    if cfg.family in ("attn", "bert"):
        x = m.row("x_out")
        out.append(Interface("model output (the residual stream itself)", "block", list(x * S_ - x), ()))
    else:
        uf0 = _norm_in(m, P, "norm_f", "xf", sp.eye(d))
        uf1 = _norm_in(m, Q, "norm_f", "xf", S_)
        y0 = uf0 * P.value("W_U", Ctx()) + P.value("b_U", Ctx())
        y1 = uf1 * Q.value("W_U", Ctx()) + Q.value("b_U", Ctx())
        out.append(Interface("logits", "block", list(y1 - y0), ("W_U", "b_U", "norm_f.w", "norm_f.b")))
    return out


def _norm_core(m: SymModel, S: sp.Matrix) -> Interface:
    """n(x·S) = n(x)·S for the norm's core n: ‖x·P·S‖² = ‖x·P‖² and x·S·P ∥ x·P·S (all 2×2 minors)."""
    d = m.cfg.d_model
    x = m.row("xc")
    P = sp.eye(d) - sp.ones(d, d) / d if m.ln else sp.eye(d)
    a, b = x * S * P, x * P * S
    res = [(b * b.T)[0, 0] - (x * P * (x * P).T)[0, 0]]
    res += [a[i] * b[j] - a[j] * b[i] for i in range(d) for j in range(i + 1, d)]
    kind = "LayerNorm (mean removed)" if m.ln else "RMSNorm"
    return Interface(f"{kind} core commutes with the stream map S", "block", res, ())


# ----------------------------------------------------------------------------- deciding
@dataclass
class ArchResult:
    arch: str
    holds: bool
    interfaces: list[Interface]
    stream_map: str
    elements: dict


def _decide(ifs: list[Interface]) -> bool:
    ok = True
    for it in ifs:
        if it.ok is None:
            it.ok = all(_zero(e) for e in it.residual)
        ok = ok and it.ok
    return ok


def _stream_map(m: SymModel, P: SymView, Q: SymView) -> tuple[sp.Matrix | None, str]:
    """S with W_E' = W_E·S identically (identity when W_E is unmapped or absent)."""
    d = m.cfg.d_model
    if m.cfg.family == "attn" or not P.has("W_E"):
        return sp.eye(d), "no token embedding: the input is not transformed"
    w0, w1 = P.value("W_E", Ctx()), Q.value("W_E", Ctx())
    if all(_zero(x) for x in (w1 - w0)):
        return sp.eye(d), "W_E is not mapped"
    S = sp.Matrix(d, d, lambda i, j: sp.Symbol(f"S_{i}{j}"))
    gens = set(w0)
    eqs = []
    for e in _numerators(list(w1 - w0 * S)):
        gs = [s for s in e.free_symbols if s in gens]
        eqs += sp.Poly(e, *gs).coeffs() if gs else [e]
    sol = unique_linear(eqs, list(S))
    if sol is None:
        return None, "the rule's W_E map is not a right multiplication W_E·S (no stream map)"
    return sp.simplify(S.subs(sol)), "S from W_E ↦ W_E·S"


def run_arch(rule: Rule, m: SymModel, els: dict) -> ArchResult:
    P = SymView(m.cfg, m.params)
    changes = apply(rule, P, els)
    Q = SymView(m.cfg, P.updated(changes))
    S, note = _stream_map(m, P, Q)
    ifs = interfaces(m, P, Q, S, note, {name for name, _ in changes})
    ok = _decide(ifs)
    if S is None:
        shown = note
    elif S == sp.eye(S.shape[0]):
        shown = "I"
    else:
        named = _match(S, _candidates(rule), rule, P, els, Ctx(0, 0, 0))
        shown = f"S = {named}" if named else f"S = {_abbrev(mat_text(S), 80)}"
    return ArchResult(arch_label(m.cfg), ok, ifs, shown, els)


@dataclass
class SymbolicResult:
    verdict_holds: bool                    # the stated rule is invariant on every architecture class
    per_arch: list[dict]
    corrected: Rule | None = None
    corrected_text: str | None = None
    correction_note: str = ""
    condition: str | None = None
    counterexample: str | None = None
    steps: list[str] = field(default_factory=list)
    search: list[str] = field(default_factory=list)        # why each tried correction slot gave nothing
    budget_seconds: float | None = None
    budget_cut: list[str] = field(default_factory=list)    # what the time budget stopped (empty: nothing)
    sizes: dict = field(default_factory=dict)              # the symbolic block's dimensions

    def to_json(self) -> dict:
        return {"holds": self.verdict_holds, "per_arch": self.per_arch,
                "corrected_rule": self.corrected_text, "correction_note": self.correction_note,
                "condition": self.condition, "counterexample": self.counterexample, "steps": self.steps,
                "correction_search": self.search, "budget_seconds": self.budget_seconds,
                "budget_cut": self.budget_cut, "sizes": self.sizes}


def _arch_models(rule: Rule, cfgs: list[Config]) -> list[SymModel]:
    seen, out = set(), []
    for cfg in cfgs:
        key = arch_key(cfg, rule)
        if key in seen:
            continue
        seen.add(key)
        m = SymModel.of(cfg, rule)
        if applicability(rule, m.shape, SymView(m.cfg, m.params).has) is None:
            out.append(m)
    return out


def check(rule: Rule, cfgs: list[Config], budget: Budget | None = None) -> SymbolicResult:
    """Decide the rule on the architecture classes of ``cfgs``; solve for a correction if it fails.

    The decision on the stated rule is exact and bounded by size alone.  The searches after a
    failure (correction, condition, small counterexample) are bounded by size limits and share
    ``budget`` (default: no time limit — the audit passes :data:`~.budget.SYMBOLIC_SECONDS` per
    claim); one that runs out of time stops with what it has, and the result says so
    (``budget_cut``)."""
    budget = budget or unlimited()
    models = _arch_models(rule, cfgs)
    if not models:
        raise NotApplicable("the rule applies to none of the architecture classes at symbolic size")
    for el in rule.elements:
        n = _size(el, models[0].shape.dims)
        if trivial_group(el, n):
            raise NotApplicable(f"{el.symbol} ∈ {el.text()} is the trivial group at n = {n}: the rule is the identity "
                                "map and a symbolic HOLDS would be vacuous")
    results = []
    for m in models:
        for els in element_assignments(rule, m.shape):
            results.append((m, run_arch(rule, m, els)))
    per = [_arch_json(r) for _, r in results]
    ok = all(r.holds for _, r in results)
    out = SymbolicResult(ok, per, budget_seconds=budget.seconds, budget_cut=budget.cut,
                         sizes={k: v for k, v in models[0].shape.dims.items() if v})
    lines: dict[str, int] = {}
    for _, r in results:
        line = f"{r.arch}: " + ("invariant" if r.holds else "NOT invariant: " + "; ".join(
            it.name for it in r.interfaces if not it.ok)) + f" (stream map {r.stream_map})"
        lines[line] = lines.get(line, 0) + 1
    out.steps = [f"{line} — {k} exact element draw(s)" for line, k in lines.items()]
    if ok:
        return out
    failing = [(m, r) for m, r in results if not r.holds]
    failing_models = list({id(m): m for m, _ in failing}.values())
    part = budget.part(SEARCH_SHARE["correction"], RESERVE["correction"])
    try:
        corr = correct(rule, failing_models, part, out.search)
        if corr is not None:
            out.corrected, out.corrected_text, out.correction_note = corr
            # correct() verified it on the failing classes; the others must stay invariant too
            rest = [m for m in models if all(m is not f for f in failing_models)]
            ok_rest = _holds_everywhere(corr[0], rest, part)
            out.steps.append(f"corrected rule checked at fresh exact draws on every class: "
                             f"{'invariant' if ok_rest else 'NOT invariant'}")
            if not ok_rest:
                out.corrected = out.corrected_text = None
                out.correction_note = "a solved correction breaks another architecture class"
    except BudgetSpent:
        out.corrected = out.corrected_text = None
        out.correction_note = ""
        budget.record(f"no correction found {part.limit_text()} (the correction search's time budget)")
    part = budget.part(SEARCH_SHARE["condition"], RESERVE["condition"])
    try:
        out.condition = condition(rule, [m for m, _ in failing], part)
    except BudgetSpent:
        budget.record(f"no condition on the group found {part.limit_text()}")
    part = budget.part(SEARCH_SHARE["counterexample"], RESERVE["counterexample"])
    try:
        out.counterexample = counterexample(rule, failing[0][0], failing[0][1], part)
    except BudgetSpent:
        out.counterexample = _generic_counterexample(failing[0][1])
        budget.record(f"no small counterexample {part.limit_text()} (the generic draw is shown)")
    return out


def mat_text(M) -> str:
    """A matrix on one line: [[a, b], [c, d]]."""
    return sp.sstr(sp.Matrix(M).tolist())


def _abbrev(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _arch_json(r: ArchResult) -> dict:
    return {"arch": r.arch, "invariant": r.holds, "stream_map": _abbrev(r.stream_map, 200),
            "interfaces": [{"name": it.name, "quantity": it.quantity, "invariant": bool(it.ok),
                            **({"note": it.note} if it.note else {})} for it in r.interfaces]}


def quantities(per_arch: list[dict]) -> dict[str, bool]:
    """The three quantities the issue names: attention scores, attention output, block output."""
    out = {"attention scores": True, "attention output": True, "block output": True}
    for a in per_arch:
        for it in a["interfaces"]:
            if not it["invariant"]:
                out["block output"] = False
                if it["quantity"] == "scores":
                    out["attention scores"] = out["attention output"] = False
                if it["quantity"] == "attention":
                    out["attention output"] = False
    return out


# ----------------------------------------------------------------------------- corrections
def _candidates(rule: Rule, norm: str | None = None) -> list[str]:
    """Expressions a solved factor is compared with: the elements, their transposes and inverses,
    diagonals of vector elements, and their conjugates by a norm's diag(γ)."""
    base = []
    for e in rule.elements:
        s = e.symbol
        if e.kind == "matrix":
            base += [s, f"transpose({s})", f"inv({s})", f"inv(transpose({s}))"]
        elif e.kind == "vector" and e.group != "translation":
            base += [f"diag({s})", f"inv(diag({s}))"]
        elif e.kind == "scalar":
            base += [s, f"inv({s})"]
    out = list(base)
    if norm:
        g = f"diag({norm}.w)"
        out += [f"inv({g}) @ {x} @ {g}" for x in base] + [f"{g} @ {x} @ inv({g})" for x in base]
    return out


def _match(B: sp.Matrix, cands: list[str], rule: Rule, view: SymView, els: dict, ctx: Ctx,
           point: dict | None = None) -> str | None:
    """The first candidate expression equal to B (``eye`` for the identity), or None.  ``point``:
    B is the solution at these values of the parameters, so the candidates are compared there."""
    syms = symbols_for(rule.elements)
    if B.shape[0] == B.shape[1] and all(_zero(x) for x in (B - sp.eye(B.shape[0]))):
        return "eye"
    for text in cands:
        try:
            node = parse_expression(text, syms)
        except GaugeAuditError:
            continue           # a candidate of another shape
        env = {n: (view.value(n, ctx.at(PARAMS[n].level)) if n in PARAMS else els[ctx.at(rule.scope_level)][n])
               for n in node.names()}
        try:
            val = evaluate(node, env, SympyOps(), view.shape.dims)
        except GaugeAuditError:
            continue
        if point:
            val = val.xreplace(point)
        if val.shape == B.shape and all(_zero(x) for x in (val - B)):
            return text
    return None


def _slots(rule: Rule, params: list[str]) -> list[tuple[str, str]]:
    """(parameter, slot) pairs to try: mapped parameters last-declared first, then unmapped ones."""
    mapped = [p for p in reversed(rule.params) if p in params]
    order = mapped + [p for p in params if p not in mapped]
    out = []
    for p in order:
        if PARAMS[p].shape[0] == 1:
            out += [(p, "right"), (p, "shift")]
        else:
            out += [(p, "right"), (p, "left")]
    return out


def _split(rule: Rule, param: str):
    """(left factors, right factors) of the stated map as expression texts, or None if not L·P·T."""
    mp = rule.map_of(param)
    if mp is None:
        return "", ""
    fs = factors(mp.node)
    idx = [i for i, f in enumerate(fs) if f.op == "name" and f.name == param]
    if len(idx) != 1:
        return None
    i = idx[0]
    return " @ ".join(f.text() for f in fs[:i]), " @ ".join(f.text() for f in fs[i + 1:])


def _slot_expr(rule: Rule, param: str, slot: str, fill: str) -> str | None:
    """The map of ``param`` with its left / right factor replaced by ``fill`` (``eye``: none), or an
    increment ``fill`` added (``shift``; an empty fill: no increment)."""
    if slot == "shift":
        mp = rule.map_of(param)
        base = mp.text if mp is not None and mp.increment is None else param
        return f"{base} + {fill}" if fill else base
    parts = _split(rule, param)
    if parts is None:
        return None
    left, right = parts
    seq = (fill, param, right) if slot == "left" else (left, param, fill)
    return " @ ".join(x for x in seq if x and x != "eye")


def _with_slot(rule: Rule, param: str, slot: str, fill: str) -> Rule | None:
    expr = _slot_expr(rule, param, slot, fill)
    if expr is None:
        return None
    try:
        return rule.with_maps({param: expr})
    except GaugeAuditError:
        return None


def _slot_residuals(rule: Rule, m: SymModel, param: str, slot: str, base_els: dict):
    """(unknown B_, the residuals every identity needs with B_ in the slot) — the unknown's entries
    symbols — or (None, why not)."""
    p = PARAMS[param]
    n = p.shape[0] if slot == "left" else p.shape[1]
    n = m.shape.dims[n] if isinstance(n, str) else n
    expr = _slot_expr(rule, param, slot, "B_")
    if expr is None:
        return None, "the stated map is not of the form L·P·T"
    table = rule.to_table()
    table["elements"]["B_"] = f"translation({n})" if slot == "shift" else f"GL({n})"
    table["maps"][param] = expr
    try:
        probe = parse_rule(table)
    except GaugeAuditError:
        return None, "no such slot"
    unknown = (sp.Matrix(1, n, lambda i, j: sp.Symbol(f"B_{j}")) if slot == "shift"
               else sp.Matrix(n, n, lambda i, j: sp.Symbol(f"B_{i}{j}")))
    els = {u: {**v, "B_": unknown} for u, v in base_els.items()}
    P = SymView(m.cfg, m.params)
    try:
        changes = apply(probe, P, els)
        Q = SymView(m.cfg, P.updated(changes))
    except GaugeAuditError:
        return None, "the slot does not apply"
    S, note = _stream_map(m, P, Q)
    if S is None:
        return None, note
    residuals = []
    for it in interfaces(m, P, Q, S, note, {name for name, _ in changes}):
        if it.ok is False:
            return None, f"{it.name} cannot hold for any value ({it.note})"
        residuals += it.residual
    return (unknown, residuals), ""


def _solve_slot(unknown: sp.Matrix, residuals: list, allowed: set, seed: int, budget: Budget):
    """The unique value of the unknown factor that makes every residual vanish identically in the
    data and the parameters outside ``allowed`` (those: at one random point, returned), by exact
    linear algebra on sampled equations (:func:`.solve.solve_sampled`); (None, point, why) if none."""
    sol, point, why = solve_sampled(residuals, list(unknown), allowed, random.Random(seed), budget)
    if sol is None:
        return None, point, why
    return unknown.xreplace(sol), point, ""


def _norm_params(m: SymModel) -> set:
    keys = [k for k in m.params if ".ln" in k or k.startswith("ln_final") or k.startswith("blocks.0.ln")]
    from ..precision.linalg import flatten
    return {s for k in keys for s in flatten(m.params[k])}


def _all_params(m: SymModel) -> set:
    return set(m.param_symbols())


def _holds_everywhere(rule: Rule, models: list[SymModel], budget: Budget | None = None) -> bool:
    for mm in models:
        for e in element_assignments(rule, mm.shape):
            if budget is not None:
                budget.check()
            if not run_arch(rule, mm, e).holds:
                return False
    return True


def correct(rule: Rule, models: list[SymModel], budget: Budget | None = None,
            log: list | None = None) -> tuple[Rule, str, str] | None:
    """A corrected rule that is invariant on every failing class, solved for (see module doc).
    At most MAX_SOLVES solves; ``budget`` (time) is checked between them — when it runs out the
    search stops (BudgetSpent propagates to the caller, which records it).  ``log`` collects why
    each slot gave nothing."""
    budget = budget or unlimited()
    log = log if log is not None else []
    m = models[0]
    els = element_assignments(rule, m.shape)[0]
    P = SymView(m.cfg, m.params)
    fixed = _correct_readers(rule, m, els)
    budget.check()
    if fixed is not None and _holds_everywhere(fixed[0], models, budget):
        return fixed
    res = run_arch(rule, m, els)
    failing = {p for it in res.interfaces if not it.ok for p in it.params}
    tries = 0
    ctx = Ctx(0, 0, 0)
    for param, slot in _slots(rule, sorted(failing, key=list(PARAMS).index)):
        if not P.has(param):
            continue
        budget.check()
        built, why = _slot_residuals(rule, m, param, slot, els)
        if built is None:
            log.append(f"{param} {slot}: {why}")
            continue
        unknown, residuals = built
        for allowed in (set(), _norm_params(m)) if slot != "shift" else (set(), _all_params(m)):
            tries += 1
            if tries > MAX_SOLVES:
                log.append(f"stopped after {MAX_SOLVES} solves (the search's size limit)")
                return None
            budget.check()
            B, point, why = _solve_slot(unknown, residuals, allowed, tries, budget)
            if B is None:
                log.append(f"{param} {slot}{' (norm weights free)' if allowed else ''}: {why}")
                continue
            if slot == "shift":
                text = "" if all(_zero(x) for x in B) else _match(B, _shift_candidates(rule, param), rule, P, els,
                                                                   ctx, point)
            else:
                text = _match(B, _candidates(rule, _reader_norm(param)), rule, P, els, ctx, point)
            if text is None:
                log.append(f"{param} {slot}: solved, but the solution is not nameable in the rule language")
                break            # solved, but not nameable in the rule language: try the next slot
            new = _with_slot(rule, param, slot, text)
            budget.check()
            if new is not None and _holds_everywhere(new, models, budget):
                return new, f"{param} ↦ {new.map_of(param).text}", (
                    f"solved {param}'s {slot} {'increment' if slot == 'shift' else 'factor'} as an unknown from "
                    f"the failing identities: the unique solution is {text or '0'} (exact linear algebra on the "
                    "identities at sampled points, compared exactly at the drawn element, re-checked at fresh "
                    "draws)")
            log.append(f"{param} {slot}: the solution {text or '0'} does not hold at fresh draws")
            break
    return None


def _shift_candidates(rule: Rule, param: str) -> list[str]:
    out = []
    ts = [e.symbol for e in rule.elements if e.group == "translation"]
    mats = [p for p in PARAMS if PARAMS[p].shape[1] == PARAMS[param].shape[1] and PARAMS[p].shape[0] != 1]
    for t in ts:
        out += [t, f"-{t}"]
        for w in mats:
            out += [f"{t} @ {w}", f"-({t} @ {w})"]
    return out


def _reader_norm(param: str) -> str | None:
    if param in ("W_Q", "W_K", "W_V"):
        return "norm1"
    if param in ("W_in", "W_gate", "W_router"):
        return "norm2"
    if param == "W_U":
        return "norm_f"
    return None


_READERS = {"norm1": ("W_Q", "W_K", "W_V"), "norm2": ("W_in", "W_gate", "W_router"), "norm_f": ("W_U",)}


def _correct_readers(rule: Rule, m: SymModel, els: dict):
    """Stream map S through an affine pre-norm: the readers must see (n·S·D_γ' + β')·B = n·D_γ + β,
    i.e. B = D_γ'⁻¹·S⁻¹·D_γ (shared by the norm's readers, replacing their left factor) and
    β' = β·B⁻¹.  Solved from those identities, named, and applied to every norm."""
    cfg = m.cfg
    if cfg.norm_placement != "pre" or cfg.norm == "none":
        return None
    P = SymView(cfg, m.params)
    Q = SymView(cfg, P.updated(apply(rule, P, els)))
    S, _ = _stream_map(m, P, Q)
    d = cfg.d_model
    if S is None or S == sp.eye(d):
        return None
    changes = {}
    notes = []
    for norm, readers in _READERS.items():
        before = len(changes)
        present = [w for w in readers if P.has(w) and not (w == "W_U" and cfg.tied)]
        if not present or (norm == "norm_f" and cfg.family in ("attn", "bert")):
            continue
        ctx = Ctx() if norm == "norm_f" else Ctx(0)
        g0, g1 = P.value(f"{norm}.w", ctx), Q.value(f"{norm}.w", ctx)
        b0 = P.value(f"{norm}.b", ctx)
        B = sp.diag(*list(g1)).inv() * S.inv() * sp.diag(*list(g0))
        B = sp.simplify(B)
        cands = _candidates(rule, norm if P.has(f"{norm}.w") else None)
        text = _match(B, cands, rule, P, els, ctx)
        if text is None:
            return None
        inv_text = _match(sp.simplify(B.inv()), cands, rule, P, els, ctx)
        for w in present:
            parts = _split(rule, w)
            if parts is None:
                return None
            expr = " @ ".join(x for x in (text, w, parts[1]) if x and x != "eye")
            stated = rule.map_of(w)
            if (stated.text if stated else w) != rule.with_maps({w: expr}).map_of(w).text:
                changes[w] = expr
        if P.has(f"{norm}.b") and not all(_zero(x) for x in (b0 * B.inv() - Q.value(f"{norm}.b", ctx))):
            if inv_text is None:
                return None
            changes[f"{norm}.b"] = f"{norm}.b @ {inv_text}"
        if len(changes) > before:
            notes.append(f"{norm}: readers' left factor B = D_γ'⁻¹·S⁻¹·D_γ = {text}"
                         + (f", β ↦ β·B⁻¹ = β @ {inv_text}" if f"{norm}.b" in changes else ""))
    if not changes:
        return None
    try:
        new = rule.with_maps(changes)
    except GaugeAuditError:
        return None
    return new, "; ".join(f"{k} ↦ {new.map_of(k).text}" for k in changes), "; ".join(notes)


# ----------------------------------------------------------------------------- conditions, counterexample
def _subgroups(el: Element, n: int, rng: random.Random) -> list[tuple[str, list[list[sp.Matrix]]]]:
    """Proper subsets of the declared group to test the stated rule on, largest first: (label, per
    draw the points to use)."""
    tag = el.symbol

    def pts(group):
        return [group_points(Element(tag, group, n), n, rng) for _ in range(DRAWS)]
    out = []
    if el.group == "GL":
        out += [(f"{tag} ∈ O({el.dim})", pts("O")), (f"{tag} ∈ SO({el.dim})", pts("SO")),
                (f"{tag} diagonal", [[sp.diag(*p) for p in d] for d in pts("diagonal")])]
    if el.group in ("O", "SO", "GL"):
        if n >= LEAST_SIZE["SO1"]:      # SO1(2) = {I}: no condition worth stating
            out.append((f"{tag} fixes the all-ones vector (SO1)", pts("SO1")))
        vs = [sp.Matrix([[_rint(rng) for _ in range(n)]]) for _ in range(DRAWS)]
        out.append((f"{tag}² = I ({tag} = 2vvᵀ/vᵀv − I, a rotation by π)",
                    [[2 * v.T * v / (v * v.T)[0, 0] - sp.eye(n)] for v in vs]))
    if el.group == "SO1" and n > 1 and n % 2:
        half_turn = 2 * sp.ones(n, n) / n - sp.eye(n)       # the rotation by π about the all-ones axis
        out.append((f"{tag}² = I ({tag} the rotation by π about the all-ones axis)", [[half_turn]] * DRAWS))
    if el.group == "diagonal":
        out += [(f"{tag} > 0", pts("positive-diagonal")),
                (f"{tag} = ±1", [[sp.Matrix([list(p)]) for p in itertools.product((1, -1), repeat=n)]] * DRAWS)]
    if el.group in ("diagonal", "positive-diagonal"):
        out.append((f"{tag} = c·ones (a common scale)", [[_rint(rng, False) * sp.ones(1, n)] for _ in range(DRAWS)]))
    if el.group == "scalar":
        out.append((f"{tag} = ±1", [[sp.Matrix([[1]]), sp.Matrix([[-1]])]] * DRAWS))
    return out


def condition(rule: Rule, models: list[SymModel], budget: Budget | None = None) -> str | None:
    """The largest tried subset of one element's group on which the stated rule holds (every
    other element at generic points).  ``budget`` is checked between decisions (BudgetSpent
    propagates)."""
    budget = budget or unlimited()
    rng = random.Random(11)
    for el in rule.elements:
        n = _size(el, models[0].shape.dims)
        for label, points in _subgroups(el, n, rng):
            if _holds_on(rule, models, {el.symbol: points}, budget):
                return f"holds only for {label}, not for a generic element of {el.text()}"
        return f"holds for no tried proper subset of {el.text()} (its identity element aside)" \
            if len(rule.elements) == 1 else None
    return None


def _holds_on(rule: Rule, models: list[SymModel], override: dict, budget: Budget) -> bool:
    for mm in models:
        for els in element_assignments(rule, mm.shape, override=override):
            budget.check()
            if not run_arch(rule, mm, els).holds:
                return False
    return True


def _generic_counterexample(r: ArchResult) -> str:
    """The failing identity at the generic draw (no further computation)."""
    bad = next((it for it in r.interfaces if not it.ok), None)
    shown = "; ".join(f"{sym} = {_abbrev(mat_text(v), 120)}" for els in list(r.elements.values())[:1]
                      for sym, v in els.items())
    return f"{r.arch}, {bad.name if bad else 'an identity'}: non-zero at the drawn exact element ({shown})"


def counterexample(rule: Rule, m: SymModel, r: ArchResult, budget: Budget | None = None) -> str | None:
    """A small exact element (entries 1..4) at which a failing identity is non-zero, with small
    integers for the data and parameters, and that value (the generic draw if no small one fails)."""
    global SPREAD
    saved, SPREAD = SPREAD, 4
    try:
        small = element_assignments(rule, m.shape, seed=5, draws=1)[:8]
    finally:
        SPREAD = saved
    budget = budget or unlimited()

    def tried():
        for els in small:
            budget.check()
            yield run_arch(rule, m, els)
    r = next((x for x in tried() if not x.holds), r)
    bad = next((it for it in r.interfaces if not it.ok), None)
    if bad is None:  # pragma: no cover - only called for a failing result
        return None
    rng = random.Random(7)
    subs = {s: sp.Integer(rng.choice([1, 2, 3]) if s.is_positive else rng.choice([-2, -1, 1, 2, 3]))
            for s in m.data_symbols() + m.param_symbols()}
    shown = "; ".join(f"{sym} = {mat_text(v)}" for els in list(r.elements.values())[:1] for sym, v in els.items())
    for e in bad.residual:
        budget.check()
        val = sp.sympify(e).subs(subs)
        free = sorted(val.free_symbols, key=str)
        val = sp.nsimplify(sp.cancel(val)) if not val.has(sp.erf, sp.exp, sp.Max) else \
            sp.N(val.subs({x: 1 for x in free}), 15)
        if val != 0:
            return (f"{r.arch}, {bad.name}: with {shown} and small integer data and parameters the identity is off "
                    f"by {val}")
    return f"{r.arch}, {bad.name}: {bad.note or 'non-zero at the drawn element'} ({shown})"


__all__ = ["SymbolicResult", "arch_config", "arch_label", "check", "quantities"]
