"""The invariance checks: the identities a rule must satisfy interface by interface (attention
scores, attention output, FFN, router, norms, embeddings, output), each a list of residuals that
must vanish identically in the data and parameters (:func:`interfaces`); the stream map S solved
from the embedding's map; and one architecture class decided at one element draw
(:func:`run_arch`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import sympy as sp

from ...claims.rule import Rule
from ...models.layers import rope_planes
from ..algebra import sym_matmul as mm
from ..budget import unlimited
from ..engine import Ctx, apply
from ..solve import solve_sampled, unique_linear
from .model import SymModel, SymView, arch_label, is_zero, numerators
from .naming import candidates, match_named


@dataclass
class Interface:
    name: str
    quantity: str  # scores | attention | block
    residual: list  # expressions that must vanish identically in the data and parameters
    params: tuple  # paper names whose maps enter it (for the correction search)
    ok: bool | None = None
    note: str = ""


def _norm_in(m: SymModel, view: SymView, norm: str, rowname: str, S: sp.Matrix) -> sp.Matrix:
    """What a norm's readers read: (n·S)⊙γ + β for a pre-norm, the stream row x·S otherwise."""
    if m.cfg.pre_norm and m.cfg.norm != "none":
        n = mm(m.normed(rowname), S)
        gamma = view.value(f"{norm}.w", Ctx(0) if norm != "norm_f" else Ctx())
        beta = view.value(f"{norm}.b", Ctx(0) if norm != "norm_f" else Ctx())
        return n.multiply_elementwise(gamma) + beta
    return mm(m.row(rowname), S)


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


def interfaces(
    m: SymModel, P: SymView, Q: SymView, S: sp.Matrix | None, s_note: str, changed: set | None = None
) -> list[Interface]:
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
    if cfg.normed_sums and cfg.norm != "none":
        for norm in ("norm1", "norm2"):
            params = {f"{norm}.w", f"{norm}.b"}
            if skip(params):
                out.append(_untouched(f"post-LN {norm} (its output is the stream)", "block", params))
                continue
            y = m.normed(f"y_{norm}")
            res = (
                mm(y, S_).multiply_elementwise(Q.value(f"{norm}.w", Ctx(0)))
                + Q.value(f"{norm}.b", Ctx(0))
                - mm(y.multiply_elementwise(P.value(f"{norm}.w", Ctx(0))) + P.value(f"{norm}.b", Ctx(0)), S_)
            )
            out.append(Interface(f"post-LN {norm} (its output is the stream)", "block", list(res), tuple(params)))
    # ---- FFN and router
    if not cfg.attention_only:
        out += [_untouched("FFN output", "block", _FFN_PARAMS)] if skip(_FFN_PARAMS) else _ffn_interfaces(m, P, Q, S_)
    # ---- ends of the model
    out += (
        [_untouched("logits", "block", _END_PARAMS)]
        if skip(_END_PARAMS) and not cfg.outputs_stream
        else _end_interfaces(m, P, Q, S, S_, s_note)
    )
    return out


_SCORE_PARAMS = ("W_Q", "b_Q", "W_K", "b_K", "norm1.w", "norm1.b")


def _qk_norm_scores(m: SymModel, P: SymView, Q: SymView, R: sp.Matrix, u: dict) -> list[Interface]:
    """Attention scores through a QK-norm (RMSNorm over each head's query / key, or over all heads'
    at once): the rule must map the norm's input q to q·M (M solved, identically in the data and
    parameters), M must be a scaled orthogonal matrix c^½·O — then RMSNorm(q·M) = RMSNorm(q)·O —,
    and the scores of the normed rows (free symbols: every direction a normed row can take) times
    the norm weights γ (not rule parameters: they stay) must not change."""
    cfg = m.cfg
    e, g = cfg.d_head, cfg.group_size
    full = cfg.qk_norm == "full"
    qgroups = [list(range(cfg.n_heads))] if full else [[h] for h in range(cfg.n_heads)]
    kgroups = [list(range(cfg.n_kv_heads))] if full else [[j] for j in range(cfg.n_kv_heads)]
    gq = sp.Matrix([m.params["blocks.0.attn.q_norm"]])
    gk = sp.Matrix([m.params["blocks.0.attn.k_norm"]])

    def side(kind: str, groups: list, row: str, gamma: sp.Matrix):
        """Per head: (the normed row times γ before, after) or an Interface saying why not."""
        per: dict = {}
        for gi, heads in enumerate(groups):

            def cat(view, idx, heads=heads):
                parts = []
                for h in heads:
                    c = Ctx(0, h // g, h) if kind == "Q" else Ctx(0, h)
                    parts.append(mm(u[row][idx], view.value(f"W_{kind}", c)) + view.value(f"b_{kind}", c))
                return sp.Matrix.hstack(*parts)

            z0, z1 = cat(P, 0), cat(Q, 1)
            n = z0.shape[1]
            M, why = _solve_linear_image(m, z0, z1, n)
            what = "query" if kind == "Q" else "key"
            if M is None:
                return Interface(
                    f"QK-norm {what} input",
                    "scores",
                    list(z1 - z0),
                    _SCORE_PARAMS,
                    ok=False,
                    note=f"the {what} does not map to q·M for any matrix M ({why}), so its RMSNorm does not either",
                )
            G = M * M.T
            c = G[0, 0]
            if not all(is_zero(x) for x in (G - c * sp.eye(n))):
                return Interface(
                    f"QK-norm core commutes with the {what} map",
                    "scores",
                    [sum(G[i, j] for i in range(n) for j in range(n) if i != j) or G[0, 0] - G[n - 1, n - 1]],
                    _SCORE_PARAMS,
                    ok=False,
                    note=f"RMSNorm(q·M) = RMSNorm(q)·M/√c needs M·Mᵀ = c·I (M = {sp.sstr(M.tolist())})",
                )
            nrow = m.row(f"n{kind.lower()}{gi}", n)
            gam = sp.Matrix.hstack(*([gamma] if full else [gamma] * len(heads)))
            before = nrow.multiply_elementwise(gam)
            after = (mm(nrow, M) / sp.sqrt(c)).multiply_elementwise(gam)
            for a, h in enumerate(heads):
                per[h] = (before[:, a * e : (a + 1) * e], after[:, a * e : (a + 1) * e])
        return per

    q = side("Q", qgroups, "xq", gq)
    if isinstance(q, Interface):
        return [q]
    k = side("K", kgroups, "xk1", gk)
    if isinstance(k, Interface):
        return [k]
    key_vars = [s for name, v in m.data.items() if name.startswith(("nk", "rope")) for s in v]
    out = []
    for h in range(cfg.n_heads):
        j = h // g
        r = mm(mm(q[h][1], R), k[j][1].T)[0, 0] - mm(mm(q[h][0], R), k[j][0].T)[0, 0]
        r_mod = r - r.xreplace({v: 0 for v in key_vars})
        out.append(Interface(f"attention scores through the QK-norm (head {h})", "scores", [r_mod], _SCORE_PARAMS))
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
    if cfg.qk_norm != "none":
        out += _qk_norm_scores(m, P, Q, R, u)
    for h in range(cfg.n_heads):
        c = Ctx(0, h // g, h)
        ck = c.at(2)

        def score(view, uq, uk, c=c, ck=ck):
            q = mm(uq, view.value("W_Q", c)) + view.value("b_Q", c)
            k = mm(uk, view.value("W_K", ck)) + view.value("b_K", ck)
            return mm(mm(q, R), k.T)[0, 0]

        if cfg.qk_norm == "none":
            r = score(Q, u["xq"][1], u["xk1"][1]) - score(P, u["xq"][0], u["xk1"][0])
            r_mod = r - r.xreplace({v: 0 for v in key_vars})  # a constant per query is no change for softmax
            out.append(Interface(f"attention scores (head {h})", "scores", [r_mod], _SCORE_PARAMS))
        a = sp.Symbol(f"a{h}", real=True)
        m.data[f"a{h}"] = sp.Matrix([[a]])
        for view, idx in ((P, 0), (Q, 1)):
            v1 = mm(u["xk1"][idx], view.value("W_V", ck)) + view.value("b_V", ck)
            v2 = mm(u["xk2"][idx], view.value("W_V", ck)) + view.value("b_V", ck)
            z = a * v1 + (1 - a) * v2
            if idx == 0:
                o0 = o0 + mm(z, view.value("W_O", c))
            else:
                o1 = o1 + mm(z, view.value("W_O", c))
    out.append(
        Interface(
            "attention output (attention weights unchanged)",
            "attention",
            list(o1 - mm(o0, S_)),
            ("W_V", "b_V", "W_O", "b_O", "norm1.w", "norm1.b"),
        )
    )
    return out


def _ffn_interfaces(m: SymModel, P: SymView, Q: SymView, S: sp.Matrix) -> list[Interface]:
    cfg = m.cfg
    out = []
    c = Ctx(0, expert=0 if cfg.experts else None)
    u0, u1 = _norm_in(m, P, "norm2", "x2", sp.eye(cfg.d_model)), _norm_in(m, Q, "norm2", "x2", S)
    names = ("W_in", "b_in", "W_gate", "W_out", "b_out", "norm2.w", "norm2.b")
    if cfg.experts:
        l0 = mm(u0, P.value("W_router", Ctx(0)))
        l1 = mm(u1, Q.value("W_router", Ctx(0)))
        diff = l1 - l0
        out.append(
            Interface(
                "MoE router logits (up to a constant per token)",
                "block",
                [diff[0, e] - diff[0, 0] for e in range(1, diff.shape[1])],
                ("W_router", "norm2.w", "norm2.b"),
            )
        )
    z0 = mm(u0, P.value("W_in", c)) + P.value("b_in", c)
    z1 = mm(u1, Q.value("W_in", c)) + Q.value("b_in", c)
    f = cfg.d_ff
    t_up, why = _solve_linear_image(m, z0, z1, f)
    if t_up is None:
        return out + [
            Interface(
                "FFN pre-activations",
                "block",
                list(z1 - z0),
                names,
                ok=False,
                note=f"x·W_in + b_in does not map to (x·W_in + b_in)·T for any matrix T ({why})",
            )
        ]
    if cfg.act == "swiglu":
        zg0 = mm(u0, P.value("W_gate", c))
        zg1 = mm(u1, Q.value("W_gate", c))
        t_gate, why = _solve_linear_image(m, zg0, zg1, f)
        if t_gate is None:
            return out + [
                Interface(
                    "FFN gate pre-activations",
                    "block",
                    list(zg1 - zg0),
                    names,
                    ok=False,
                    note=f"the gate input does not map linearly ({why})",
                )
            ]
        bad = _commutes_with_activation("silu", t_gate)
        if bad:
            return out + [Interface("FFN gate: silu(z·T) = silu(z)·T", "block", [bad[1]], names, ok=False, note=bad[0])]
        gv = m.row("silu", f)
        h1 = mm(gv, t_gate).multiply_elementwise(mm(z0, t_up))
        h0 = gv.multiply_elementwise(z0)
    else:
        bad = _commutes_with_activation(cfg.act, t_up)
        if bad:
            return out + [
                Interface(
                    f"FFN activation: {cfg.act}(z·T) = {cfg.act}(z)·T", "block", [bad[1]], names, ok=False, note=bad[0]
                )
            ]
        hv = m.row("act", f)
        h1, h0 = mm(hv, t_up), hv
    y0 = mm(h0, P.value("W_out", c)) + P.value("b_out", c)
    y1 = mm(h1, Q.value("W_out", c)) + Q.value("b_out", c)
    out.append(Interface("FFN output", "block", list(y1 - mm(y0, S)), names))
    return out


def _solve_linear_image(m: SymModel, z0: sp.Matrix, z1: sp.Matrix, f: int):
    """T with z1 ≡ z0·T identically in the data and parameters (unique), or (None, why)."""
    T = sp.Matrix(f, f, lambda i, j: sp.Symbol(f"T_{i}{j}"))
    generic = set(m.data_symbols()) | set(m.param_symbols())
    residuals = list(z1 - mm(z0, T))
    if all(s in generic for e in residuals for s in e.free_symbols if s not in set(T)):
        # every other symbol is generic: T is a number matrix, solved from sampled points and then
        # verified exactly (faster than extracting every coefficient)
        sol, _, why = solve_sampled(residuals, list(T), set(), random.Random(0), unlimited())
        if sol is None:
            return None, "no unique solution"
        t = T.xreplace(sol)
        if not all(is_zero(e) for e in (z1 - mm(z0, t))):
            return None, "no unique solution"
        return t, ""
    eqs: list = []
    for e in numerators(list(z1 - mm(z0, T))):
        gens = [s for s in e.free_symbols if s in generic]
        eqs += sp.Poly(e, *gens).coeffs() if gens else [e]
    sol = unique_linear(eqs, list(T)) if eqs else None
    if sol is None:
        return None, "no unique solution"
    return T.subs(sol), ""


_ACT = {
    "relu": lambda u: sp.Max(0, u),
    "gelu": lambda u: u * (1 + sp.erf(u / sp.sqrt(2))) / 2,
    "silu": lambda u: u / (1 + sp.exp(-u)),
}


def _commutes_with_activation(act: str, T: sp.Matrix):
    """None when act(z·T) = act(z)·T for every z (T monomial, act(t·u) = t·act(u) for each entry t,
    checked by SymPy at u = ±r, r > 0); else (why, a non-zero residual)."""
    f = T.shape[0]
    nz = [[j for j in range(f) if not is_zero(T[i, j])] for i in range(f)]
    cols = [[i for i in range(f) if not is_zero(T[i, j])] for j in range(f)]
    if any(len(r) != 1 for r in nz) or any(len(cl) != 1 for cl in cols):
        return (
            f"the hidden units are mixed (T = {sp.sstr(sp.simplify(T))} is not a scaled permutation), "
            f"which an element-wise {act} does not commute with",
            sum(T[i, j] for i in range(f) for j in range(f) if i != j),
        )
    r = sp.Symbol("r", positive=True)
    fn = _ACT[act]
    for i in range(f):
        t = sp.simplify(T[i, nz[i][0]])
        for u in (r, -r):
            res = fn(t * u) - t * fn(u)
            if res == 0:  # SymPy's automatic evaluation settles ReLU with t > 0, and t = 1
                continue
            # a non-zero value at some r > 0 (50 digits) refutes homogeneity without simplify()
            if any(abs(sp.N(res.subs(r, v), 50)) > sp.Float("1e-40") for v in (1, 2, sp.Rational(3, 7))):
                return (
                    f"{act}(t·u) ≠ t·{act}(u) for the hidden scaling t = {t} (u = {u}): {act} is not homogeneous there",
                    res,
                )
            if sp.simplify(res) != 0:  # pragma: no cover - zero at three points, non-zero elsewhere
                return (f"{act}(t·u) ≠ t·{act}(u) for t = {t}", res)
    return None


def _end_interfaces(m: SymModel, P: SymView, Q: SymView, S, S_: sp.Matrix, s_note: str) -> list[Interface]:
    cfg = m.cfg
    out = []
    d = cfg.d_model
    if not cfg.attention_only:
        if S is None:
            out.append(
                Interface("token embedding W_E ↦ W_E·S", "block", [sp.Integer(1)], ("W_E",), ok=False, note=s_note)
            )
        if P.has("W_pos"):
            out.append(
                Interface(
                    "position embedding W_pos ↦ W_pos·S",
                    "block",
                    list(Q.value("W_pos", Ctx()) - mm(P.value("W_pos", Ctx()), S_)),
                    ("W_pos",),
                )
            )
        if cfg.n_types:
            tt = sp.Matrix(m.params["embed.W_tt"])
            out.append(
                Interface("token-type embedding (not a rule parameter) ↦ ·S", "block", list(tt - mm(tt, S_)), ())
            )
        if cfg.embed_norm:
            y = m.normed("y_embed")
            w, b = sp.Matrix([m.params["embed.ln.w"]]), sp.Matrix([m.params["embed.ln.b"]])
            res = mm(y, S_).multiply_elementwise(w) + b - mm(y.multiply_elementwise(w) + b, S_)
            out.append(
                Interface(
                    "embedding LayerNorm (not a rule parameter; its output is the stream)", "block", list(res), ()
                )
            )
    if S_ != sp.eye(d) and cfg.norm != "none":
        out.append(_norm_core(m, S_))
    if cfg.outputs_stream:
        x = m.row("x_out")
        out.append(Interface("model output (the residual stream itself)", "block", list(mm(x, S_) - x), ()))
    else:
        uf0 = _norm_in(m, P, "norm_f", "xf", sp.eye(d))
        uf1 = _norm_in(m, Q, "norm_f", "xf", S_)
        y0 = mm(uf0, P.value("W_U", Ctx())) + P.value("b_U", Ctx())
        y1 = mm(uf1, Q.value("W_U", Ctx())) + Q.value("b_U", Ctx())
        out.append(Interface("logits", "block", list(y1 - y0), ("W_U", "b_U", "norm_f.w", "norm_f.b")))
    return out


def _norm_core(m: SymModel, S: sp.Matrix) -> Interface:
    """n(x·S) = n(x)·S for the norm's core n: ‖x·P·S‖² = ‖x·P‖² and x·S·P ∥ x·P·S (all 2×2 minors)."""
    d = m.cfg.d_model
    x = m.row("xc")
    P = sp.eye(d) - sp.ones(d, d) / d if m.ln else sp.eye(d)
    a, b = mm(mm(x, S), P), mm(mm(x, P), S)
    res = [mm(b, b.T)[0, 0] - mm(mm(x, P), mm(x, P).T)[0, 0]]
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
            it.ok = all(is_zero(e) for e in it.residual)
        ok = ok and it.ok
    return ok


def solve_stream_map(m: SymModel, P: SymView, Q: SymView) -> tuple[sp.Matrix | None, str]:
    """S with W_E' = W_E·S identically (identity when W_E is unmapped or absent)."""
    d = m.cfg.d_model
    if m.cfg.attention_only or not P.has("W_E"):
        return sp.eye(d), "no token embedding: the input is not transformed"
    w0, w1 = P.value("W_E", Ctx()), Q.value("W_E", Ctx())
    if all(is_zero(x) for x in (w1 - w0)):
        return sp.eye(d), "W_E is not mapped"
    S = sp.Matrix(d, d, lambda i, j: sp.Symbol(f"S_{i}{j}"))
    gens = set(w0)
    eqs: list = []
    for e in numerators(list(w1 - mm(w0, S))):
        gs = [s for s in e.free_symbols if s in gens]
        eqs += sp.Poly(e, *gs).coeffs() if gs else [e]
    sol = unique_linear(eqs, list(S))
    if sol is None:
        return None, "the rule's W_E map is not a right multiplication W_E·S (no stream map)"
    return S.subs(sol).applyfunc(sp.cancel), "S from W_E ↦ W_E·S"


def run_arch(rule: Rule, m: SymModel, els: dict) -> ArchResult:
    P = SymView(m.cfg, m.params)
    changes = apply(rule, P, els)
    Q = SymView(m.cfg, P.updated(changes))
    S, note = solve_stream_map(m, P, Q)
    ifs = interfaces(m, P, Q, S, note, {name for name, _ in changes})
    ok = _decide(ifs)
    if S is None:
        shown = note
    elif S == sp.eye(S.shape[0]):
        shown = "I"
    else:
        named = match_named(S, candidates(rule), rule, P, els, Ctx(0, 0, 0))
        shown = f"S = {named}" if named else f"S = {abbrev(mat_text(S), 80)}"
    return ArchResult(arch_label(m.cfg), ok, ifs, shown, els)


def mat_text(M) -> str:
    """A matrix on one line: [[a, b], [c, d]]."""
    return sp.sstr(sp.Matrix(M).tolist())


def abbrev(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."
