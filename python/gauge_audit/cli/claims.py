"""``gauge-audit claims``: list the claim catalog."""

from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "claims",
        help="list the claim catalog (claims/*.toml)",
        description="List every claim of the catalog with its kind, checkers and source.",
    )
    p.add_argument("--json", action="store_true", help="print a JSON array")
    p.add_argument("--kind", help="only claims of this kind (symmetry, derivation, count, accuracy, bound)")
    p.add_argument("--file", action="append", help="load these claim files instead of claims/*.toml")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..claims import load_catalog

    catalog = load_catalog(args.file)
    claims = [c for c in catalog.values() if args.kind is None or c.kind == args.kind]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": c.id,
                        "source": c.source,
                        "document": c.document.title,
                        "location": c.location,
                        "statement": c.statement,
                        "kind": c.kind,
                        "checkers": list(c.checkers),
                        "action": c.action,
                        "expected": c.expected,
                        "file": c.file,
                        "line": c.line,
                        **({"rule": c.rule.to_table()} if c.rule is not None else {}),
                    }
                    for c in claims
                ],
                indent=2,
                ensure_ascii=False,
            )
        )
        return 0
    for c in claims:
        print(f"{c.id:<26} {c.kind:<10} {','.join(c.checkers):<40} {c.document.key}: {c.location}")
    print(f"{len(claims)} claims")
    return 0
