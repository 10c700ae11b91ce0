"""``gauge-audit derive CLAIM_ID [--latex] [--json]`` and ``gauge-audit derive --list``."""

from __future__ import annotations

import json

from ..errors import GaugeAuditError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "derive",
        help="run the SymPy derivation of a claim and print its verdict",
        description="Run the SymPy derivation that settles CLAIM_ID: numbered steps, the "
        "derived rule, the residual of the claimed rule and the verdict.",
    )
    p.add_argument("claim_id", nargs="?", help="claim id from `gauge-audit claims`")
    p.add_argument("--list", action="store_true", help="list the claims that have a derivation")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--latex", action="store_true", help="print LaTeX of the key expressions")
    fmt.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..claims import load_catalog
    from ..symbolic import DERIVATIONS, derive

    if args.list:
        catalog = load_catalog()
        if args.json:
            print(json.dumps(sorted(DERIVATIONS)))
            return 0
        for cid in sorted(DERIVATIONS):
            c = catalog.get(cid)
            print(f"{cid:<26} gauge_audit.symbolic.{DERIVATIONS[cid].__name__:<24} {c.kind if c else ''}")
        return 0
    if not args.claim_id:
        raise GaugeAuditError("derive needs a CLAIM_ID (or --list)")
    catalog = load_catalog()
    if args.claim_id not in catalog:
        raise GaugeAuditError(f"unknown claim id {args.claim_id!r} (see `gauge-audit claims`)")
    result = derive(args.claim_id)
    if args.json:
        print(result.to_json())
    elif args.latex:
        print(result.latex)
    else:
        print(result.render())
    return 0
