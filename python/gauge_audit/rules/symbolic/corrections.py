"""The correction search: when an identity fails, one parameter's map gets an unknown factor
(``B @ W``, ``W @ B``, ``b + t``) — or, for a rotation of the stream through an affine pre-norm,
the readers' shared factor and the norm's shift — solved for by exact linear algebra, named in the
rule language and re-checked from scratch at fresh draws (:func:`correct`), under a size limit
(:data:`MAX_SOLVES`) and a time budget.
"""

from __future__ import annotations

import random

import sympy as sp

from ...claims.rule import Rule, parse_rule
from ...errors import GaugeAuditError
from ...models.naming import PARAMS
from ..budget import Budget, unlimited
from ..engine import Ctx, apply, factors
from ..solve import solve_sampled
from .elements import element_assignments
from .interfaces import interfaces, run_arch, solve_stream_map
from .model import SymModel, SymView, is_zero
from .naming import candidates, match_named

MAX_SOLVES = 40


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
    return " @ ".join(f.text() for f in fs[:i]), " @ ".join(f.text() for f in fs[i + 1 :])


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


def _map_text(rule: Rule, param: str) -> str:
    """The text of ``param``'s map in ``rule``, which states one (it was just set)."""
    m = rule.map_of(param)
    assert m is not None
    return m.text


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
    unknown = (
        sp.Matrix(1, n, lambda i, j: sp.Symbol(f"B_{j}"))
        if slot == "shift"
        else sp.Matrix(n, n, lambda i, j: sp.Symbol(f"B_{i}{j}"))
    )
    els = {u: {**v, "B_": unknown} for u, v in base_els.items()}
    P = SymView(m.cfg, m.params)
    try:
        changes = apply(probe, P, els)
        Q = SymView(m.cfg, P.updated(changes))
    except GaugeAuditError:
        return None, "the slot does not apply"
    S, note = solve_stream_map(m, P, Q)
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
    from ...precision.linalg import flatten

    return {s for k in keys for s in flatten(m.params[k])}


def _all_params(m: SymModel) -> set:
    return set(m.param_symbols())


def holds_everywhere(rule: Rule, models: list[SymModel], budget: Budget | None = None) -> bool:
    for mm in models:
        for e in element_assignments(rule, mm.shape):
            if budget is not None:
                budget.check()
            if not run_arch(rule, mm, e).holds:
                return False
    return True


def correct(
    rule: Rule,
    models: list[SymModel],
    budget: Budget | None = None,
    log: list | None = None,
    slots: bool = True,
    closed: bool = True,
) -> tuple[Rule, str, str] | None:
    """A corrected rule that is invariant on every failing class, solved for (see module doc).
    At most MAX_SOLVES solves; ``budget`` (time) is checked between them — when it runs out the
    search stops (BudgetSpent propagates to the caller, which records it).  ``log`` collects why
    each slot gave nothing.  ``slots`` False: the closed forms only (the norms following the stream
    map, the readers' folded norm weight), no solve; ``closed`` False: the solves only."""
    budget = budget or unlimited()
    log = log if log is not None else []
    m = models[0]
    # an element at which the rule fails (the first draw may be the identity: a permutation's)
    draws = element_assignments(rule, m.shape)
    els, res = draws[0], None
    for e in draws:
        budget.check()
        r = run_arch(rule, m, e)
        if not r.holds:
            els, res = e, r
            break
    P = SymView(m.cfg, m.params)
    # an identity no parameter enters (the norm core under the stream map, the model's output when it
    # is the stream) cannot be mended by the closed forms, which keep the stream map
    hopeless = res is not None and any(not it.ok and not it.params for it in res.interfaces)
    for closed_form in (_follow_norms, _correct_readers) if closed and not hopeless else ():
        budget.check()
        fixed = closed_form(rule, m, els)
        if fixed is not None and holds_everywhere(fixed[0], models, budget):
            return fixed
    if not slots:
        return None
    res = res or run_arch(rule, m, els)
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
        present = set().union(*(sp.sympify(e).free_symbols for e in residuals))
        solved: set = set()
        for allowed in (set(), _norm_params(m)) if slot != "shift" else (set(), _all_params(m)):
            held = frozenset(allowed & present)
            if held in solved:
                continue  # no symbol of the residuals is newly held fixed: the same system as the last solve
            solved.add(held)
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
                text = (
                    ""
                    if all(is_zero(x) for x in B)
                    else match_named(B, _shift_candidates(rule, param), rule, P, els, ctx, point)
                )
            else:
                text = match_named(B, candidates(rule, _reader_norm(param)), rule, P, els, ctx, point)
            if text is None:
                log.append(f"{param} {slot}: solved, but the solution is not nameable in the rule language")
                break  # solved, but not nameable in the rule language: try the next slot
            new = _with_slot(rule, param, slot, text)
            budget.check()
            if new is not None and holds_everywhere(new, models, budget):
                return (
                    new,
                    f"{param} ↦ {_map_text(new, param)}",
                    (
                        f"solved {param}'s {slot} {'increment' if slot == 'shift' else 'factor'} as an unknown from "
                        f"the failing identities: the unique solution is {text or '0'} (exact linear algebra on the "
                        "identities at sampled points, compared exactly at the drawn element, re-checked at fresh "
                        "draws)"
                    ),
                )
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


def _stream_map(rule: Rule, m: SymModel, els: dict):
    """(the stream map S of the rule at this draw, the model's view before and after the rule) — S
    None when there is none or it is the identity."""
    P = SymView(m.cfg, m.params)
    Q = SymView(m.cfg, P.updated(apply(rule, P, els)))
    S, _ = solve_stream_map(m, P, Q)
    return (None if S is None or S == sp.eye(m.cfg.d_model) else S), P, Q


def _follow_norms(rule: Rule, m: SymModel, els: dict):
    """The norms' parameters carried along the stream map: γ ↦ γ·S and β ↦ β·S for every norm the
    rule leaves alone (right for a permutation of the stream, which a norm's element-wise weight
    commutes with up to that permutation), S named in the rule language."""
    if m.cfg.norm == "none":
        return None
    S, P, _ = _stream_map(rule, m, els)
    if S is None:
        return None
    name = match_named(S, candidates(rule), rule, P, els, Ctx(0, 0, 0))
    if name is None or name == "eye":
        return None
    changes = {
        p: f"{p} @ {name}"
        for norm in ("norm1", "norm2", "norm_f")
        for p in (f"{norm}.w", f"{norm}.b")
        if P.has(p) and rule.map_of(p) is None
    }
    return _changed(rule, changes, f"the norms' weights and shifts follow the stream map S = {name}")


def _changed(rule: Rule, changes: dict, note: str):
    """(the rule with these maps replaced, the changes as text, ``note``), or None (no change, or a
    rule the language refuses)."""
    if not changes:
        return None
    try:
        new = rule.with_maps(changes)
    except GaugeAuditError:
        return None
    return new, "; ".join(f"{k} ↦ {_map_text(new, k)}" for k in changes), note


def _correct_readers(rule: Rule, m: SymModel, els: dict):
    """Stream map S through an affine pre-norm: the readers must see (n·S·D_γ' + β')·B = n·D_γ + β,
    i.e. B = D_γ'⁻¹·S⁻¹·D_γ (shared by the norm's readers, replacing their left factor) and
    β' = β·B⁻¹.  Solved from those identities, named, and applied to every norm."""
    cfg = m.cfg
    if not cfg.pre_norm or cfg.norm == "none":
        return None
    S, P, Q = _stream_map(rule, m, els)
    if S is None:
        return None
    changes: dict[str, str] = {}
    notes = []
    for norm, readers in _READERS.items():
        before = len(changes)
        present = [w for w in readers if P.has(w) and not (w == "W_U" and cfg.tied)]
        if not present or (norm == "norm_f" and cfg.outputs_stream):
            continue
        ctx = Ctx() if norm == "norm_f" else Ctx(0)
        g0, g1 = P.value(f"{norm}.w", ctx), Q.value(f"{norm}.w", ctx)
        b0 = P.value(f"{norm}.b", ctx)
        B = sp.diag(*list(g1)).inv() * S.inv() * sp.diag(*list(g0))
        B = B.applyfunc(sp.cancel)
        cands = candidates(rule, norm if P.has(f"{norm}.w") else None)
        text = match_named(B, cands, rule, P, els, ctx)
        if text is None:
            return None
        inv_text = match_named(B.inv().applyfunc(sp.cancel), cands, rule, P, els, ctx)
        for w in present:
            parts = _split(rule, w)
            if parts is None:
                return None
            expr = " @ ".join(x for x in (text, w, parts[1]) if x and x != "eye")
            stated = rule.map_of(w)
            if (stated.text if stated else w) != _map_text(rule.with_maps({w: expr}), w):
                changes[w] = expr
        if P.has(f"{norm}.b") and not all(is_zero(x) for x in (b0 * B.inv() - Q.value(f"{norm}.b", ctx))):
            if inv_text is None:
                return None
            changes[f"{norm}.b"] = f"{norm}.b @ {inv_text}"
        if len(changes) > before:
            notes.append(
                f"{norm}: readers' left factor B = D_γ'⁻¹·S⁻¹·D_γ = {text}"
                + (f", β ↦ β·B⁻¹ = β @ {inv_text}" if f"{norm}.b" in changes else "")
            )
    return _changed(rule, changes, "; ".join(notes))
