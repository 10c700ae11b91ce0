"""Certified counterexamples: interval arithmetic on exactly representable inputs.

For every false rule a small model is built from a seed, and its parameters, inputs
and group element are rounded to dyadic rationals (exactly representable, so there is
no "up to rounding" left in the data).  The rule is then applied in exact rational
arithmetic (:mod:`.transforms` on ``Fraction``), both parameter sets are evaluated
with ``mpmath.iv`` interval arithmetic (:data:`.block.IV`; GELU's erf by a rigorous
alternating-series enclosure), and the output difference y' − y is an interval that is
guaranteed to contain the exact real difference.  If some entry's interval excludes 0,
the function has changed: a proof, not a measurement.

As a control, the corrected rule on the same rational data gives intervals that all
contain 0 (and are as narrow as the working precision allows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from fractions import Fraction

import torch
from mpmath import mp

from ..actions import ACTIONS
from ..errors import GaugeAuditError
from ..models import attn as attn_family
from ..models import build_config, gpt2
from ..models.config import Config
from ..runtime import generator
from .block import IV, ends, forward, workdps
from .linalg import flatten, identity, matmul, transpose
from .transforms import apply_rule, exact_rotation

GRID = 32  # parameters and inputs rounded to multiples of 1/32
ELEMENT_GRID = 16  # group elements to multiples of 1/16
CERT_DPS = 30


@dataclass
class Certificate:
    rule: str
    claim: str
    model: str  # the small config, in words
    dps: int
    entry: list[int]  # (batch, token, feature) of the certified entry
    interval: list[str]  # [lo, hi] of y'_entry − y_entry, exact decimal strings
    lower_magnitude: float  # min |x| over the interval (> 0 ⇔ excludes 0)
    width: float  # hi − lo: the enclosure's own uncertainty
    output_scale: float  # max |y| (upper bounds), to read the interval relative to
    excludes_zero: bool
    entries_excluding_zero: int  # how many output entries are certified changed
    entries: int
    element: str  # the rational element, in words
    exact_facts: list[str] = field(default_factory=list)
    control_rule: str | None = None
    control_contains_zero: bool | None = None
    control_max_abs: float | None = None  # max over entries of max |x| in the control intervals

    @property
    def verdict(self) -> str:
        return "FAILS" if self.excludes_zero else "INCONCLUSIVE"

    def to_json(self) -> dict:
        return {**asdict(self), "verdict": self.verdict}

    def render(self) -> str:
        lines = [
            f"{self.rule}: certified counterexample on {self.model} (iv, dps {self.dps})",
            f"  element: {self.element}",
        ]
        lines += [f"  exact: {f}" for f in self.exact_facts]
        lines.append(f"  y'−y at entry {tuple(self.entry)} ∈ [{self.interval[0]}, {self.interval[1]}]")
        lines.append(
            f"  excludes 0: {'yes' if self.excludes_zero else 'NO'}  (|y'−y| ≥ {self.lower_magnitude:.6g}, "
            f"width {self.width:.2g}; "
            f"output scale {self.output_scale:.4g}; {self.entries_excluding_zero}/{self.entries} entries "
            "certified changed)"
        )
        if self.control_rule:
            lines.append(
                f"  control {self.control_rule}: every interval contains 0: "
                f"{'yes' if self.control_contains_zero else 'NO'} (max |·| {self.control_max_abs:.3g})"
            )
        return "\n".join(lines)


# ----------------------------------------------------------------------------- rational data
def _frac(x: float, grid: int) -> Fraction:
    return Fraction(round(x * grid), grid)


def _rational(t, grid: int):
    data = t.detach().cpu().double().tolist() if hasattr(t, "detach") else t
    if isinstance(data, list):
        return [_rational(x, grid) for x in data]
    return _frac(data, grid)


def _mat_str(m: list) -> str:
    return "[" + "; ".join(" ".join(str(x) for x in row) for row in m) + "]"


def _cert_config(rule: str) -> Config:
    if rule in ("qk-same-action",):
        return attn_family.config(d_model=4, n_heads=2, n_kv_heads=2, d_head=2)
    if rule == "qk-gl-rope-generic":
        return attn_family.config(d_model=4, n_heads=1, n_kv_heads=1, d_head=4, pos="rope", attn_bias=False)
    if rule == "qk-gl-untied-gqa":
        return attn_family.config(d_model=4, n_heads=2, n_kv_heads=1, d_head=2)
    if rule in ("stream-rotation-paper", "gelu-scaling"):
        return gpt2.config(d_model=4, n_heads=2, n_kv_heads=2, d_head=2, d_ff=8, n_layers=1, vocab=8, n_ctx=3)
    raise GaugeAuditError(f"no certified counterexample for {rule!r}; known: {', '.join(CERTIFIABLE)}")


def _describe(cfg: Config) -> str:
    bits = [cfg.family, f"d_model={cfg.d_model}", f"heads={cfg.n_heads}/{cfg.n_kv_heads}kv", f"d_head={cfg.d_head}"]
    if not cfg.attention_only:
        bits += [f"d_ff={cfg.d_ff}", cfg.norm, cfg.act]
    if cfg.pos == "rope":
        bits.append(f"RoPE({cfg.rope_style})")
    return " ".join(bits)


def _inputs(cfg: Config, seed: int) -> dict:
    g = generator(seed)
    n = 3
    if cfg.attention_only:
        return {"x": _rational(torch.randn(1, n, cfg.d_model, generator=g, dtype=torch.float64), 4)}
    return {"tokens": torch.randint(0, cfg.vocab, (1, n), generator=g).tolist()}


def _element(rule: str, cfg: Config, params: Mapping, seed: int) -> tuple[dict, str, list[str]]:
    """A rational group element from the torch sampler (rounded), and facts checked exactly."""
    el = ACTIONS[rule].sample(cfg, params, generator(seed + 1), 4.0)
    if rule == "stream-rotation-paper":
        r = exact_rotation(_rational(el.parts["R"], ELEMENT_GRID), cfg)
        d = len(r)
        facts = []
        if matmul(transpose(r), r) != identity(d, Fraction(1), Fraction(0)):
            raise GaugeAuditError("internal: the Cayley rotation is not exactly orthogonal")  # pragma: no cover
        facts.append("RᵀR = I (exact rational arithmetic)")
        if [sum(row) for row in r] != [1] * d:
            raise GaugeAuditError("internal: the Cayley rotation does not fix the all-ones vector")  # pragma: no cover
        facts.append("R·1 = 1, det R = +1 (Cayley transform of a skew A with A·1 = 0): R ∈ SO(d−1) on 1^⊥")
        return {"R": r}, f"Cayley rotation R = {_mat_str(r)}", facts
    if rule == "gelu-scaling":
        s = [[max(x, Fraction(1, ELEMENT_GRID)) for x in row] for row in _rational(el.parts["s"], ELEMENT_GRID)]
        return {"s": s}, "s = [" + " ".join(str(x) for x in s[0]) + "]", ["s > 0 (the ReLU rule's positive scaling)"]
    m = _rational(el.parts["M"], ELEMENT_GRID)
    return {"M": m}, "M = " + ", ".join(_mat_str(x) for x in m[0]), ["M invertible (exact Gauss–Jordan)"]


def _control(rule: str, cfg: Config, el: dict) -> tuple[str, Config, dict] | None:
    """The corrected rule on the same rational data."""
    if rule == "qk-same-action":
        return "qk-gl (W_K·M⁻ᵀ)", cfg, el
    if rule == "qk-gl-rope-generic":
        half = cfg.d_head // 2
        planes = (
            [(i, i + half) for i in range(half)]
            if cfg.rope_style == "half"
            else [(2 * i, 2 * i + 1) for i in range(half)]
        )

        def project(m):
            p = [[Fraction(0)] * len(m) for _ in m]
            for i, j in planes:
                a, b = (m[i][i] + m[j][j]) / 2, (m[i][j] - m[j][i]) / 2
                p[i][i], p[j][j], p[i][j], p[j][i] = a, a, b, -b
            return p

        return (
            "qk-gl with M projected onto the RoPE commutant",
            cfg,
            {"M": [[project(m) for m in ml] for ml in el["M"]]},
        )
    if rule == "qk-gl-untied-gqa":
        g = cfg.group_size
        tied = [[ml[(h // g) * g] for h in range(cfg.n_heads)] for ml in el["M"]]
        return "one M per KV group (tied)", cfg, {"M": tied}
    if rule == "stream-rotation-paper":
        return "stream-rotation (β·C, C⁻¹·W with C = D_γ⁻¹RD_γ)", cfg, el
    if rule == "gelu-scaling":
        return "relu-scaling on the same data with ReLU", cfg.with_(act="relu"), el
    return None  # pragma: no cover


_CONTROL_RULE = {
    "qk-same-action": "qk-gl",
    "qk-gl-rope-generic": "qk-gl",
    "qk-gl-untied-gqa": "qk-gl-untied-gqa",
    "stream-rotation-paper": "stream-rotation",
    "gelu-scaling": "relu-scaling",
}


def _diff_intervals(cfg: Config, P: dict, Q: dict, inputs: dict) -> tuple[list, float]:
    y0 = forward(cfg, P, inputs, IV)
    y1 = forward(cfg, Q, inputs, IV)
    scale = max(_mag(v) for v in flatten(y0))
    return [[[u - v for u, v in zip(r1, r0)] for r1, r0 in zip(s1, s0)] for s1, s0 in zip(y1, y0)], float(scale)


def _mig(x) -> mp.mpf:
    """min |t| over the interval x (0 when x contains 0)."""
    lo, hi = ends(x)
    if lo > 0:
        return lo
    if hi < 0:
        return -hi
    return mp.mpf(0)


def _mag(x) -> mp.mpf:
    return max(abs(e) for e in ends(x))


def _contains_zero(x) -> bool:
    lo, hi = ends(x)
    return lo <= 0 <= hi


def _width(x) -> float:
    lo, hi = ends(x)
    return float(hi - lo)


def _interval_text(x) -> list[str]:
    return [mp.nstr(e, 15) for e in ends(x)]


def certify_rule(rule: str, seed: int = 0, dps: int = CERT_DPS) -> Certificate:
    """Certify that the false ``rule`` changes the model's function (see module doc)."""
    if rule == "value-g3-eq-g0":
        return certify_value_g3(seed, dps)
    cfg = _cert_config(rule)
    model = build_config(cfg, seed, "cpu", torch.float64, name=rule)
    with workdps(dps):
        P = rational_params(model.params)
        inputs = certificate_inputs(cfg, seed)
        el, el_text, facts = _element(rule, cfg, model.params, seed)
        Q = apply_rule(rule, cfg, P, el)
        cert = certify_transform(rule, ACTIONS[rule].claim or rule, cfg, P, Q, inputs, el_text, facts, dps)
        ctrl = _control(rule, cfg, el)
        if ctrl:
            text, c_cfg, c_el = ctrl
            attach_control(cert, c_cfg, P, apply_rule(_CONTROL_RULE[rule], c_cfg, P, c_el), inputs, text)
    return cert


def rational_params(params: Mapping) -> dict:
    """Parameters rounded to multiples of 1/GRID (exact Fractions)."""
    return {k: _rational(v, GRID) for k, v in params.items()}


def certificate_inputs(cfg: Config, seed: int) -> dict:
    return _inputs(cfg, seed)


def certify_transform(
    rule: str, claim: str, cfg: Config, P: dict, Q: dict, inputs: dict, el_text: str, facts: list[str], dps: int
) -> Certificate:
    """Interval enclosures of y(Q) − y(P) (P, Q exact rational parameters, at the working precision
    of the caller's ``workdps``): the entry whose interval lies farthest from 0, and how many
    entries exclude 0."""
    Pi = {k: _to_iv(v) for k, v in P.items()}
    Qi = {k: _to_iv(v) for k, v in Q.items()}
    diff, scale = _diff_intervals(cfg, Pi, Qi, inputs)
    best, where, count, total = None, None, 0, 0
    for b, seq in enumerate(diff):
        for t, row in enumerate(seq):
            for f, x in enumerate(row):
                total += 1
                m = _mig(x)
                count += m > 0
                if best is None or m > _mig(best):
                    best, where = x, [b, t, f]
    assert where is not None  # the output has at least one entry
    return Certificate(
        rule,
        claim,
        _describe(cfg),
        dps,
        where,
        _interval_text(best),
        float(_mig(best)),
        _width(best),
        scale,
        _mig(best) > 0,
        int(count),
        total,
        el_text,
        facts,
    )


def attach_control(cert: Certificate, cfg: Config, P: dict, Qc: dict, inputs: dict, text: str) -> None:
    """The corrected rule on the same rational data: every interval should contain 0."""
    Pi = {k: _to_iv(v) for k, v in P.items()}
    c_diff, _ = _diff_intervals(cfg, Pi, {k: _to_iv(v) for k, v in Qc.items()}, inputs)
    flat = flatten(c_diff)
    cert.control_rule = text
    cert.control_contains_zero = all(_contains_zero(x) for x in flat)
    cert.control_max_abs = float(max(_mag(x) for x in flat))


def _to_iv(a):
    if isinstance(a, list):
        return [_to_iv(x) for x in a]
    return IV.num(a)


def certify_value_g3(seed: int = 0, dps: int = CERT_DPS) -> Certificate:
    """van Nierop Sec. 4.4: "from the value matrix, g(3) = g(0)".  With Ē' = g0·Ē
    (column vectors, as in the paper) and V' = V·g3, the value path is V·g3·g0·Ē, so
    invariance needs g3 = g0⁻¹.  Certified: V·g0·g0·Ē − V·Ē ≠ 0 for a generic rational
    rotation g0 ∈ SO(d_e − 1) (fixing the all-ones vector); the control g3 = g0ᵀ = g0⁻¹
    gives intervals containing 0.  (g3 = g0 is right only for involutions, g0² = I.)"""
    d_e, d_h, n = 4, 2, 3
    g = generator(seed)
    cfg = gpt2.config(d_model=d_e, n_heads=2, n_kv_heads=2, d_head=d_h, d_ff=8, n_layers=1, vocab=8, n_ctx=3)
    with workdps(dps):
        v = _rational(torch.randn(d_h, d_e, generator=g, dtype=torch.float64), GRID)
        e_bar = _rational(torch.randn(d_e, n, generator=g, dtype=torch.float64), GRID)
        sample = ACTIONS["stream-rotation"].sample(cfg, {}, generator(seed + 1), 1.0)
        g0 = exact_rotation(_rational(sample.parts["R"], ELEMENT_GRID), cfg)
        eye = identity(d_e, Fraction(1), Fraction(0))
        facts = []
        if matmul(transpose(g0), g0) != eye:
            raise GaugeAuditError("internal: g0 is not exactly orthogonal")  # pragma: no cover
        facts.append("g0ᵀg0 = I, g0·1 = 1 (exact): g0 ∈ SO(d_e − 1)")
        if matmul(g0, g0) == eye:
            raise GaugeAuditError("internal: g0 is an involution; pick another seed")  # pragma: no cover
        facts.append("g0² ≠ I (g0 is not an involution)")
        vi, gi, ei = _to_iv(v), _to_iv(g0), _to_iv(e_bar)
        git = _to_iv(transpose(g0))
        base = matmul(vi, ei)
        paper = matmul(matmul(matmul(vi, gi), gi), ei)
        fixed = matmul(matmul(matmul(vi, git), gi), ei)
        diff = [[a - b for a, b in zip(r1, r0)] for r1, r0 in zip(paper, base)]
        ctrl = [[a - b for a, b in zip(r1, r0)] for r1, r0 in zip(fixed, base)]
        flat = flatten(diff)
        best = max(flat, key=_mig)
        idx = flat.index(best)
        scale = float(max(_mag(x) for x in flatten(base)))
        cflat = flatten(ctrl)
        cert = Certificate(
            "value-g3-eq-g0",
            "value-g3-eq-g0",
            f"value path V·g3·g0·Ē, d_e={d_e}, d_h={d_h}, n={n}",
            dps,
            [idx // n, idx % n],
            _interval_text(best),
            float(_mig(best)),
            _width(best),
            scale,
            _mig(best) > 0,
            sum(_mig(x) > 0 for x in flat),
            len(flat),
            f"g0 = {_mat_str(g0)} (Cayley, rational)",
            facts,
            "g3 = g0⁻¹ = g0ᵀ",
            all(_contains_zero(x) for x in cflat),
            float(max(_mag(x) for x in cflat)),
        )
    return cert


CERTIFIABLE = (
    "qk-same-action",
    "value-g3-eq-g0",
    "stream-rotation-paper",
    "qk-gl-rope-generic",
    "qk-gl-untied-gqa",
    "gelu-scaling",
)


def certify_all(seed: int = 0, dps: int = CERT_DPS, progress=None) -> list[Certificate]:
    out = []
    for i, rule in enumerate(CERTIFIABLE):
        out.append(certify_rule(rule, seed=seed, dps=dps))
        if progress:
            progress(i + 1, len(CERTIFIABLE))
    return out


def value_g3_residuals(dps_list=(30, 50, 100), seed: int = 0) -> list[dict]:
    """The value-path residual max|V·g3·g0·Ē − V·Ē| / max|V·Ē| in mpmath at each dps, for
    the paper's g3 = g0 and the corrected g3 = g0⁻¹ (inverse computed at that dps) with
    the float64 Cayley rotation g0 taken as exact."""
    from .linalg import inverse

    d_e, d_h, n = 4, 2, 3
    cfg = gpt2.config(d_model=d_e, n_heads=2, n_kv_heads=2, d_head=d_h, d_ff=8, n_layers=1, vocab=8, n_ctx=3)
    g = generator(seed)
    v64 = torch.randn(d_h, d_e, generator=g, dtype=torch.float64).tolist()
    e64 = torch.randn(d_e, n, generator=g, dtype=torch.float64).tolist()
    r64 = ACTIONS["stream-rotation"].sample(cfg, {}, generator(seed + 1), 1.0).parts["R"].tolist()
    out = []
    for dps in dps_list:
        with workdps(dps):
            v = [[mp.mpf(x) for x in row] for row in v64]
            e = [[mp.mpf(x) for x in row] for row in e64]
            g0 = exact_rotation([[mp.mpf(x) for x in row] for row in r64], cfg)
            base = matmul(v, e)
            scale = max(abs(x) for x in flatten(base))

            def rel(g3, v=v, e=e, g0=g0, base=base, scale=scale):
                y = matmul(matmul(matmul(v, g3), g0), e)
                return max(abs(a - b) for a, b in zip(flatten(y), flatten(base))) / scale

            out.append({"dps": dps, "paper": float(rel(g0)), "corrected": float(rel(inverse(g0)))})
    return out


__all__ = [
    "CERTIFIABLE",
    "Certificate",
    "attach_control",
    "certificate_inputs",
    "certify_all",
    "certify_rule",
    "certify_transform",
    "rational_params",
    "value_g3_residuals",
]
