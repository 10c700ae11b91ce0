"""Families of models whose sublayer outputs are normed and which have no pre-norms (OLMo 2:
x ↦ x + n(f(x)), ``norm_placement="output"``).

The residual stream is written by the embedding and by γ⊙n(y) of every output norm, and read raw
by every sublayer and by the final norm.  A stream map x ↦ x·T must pass through the final norm,
n(x·T) = n(x)·T' — only for T = c·Q with Q orthogonal — and through every output norm,
diag(γ)·T = T·diag(γ'), which for generic distinct γ leaves T diagonal: together only T = c·I
(and signs).  So the stream keeps just its scale (ε-broken: n(c·x) = n(x) only at ε = 0), and each
normed sublayer output its own scale (W_O or W_out ×c, ε-broken).  What is exact lives inside the
sublayers (vo-gl, FFN scaling, the QK-norm's weight scaling).
"""

from __future__ import annotations

from ..measure import Problem
from .base import Family, Rows, make_family


def output_norm_families(problem: Problem) -> list[Family]:
    cfg, p, layout = problem.cfg, problem.params(), problem.layout
    eps_kind = "exact" if cfg.norm_eps == 0 else "eps-broken"
    R = Rows(layout)
    for i in range(cfg.n_layers):
        for sub in ("attn", "mlp"):
            v = R.new()
            for name in ("W_O", "b_O") if sub == "attn" else ("W_out", "b_out"):
                key = f"blocks.{i}.{sub}.{name}"
                if key in p:
                    R.at(v, key)[...] = p[key]
    fams = []
    if "ln_final.w" in p and "unembed.W_U" in p:  # untied: the final norm's γ folds into W_U's rows
        R_f = Rows(layout)
        for i in range(cfg.d_model):
            v = R_f.new()
            R_f.at(v, "ln_final.w")[i] = p["ln_final.w"][i]
            R_f.at(v, "unembed.W_U")[i] = -p["unembed.W_U"][i]
        fams.append(
            make_family(
                layout,
                "final-norm-scale",
                "d",
                cfg.d_model,
                R_f,
                """The final norm's γ_i and row i of the unembedding trade a factor:
                                diag(γ)·W_U = diag(γ·s)·diag(1/s)·W_U.  (The output norms' γ cannot: they
                                write into the stream.)""",
            )
        )
    fams.append(
        make_family(
            layout,
            "output-norm-input-scale",
            "2L",
            2 * cfg.n_layers,
            R,
            """n(c·y) = n(y) at ε = 0: the closing projection of a sublayer whose output is normed
                        (W_O, b_O; W_out, b_out) can be scaled freely.  Exact only at ε = 0.""",
            kind=eps_kind,
        )
    )
    # every writer ×c (W_E, the output norms' γ) and every reader of the raw stream ×1/c (the
    # sublayers' input projections; their biases add after the product and stay): each sublayer
    # sees what it saw, so only the final norm meets c·x
    R = Rows(layout)
    v = R.new()
    R.at(v, "embed.W_E")[...] = p["embed.W_E"]
    for i in range(cfg.n_layers):
        for n in ("ln1", "ln2"):
            if f"blocks.{i}.{n}.w" in p:
                R.at(v, f"blocks.{i}.{n}.w")[...] = p[f"blocks.{i}.{n}.w"]
        for n in (
            "attn.W_Q",
            "attn.W_K",
            "attn.W_V",
            "mlp.W_in",
            "mlp.W_gate",
            "moe.W_in",
            "moe.W_gate",
            "moe.W_router",
        ):
            if f"blocks.{i}.{n}" in p:
                R.at(v, f"blocks.{i}.{n}")[...] = -p[f"blocks.{i}.{n}"]
    if cfg.tied:  # W_E is also the unembedding: the final norm's γ takes the 1/c back
        if "ln_final.w" not in p:
            return fams
        R.at(v, "ln_final.w")[...] = -p["ln_final.w"]
    fams.append(
        make_family(
            layout,
            "stream-scale",
            "1",
            1,
            R,
            """Every writer ×c (the embedding and the output norms' γ) scales the stream and
                            every reader of the raw stream ×1/c (W_Q, W_K, W_V, W_in, W_gate, the router):
                            each sublayer sees what it saw, and the final norm divides c out, exactly only
                            when ε = 0.  The stream rotation is blocked: diag(γ)·R = R·diag(γ')
                            for every output norm forces R diagonal.""",
            kind=eps_kind,
        )
    )
    return fams
