"""LayerNorm / RMSNorm and residual-stream rotations.

LN(x) = γ ⊙ z + β with z = √d·P·x/‖P·x‖, P = I − 11ᵀ/d;  RMS(x) = γ ⊙ √d·x/‖x‖.
A stream rotation multiplies every writer by g and must be undone by the readers.
"""

from __future__ import annotations

from functools import lru_cache

import sympy as sp
from sympy.polys.matrices import DomainMatrix

from .nierop import CYCLIC, ROT17
from .registry import claim, coefficient_equations, derivation, sym_matrix
from .result import Derivation, decide


def _antisymmetric(d: int, name: str = "w"):
    syms = []
    O = sp.zeros(d, d)
    for i in range(d):
        for j in range(i + 1, d):
            s = sp.Symbol(f"{name}_{i}{j}")
            syms.append(s)
            O[i, j], O[j, i] = s, -s
    return O, syms


def _solution_dimension(eqs, unknowns) -> int:
    if not eqs:
        return len(unknowns)
    A, _ = sp.linear_eq_to_matrix(eqs, unknowns)
    # exact rank over the fraction field of the coefficient domain (ℚ or ℚ(γ, β))
    return len(unknowns) - DomainMatrix.from_Matrix(A).to_field().rank()


@lru_cache(maxsize=32)
def equivariance_dimension(d: int, norm: str, general: bool = False) -> int:
    """dim of {Ω : D N(x)[Ω x] = Ω N(x) ∀x} for N = weight-free LayerNorm or RMSNorm.

    ``general``: Ω ∈ gl(d); otherwise Ω ∈ so(d).  The condition is made polynomial by
    multiplying out ‖y‖³: ‖y‖²·(P_Ω x − Ω y) − y·(y·P_Ω x) = 0 with y = P x (LN) or y = x (RMS).
    It is linear in Ω, so the solutions are the kernel of the map basis element → coefficients
    of its residual polynomial (exact over ℚ): the same linear system as solving the coefficient
    equations of a symbolic Ω, without expanding d² unknowns through the cubic.  Cached: several
    derivations ask for the same (d, norm)."""
    xs = sp.symbols(f"x0:{d}")
    P = sp.eye(d) - sp.ones(d, d) / d if norm == "layernorm" else sp.eye(d)
    pairs = (
        [(i, j) for i in range(d) for j in range(d)] if general else [(i, j) for i in range(d) for j in range(i + 1, d)]
    )

    def linear(row) -> sp.Poly:
        return sp.Poly(sum(c * x for c, x in zip(row, xs)), *xs, domain=sp.QQ)

    y = [linear(P.row(i)) for i in range(d)]
    yy = sum((t * t for t in y[1:]), y[0] * y[0])
    columns: list[dict] = []
    for i, j in pairs:
        B = sp.zeros(d, d)
        B[i, j] = 1
        if not general:
            B[j, i] = -1
        pbx = [linear((P * B).row(k)) for k in range(d)]
        by = [linear((B * P).row(k)) for k in range(d)]
        ypbx = sum((a * b for a, b in zip(y[1:], pbx[1:])), y[0] * pbx[0])
        col = {}
        for k in range(d):
            for monom, c in (yy * (pbx[k] - by[k]) - y[k] * ypbx).terms():
                col[(k, monom)] = c
        columns.append(col)
    rows = sorted({key for col in columns for key in col})
    if not rows:
        return len(pairs)
    A = DomainMatrix([[col.get(r, sp.QQ(0)) for col in columns] for r in rows], (len(rows), len(columns)), sp.QQ)
    return len(pairs) - A.rank()


def _ln(x: sp.Matrix, gamma: sp.Matrix, beta: sp.Matrix) -> sp.Matrix:
    d = x.rows
    y = x - sp.ones(d, 1) * (sum(x) / d)
    sigma = sp.sqrt((y.T * y)[0] / d)
    return sp.Matrix([gamma[i] * y[i] / sigma + beta[i] for i in range(d)])


@derivation("ln-noaffine-rotation")
def ln_noaffine_rotation() -> Derivation:
    c = claim("ln-noaffine-rotation")
    x = sym_matrix("x", 3, 1, real=True)
    one, zero = sp.ones(3, 1), sp.zeros(3, 1)
    resid = sp.simplify(_ln(CYCLIC * x, one, zero) - CYCLIC * _ln(x, one, zero))
    dims = {dd: equivariance_dimension(dd, "layernorm") for dd in (3, 4)}
    formula = {dd: (dd - 1) * (dd - 2) // 2 for dd in dims}
    gen4 = equivariance_dimension(4, "layernorm", general=True)
    ok = all(r == 0 for r in resid) and dims == formula
    steps = [
        "Weight-free LayerNorm: LN(x) = √d·P·x/‖P·x‖. A rotation g with g·1 = 1 commutes with P and preserves ‖P·x‖.",
        f"Exact check with g = 120° rotation about (1,1,1), symbolic x: LN(g·x) − g·LN(x) = {sp.sstr(resid.T)}.",
        f"Linearised equivariance over so(d) (polynomial coefficients in x): dimension {dims} for d = 3, 4; "
        f"(d−1)(d−2)/2 = {formula}.",
        f"Over all of gl(4) the equivariant algebra has dimension {gen4} = 3 + 1: the rotations fixing 1 plus "
        "Ω = 1·1ᵀ (rescaling the all-ones component, which LayerNorm discards).",
        "So with readers W → W·g⁻¹ the paper's rule preserves the function for γ = 1, β = 0.",
    ]
    return Derivation(
        claim="ln-noaffine-rotation",
        title="Rotation symmetry of weight-free LayerNorm",
        claimed=c.statement,
        verdict=decide(ok),
        derived="LN(g·x) = g·LN(x) for g ∈ O(d), g·1 = 1; dim = (d−1)(d−2)/2",
        residual=sp.sstr(resid.T),
        steps=steps,
        data={"so_dimension": dims, "gl_dimension_d4": gen4},
        exprs=[("residual", resid)],
    )


@derivation("rmsnorm-rotation")
def rmsnorm_rotation() -> Derivation:
    c = claim("rmsnorm-rotation")
    dims = {dd: equivariance_dimension(dd, "rmsnorm") for dd in (3, 4)}
    gen = {dd: equivariance_dimension(dd, "rmsnorm", general=True) for dd in (3, 4)}
    full = {dd: dd * (dd - 1) // 2 for dd in dims}
    claimed = {dd: (dd - 1) * (dd - 2) // 2 for dd in dims}
    x = sym_matrix("x", 3, 1, real=True)
    g = sp.Matrix([[sp.Rational(3, 5), sp.Rational(-4, 5), 0], [sp.Rational(4, 5), sp.Rational(3, 5), 0], [0, 0, 1]])
    rms = lambda v: v * sp.sqrt(3) / sp.sqrt((v.T * v)[0])  # noqa: E731
    resid = sp.simplify(rms(g * x) - g * rms(x))
    moves_ones = g * sp.ones(3, 1) != sp.ones(3, 1)
    sym_exists = all(r == 0 for r in resid) and dims == full
    steps = [
        "Weight-free RMSNorm: RMS(x) = √d·x/‖x‖ — no mean subtraction, so every rotation commutes with it.",
        f"Exact check with a rotation that moves the all-ones vector ({moves_ones}): RMS(g·x) − g·RMS(x) = {sp.sstr(resid.T)}.",
        f"Linearised equivariance: so(d) part has dimension {dims}, gl(d) {gen}; d(d−1)/2 = {full}.",
        f"The SO(d_e−1) count used for LLaMA in Table 1 gives {claimed}: it undercounts by d_e − 1.",
        "With a learned RMSNorm weight γ the readers must use the corrected rule W·diag(γ)·gᵀ·diag(γ)⁻¹ "
        "(see ln-affine-rotation); untied LLaMA keeps the full SO(d_e).",
    ]
    claimed_ok = sym_exists and dims == claimed
    return Derivation(
        claim="rmsnorm-rotation",
        title="Stream rotations through RMSNorm (LLaMA)",
        claimed=c.statement,
        verdict=decide(claimed_ok, sym_exists, substance_kept=sym_exists),
        derived="RMSNorm is O(d_e)-equivariant: d_e(d_e−1)/2 rotation dimensions",
        residual=f"count difference d(d−1)/2 − (d−1)(d−2)/2 = d−1: { {dd: full[dd] - claimed[dd] for dd in dims} }",
        corrected_rule="SO(d_e) (dim d_e(d_e−1)/2) for RMSNorm models; with learned weight the readers "
        "transform as W·diag(γ)·gᵀ·diag(γ)^-1",
        steps=steps,
        data={"so_dimension": dims, "gl_dimension": gen},
        exprs=[("residual", resid)],
    )


def _affine_setup(d: int):
    gam = sp.Matrix(sp.symbols(f"gamma0:{d}", positive=True))
    bet = sp.Matrix(sp.symbols(f"beta0:{d}"))
    return gam, bet, sp.diag(*gam)


def _paper_rule_algebra(d: int, gam_values=None) -> int:
    """dim of {Ω ∈ so(d), Ω·1 = 0 : the paper's reader rule W→W·g⁻¹ still preserves W·LN(x)} (linearised).

    Requirement: W·g⁻¹·(D·g·z + β) = W·(D·z + β) ∀z ⊥ 1 → [D, Ω]·z = 0 on 1^⊥ and Ω·β = 0."""
    gam, bet, D = _affine_setup(d)
    if gam_values is not None:
        D = sp.diag(*gam_values)
    O, unknowns = _antisymmetric(d)
    zs = [sp.eye(d)[:, i] - sp.eye(d)[:, i + 1] for i in range(d - 1)]  # basis of 1^⊥
    eqs = list(O * sp.ones(d, 1))
    for z in zs:
        eqs += list((D * O - O * D) * z)
    eqs += list(O * bet) if gam_values is None else []
    eqs = [sp.expand(e) for e in eqs if sp.expand(e) != 0]
    return _solution_dimension(eqs, unknowns)


@derivation("ln-affine-rotation")
@lru_cache(maxsize=1)  # ln-reviewer-no-fix reads its corrected-rule residual: derived once
def ln_affine_rotation() -> Derivation:
    c = claim("ln-affine-rotation")
    d = 4
    paper_dim = _paper_rule_algebra(d)
    const_dim = _paper_rule_algebra(d, gam_values=[2, 2, 2, 2])
    # exact counterexample with the 120° rotation, γ = (1,2,3), β = 0
    x = sym_matrix("x", 3, 1, real=True)
    gam = sp.Matrix([1, 2, 3])
    zero = sp.zeros(3, 1)
    W = sym_matrix("w", 2, 3)
    g = CYCLIC
    paper_resid = sp.simplify(W * g.inv() * _ln(g * x, gam, zero) - W * _ln(x, gam, zero))
    # corrected rule, any dimension (MatrixSymbols): W' = W·D·g⁻¹·D⁻¹, β' = D·g·D⁻¹·β
    m = sp.Symbol("d_model", positive=True, integer=True)
    r = sp.Symbol("m", positive=True, integer=True)
    Dm, gm = sp.MatrixSymbol("D_gamma", m, m), sp.MatrixSymbol("g", m, m)
    Wm, zm, bm = sp.MatrixSymbol("W", r, m), sp.MatrixSymbol("z", m, 1), sp.MatrixSymbol("beta", m, 1)
    corr = sp.simplify(sp.expand(Wm * Dm * gm.I * Dm.I * (Dm * gm * zm + Dm * gm * Dm.I * bm) - Wm * (Dm * zm + bm)))
    corr_zero = corr == 0 or corr == sp.ZeroMatrix(r, 1)
    # explicit exact check of the corrected rule with the same numbers and β ≠ 0
    bet = sp.Matrix([1, -2, 5])
    Dg = sp.diag(*gam)
    g2 = ROT17  # a rotation fixing 1 that is not a permutation
    corr_explicit = sp.simplify(
        W * Dg * g2.inv() * Dg.inv() * _ln(g2 * x, gam, Dg * g2 * Dg.inv() * bet) - W * _ln(x, gam, bet)
    )
    corr_explicit_zero = all(e == 0 for e in corr_explicit)
    so_dim = equivariance_dimension(d, "layernorm")
    # tied embedding/unembedding: E' = E·gᵀ (writer) and E' = E·D_f·gᵀ·D_f⁻¹ (reader) → [g, D_f] = 0
    tied_dim = _paper_rule_algebra(d, gam_values=list(sp.symbols(f"c0:{d}", positive=True)))
    tied_const = _paper_rule_algebra(d, gam_values=[3] * d)
    steps = [
        "Pre-LN reader: y = W·LN(x), LN(x) = D_γ·z + β with z = √d·P·x/‖P·x‖ (z ⊥ 1). Stream rotation x → g·x "
        "with g orthogonal, g·1 = 1, gives z → g·z.",
        "The paper's rule (Ē' = g·Ē, readers W → W·g⁻¹, γ and β unchanged) needs W·g⁻¹·(D_γ·g·z + β) = W·(D_γ·z + β) "
        "∀z ⊥ 1, i.e. [D_γ, Ω]·z = 0 on 1^⊥ and Ω·β = 0 for the generator Ω.",
        f"Solved over so(d) with Ω·1 = 0 (d = {d}, symbolic γ, β): dimension {paper_dim} (the full group has {so_dim}); "
        f"with constant γ = 2·1 and β = 0 it is {const_dim}. For generic γ only a finite group survives "
        "(g must commute with diag(γ): g = diag(±1), and g·1 = 1 forces g = I).",
        f"Exact counterexample, d = 3, γ = (1,2,3), β = 0, g = 120° rotation about (1,1,1): "
        f"W·g⁻¹·LN(g·x) − W·LN(x) = {sp.sstr(paper_resid.T)[:160]}… ≠ 0.",
        f"Corrected reader rule (any dimension, MatrixSymbols): W' = W·D_γ·g⁻¹·D_γ⁻¹, β' = D_γ·g·D_γ⁻¹·β, γ' = γ: "
        f"residual {corr}; exact d = 3 check, g = rotation about (1,1,1) with cos θ = 1/7, γ = (1,2,3), β = (1,−2,5): {sp.sstr(corr_explicit.T)}.",
        f"No rule exists with tied embedding/unembedding: the embedding (writer) needs E' = E·gᵀ, the unembedding "
        f"(reader) E' = E·D_f·gᵀ·D_f⁻¹, so [g, D_f] = 0: algebra dimension {tied_dim} for generic final γ_f "
        f"({tied_const} when γ_f is a constant vector).",
    ]
    claimed_ok = paper_dim == so_dim
    corrected_ok = corr_zero and corr_explicit_zero
    return Derivation(
        claim="ln-affine-rotation",
        title="SO(d_e−1) stream rotation through affine LayerNorm",
        claimed=c.statement,
        verdict=decide(claimed_ok, corrected_ok, substance_kept=corrected_ok and so_dim == (d - 1) * (d - 2) // 2),
        derived="paper's rule survives only for g commuting with diag(γ) (finite group for generic γ); "
        "corrected: W' = W·diag(γ)·g^-1·diag(γ)^-1, β' = diag(γ)·g·diag(γ)^-1·β",
        residual=f"W·g^-1·(diag(γ)·g − g·diag(γ))·z − W·g^-1·(g − I)·β; d=3 instance: {sp.sstr(paper_resid.T)[:120]}…",
        corrected_rule="γ' = γ, β' = diag(γ)·g·diag(γ)^-1·β, every reader W' = W·diag(γ)·gᵀ·diag(γ)^-1 (g orthogonal, "
        "g·1 = 1, γ without zeros); impossible with tied embedding/unembedding unless [g, diag(γ_f)] = 0",
        counterexample="d = 3, γ = (1,2,3), β = 0, g = 120° rotation about (1,1,1) with readers W·g^-1",
        steps=steps,
        data={
            "paper_rule_dimension": paper_dim,
            "rotation_dimension": so_dim,
            "constant_gamma_dimension": const_dim,
            "tied_dimension_generic_gamma": tied_dim,
            "tied_dimension_constant_gamma": tied_const,
            "corrected_residual_zero": corrected_ok,
        },
        exprs=[("corrected rule residual", corr), ("paper rule residual (d=3)", paper_resid)],
    )


@derivation("ln-reviewer-no-fix")
def ln_reviewer_no_fix() -> Derivation:
    c = claim("ln-reviewer-no-fix")
    gam = sp.Matrix(sp.symbols("gamma0:3", positive=True))
    bet = sp.Matrix(sp.symbols("beta0:3"))
    gp = sp.Matrix(sp.symbols("gp0:3"))
    bp = sp.Matrix(sp.symbols("bp0:3"))
    z1, z2 = sp.symbols("z1 z2")
    z = sp.Matrix([z1, z2, -z1 - z2])  # z ⊥ 1

    def solve_for(g, subs=None):
        resid = sp.diag(*gp) * g * z + bp - g * (sp.diag(*gam) * z + bet)
        if subs:
            resid = resid.subs(subs)
        eqs = coefficient_equations(resid, [z1, z2]) + [sp.expand(e) for e in resid.subs({z1: 0, z2: 0})]
        eqs = [e for e in eqs if e != 0]
        return eqs, sp.solve(eqs, list(gp) + list(bp), dict=True)

    eqs, sol = solve_for(ROT17)
    generic_none = sol == []
    _, sol_const = solve_for(ROT17, {gam[0]: 2, gam[1]: 2, gam[2]: 2})
    _, sol_perm = solve_for(CYCLIC)
    restored = ln_affine_rotation().data["corrected_residual_zero"]
    steps = [
        "The review: γ'⊙(g·z) + β' = g·(γ⊙z + β) must hold ∀z ⊥ 1 for the paper's Ē' = g·Ē, and no γ', β' does it.",
        f"Solve for the unknown γ', β' (d = 3, g = rotation about (1,1,1) with cos θ = 1/7, symbolic γ, β): "
        f"solutions {sol} — none for generic γ: {generic_none}.",
        f"With constant γ = 2·1 there is one: {sol_const}.",
        f"Exception: when g permutes coordinates (120° rotation about (1,1,1)) γ, β can be permuted: {sol_perm} — a "
        "finite subgroup only.",
        f"But γ, β need not carry the whole correction: with readers W → W·diag(γ)·gᵀ·diag(γ)⁻¹ and "
        f"β' = diag(γ)·g·diag(γ)⁻¹·β the function is preserved exactly (ln-affine-rotation: {restored}).",
        "So the review's statement holds for transformations of γ, β alone, but the symmetry itself is restored "
        "for untied models; it is lost only with tied embedding/unembedding (generic final γ) or post-LN.",
    ]
    return Derivation(
        claim="ln-reviewer-no-fix",
        title="Review: nothing on γ, β restores the rotation",
        claimed=c.statement,
        verdict=decide(generic_none and not restored, generic_none and restored, substance_kept=generic_none),
        derived="no diagonal γ', β' with γ'⊙(g·z) + β' = g·(γ⊙z + β) for generic γ",
        residual=f"γ', β' equations inconsistent: {len(eqs)} equations, solutions {sol}",
        corrected_rule="true for γ, β alone; the rotation is restored by also transforming the readers: "
        "W' = W·diag(γ)·gᵀ·diag(γ)^-1, β' = diag(γ)·g·diag(γ)^-1·β (untied, pre-LN models)",
        counterexample="g = rotation about (1,1,1) with cos θ = 1/7: no diagonal γ' exists, yet the corrected reader "
        "rule preserves every output",
        steps=steps,
        data={
            "gamma_beta_solutions_generic": len(sol),
            "gamma_beta_solutions_constant": len(sol_const),
            "gamma_beta_solutions_permutation": len(sol_perm),
            "restored_by_readers": restored,
        },
        exprs=[("equations", sp.Matrix(eqs))],
    )
