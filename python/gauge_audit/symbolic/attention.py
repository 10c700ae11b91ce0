"""Attention-head identities: QK and VO actions, head and expert permutations, MoE routing."""

from __future__ import annotations

import sympy as sp

from .lie import attention_symmetry_dim
from .registry import claim, coefficient_equations, derivation, sym_matrix
from .result import FAILS, Derivation, decide

n, d, k, v = sp.symbols("n d_model d_k d_v", positive=True, integer=True)
X = sp.MatrixSymbol("X", n, d)
WQ = sp.MatrixSymbol("W_Q", d, k)
WK = sp.MatrixSymbol("W_K", d, k)
WV = sp.MatrixSymbol("W_V", d, v)
WO = sp.MatrixSymbol("W_O", v, d)
M = sp.MatrixSymbol("M", k, k)
N = sp.MatrixSymbol("N", v, v)
SCORES = X * WQ * (X * WK).T


def _solve_partner(rule_left: sp.Matrix, size: int, name: str, transpose_partner: bool):
    """Solve for the partner transform B (explicit size×size symbols) that makes
    X·W_1·A·(X·W_2·B)ᵀ (or X·W_1·A·B·W_2) invariant for all X, W_1, W_2."""
    B = sym_matrix(name, size, size)
    Xs, W1, W2 = sym_matrix("x", 1, size), sym_matrix("p", size, size), sym_matrix("q", size, size)
    if transpose_partner:
        resid = Xs * W1 * rule_left * (Xs * W2 * B).T - Xs * W1 * (Xs * W2).T
    else:
        resid = Xs * W1 * rule_left * B * W2 - Xs * W1 * W2
    eqs = coefficient_equations(resid, list(Xs) + list(W1) + list(W2))
    sol = sp.solve(eqs, list(B), dict=True)
    return B, eqs, sol


@derivation("qk-gl")
def qk_gl() -> Derivation:
    c = claim("qk-gl")
    new = (X * WQ * M) * (X * WK * M.I.T).T
    resid = sp.simplify(new - SCORES)
    # solve for the key partner of W_Q -> W_Q M at d_k = 2
    A = sym_matrix("m", 2, 2)
    B, eqs, sol = _solve_partner(A, 2, "b", transpose_partner=True)
    solved = B.subs(sol[0]) if len(sol) == 1 else None
    expected = A.inv().T
    solved_ok = solved is not None and sp.simplify(solved - expected) == sp.zeros(2, 2)
    dims = attention_symmetry_dim(2, 2, 4, 2, 2, seed=1)
    steps = [
        "Scores of one head: S = (X·W_Q)(X·W_K)ᵀ = X·W_Q·W_Kᵀ·Xᵀ (MatrixSymbol, any n, d_model, d_k).",
        f"Apply W_Q→W_Q·M, W_K→W_K·M⁻ᵀ: S' = {sp.sstr(new)} = {sp.sstr(new.doit())}.",
        f"Residual S' − S simplifies to {resid}.",
        f"Solve instead of verify (d_k = 2): W_K→W_K·B, unknown B; the invariance for all X, W_Q, W_K gives "
        f"{len(eqs)} coefficient equations with unique solution B = {sp.sstr(solved)} = M⁻ᵀ: {solved_ok}.",
        f"Lie algebra of one layer (h=2, d_model=4, d_k=d_v=2, exact rank over ℚ): dimension {dims.dimension} "
        f"= h(d_k²+d_v²) = {2 * (4 + 4)}.",
    ]
    ok = resid == sp.ZeroMatrix(n, n) or resid == 0
    return Derivation(
        claim="qk-gl",
        title="Query–key GL(d_k) action",
        claimed=c.statement,
        verdict=decide(bool(ok) and solved_ok),
        derived="W_K' = W_K·M^-T for W_Q' = W_Q·M (any invertible M)",
        residual=resid,
        steps=steps,
        data={"solved_partner": sp.sstr(solved), "lie_dimension": dims.dimension},
        exprs=[("scores", SCORES), ("transformed scores", new), ("residual", resid), ("solved partner", solved)],
    )


@derivation("qk-same-action")
def qk_same_action() -> Derivation:
    c = claim("qk-same-action")
    new = (X * WQ * M) * (X * WK * M).T
    resid = sp.expand(new - SCORES)
    factored = X * WQ * (M * M.T - sp.Identity(k)) * WK.T * X.T
    diff = (sp.expand(factored) - resid).doit()
    factored_ok = diff == 0 or isinstance(diff, sp.ZeroMatrix)
    # explicit: the residual vanishes for all X, W iff M Mᵀ = I
    Ms = sym_matrix("m", 2, 2)
    Xs, W1, W2 = sym_matrix("x", 1, 2), sym_matrix("p", 2, 2), sym_matrix("q", 2, 2)
    r = Xs * W1 * Ms * (Xs * W2 * Ms).T - Xs * W1 * (Xs * W2).T
    eqs = coefficient_equations(r, list(Xs) + list(W1) + list(W2))
    mmt = [sp.expand(e) for e in (Ms * Ms.T - sp.eye(2)) if sp.expand(e) != 0]
    condition_is_orthogonality = all(
        any(sp.expand(e - m) == 0 or sp.expand(e + m) == 0 for m in mmt) for e in eqs
    ) and all(any(sp.expand(e - m) == 0 or sp.expand(e + m) == 0 for e in eqs) for m in mmt)
    Mc = sp.diag(2, 1)
    num = (Xs * W1 * Mc * (Xs * W2 * Mc).T - Xs * W1 * (Xs * W2).T)[0]
    inst = {s: 1 for s in list(Xs) + list(W1) + list(W2)}
    num_val = num.subs(inst)
    # the corrected rule (M^-T on keys) has zero residual
    corr = sp.simplify((X * WQ * M) * (X * WK * M.I.T).T - SCORES)
    corr_ok = corr == sp.ZeroMatrix(n, n) or corr == 0
    steps = [
        "Apply the wiki's Theorem-3 rule W_Q→W_Q·M, W_K→W_K·M to the scores.",
        f"Residual S' − S = {sp.sstr(resid)} = X·W_Q·(M·Mᵀ − I)·W_Kᵀ·Xᵀ (checked by expansion: {factored_ok}).",
        f"d_k = 2, all entries symbolic: the {len(eqs)} coefficient equations are exactly the entries of M·Mᵀ − I "
        f"({condition_is_orthogonality}), so the rule works iff M ∈ O(d_k) (dimension d_k(d_k−1)/2, not d_k²).",
        f"Counterexample M = diag(2, 1), X = (1, 1), W_Q = W_K = all-ones: residual = {num_val} ≠ 0.",
        f"The keys need M⁻ᵀ instead: residual {corr} (claim qk-gl).",
    ]
    verdict = decide(False, corr_ok, substance_kept=False) if num_val != 0 else decide(True)
    return Derivation(
        claim="qk-same-action",
        title="Same matrix on queries and keys",
        claimed=c.statement,
        verdict=verdict,
        derived="same-action rule preserves scores iff M·Mᵀ = I",
        residual=sp.sstr(factored),
        corrected_rule="W_Q→W_Q·M, W_K→W_K·M^-T (any M ∈ GL(d_k)); the same-M rule only for M ∈ O(d_k)",
        counterexample=f"M = diag(2,1), x = (1,1), W_Q = W_K = ones(2,2): score changes by {num_val}",
        steps=steps,
        data={"condition_equations": [sp.sstr(e) for e in eqs], "counterexample_residual": int(num_val)},
        exprs=[("residual", factored)],
    )


@derivation("qk-orthogonal-only")
def qk_orthogonal_only() -> Derivation:
    c = claim("qk-orthogonal-only")
    Mc = sp.diag(2, 1)
    Xs, W1, W2 = sym_matrix("x", 1, 2), sym_matrix("p", 2, 2), sym_matrix("q", 2, 2)
    r = sp.simplify(Xs * W1 * Mc * (Xs * W2 * Mc.inv().T).T - Xs * W1 * (Xs * W2).T)
    non_orth = Mc * Mc.T != sp.eye(2)
    dims = attention_symmetry_dim(2, 2, 4, 2, 2, seed=2)
    qk_part = attention_symmetry_dim(2, 2, 4, 2, 2, seed=2).dimension - 2 * 4  # minus VO part h·d_v²
    o_dim = 2 * (2 * 1 // 2)
    steps = [
        "The wiki's table lists the query–key symmetry of GPT-2/BERT/LLaMA/Qwen as O(d_k)^h (Lemma 1: T must be orthogonal).",
        f"Take the non-orthogonal M = diag(2,1) (M·Mᵀ ≠ I: {non_orth}) with W_Q→W_Q·M, W_K→W_K·M⁻ᵀ: the score residual "
        f"(all entries symbolic) is {sp.sstr(r)}.",
        f"Exact Lie-algebra rank (h=2, d_model=4, d_k=d_v=2): the QK part has dimension {qk_part} = h·d_k² = 8, "
        f"while O(d_k)^h has dimension h·d_k(d_k−1)/2 = {o_dim}.",
        "Lemma 1 is right only for the same-action rule W_K→W_K·T (see qk-same-action); the group is GL(d_k)^h.",
    ]
    claimed_ok = not (r == sp.zeros(1, 1) and non_orth) and qk_part == o_dim
    return Derivation(
        claim="qk-orthogonal-only",
        title="Is the QK symmetry only O(d_k)^h?",
        claimed=c.statement,
        verdict=decide(claimed_ok),
        derived=f"QK symmetry algebra dimension per head = d_k² (computed {qk_part // 2} at d_k=2)",
        residual=sp.sstr(r),
        corrected_rule="query–key symmetry is GL(d_k)^h acting by (M, M^-T)",
        counterexample="M = diag(2,1) with W_K → W_K·M^-T leaves every score unchanged",
        steps=steps,
        data={"qk_lie_dimension": qk_part, "orthogonal_dimension": o_dim, "lie_dimension": dims.dimension},
        exprs=[("residual", r)],
    )


@derivation("vo-gl")
def vo_gl() -> Derivation:
    c = claim("vo-gl")
    new = (X * WV * N) * (N.I * WO)
    resid = sp.simplify(new - X * WV * WO)
    A = sym_matrix("n", 2, 2)
    B, eqs, sol = _solve_partner(A, 2, "b", transpose_partner=False)
    solved = B.subs(sol[0]) if len(sol) == 1 else None
    solved_ok = solved is not None and sp.simplify(solved - A.inv()) == sp.zeros(2, 2)
    ok = (resid == sp.ZeroMatrix(n, d) or resid == 0) and solved_ok
    steps = [
        f"Value path of one head: X·W_V·W_O. Apply W_V→W_V·N, W_O→N⁻¹·W_O: {sp.sstr(new)} → {sp.sstr(new.doit())}.",
        f"Residual: {resid}. The attention pattern multiplies on the left and is untouched.",
        f"Solve (d_v = 2): W_O→B·W_O with unknown B; {len(eqs)} coefficient equations give B = {sp.sstr(solved)} = N⁻¹: {solved_ok}.",
    ]
    return Derivation(
        claim="vo-gl",
        title="Value–output GL(d_v) action",
        claimed=c.statement,
        verdict=decide(ok),
        derived="W_O' = N^-1·W_O for W_V' = W_V·N",
        residual=resid,
        steps=steps,
        data={"solved_partner": sp.sstr(solved)},
        exprs=[("residual", resid), ("solved", solved)],
    )


def _head_terms(h: int, perm: list[int], head):
    qs, ks, vs, os_ = (sp.symbols(f"{p}0:{h}") for p in ("q", "k", "v", "o"))
    return sum(head(qs[perm[i]], ks[perm[i]], vs[perm[i]], os_[perm[i]]) for i in range(h)), (qs, ks, vs, os_)


@derivation("head-perm")
def head_perm() -> Derivation:
    c = claim("head-perm")
    head = sp.Function("head")  # any function of one head's own parameters (softmax(X Q Kᵀ Xᵀ) X V O)
    h = 4
    perm = [2, 0, 3, 1]
    base, syms = _head_terms(h, list(range(h)), head)
    permuted, _ = _head_terms(h, perm, head)
    resid = sp.simplify(permuted - base)
    qs, ks, vs, os_ = syms
    broken = sum(head(qs[perm[i]], ks[i], vs[i], os_[i]) for i in range(h)) - base
    steps = [
        "Multi-head attention is a sum over heads of one function of each head's own (W_Q^i, W_K^i, W_V^i, W_O^i).",
        f"Permute all four parameter blocks of h = {h} heads by π = {perm}: residual of the sum = {resid}.",
        f"Permuting only the queries (not the whole head) leaves residual {sp.sstr(broken)} ≠ 0.",
        "S_h is finite: it contributes no dimensions to the symmetry count (cf. count-wiki-log-hfact).",
    ]
    return Derivation(
        claim="head-perm",
        title="Head permutation",
        claimed=c.statement,
        verdict=decide(resid == 0),
        derived="Σ_i head(θ_π(i)) = Σ_i head(θ_i) for every π ∈ S_h (dimension 0)",
        residual=resid,
        steps=steps,
        data={"group_dimension": 0},
        exprs=[("residual", resid)],
    )


def _moe(perm_router, perm_experts, E=3):
    x = sp.Symbol("x", real=True)
    r = sp.symbols(f"r0:{E}", real=True)
    ex = [sp.Function(f"E{i}") for i in range(E)]
    logits = [r[perm_router[i]] * x for i in range(E)]
    Z = sum(sp.exp(t) for t in logits)
    return sum(sp.exp(logits[i]) / Z * ex[perm_experts[i]](x) for i in range(E))


@derivation("moe-expert-perm")
def moe_expert_perm() -> Derivation:
    c = claim("moe-expert-perm")
    ident = [0, 1, 2]
    perm = [1, 2, 0]
    resid = sp.simplify(_moe(perm, perm) - _moe(ident, ident))
    broken = sp.simplify(_moe(ident, perm) - _moe(ident, ident))
    steps = [
        "MoE(x) = Σ_i G(x)_i·E_i(x) with G = softmax(router logits) (top-k keeps the k largest; the selected set is "
        "permuted along with the logits when there are no ties).",
        f"Permute experts and router rows together (E = 3, π = {perm}): residual {resid}.",
        f"Permute experts but not the router: residual {sp.sstr(broken)} ≠ 0.",
        "The group is S_E: |S_E| = E!, finite, so it adds no continuous dimension.",
    ]
    return Derivation(
        claim="moe-expert-perm",
        title="Expert permutation",
        claimed=c.statement,
        verdict=decide(resid == 0 and broken != 0),
        derived="(router rows, experts) → permuted jointly",
        residual=resid,
        steps=steps,
        data={"group_dimension": 0},
        exprs=[("residual", resid)],
    )


@derivation("moe-routing")
def moe_routing() -> Derivation:
    c = claim("moe-routing")
    Wr = sp.MatrixSymbol("W_r", d, sp.Symbol("E", positive=True, integer=True))
    scores_new = sp.simplify((X * WQ * M) * (X * WK * M.I.T).T - SCORES)
    ov_new = sp.simplify((X * WV * N) * (N.I * WO) - X * WV * WO)
    P = sp.Function("softmax")
    A = sp.MatrixSymbol("A", n, n)  # softmax(S): a function of S only, S is unchanged
    attn = A * X * WV * WO
    attn_new = A * (X * WV * N) * (N.I * WO)
    router_resid = sp.simplify((X + attn_new) * Wr - (X + attn) * Wr)
    ok = (
        scores_new in (0, sp.ZeroMatrix(n, n))
        and ov_new in (0, sp.ZeroMatrix(n, d))
        and router_resid in (0, sp.ZeroMatrix(n, Wr.shape[1]))
    )
    steps = [
        f"Under (M, N) ∈ G_max the scores change by {scores_new} and the value circuit by {ov_new}, so A = {P}(S/√d_k) "
        "and the attention output are unchanged.",
        f"The router reads the hidden state X + Attn(X): router logits residual = {router_resid}; "
        "softmax and top-k of identical logits are identical.",
        "Caveat: for stream rotations (van Nierop's g(0)) the router is a reader and must transform as W_r→g·W_r; "
        "MGS's G_max acts inside attention only, so the claim as stated holds.",
    ]
    return Derivation(
        claim="moe-routing",
        title="MoE routing invariance",
        claimed=c.statement,
        verdict=decide(ok),
        derived="router logits unchanged under every (M, N) ∈ G_max",
        residual=router_resid,
        steps=steps,
        exprs=[("router residual", router_resid)],
    )


__all__ = [
    "qk_gl",
    "qk_same_action",
    "qk_orthogonal_only",
    "vo_gl",
    "head_perm",
    "moe_expert_perm",
    "moe_routing",
    "FAILS",
]
