"""Apply a transformation rule to a model's parameters — one engine for every number system.

A *view* presents a parameter set by paper names (:mod:`gauge_audit.models.naming`): which
tensors exist, how many layers / heads / KV heads / experts there are, and the value of one
instance of a name as a 2-D matrix of the number system at hand (torch tensors, SymPy matrices,
nested lists).  :func:`apply` walks the rule's maps over the view's *contexts* (the instances a
map is evaluated at), binds the names and the group elements of each context's unit, evaluates
the expressions with :func:`gauge_audit.rules.algebra.evaluate`, and returns the new values;
the view writes them back into a parameter dict of its own layout.

:func:`applicability` decides, from the configuration alone, whether the rule can act on a model
at all — and says why not: a tensor the rule gives a value to but the model lacks, a weight it
reads that the model lacks, several elements acting on one shared tensor (a head-scoped rule on a
KV head shared by a GQA group), a numeric dimension that does not fit.  An absent bias is a zero
row and an absent norm weight the all-ones row (that is what the model computes), so a rule that
maps an absent bias to zero (``b_V @ diag(s)``) applies.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction

import torch

from ..claims.matexpr import Node
from ..claims.rule import Map, Rule, vanishes_at_zero
from ..errors import GaugeAuditError
from ..models.config import Config
from ..models.layers import rope_planes
from ..models.naming import FFN_NAMES, HEAD, KV, LAYER, MODEL, PARAMS, locate, present
from ..models.naming import dims as config_dims
from ..precision import linalg as la
from .algebra import ListOps, Ops, TorchOps, evaluate


class NotApplicable(GaugeAuditError):
    """The rule cannot act on this model (the reason is the message)."""


@dataclass(frozen=True)
class Ctx:
    """One place a map is evaluated: a layer, KV head, query head and expert (None: not set)."""

    layer: int | None = None
    kv: int | None = None
    head: int | None = None
    expert: int | None = None

    def at(self, level: int, expert: bool = False) -> Ctx:
        """The coarser context of a parameter (or unit) at ``level``; the expert kept when asked."""
        return Ctx(
            self.layer if level >= LAYER else None,
            self.kv if level >= KV else None,
            self.head if level >= HEAD else None,
            self.expert if expert else None,
        )

    def label(self) -> str:
        parts = []
        if self.layer is not None:
            parts.append(f"layer {self.layer}")
        if self.head is not None:
            parts.append(f"head {self.head}")
        elif self.kv is not None:
            parts.append(f"KV head {self.kv}")
        if self.expert is not None:
            parts.append(f"expert {self.expert}")
        return ", ".join(parts) or "model"


@dataclass(frozen=True)
class Shape:
    """The structure of a model a rule cares about."""

    dims: dict
    n_layers: int
    n_heads: int
    n_kv: int
    experts: int  # 0: dense FFN
    tied: bool
    planes: tuple = ()  # the coordinate pairs of a head that RoPE rotates together (none without RoPE)

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv

    @classmethod
    def of(cls, cfg: Config) -> Shape:
        planes = tuple(rope_planes(cfg)) if cfg.pos == "rope" else ()
        return cls(config_dims(cfg), cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.experts, cfg.tied, planes)

    def contexts(self, level: int, experts: bool = False) -> list[Ctx]:
        if level == MODEL:
            base = [Ctx()]
        elif level == LAYER:
            base = [Ctx(l) for l in range(self.n_layers)]
        elif level == KV:
            base = [Ctx(l, j) for l in range(self.n_layers) for j in range(self.n_kv)]
        else:
            base = [Ctx(l, h // self.group, h) for l in range(self.n_layers) for h in range(self.n_heads)]
        if experts and self.experts:
            return [replace(c, expert=e) for c in base for e in range(self.experts)]
        return base


def _touches_ffn(m: Map) -> bool:
    return m.param in FFN_NAMES or any(n in FFN_NAMES for n in m.node.names())


class View:
    """Paper-named access to one parameter set.  Subclasses implement :meth:`has`, :meth:`raw`
    and :meth:`updated`; ``ops`` is the number system."""

    shape: Shape
    ops: Ops

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def raw(self, name: str, ctx: Ctx):
        """The value of an existing instance as a 2-D matrix."""
        raise NotImplementedError

    def same(self, a, b) -> bool:
        """Are two values of this view's number system equal (exactly, or within its tolerance)?"""
        raise NotImplementedError

    def updated(self, changes: dict):
        """A new parameter set in the view's layout with ``changes[(name, ctx)]`` written in."""
        raise NotImplementedError

    def value(self, name: str, ctx: Ctx):
        """The instance's value; an absent bias / norm shift is a zero row, an absent norm weight
        the all-ones row (what the model computes with)."""
        if self.has(name):
            return self.raw(name, ctx)
        p = PARAMS[name]
        n = self.shape.dims[p.shape[1]] if isinstance(p.shape[1], str) else p.shape[1]
        if p.kind in ("bias", "norm_b"):
            return self.ops.mul(self.ops.num(Fraction(0)), self.ops.ones(n))
        if p.kind == "norm_w":
            return self.ops.ones(n)
        raise NotApplicable(f"the model has no {name} ({p.doc})")  # pragma: no cover - applicability()


# ----------------------------------------------------------------------------- applicability
class ShapeOps(Ops):
    """Shapes only: evaluating a rule with it checks every dimension against a model."""

    def shape(self, a):
        return a

    def num(self, q):
        return (1, 1)

    def matmul(self, a, b):
        self.check_product(a, b)
        return (a[0], b[1])

    def mul(self, a, b):
        if a == (1, 1) or b == (1, 1):
            return b if a == (1, 1) else a
        self.check_same("*", a, b)
        return a

    def add(self, a, b):
        self.check_same("+", a, b)
        return a

    sub = add

    def neg(self, a):
        return a

    def inv(self, a):
        if a[0] != a[1]:
            raise GaugeAuditError(f"inv() of a non-square {a[0]}×{a[1]} matrix")
        return a

    def transpose(self, a):
        return (a[1], a[0])

    def diag(self, v):
        n = v[1] if v[0] == 1 else v[0]
        return (n, n)

    def ones(self, n):
        return (1, n)

    def eye(self, n):
        return (n, n)

    def outer(self, u, v):
        return (u[1] if u[0] == 1 else u[0], v[1] if v[0] == 1 else v[0])


def _resolve(shape: tuple, dims: dict) -> tuple:
    missing = [d for d in shape if isinstance(d, str) and d not in dims]
    if missing:
        raise NotApplicable(f"the dimension {missing[0]} is not known for this model")
    return tuple(dims[d] if isinstance(d, str) else d for d in shape)


_ENDS = {
    "W_E": "the model has no token embedding: its input is not produced by parameters, so a rule that "
    "transforms the embedding's output cannot be applied to it",
    "W_U": "the model has no unembedding: its output is the residual stream itself",
}


def applicability(rule: Rule, shape: Shape, has: Callable[[str], bool]) -> str | None:
    """None when the rule can act on a model of this shape whose tensors ``has`` tells; else why not."""
    if not any(has(m.param) for m in rule.maps):
        return f"the model has none of the rule's parameters ({', '.join(rule.params)})"
    for e in rule.elements:
        if e.dim is not None and _resolve(e.shape, shape.dims)[1] < 1:
            return f"{e.symbol} ∈ {e.text()} has dimension 0 in this model"
    for m in rule.maps:
        p = PARAMS[m.param]
        if not has(m.param):
            if m.param in _ENDS:
                return _ENDS[m.param]
            if p.kind != "norm_w" and vanishes_at_zero(m):
                continue  # nothing to transform: an absent bias stays zero, an absent weight absent
            what = "a weight-free norm computes with γ = 1" if p.kind == "norm_w" else "the rule gives it a value"
            return f"the model has no {m.param} ({p.doc}) but {what}"
        for name in sorted(n for n in m.node.names() if n in PARAMS):
            if not has(name) and PARAMS[name].kind == "weight":
                return f"the rule reads {name} ({PARAMS[name].doc}), which the model lacks"
        if shape.experts and m.param not in FFN_NAMES and _touches_ffn(m) and m.param != "W_router":
            return (
                f"the map of {m.param} reads expert tensors of a mixture of experts "
                "(one value per expert for one shared tensor)"
            )
        per = len(shape.contexts(m.context_level)) // max(1, len(shape.contexts(p.level)))
        if per > 1 and m.increment is None:
            return (
                f"{m.param} is shared by {per} elements of a {rule.scope}-scoped rule (e.g. a KV head "
                f"read by {shape.group} query heads); write its map as an increment ({m.param} + …) "
                "or use a coarser scope (kv-group)"
            )
    try:
        env = {name: _resolve(PARAMS[name].shape, shape.dims) for name in rule.referenced}
        for e in rule.elements:
            env[e.symbol] = _resolve(e.shape, shape.dims)
    except NotApplicable as exc:
        return str(exc)
    for m in rule.maps:
        try:
            got = evaluate(m.node, env, ShapeOps(), shape.dims)
        except GaugeAuditError as exc:
            return f"{m.param} ↦ {m.text}: {exc} (dimensions {_dims_text(shape.dims)})"
        if got != env[m.param]:
            return (
                f"{m.param} ↦ {m.text} is {got[0]}×{got[1]} but {m.param} is {env[m.param][0]}×{env[m.param][1]} here"
            )
    return None


def _dims_text(dims: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in dims.items() if v)


# ----------------------------------------------------------------------------- apply
def units(rule: Rule, shape: Shape) -> list[Ctx]:
    """One unit per element draw: every head, KV head, layer, or the model."""
    return shape.contexts(rule.scope_level)


def apply(
    rule: Rule, view: View, elements: dict[Ctx, dict], maps: Iterable[Map] | None = None, check_tied: bool = True
) -> dict:
    """New values ``{(name, ctx): value}`` of every instance the rule maps (simultaneously, from the
    original parameters); ``elements[unit][symbol]`` are the group elements.  ``check_tied``: verify
    a tied model's W_U against its W_E (off inside forward-mode differentiation)."""
    shape, ops = view.shape, view.ops
    changes: dict = {}
    for m in rule.maps if maps is None else maps:
        p = PARAMS[m.param]
        if not view.has(m.param):
            continue  # applicability(): absent and mapped to zero / left absent
        ffn_ctx = bool(shape.experts) and _touches_ffn(m)
        groups: dict[Ctx, list[Ctx]] = defaultdict(list)
        for c in shape.contexts(m.context_level, experts=ffn_ctx):
            groups[c.at(p.level, expert=ffn_ctx and m.param in FFN_NAMES)].append(c)
        node = m.node if m.increment is None else m.increment
        for inst, ctxs in groups.items():
            if len(ctxs) > 1 and m.increment is None:
                raise NotApplicable(f"{m.param} at {inst.label()} is shared by {len(ctxs)} elements")
            vals = [ops.dense(evaluate(node, _env(rule, view, c, m, ffn_ctx, elements), ops, shape.dims)) for c in ctxs]
            if m.increment is None:
                new = vals[0]
            else:
                new = view.value(m.param, inst)
                for v in vals:
                    new = ops.add(new, v)
            changes[(m.param, inst)] = new
    if check_tied and shape.tied and any(k[0] == "W_U" for k in changes):
        _check_tied(view, changes)
    return changes


def _env(rule: Rule, view: View, c: Ctx, m: Map, ffn_ctx: bool, elements: dict) -> dict:
    env = {}
    for name in m.node.names():
        if name in PARAMS:
            env[name] = view.value(name, c.at(PARAMS[name].level, expert=ffn_ctx and name in FFN_NAMES))
        else:
            env[name] = elements[c.at(rule.scope_level)][name]
    return env


def _check_tied(view: View, changes: dict) -> None:
    """A tied model stores W_U = W_Eᵀ once: the rule's W_U must be the transpose of its W_E."""
    ops = view.ops
    w_u = changes[("W_U", Ctx())]
    w_e = changes.get(("W_E", Ctx()), view.value("W_E", Ctx()))
    if not view.same(w_u, ops.transpose(w_e)):
        raise NotApplicable(
            "the unembedding is tied (W_U = W_Eᵀ) but the rule's W_U is not the transpose of "
            "its W_E; untie the unembedding first"
        )


# ----------------------------------------------------------------------------- the project's layout
class ProjectView(View):
    """A model handle's parameters in the project's layout (any family, any checkpoint with a
    :class:`Config` and a params dict), as float64 torch tensors or as nested lists."""

    def __init__(self, cfg: Config, params: Mapping, ops: Ops | None = None, tolerance: float = 0.0):
        self.cfg, self.params = cfg, params
        self.shape = Shape.of(cfg)
        self.ops = ops or TorchOps()
        self.lists = isinstance(self.ops, ListOps)
        self.tolerance = tolerance  # relative, for the tied-embedding consistency check

    def has(self, name: str) -> bool:
        return present(self.cfg, name, self.params)

    def _loc(self, name: str, ctx: Ctx):
        return locate(self.cfg, name, ctx.layer, ctx.kv, ctx.head, ctx.expert)

    def raw(self, name: str, ctx: Ctx):
        loc = self._loc(name, ctx)
        t = self.params[loc.key]
        for i in loc.index:
            t = t[i]
        if self.lists:
            m = t if isinstance(t[0], list) else [list(t)]
            return la.transpose(m) if loc.transposed else m
        t = t.detach().to("cpu", torch.float64)
        m = t if t.dim() == 2 else t.reshape(1, -1)
        return m.T if loc.transposed else m

    def same(self, a, b) -> bool:
        if self.lists:
            return (
                all(x == y for x, y in zip(la.flatten(a), la.flatten(b)))
                if not self.tolerance
                else max(abs(x - y) for x, y in zip(la.flatten(a), la.flatten(b)))
                <= self.tolerance * max(abs(x) for x in la.flatten(b))
            )
        return float((a - b).abs().max()) <= self.tolerance * float(b.abs().max())

    def updated(self, changes: dict) -> dict:
        out = dict(self.params)
        copied: set[str] = set()
        for (name, ctx), value in changes.items():
            loc = self._loc(name, ctx)
            if loc.transposed:
                continue  # the tied W_U follows W_E (checked consistent in apply)
            if self.lists:
                out[loc.key] = _set_list(out[loc.key], loc.index, value, vector=PARAMS[name].shape[0] == 1)
                continue
            if loc.key not in copied:
                out[loc.key] = out[loc.key].detach().clone()
                copied.add(loc.key)
            t = out[loc.key]
            target = t[loc.index] if loc.index else t
            target.copy_(value.reshape(target.shape).to(device=t.device, dtype=t.dtype))
        return out


def _set_list(tree, index: tuple, value, vector: bool):
    """A copy of the nested list ``tree`` with the sub-list at ``index`` replaced."""
    new = value[0] if vector else value
    if not index:
        return new
    out = list(tree)
    out[index[0]] = _set_list(tree[index[0]], index[1:], value, vector)
    return out


def rounding_terms(node: Node, dims: dict) -> int:
    """Σ of the inner lengths of the expression's products and inverses (each length-k inner
    product or k×k elimination carries ≲ k·ε relative error): the K of a map."""

    def size(d):
        return dims[d] if isinstance(d, str) else d

    own = 0
    if node.op == "matmul":
        own = size(node.args[0].shape[1])
    elif node.op == "inv":
        own = size(node.shape[0])
    return own + sum(rounding_terms(a, dims) for a in node.args)


def factors(node: Node) -> list[Node]:
    """The factors of a product chain (a @ b @ c, scalars included)."""
    if node.op == "matmul":
        return factors(node.args[0]) + factors(node.args[1])
    return [node]


def sandwich_kappa(rule: Rule, view: View, elements: dict) -> float:
    """The condition number the rule's rounding is amplified by: for every map L·P·T of a parameter P
    (scalar factors aside), κ(L)·κ(T) at every unit — the left and right factors evaluated with the
    unit's element (as the built-in actions' κ(M), κ(s), κ(D_γ⁻¹·R·D_γ))."""
    shape = view.shape
    best = 1.0
    # a factor is the same at every context that agrees on the units it reads: its elements' unit
    # and its parameters' (a layer's norm weight is one per layer), and the same for every map
    # with that factor (W_in @ P, b_in @ P, W_gate @ P): one condition number per distinct value
    seen: dict = {}
    for m in rule.maps:
        fs = factors(m.node)
        idx = [i for i, f in enumerate(fs) if f.op == "name" and f.name == m.param]
        if len(idx) != 1:
            continue
        i = idx[0]
        if not view.has(m.param):
            continue
        ffn_ctx = bool(shape.experts) and _touches_ffn(m)
        sides = [(_chain(side), _side_level(rule, side)) for side in (fs[:i], fs[i + 1 :]) if side]
        for c in shape.contexts(m.context_level):
            env = _env(rule, view, replace(c, expert=0) if ffn_ctx else c, m, ffn_ctx, elements)
            k = 1.0
            for node, level in sides:
                key = (node.text(), c.at(level))
                if key not in seen:
                    seen[key] = view.ops.cond(evaluate(node, env, view.ops, shape.dims))
                k *= seen[key]
            best = max(best, k)
    return best


def _side_level(rule: Rule, side: list[Node]) -> int:
    """The finest level a product of factors depends on: the scope of the elements it uses and
    the levels of the parameters it reads."""
    names = set().union(*(f.names() for f in side))
    levels = [PARAMS[n].level for n in names if n in PARAMS]
    if names - set(PARAMS):
        levels.append(rule.scope_level)
    return max(levels, default=rule.scope_level)


def _chain(fs: list[Node]) -> Node:
    out = fs[0]
    for f in fs[1:]:
        out = Node("matmul", (out.shape[0], f.shape[1]), out.inv, (out, f))
    return out


__all__ = [
    "Ctx",
    "NotApplicable",
    "ProjectView",
    "Shape",
    "View",
    "applicability",
    "apply",
    "factors",
    "rounding_terms",
    "sandwich_kappa",
    "units",
]
