"""The gauge actions re-implemented on nested lists, in exact or arbitrary precision.

Each rule takes the parameters as a ``dict[str, nested list]`` (numbers: ``Fraction``
for exact rational arithmetic, ``mpf`` at the working precision) and a group element
whose entries are numbers of the same kind, and returns new parameters; inputs are
never mutated.  The rules mirror :mod:`gauge_audit.actions` but share no code with
them: inverses are computed here by Gauss–Jordan elimination at the working precision
(or exactly), so a true symmetry is reproduced to ≈ κ·2^-prec rather than to the
float64 rounding of a torch-transformed checkpoint.

Group elements come from the torch samplers (same seed → same element); their float64
entries are taken as exact numbers.  The one exception is a stream rotation: a float64
R is orthogonal only to ~1e-16, so :func:`exact_rotation` replaces it by the nearby
Cayley rotation (I − A)(I + A)⁻¹ (A the skew part of R's inverse Cayley transform,
projected onto 1^⊥ for LayerNorm), which is orthogonal and fixes the all-ones vector
exactly in rationals and to the working precision in mpf.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import GaugeAuditError
from ..models.config import Config
from .linalg import add, cayley, identity, inverse, matmul, scale, sub, transpose, vecmat

Rule = Callable[[Config, dict, dict], dict]


# ----------------------------------------------------------------------------- helpers
def _is_vec(t) -> bool:
    return not (t and isinstance(t[0], list))


def _is_mat(t) -> bool:
    return bool(t) and isinstance(t[0], list) and _is_vec(t[0])


def right(t, m):
    """Every last-axis vector v of ``t`` ↦ v·m."""
    return vecmat(t, m) if _is_vec(t) else [right(x, m) for x in t]


def left(m, t):
    """Every trailing matrix W of ``t`` (axis −2 being the one ``m`` acts on) ↦ m·W."""
    return matmul(m, t) if _is_mat(t) else [left(m, x) for x in t]


def _ffn(cfg: Config, l: int) -> str:
    return f"blocks.{l}.{'moe' if cfg.experts else 'mlp'}"


def _inv_t(m: list) -> list:
    return transpose(inverse(m))


def norm_readers(cfg: Config, P: dict) -> dict[str, list[tuple[str, str | None]]]:
    """Pre-norm models: norm → [(reader weight, reader bias or None)] (d_model at axis −2)."""
    out: dict[str, list] = {}
    for l in range(cfg.n_layers):
        a, f = f"blocks.{l}.attn", _ffn(cfg, l)
        out[f"blocks.{l}.ln1"] = [(f"{a}.W_{c}", f"{a}.b_{c}") for c in "QKV"]
        out[f"blocks.{l}.ln2"] = [(f"{f}.W_in", f"{f}.b_in")]
        if cfg.act == "swiglu":
            out[f"blocks.{l}.ln2"].append((f"{f}.W_gate", f"{f}.b_gate"))
        if cfg.experts:
            out[f"blocks.{l}.ln2"].append((f"{f}.W_router", None))
    if not cfg.tied:
        out["ln_final"] = [("unembed.W_U", "unembed.b_U")]
    return {k: [(w, b if b in P else None) for w, b in v] for k, v in out.items()}


def stream_writers(cfg: Config, P: dict) -> list[str]:
    names = ["embed.W_E", "embed.W_pos"]
    for l in range(cfg.n_layers):
        names += [f"blocks.{l}.attn.W_O", f"blocks.{l}.attn.b_O", f"{_ffn(cfg, l)}.W_out", f"{_ffn(cfg, l)}.b_out"]
    return [n for n in names if n in P]


def exact_rotation(r0: list, cfg: Config | None = None, fix_ones: bool | None = None) -> list:
    """An exactly orthogonal rotation next to the (float) rotation ``r0``; for LayerNorm
    models (or ``fix_ones``) it also fixes the all-ones vector exactly.  Numbers keep r0's type."""
    d = len(r0)
    one = r0[0][0] * 0 + 1
    eye = identity(d, one, one * 0)
    a0 = matmul(sub(eye, r0), inverse(add(eye, r0)))  # inverse Cayley: skew up to rounding
    a = scale(sub(a0, transpose(a0)), one / 2)
    if fix_ones is None:
        assert cfg is not None  # without fix_ones the configuration's norm decides
        fix_ones = cfg.norm.startswith("layernorm")
    if fix_ones:
        p = [[(one if i == j else one * 0) - one / d for j in range(d)] for i in range(d)]
        a = matmul(matmul(p, a), p)  # A·1 = 0 ⇒ R·1 = 1
    return cayley(a)


def _check_applies(cfg: Config, name: str) -> None:
    from ..actions import get_action

    reason = get_action(name).applies(cfg) if name in _TORCH_NAMES else None
    if reason:
        raise GaugeAuditError(f"rule {name} does not apply to this model: {reason}")


# ----------------------------------------------------------------------------- attention rules
def _qk(cfg: Config, P: dict, m_query: list, m_key: list) -> dict:
    """W_Q[h] ↦ W_Q[h]·m_query[l][h], W_K[j] ↦ W_K[j]·m_key[l][j] (and the biases)."""
    out = dict(P)
    for l in range(cfg.n_layers):
        a = f"blocks.{l}.attn"
        for c, ms in (("Q", m_query[l]), ("K", m_key[l])):
            for kind in ("W", "b"):
                key = f"{a}.{kind}_{c}"
                if key in P:
                    out[key] = [right(t, m) for t, m in zip(P[key], ms)]
    return out


def _per_query(cfg: Config, m: list) -> list:
    return [[m[l][h // cfg.group_size] for h in range(cfg.n_heads)] for l in range(cfg.n_layers)]


def qk_gl(cfg: Config, P: dict, el: dict) -> dict:
    """W_Q[h] ↦ W_Q[h]·M_j, b_Q[h] ↦ b_Q[h]·M_j (j the KV head of h); W_K[j] ↦ W_K[j]·M_j⁻ᵀ."""
    m = el["M"]
    return _qk(cfg, P, _per_query(cfg, m), [[_inv_t(x) for x in ml] for ml in m])


def qk_same_action(cfg: Config, P: dict, el: dict) -> dict:
    """FALSE (wiki): W_Q ↦ W_Q·M and W_K ↦ W_K·M with the same M."""
    m = el["M"]
    return _qk(cfg, P, _per_query(cfg, m), m)


def qk_gl_untied_gqa(cfg: Config, P: dict, el: dict) -> dict:
    """FALSE (GQA): W_Q[h] ↦ W_Q[h]·M_h per query head, the shared key by the group's first M⁻ᵀ."""
    m = el["M"]
    firsts = [[_inv_t(ml[j * cfg.group_size]) for j in range(cfg.n_kv_heads)] for ml in m]
    return _qk(cfg, P, m, firsts)


def vo_gl(cfg: Config, P: dict, el: dict) -> dict:
    """W_V[j] ↦ W_V[j]·N_j, b_V[j] ↦ b_V[j]·N_j, W_O[h] ↦ N_j⁻¹·W_O[h]."""
    out = dict(P)
    for l in range(cfg.n_layers):
        a, n = f"blocks.{l}.attn", el["N"][l]
        for kind in ("W", "b"):
            key = f"{a}.{kind}_V"
            if key in P:
                out[key] = [right(t, x) for t, x in zip(P[key], n)]
        inv = [inverse(x) for x in n]
        out[f"{a}.W_O"] = [matmul(inv[h // cfg.group_size], w) for h, w in enumerate(P[f"{a}.W_O"])]
    return out


def head_perm(cfg: Config, P: dict, el: dict) -> dict:
    """KV heads re-indexed by kv_perm (with the query heads they serve), query heads
    within each group by q_perm; W_Q, b_Q, W_O along the query axis, W_K, b_K, W_V, b_V along KV."""
    out = dict(P)
    g = cfg.group_size
    for l in range(cfg.n_layers):
        a, kv, qp = f"blocks.{l}.attn", el["kv_perm"][l], el["q_perm"][l]
        q_index = [kv[j] * g + qp[j][r] for j in range(cfg.n_kv_heads) for r in range(g)]
        for c, idx in (("Q", q_index), ("O", q_index), ("K", kv), ("V", kv)):
            for kind in ("W", "b"):
                key = f"{a}.{kind}_{c}"
                if key in P and not (c == "O" and kind == "b"):
                    out[key] = [P[key][i] for i in idx]
    return out


def key_bias_shift(cfg: Config, P: dict, el: dict) -> dict:
    """b_K[j] ↦ b_K[j] + c_j."""
    out = dict(P)
    for l in range(cfg.n_layers):
        key = f"blocks.{l}.attn.b_K"
        out[key] = add(P[key], el["c"][l])
    return out


def value_bias_fold(cfg: Config, P: dict, el: dict) -> dict:
    """b_V[j] ↦ b_V[j] + c_j and b_O ↦ b_O − Σ_h c_{j(h)}·W_O[h]."""
    out = dict(P)
    for l in range(cfg.n_layers):
        a, c = f"blocks.{l}.attn", el["c"][l]
        out[f"{a}.b_V"] = add(P[f"{a}.b_V"], c)
        b_o = P[f"{a}.b_O"]
        for h, w in enumerate(P[f"{a}.W_O"]):
            b_o = sub(b_o, vecmat(c[h // cfg.group_size], w))
        out[f"{a}.b_O"] = b_o
    return out


# ----------------------------------------------------------------------------- stream / norm rules
def norm_scale(cfg: Config, P: dict, el: dict) -> dict:
    """γ ↦ γ⊙s, β ↦ β⊙s, readers W ↦ diag(s)⁻¹·W."""
    out = dict(P)
    readers = norm_readers(cfg, P)
    for norm, s in el.items():
        for t in ("w", "b"):
            key = f"{norm}.{t}"
            if key in P:
                out[key] = [x * y for x, y in zip(P[key], s)]
        d_inv = [[(1 / s[i] if i == j else s[i] * 0) for j in range(len(s))] for i in range(len(s))]
        for w, _ in readers[norm]:
            out[w] = left(d_inv, P[w])
    return out


def _minus_delta_w(b, delta, w):
    """b − δ·W over leading (head / expert) axes."""
    if _is_vec(b):
        return sub(b, vecmat(delta, w))
    return [_minus_delta_w(x, delta, y) for x, y in zip(b, w)]


def norm_shift(cfg: Config, P: dict, el: dict) -> dict:
    """β ↦ β + δ and every reader bias b ↦ b − δ·W."""
    out = dict(P)
    readers = norm_readers(cfg, P)
    for norm, delta in el.items():
        out[f"{norm}.b"] = add(P[f"{norm}.b"], delta)
        for w, b in readers[norm]:
            if b is None:
                raise GaugeAuditError(f"{norm} has a reader {w} without a bias")
            out[b] = _minus_delta_w(P[b], delta, P[w])
    return out


def _rotate_writers(cfg: Config, P: dict, r: list) -> dict:
    out = dict(P)
    for w in stream_writers(cfg, P):
        out[w] = right(P[w], r)
    return out


def stream_rotation(cfg: Config, P: dict, el: dict) -> dict:
    """Writers W ↦ W·R; per norm, C = D_γ⁻¹·R·D_γ (R without γ): β ↦ β·C, readers W ↦ C⁻¹·W."""
    r = el["R"]
    out = _rotate_writers(cfg, P, r)
    for norm, readers in norm_readers(cfg, P).items():
        gamma = P.get(f"{norm}.w")
        c = r if gamma is None else [[r[i][k] * gamma[k] / gamma[i] for k in range(len(r))] for i in range(len(r))]
        if f"{norm}.b" in P:
            out[f"{norm}.b"] = vecmat(P[f"{norm}.b"], c)
        c_inv = inverse(c)
        for w, _ in readers:
            out[w] = left(c_inv, P[w])
    return out


def stream_rotation_paper(cfg: Config, P: dict, el: dict) -> dict:
    """FALSE with affine norms (van Nierop eqs. 6–13): writers W ↦ W·R, readers W ↦ Rᵀ·W,
    γ and β unchanged."""
    r = el["R"]
    out = _rotate_writers(cfg, P, r)
    rt = transpose(r)
    for readers in norm_readers(cfg, P).values():
        for w, _ in readers:
            out[w] = left(rt, P[w])
    return out


# ----------------------------------------------------------------------------- FFN rules
def _hidden_in(cfg: Config, P: dict, l: int, names=("W_in", "b_in", "W_gate", "b_gate")) -> list[str]:
    return [f"{_ffn(cfg, l)}.{n}" for n in names if f"{_ffn(cfg, l)}.{n}" in P]


def _perm_last(t, p):
    return [t[i] for i in p] if _is_vec(t) else [_perm_last(x, p) for x in t]


def _perm_rows(t, p):
    return [t[i] for i in p] if _is_mat(t) else [_perm_rows(x, p) for x in t]


def _lead(t, p, fn):
    """Apply fn(t_e, p_e) per expert when p carries an expert axis."""
    return fn(t, p) if not isinstance(p[0], list) else [fn(x, q) for x, q in zip(t, p)]


def ffn_perm(cfg: Config, P: dict, el: dict) -> dict:
    """Hidden neuron i ↦ π(i): columns of W_in/W_gate, entries of b_in/b_gate, rows of W_out."""
    out = dict(P)
    for l in range(cfg.n_layers):
        p = el["perm"][l]
        for key in _hidden_in(cfg, P, l):
            out[key] = _lead(P[key], p, _perm_last)
        key = f"{_ffn(cfg, l)}.W_out"
        out[key] = _lead(P[key], p, _perm_rows)
    return out


def _scale_last(t, s):
    return [x * y for x, y in zip(t, s)] if _is_vec(t) else [_scale_last(x, s) for x in t]


def _unscale_rows(t, s):
    return [[x / si for x in row] for row, si in zip(t, s)] if _is_mat(t) else [_unscale_rows(x, s) for x in t]


def _scale_hidden(cfg: Config, P: dict, el: dict, names: tuple) -> dict:
    out = dict(P)
    for l in range(cfg.n_layers):
        s = el["s"][l]
        for key in _hidden_in(cfg, P, l, names):
            out[key] = _lead(P[key], s, _scale_last)
        key = f"{_ffn(cfg, l)}.W_out"
        out[key] = _lead(P[key], s, _unscale_rows)
    return out


def relu_scaling(cfg: Config, P: dict, el: dict) -> dict:
    """W_in[:, i] ↦ s_i·W_in[:, i], b_in[i] ↦ s_i·b_in[i], W_out[i, :] ↦ W_out[i, :]/s_i."""
    return _scale_hidden(cfg, P, el, ("W_in", "b_in"))


gelu_scaling = relu_scaling  # FALSE: the same rule on a GELU FFN
swiglu_scaling = relu_scaling  # the up projection W_in carries s; the gate is untouched


def expert_perm(cfg: Config, P: dict, el: dict) -> dict:
    """Expert e ↦ π(e): router columns and every stacked expert tensor."""
    out = dict(P)
    for l in range(cfg.n_layers):
        pre, p = _ffn(cfg, l), el["perm"][l]
        out[f"{pre}.W_router"] = [[row[i] for i in p] for row in P[f"{pre}.W_router"]]
        for n in ("W_in", "b_in", "W_gate", "b_gate", "W_out", "b_out"):
            key = f"{pre}.{n}"
            if key in P:
                out[key] = [P[key][i] for i in p]
    return out


RULES: dict[str, Rule] = {
    "qk-gl": qk_gl,
    "vo-gl": vo_gl,
    "head-perm": head_perm,
    "key-bias-shift": key_bias_shift,
    "value-bias-fold": value_bias_fold,
    "qk-same-action": qk_same_action,
    "qk-gl-rope-generic": qk_gl,
    "qk-gl-untied-gqa": qk_gl_untied_gqa,
    "norm-scale": norm_scale,
    "norm-shift": norm_shift,
    "stream-rotation": stream_rotation,
    "stream-rotation-paper": stream_rotation_paper,
    "ffn-perm": ffn_perm,
    "relu-scaling": relu_scaling,
    "swiglu-scaling": swiglu_scaling,
    "gelu-scaling": gelu_scaling,
    "expert-perm": expert_perm,
}
_TORCH_NAMES = frozenset(RULES)


def exact_element(name: str, cfg: Config, parts: dict, num: Callable) -> dict:
    """A torch :class:`~gauge_audit.actions.Element`'s parts as nested lists of exact
    numbers (``num`` maps a Python float; integer parts stay ints).  Norm-keyed parts
    (norm-scale, norm-shift) keep their norm names; rotations are made exactly orthogonal."""
    out = {}
    for k, v in parts.items():
        data = v.detach().cpu().tolist() if hasattr(v, "detach") else v
        if hasattr(v, "is_floating_point") and not v.is_floating_point():
            out[k] = data
        else:
            out[k] = _leaves(data, num)
    if name in ("stream-rotation", "stream-rotation-paper"):
        out["R"] = exact_rotation(out["R"], cfg)
    return out


def _leaves(a, fn):
    return [_leaves(x, fn) for x in a] if isinstance(a, list) else fn(a)


def apply_rule(name: str, cfg: Config, P: dict, el: dict) -> dict:
    """Apply the named rule (see :data:`RULES`) to nested-list parameters."""
    try:
        rule = RULES[name]
    except KeyError:
        raise GaugeAuditError(f"no exact re-implementation of {name!r}; known: {', '.join(RULES)}") from None
    _check_applies(cfg, name)
    return rule(cfg, P, el)
