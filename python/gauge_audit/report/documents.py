"""Per source document: how many claims, each verdict, and the statements read but not checkable.

Both tables come from data: the verdicts of an audit and the ``[[unchecked]]`` rows of the claim
files (:func:`gauge_audit.claims.load_unchecked`); nothing is counted by hand.
"""

from __future__ import annotations

from ..claims import Unchecked, load_unchecked

VERDICTS = ("HOLDS", "HOLDS-WITH-CORRECTION", "FAILS", "UNDECIDED")
COLUMNS = ["document", "claims", "HOLDS", "HOLDS-WITH-CORRECTION", "FAILS", "UNDECIDED", "read but not checkable"]


def unchecked_for(results) -> list[Unchecked]:
    """The unchecked rows of the catalog files the audited claims come from."""
    files = {r.claim.file for r in results}
    return [u for u in load_unchecked() if u.document.file in files]


def count_rows(results, unchecked: list[Unchecked]) -> list[list]:
    """One row per document (in the order its claims appear), then the total."""
    docs: dict[str, dict] = {}
    for r in results:
        row = docs.setdefault(r.claim.document.key, {"claims": 0, **{v: 0 for v in VERDICTS}, "unchecked": 0})
        row["claims"] += 1
        row[r.verdict.verdict] = row.get(r.verdict.verdict, 0) + 1
    for u in unchecked:
        docs.setdefault(u.document.key, {"claims": 0, **{v: 0 for v in VERDICTS}, "unchecked": 0})["unchecked"] += 1
    rows = [[k, d["claims"], *(d[v] for v in VERDICTS), d["unchecked"]] for k, d in docs.items()]
    rows.append(["total", *(sum(r[i] for r in rows) for i in range(1, len(COLUMNS)))])
    return rows


def counts_table(results) -> dict:
    """The per-document table in the report's extras format."""
    return {
        "title": "Claims per source document",
        "note": "read but not checkable: statements without checkable content (analogies, advice, undefined "
        "objects), listed with the reason in proofs.md.",
        "columns": COLUMNS,
        "rows": count_rows(results, unchecked_for(results)),
    }
