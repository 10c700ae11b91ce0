"""Finite elements of the group measured on transformers' own forward: ``check`` and
``transform`` for a checkpoint whose architecture has no family file.

``groups DIR`` keeps, of every candidate family, the subalgebra that is flat on the forward — a
first-order statement.  A finite element settles it: the flow of a random flat direction for unit
time (:class:`~gauge_audit.actions.candidates.Family`'s ``act``), its step chosen by bisection so
that the element's condition number is κ (coefficients at most ``STEP_CAP``), is applied and
transformers' float64 logits compared with the derived tolerance — κ·L·K·ε worst case and
κ·λ·√(L·K)·ε statistical, as in :mod:`gauge_audit.numeric`, K the inner-product lengths along one
block.  A family flat at first order only (a special point, or a candidate whose finite action is
not the symmetry's) FAILS here by many orders of magnitude.

The composite — every family's element in turn, then every discrete map that held — is what
``transform`` writes (``save_pretrained`` of transformers' own class, in the stored dtype); its
certificate is transformers' float64 logits of the written files against the original's.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .actions.candidates import Family, discrete
from .errors import GaugeAuditError
from .models.checkpoint import HFDir
from .models.checkpoint.writer import TOKENIZER_FILES, atomic_dir, refuse_existing
from .models.derived import MAX_PARAMS_OWN, OWN_WEIGHTS, Description, HFModel, describe, load
from .nullity.found import Found, inputs, measure, path_length
from .numeric import statistical_factor, verdict_for, worst_case_tolerance
from .runtime import eps, generator

STEP_CAP = 2.0  # the largest coefficient of a drawn element (a rotation by 2 rad, a scaling by e²)
CERT_SEED, CERT_BATCH, CERT_LEN = 0, 2, 16


@dataclass
class Row:
    """One element checked on the forward."""

    family: str
    scope: str
    what: str
    dimension: int  # of the flat subalgebra it was drawn from (0: a discrete map)
    kappa: float
    max_rel_error: float  # ‖y′ − y‖∞ / ‖y‖∞ of the float64 logits
    residual_eps: float
    tolerance_eps: float  # κ·L·K·ε
    tolerance_statistical_eps: float  # κ·λ·√(L·K)·ε
    verdict: str


@dataclass
class Measured:
    model: HFModel
    desc: Description
    found: Found
    rows: list[Row] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "model": self.model.name,
            "measured_on": self.found.source,
            "nullity": self.found.nullity,
            "explained": self.found.explained,
            "converged": self.found.converged,
            "checks": [asdict(r) for r in self.rows],
        }


def described(path: Path, seed: int, what: str) -> tuple[HFModel, Description]:
    """The checkpoint's own weights and their description; a checkpoint measured only on a small
    copy is refused (a finite element must act on its own tensors), so is a tensor without a role."""
    model = load(path, seed)
    if model.source != OWN_WEIGHTS:
        raise GaugeAuditError(
            f"{path}: {what} on an architecture without a family file needs the group measured on the "
            f"checkpoint's own weights, at most {MAX_PARAMS_OWN:,} parameters (`groups` measures a small copy)"
        )
    desc = describe(model, seed)
    if desc.unplaced:
        raise GaugeAuditError(f"{path}: {len(desc.unplaced)} tensor(s) without a role: {desc.lines()[0]}")
    return model, desc


def measured(path: Path, seed: int, budget_s: float, quiet: bool, what: str) -> Measured:
    """:func:`described`, and the group measured on the checkpoint's own forward."""
    model, desc = described(path, seed, what)
    return Measured(model, desc, measure(model, desc, seed, budget_s=budget_s, quiet=quiet))


def draw(fam: Family, basis: torch.Tensor, g: torch.Generator, kappa: float) -> tuple[torch.Tensor, float]:
    """Coefficients of a random element of the flat subalgebra spanned by ``basis``'s columns: a
    Gaussian vector of every coefficient projected on that subalgebra (the projection, unlike the
    basis an SVD returns, does not depend on the thread count), scaled so its largest coefficient
    is 1, then stepped to condition number ``kappa`` (bisection, 40 halvings) or to ``STEP_CAP``
    when κ stays below it (rotations)."""
    q = torch.linalg.qr(basis).Q
    z = torch.randn(basis.shape[0], generator=g, dtype=torch.float64)
    c0 = q @ (q.T @ z)
    c0 = c0 / c0.abs().max()
    if fam.kappa(STEP_CAP * c0) <= kappa:
        return STEP_CAP * c0, fam.kappa(STEP_CAP * c0)
    lo, hi = 0.0, STEP_CAP
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fam.kappa(mid * c0) <= kappa else (lo, mid)
    return lo * c0, fam.kappa(lo * c0)


def tolerances(desc: Description, params: dict, kappa: float, outputs: int, dtype: torch.dtype) -> tuple[float, float]:
    L, K = max(1, desc.n_layers), path_length(desc, params)
    _, factor = statistical_factor(L, K, outputs)
    return worst_case_tolerance(kappa, L, K, dtype), kappa * factor * eps(dtype)


def _rel(y: torch.Tensor, y0: torch.Tensor) -> float:
    return float((y - y0).abs().max() / y0.abs().max())


def check_all(m: Measured, seed: int, kappa: float, only: str | None = None) -> list[Row]:
    """One element of every flat family on its own (per scope), every discrete map that held, and
    the composite; each row's verdict against its own κ.  ``only``: the rows of that family."""
    model, params = m.model, m.model.state
    ids = inputs(model.vocab, 8, generator(seed + 3), cover=True)
    with torch.no_grad():
        y0 = model.logits(params, ids)
    e64 = eps(torch.float64)

    def row(name: str, scope: str, what: str, dim: int, k: float, new: dict) -> Row:
        with torch.no_grad():
            err = _rel(model.logits(new, ids), y0)
        tol, stat = tolerances(m.desc, params, k, y0.numel(), torch.float64)
        return Row(name, scope, what, dim, k, err, err / e64, tol / e64, stat / e64, verdict_for(err, stat, tol))

    rows = []
    for fam, basis, c, k in _elements(m, seed, kappa):
        if only in (None, fam.name):
            rows.append(row(fam.name, fam.scope, fam.what, basis.shape[1], k, fam.act(params, c)))
    for d in held_maps(m, discrete(m.desc, params)):
        if only in (None, d.name):
            rows.append(row(d.name, d.scope, d.what, 0, 1.0, d.apply(params)))
    if only in (None, "composite"):
        new, k_all = composite(m, seed, kappa)
        rows.append(row("composite", "all", "every flat family, then every held discrete map", 0, k_all, new))
    m.rows = rows
    return rows


def _elements(m: Measured, seed: int, kappa: float):
    """(family, flat basis, coefficients, κ) of one drawn element per flat family and scope."""
    g = generator(seed + 1)
    for fam, basis in m.found.flat:
        c, k = draw(fam, basis, g, kappa)
        yield fam, basis, c, k


def held_maps(m: Measured, cands: list) -> list:
    held = {(d.name, d.scope, d.what) for d in m.found.discrete if d.holds}
    return [d for d in cands if (d.name, d.scope, d.what) in held]


def composite(m: Measured, seed: int, kappa: float, only: str | None = None) -> tuple[dict, float]:
    """The parameters moved by one element of every flat family (or of the family named ``only``)
    in turn, then by every discrete map that held.  κ: the scopes of one family act on disjoint
    entries, so a family's κ is its scopes' largest; the composite's is at most the product over
    the families."""
    params = m.model.state
    by_name: dict[str, float] = {}
    for fam, _, c, k in _elements(m, seed, kappa):  # every family drawn: an element does not depend on `only`
        if only in (None, fam.name):
            params = fam.act(params, c)
            by_name[fam.name] = max(by_name.get(fam.name, 1.0), k)
    for d in held_maps(m, discrete(m.desc, m.model.params)):
        if only in (None, d.name):
            params = d.apply(params)
    return params, math.prod(by_name.values())


def choices(m: Measured) -> list[str]:
    names = [fam.name for fam, _ in m.found.flat] + [d.name for d in m.found.discrete if d.holds]
    return ["composite"] + sorted(set(names), key=names.index)


# ----------------------------------------------------------------------------- transform
def stored_dtype(path: Path) -> torch.dtype:
    """The coarsest float dtype the checkpoint stores its tensors in."""
    dtypes = {dt for dt, _ in HFDir(path).entries.values() if dt.is_floating_point}
    return max(dtypes, key=lambda dt: torch.finfo(dt).eps) if dtypes else torch.float32


def certificate_inputs(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (CERT_BATCH, CERT_LEN), generator=generator(CERT_SEED))


def transform(
    path: Path,
    action: str,
    out: Path,
    *,
    seed: int = 0,
    kappa: float = 10.0,
    dtype: torch.dtype | None = None,
    budget_s: float = 600.0,
    say: Callable[[str], None] = lambda line: None,
) -> dict:
    """Write ``out`` (transformers' own files and a certificate.json) moved by an element of the
    measured group: ``action`` ``composite`` or the name of a flat family or held discrete map."""
    refuse_existing(out)
    say(f"transform: measuring the group of {path} on transformers' own forward ...")
    m = measured(path, seed, budget_s, quiet=True, what="transform")
    names = choices(m)
    if action not in names:
        raise GaugeAuditError(f"{action!r} is no part of the group measured on {path} (measured: {', '.join(names)})")
    new, k = composite(m, seed, kappa, None if action == "composite" else action)
    families = [f"{fam.name} {fam.scope}" for fam, _ in m.found.flat if action in ("composite", fam.name)]
    about = {"action": action, "element": {"seed": seed}, "families": families}
    return write_moved(m, path, new, k, out, dtype or stored_dtype(path), about, seed, say)


def write_moved(
    m: Measured,
    path: Path,
    new: dict,
    k: float,
    out: Path,
    wdtype: torch.dtype,
    about: dict,
    seed: int = 0,
    say: Callable[[str], None] = lambda line: None,
) -> dict:
    """Write ``out``: transformers' own files of the model at ``new`` (an element of condition
    number ``k`` away from the checkpoint at ``path``) in ``wdtype``, the tokenizer, and
    certificate.json — transformers' float64 logits of the written files against the original's.
    ``about`` (what moved it) opens the certificate."""
    refuse_existing(out)
    module: Any = m.model.module  # a transformers PreTrainedModel
    with atomic_dir(out) as tmp:
        tensors = dict(module.named_parameters()) | dict(module.named_buffers())

        def put(values: dict) -> None:
            with torch.no_grad():
                for name, value in values.items():
                    tensors[name].copy_(value)

        put(new)
        module.to(wdtype)
        try:
            module.save_pretrained(tmp)
        finally:
            module.to(torch.float64)
            tensors = dict(module.named_parameters()) | dict(module.named_buffers())
            put(m.model.state)
        for f in TOKENIZER_FILES:
            if (path / f).is_file():
                shutil.copy2(path / f, tmp / f)
        say("certificate (transformers' logits, float64) ...")
        written = load(tmp, seed)
        ids = certificate_inputs(m.model.vocab)
        with torch.no_grad():
            before = m.model.logits(m.model.state, ids)
            after = written.logits(written.state, ids)
        change = function_change(m, after, before, k, wdtype)
        cert = {
            "checkpoint": str(path),
            "architecture": m.model.name,
            **about,
            "kappa": k,
            "dtype": str(wdtype).removeprefix("torch."),
            "inputs": {"tokens": ids.tolist()},
            "reference": f"transformers' {m.model.name}, float64 end to end",
            **{key: v for key, v in change.items() if key != "verdict"},
            "tolerance_formula": f"κ·L·K·ε = {k:.3g}·{max(1, m.desc.n_layers)}·{path_length(m.desc, m.model.params)}·ε",
            "verdict": change["verdict"],
            "next_token_unchanged": bool(torch.equal(before[:, -1].argmax(-1), after[:, -1].argmax(-1))),
            "group": {"nullity": m.found.nullity, "explained": m.found.explained, "converged": m.found.converged},
        }
        (tmp / "certificate.json").write_text(json.dumps(cert, indent=2) + "\n")
    return cert


def function_change(m: Measured, after: torch.Tensor, before: torch.Tensor, kappa: float, dtype: torch.dtype) -> dict:
    """How far the logits moved, in ε of ``dtype``, against κ·L·K·ε and κ·λ·√(L·K)·ε; the verdict."""
    err = _rel(after, before)
    tol, stat = tolerances(m.desc, m.model.params, kappa, before.numel(), dtype)
    e = eps(dtype)
    return {
        "max_rel_change": err,
        "residual_eps": err / e,
        "tolerance_eps": tol / e,
        "tolerance_statistical_eps": stat / e,
        "verdict": verdict_for(err, stat, tol),
    }


def action_length(desc: Description) -> int:
    """m, the longest inner product an action of the measured group takes: an element of condition
    number κ rounds each entry it moves by about κ·m·ε."""
    return max([desc.d_model] + [h.head_dim for h in desc.heads])


def format_rows(name: str, m: Measured) -> str:
    w = max(12, *(len(r.family) + len(r.scope) + 1 for r in m.rows))
    lines = [
        f"{name}: {m.desc.architecture} (derived), the group measured on {m.found.source}: nullity "
        f"{m.found.nullity}, explained {m.found.explained}",
        f"{'family':{w}s} {'dim':>4s} {'max rel err':>11s} {'residual/ε':>11s} {'stat tol/ε':>11s} "
        f"{'tol/ε':>11s} {'κ':>8s}  verdict",
    ]
    for r in m.rows:
        label = f"{r.family} {r.scope}"
        lines.append(
            f"{label:{w}s} {r.dimension:4d} {r.max_rel_error:11.3e} {r.residual_eps:11.4g} "
            f"{r.tolerance_statistical_eps:11.4g} {r.tolerance_eps:11.4g} {r.kappa:8.3g}  {r.verdict}"
        )
    return "\n".join(lines)


def agrees(m: Measured) -> bool:
    return all(r.verdict.startswith("HOLDS") for r in m.rows)
