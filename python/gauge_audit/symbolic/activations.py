"""Feed-forward nonlinearities: which per-neuron scalings are symmetries."""

from __future__ import annotations

import sympy as sp

from .registry import claim, derivation
from .result import Derivation, decide

x = sp.Symbol("x", real=True)
t = sp.Symbol("t", positive=True)
c = sp.Symbol("c", positive=True)


def relu(u):
    return sp.Max(0, u)


def gelu(u):
    return u * (1 + sp.erf(u / sp.sqrt(2))) / 2


def silu(u):
    return u / (1 + sp.exp(-u))


def homogeneity_residual(f, u, scale):
    return f(scale * u) - scale * f(u)


def scaling_algebra_dim(f, d_ff: int = 3) -> int:
    """Dimension of the per-neuron scalings c_i (generator s_i) with f(c·u) = c·f(u) to first order:
    d/dc [f(c u) − c f(u)] at c = 1 is u·f'(u) − f(u); each neuron contributes 1 iff this vanishes (u ≠ 0)."""
    gen = sp.simplify(x * sp.diff(f(x), x) - f(x))
    vanishes = all(sp.simplify(gen.subs(x, v)) == 0 for v in (t, -t))
    return d_ff if vanishes else 0


@derivation("relu-forces-identity")
def relu_forces_identity() -> Derivation:
    cl = claim("relu-forces-identity")
    d_ff = int(cl.params.get("d_ff", 3))
    pos = sp.simplify(homogeneity_residual(relu, t, c))
    neg = sp.simplify(homogeneity_residual(relu, -t, c))
    # the FFN block W2·diag(c)^-1·relu(diag(c)·W1·u) with symbolic positive c_i
    cs = sp.symbols(f"c0:{d_ff}", positive=True)
    hs = sp.symbols(f"h0:{d_ff}", real=True)  # pre-activations W1·u
    w2 = sp.symbols(f"w0:{d_ff}", real=True)  # one output row of W2
    block = sum(w2[i] / cs[i] * relu(cs[i] * hs[i]) for i in range(d_ff)) - sum(
        w2[i] * relu(hs[i]) for i in range(d_ff)
    )
    block_cases = [
        sp.simplify(
            block.subs(
                {hs[i]: (s if (mask >> i) & 1 else -s) for i, s in enumerate(sp.symbols(f"s0:{d_ff}", positive=True))}
            )
        )
        for mask in range(2**d_ff)
    ]
    block_zero = all(b == 0 for b in block_cases)
    g_val = sp.nsimplify(homogeneity_residual(gelu, 1, 2))
    s_val = sp.simplify(homogeneity_residual(silu, 1, 2))
    dims = {
        "relu": scaling_algebra_dim(relu, d_ff),
        "gelu": scaling_algebra_dim(gelu, d_ff),
        "silu": scaling_algebra_dim(silu, d_ff),
    }
    neg_scale = sp.simplify(relu(-1 * t) - (-1) * relu(t))
    steps = [
        "Paper: f(0) scales the first FFN layer, f(1) the second; the nonlinearity is claimed to force f(0) = f(1) = 1.",
        f"ReLU(c·u) − c·ReLU(u) for c > 0: u = t > 0 gives {pos}, u = −t < 0 gives {neg}: ReLU is positively homogeneous.",
        f"FFN block with f(0) = diag(c_1..c_{d_ff}) (all c_i > 0 symbolic) and f(1) = f(0)⁻¹: residual over all "
        f"{2**d_ff} sign patterns of the pre-activations = 0: {block_zero}.",
        f"Negative scalings are not allowed: ReLU(−t) + ReLU(t) = {neg_scale} ≠ 0.",
        f"GELU(2·1) − 2·GELU(1) = {g_val} = {sp.N(g_val, 6)} ≠ 0; SiLU: {sp.N(s_val, 6)} ≠ 0.",
        f"Linearised per-neuron scaling algebra (u·f'(u) − f(u) ≡ 0?), d_ff = {d_ff}: {dims}.",
        "So for ReLU the group is (ℝ_{>0})^{d_ff} per layer (plus permutations), not {1}; for GELU/SiLU only "
        "permutations remain (f(0) = 1 up to permutation is right there).",
    ]
    claimed_ok = dims["relu"] == 0
    return Derivation(
        claim="relu-forces-identity",
        title="Does the FFN nonlinearity force f(0) = f(1) = 1?",
        claimed=cl.statement,
        verdict=decide(claimed_ok),
        derived="ReLU admits f(0) = diag(c), c_i > 0, f(1) = f(0)^-1",
        residual=f"ReLU(c·u) − c·ReLU(u) = {pos} (u > 0), {neg} (u < 0)",
        corrected_rule="f(0) = positive diagonal, f(1) = f(0)^-1 (ReLU): +d_ff dimensions per layer; "
        "f(0) = 1 up to permutation only for GELU/SiLU",
        counterexample="c = 2: ReLU(2u) = 2·ReLU(u) for every u",
        steps=steps,
        data={"scaling_dimension": dims, "gelu_residual": str(sp.N(g_val, 10))},
        exprs=[("ReLU residual", pos), ("GELU residual at u=1, c=2", g_val)],
    )
