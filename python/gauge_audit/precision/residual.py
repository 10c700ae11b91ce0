"""dps-scaled residuals of the gauge actions, and the torch ↔ mpmath cross-check.

For an action and a (one-layer) model: the original float64 parameters are converted
to mpmath exactly, the torch sampler's element is taken as exact, the rule is applied
in mpmath at ``dps`` digits (:mod:`.transforms`), both parameter sets are run through
the independent mpmath model (:mod:`.block`) on the same inputs, and the residual is

    r(dps) = max |y' − y| / max |y|        (computed at dps digits).

Bound for a true symmetry (the torch tolerance of :mod:`gauge_audit.numeric` with the
float64 ε replaced by the mpmath unit u = 2^(1 − prec(dps))):

    r(dps) ≤ κ · L · K · u

κ the element's condition number (inverting it loses log10 κ digits), L the number of
layers, K the summed inner-product lengths along one block's path (Higham's γ_k ≈ k·u
per length-k dot product).  For κ = 10, K ≈ 100: about 10^3 · u ≈ 10^(3 − dps) — well
inside the precision claims' 10^(5 − dps).  A false rule gives r = O(1) at every dps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from mpmath import mp

from ..actions import ACTIONS, get_action
from ..errors import GaugeAuditError
from ..models import NAMED, Model, build_config, config_of
from ..numeric import path_length
from ..runtime import eps, generator
from .block import MP, exact_params, forward, workdps
from .linalg import flatten
from .transforms import RULES, apply_rule, exact_element

DEFAULT_DPS = (30, 50, 100)
BATCH, SEQ = 2, 4


@dataclass
class DpsResidual:
    dps: int
    residual: float  # relative max-abs output change (0.0 when exactly zero)
    log10: float | None  # log10 of the residual (None when exactly zero)
    bound: float  # κ·L·K·u(dps)
    within: bool  # residual ≤ bound


@dataclass
class ActionPrecision:
    """The mpmath verdict on one action at several precisions."""

    action: str
    model: str
    seed: int
    kappa: float
    expected: str  # HOLDS / FAILS: what the theory predicts here
    verdict: str  # HOLDS (≤ bound at every dps, shrinking) / FAILS (O(1) residual)
    residuals: list[DpsResidual]
    shrinks: bool  # max(r, u) strictly decreases 30 → 50 → 100
    bound_formula: str
    certificate: dict | None = None  # for false rules with --certify: see certify.Certificate
    notes: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return self.verdict == self.expected

    def to_json(self) -> dict:
        return asdict(self)


def unit_roundoff(dps: int) -> float:
    """u = 2^(1 − prec): the mpmath analogue of torch.finfo(dtype).eps at ``dps`` digits."""
    with workdps(dps):
        return float(mp.mpf(2) ** (1 - mp.prec))


def default_model(action: str) -> str:
    """The first named tiny model (table order) the action applies to."""
    act = get_action(action)
    for name, cfg in NAMED.items():
        if act.applies(cfg) is None:
            return name
    raise GaugeAuditError(f"no named model to which {action} applies")  # pragma: no cover


def one_layer(name: str, seed: int) -> Model:
    """The named tiny model, cut to one block (the object a per-block claim is about), float64 CPU."""
    if name == "minilm":
        raise GaugeAuditError("the mpmath reference runs on the tiny models only (MiniLM is 22M parameters)")
    cfg = config_of(name).with_(n_layers=1)
    return build_config(cfg, seed, "cpu", torch.float64, name=f"{name} (1 layer)")


def relative(y0: list, y1: list):
    a, b = flatten(y0), flatten(y1)
    num = max(abs(u - v) for u, v in zip(a, b))
    den = max(abs(u) for u in a)
    return num / den


def _as_float(x) -> tuple[float, float | None]:
    if x == 0:
        return 0.0, None
    return float(x), float(mp.log10(x))


def residual_at(model: Model, action: str, element, inputs: dict, dps: int) -> tuple[float, float | None]:
    """(relative residual, log10) of ``action`` with the given torch element at ``dps`` digits."""
    with workdps(dps):
        P = exact_params(model.params, MP)
        el = exact_element(action, model.cfg, element.parts, MP.num)
        Q = apply_rule(action, model.cfg, P, el)
        r = relative(forward(model.cfg, P, inputs, MP), forward(model.cfg, Q, inputs, MP))
        return _as_float(r)


def shrinking(rows: list[DpsResidual]) -> bool:
    """The error envelope max(r(dps), u(dps)) strictly decreases with dps.  (A residual
    below one unit roundoff — e.g. exactly 0 after a permutation — counts as one unit.)"""
    env = [max(x.residual, unit_roundoff(x.dps)) for x in rows]
    return all(b < a for a, b in zip(env, env[1:]))


def dps_verdict(rows: list[DpsResidual]) -> tuple[str, bool]:
    """HOLDS (every residual within its bound, shrinking with dps), FAILS (≥ 10⁻³ at every dps) or
    INCONCLUSIVE (neither: reported, never hidden); and whether they shrink."""
    shrinks = shrinking(rows)
    if all(x.within for x in rows) and shrinks:
        return "HOLDS", shrinks
    if all(x.residual >= 1e-3 for x in rows):
        return "FAILS", shrinks
    return "INCONCLUSIVE", shrinks  # pragma: no cover - neither exact nor O(1)


def check_action(
    action: str,
    model: str | None = None,
    dps: tuple[int, ...] | list[int] = DEFAULT_DPS,
    seed: int = 0,
    kappa: float = 10.0,
    certify: bool = False,
    progress=None,
) -> ActionPrecision:
    """Residuals of ``action`` at each dps on a one-layer ``model`` (default: the first
    named tiny model it applies to).  HOLDS when every residual is within κ·L·K·u and
    they shrink with dps; FAILS when the residual stays O(1) (≥ 1e-3 at every dps)."""
    if action not in RULES:
        raise GaugeAuditError(f"unknown action {action!r}; known: {', '.join(RULES)}")
    act = ACTIONS[action]
    name = model or default_model(action)
    m = one_layer(name, seed)
    reason = act.applies(m.cfg)
    if reason:
        raise GaugeAuditError(f"action {action} does not apply to {name}: {reason}")
    el = act.sample(m.cfg, m.params, generator(seed + 1), kappa)
    inputs = m.sample_inputs(seed, batch=BATCH, n=SEQ)
    k, k_text = path_length(m.cfg, SEQ)
    layers = max(1, m.cfg.n_layers)
    rows = []
    for i, d in enumerate(sorted(set(dps))):
        r, lg = residual_at(m, action, el, inputs, d)
        bound = el.kappa * layers * k * unit_roundoff(d)
        rows.append(DpsResidual(d, r, lg, bound, r <= bound))
        if progress:
            progress(i + 1, len(set(dps)))
    verdict, shrinks = dps_verdict(rows)
    expected = "HOLDS" if act.expected_holds(m.cfg) else "FAILS"
    result = ActionPrecision(
        action,
        name,
        seed,
        el.kappa,
        expected,
        verdict,
        rows,
        shrinks,
        f"κ·L·K·u = {el.kappa:.3g}·{layers}·{k}·2^(1−prec)  (K = {k_text})",
    )
    if certify and expected == "FAILS":
        from .certify import certify_rule

        result.certificate = certify_rule(action, seed=seed).to_json()
    return result


@dataclass
class Agreement:
    model: str
    seed: int
    dps: int
    rel_diff: float  # max |y_torch − y_mp| / max |y_mp|
    diff_eps: float  # in units of float64 ε
    bound: float  # L·K·ε64 (numeric.tolerance with κ = 1)
    within: bool

    def to_json(self) -> dict:
        return asdict(self)


def torch_agreement(name: str = "gpt2-tiny", seed: int = 0, dps: int = 30, n_layers: int | None = None) -> Agreement:
    """The torch float64 forward vs the independent mpmath forward on the same
    parameters and inputs: they must agree to float64 accuracy, L·K·ε."""
    cfg = config_of(name)
    if n_layers is not None:
        cfg = cfg.with_(n_layers=n_layers)
    m = build_config(cfg, seed, "cpu", torch.float64, name=name)
    inputs = m.sample_inputs(seed, batch=BATCH, n=SEQ)
    with torch.no_grad():
        y_t = m.forward(m.params, inputs).tolist()
    with workdps(dps):
        P = exact_params(m.params, MP)
        y_m = forward(m.cfg, P, inputs, MP)
        diff = float(relative(y_m, [[[mp.mpf(v) for v in row] for row in seq] for seq in y_t]))
    k, _ = path_length(m.cfg, SEQ)
    e = eps(torch.float64)
    bound = max(1, cfg.n_layers) * k * e
    return Agreement(name, seed, dps, diff, diff / e, bound, diff <= bound)


def true_actions() -> list[str]:
    """Actions that are symmetries on their default model."""
    return [a for a in RULES if ACTIONS[a].expected_holds(config_of(default_model(a)))]


def false_actions() -> list[str]:
    return [a for a in RULES if not ACTIONS[a].expected_holds(config_of(default_model(a)))]
