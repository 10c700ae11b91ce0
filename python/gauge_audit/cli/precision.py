"""``gauge-audit precision``: the mpmath cross-check, certified counterexamples, the
referee's concrete test and the floating-point error study.

    gauge-audit precision ACTION_OR_CLAIM [--dps N] [--model M] [--certify] [--json]
    gauge-audit precision --referee-test [--dps N] [--json]
    gauge-audit precision --plot PATH [--full] [--no-minilm] [--json]
    gauge-audit precision --list
"""

from __future__ import annotations

import json

from ..errors import GaugeAuditError
from ..progress import ticker

DEFAULT_PLOT = "reports/precision/error_vs_kappa.png"


def register(sub) -> None:
    p = sub.add_parser(
        "precision",
        help="high-precision (mpmath) residuals, certified counterexamples, error study",
        description="Settle a gauge action or claim in arbitrary precision: residuals at 30/50/100 "
        "digits for true actions, interval-certified counterexamples for false rules, "
        "the referee's concrete test, and the float64/float32 error-vs-κ study.",
    )
    p.add_argument("name", nargs="?", metavar="ACTION_OR_CLAIM", help="an action (see --list) or a claim id")
    p.add_argument("--dps", type=int, help="decimal digits (default: 30, 50 and 100; referee test: 50)")
    p.add_argument("--model", help="tiny model for an action (default: the first one it applies to)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled element and model")
    p.add_argument("--kappa", type=float, default=10.0, help="condition number of the sampled element")
    p.add_argument(
        "--certify",
        action="store_true",
        help="for a false rule: the interval enclosure of the residual and whether it excludes 0",
    )
    p.add_argument("--referee-test", action="store_true", help="reproduce the referee's concrete test")
    p.add_argument("--sequences", type=int, default=100, help="referee test: number of token sequences")
    p.add_argument(
        "--plot",
        metavar="PATH",
        nargs="?",
        const=DEFAULT_PLOT,
        help=f"run the error study and write its PNG plot (default path {DEFAULT_PLOT})",
    )
    p.add_argument("--full", action="store_true", help="error study: κ = 10^0..10^12, 5 seeds, three models")
    p.add_argument("--no-minilm", action="store_true", help="error study: skip the real MiniLM weights")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="error study device")
    p.add_argument("--list", action="store_true", help="list the actions and claims this command settles")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=run)


def _emit(args, obj: dict, text: str) -> None:
    print(json.dumps(obj, sort_keys=True, default=str) if args.json else text)


def _table(r) -> str:
    lines = [
        f"{r.action} on {r.model}, seed {r.seed}, κ = {r.kappa:.3g}  (expected {r.expected})",
        f"  {'dps':>4s}  {'residual':>12s}  {'log10':>8s}  {'bound':>10s}  within",
        *[
            f"  {x.dps:4d}  {x.residual:12.3e}  {'-∞' if x.log10 is None else f'{x.log10:8.2f}':>8s}  "
            f"{x.bound:10.2e}  {'yes' if x.within else 'no'}"
            for x in r.residuals
        ],
        f"  bound = {r.bound_formula}",
        f"  shrinks with dps: {'yes' if r.shrinks else 'no'};  verdict: {r.verdict}"
        + ("" if r.agrees else "   <-- differs from theory"),
    ]
    if r.certificate:
        c = r.certificate
        lines += [
            f"  certified ({c['model']}, iv dps {c['dps']}): y'−y at {tuple(c['entry'])} ∈ "
            f"[{c['interval'][0]}, {c['interval'][1]}]  excludes 0: {'yes' if c['excludes_zero'] else 'NO'}",
            f"  control {c['control_rule']}: intervals contain 0: {c['control_contains_zero']}",
        ]
    return "\n".join(lines)


def _list() -> int:
    from ..precision import CERTIFIABLE, CLAIMS, true_actions

    print("true actions (residual at 30/50/100 digits): " + ", ".join(true_actions()))
    print("false rules (certified counterexample, --certify): " + ", ".join(CERTIFIABLE))
    print("claims: " + ", ".join(CLAIMS))
    return 0


def run(args) -> int:
    from .. import precision as P

    if args.list:
        return _list()
    if args.dps is not None:
        with P.workdps(args.dps):  # validates the value early (a GaugeAuditError otherwise)
            pass
    if args.sequences < 1:
        raise GaugeAuditError("--sequences must be >= 1")
    if args.referee_test:
        r = P.referee_test(
            seed=args.seed, dps=args.dps or 50, sequences=args.sequences, progress=ticker("referee test")
        )
        _emit(args, r.to_json(), r.render())
        return 0
    if args.plot is not None:
        return _plot(args, P)
    if not args.name:
        raise GaugeAuditError("give an action or claim name, --referee-test, --plot PATH, or --list")
    return _name(args, P)


def _plot(args, P) -> int:
    if args.full:
        study = P.run_study(
            models=("gpt2-tiny", "llama-tiny", "bert-tiny"),
            kappas=P.error_study.FULL_KAPPAS,
            seeds=tuple(range(args.seed, args.seed + 5)),
            minilm=not args.no_minilm,
            device=args.device,
            progress=ticker("error study"),
        )
    else:
        study = P.run_study(
            seeds=(args.seed, args.seed + 1, args.seed + 2),
            minilm=not args.no_minilm,
            device=args.device,
            progress=ticker("error study"),
        )
    path = P.plot_study(study, args.plot)
    v24, v12 = P.eps24_verdict(study), P.wiki_1e12_verdict(study)
    obj = {"plot": path, "study": study.to_json(), "eps-24": v24.to_json(), "wiki-1e-12": v12.to_json()}
    _emit(args, obj, "\n".join([study.render(), v24.render(), v12.render(), f"plot written to {path}"]))
    return 0


def _name(args, P) -> int:
    from ..precision.transforms import RULES

    name = args.name
    dps = (args.dps,) if args.dps else (30, 50, 100)
    if name in RULES:
        if args.kappa < 1 or args.kappa != args.kappa:
            raise GaugeAuditError("--kappa must be a number >= 1")
        r = P.check_action(
            name, args.model, dps=dps, seed=args.seed, kappa=args.kappa, certify=args.certify, progress=ticker(name)
        )
        if args.certify and r.certificate is None:
            if r.expected == "HOLDS":
                note = f"{name} is a true symmetry on {r.model}: there is no counterexample to certify"
                _emit(args, {**r.to_json(), "note": note}, _table(r) + f"\n  {note}")
                return 0
        _emit(args, r.to_json(), _table(r))
        return 0 if r.agrees else 1
    if args.model:
        raise GaugeAuditError("--model applies to actions only")
    if name == "value-g3-eq-g0" or (args.certify and name in P.CERTIFIABLE):
        c = P.certify_rule(name, seed=args.seed)
        rows = P.value_g3_residuals(dps, seed=args.seed) if name == "value-g3-eq-g0" else []
        text = c.render()
        if rows:
            text += "\n  mpmath residual max|V·g3·g0·Ē − V·Ē|/max|V·Ē|:\n" + "\n".join(
                f"    dps {r['dps']:4d}: paper g3 = g0: {r['paper']:.4g}   corrected g3 = g0⁻¹: {r['corrected']:.3e}"
                for r in rows
            )
        _emit(args, {**c.to_json(), "mp_residuals": rows}, text)
        return 0
    if name in P.CLAIMS:
        v = P.claim_verdict(name, seed=args.seed)
        _emit(args, v.to_json(), v.render())
        return 0
    raise GaugeAuditError(f"unknown action or claim {name!r}; see gauge-audit precision --list")
