"""Measure the symmetry dimension: the nullity of the output Jacobian J = ∂y/∂θ.

At a generic parameter point θ, the fibre of the parameter→function map through θ
is a manifold whose dimension is the nullity of J, provided J is taken over enough
inputs that its row space is the whole cotangent space of the function (rows ≥ 3·P,
every token / position / token type / expert exercised, no ReLU unit dead or always
active over the data).  Everything here is float64.

* :class:`Problem` — a model, its parameters flattened into one vector θ (with a
  :class:`Layout` mapping blocks of θ back to named tensors) and generic inputs.
* :func:`jacobian_rows` / :func:`dense_jacobian` — J by row blocks, one ``jacrev`` per sequence,
  vmapped over sequences.
* :func:`numerical_rank` — the rank threshold placed in the largest relative gap of
  the singular-value spectrum (extended by the float64 noise floor P·ε so that a
  full-rank J is recognised); refuses when that gap is not clear.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch.func import jacrev, jvp, vjp, vmap

from ..errors import GaugeAuditError
from ..models import Config, Model, build_config
from ..progress import bar, note, timed_call
from ..runtime import generator
from .cost import matmul_gflops

EPS64 = float(torch.finfo(torch.float64).eps)
MIN_GAP = 1e4  # below this ratio the spectrum has no clear separation (typical clean gaps are >= 1e6)


def progress(msg: str, quiet: bool = False) -> None:
    """A status line on stderr, above any progress bar — on a terminal only (quiet in pipes,
    logs and under --json, like the bars)."""
    if not quiet:
        note(f"[nullity] {msg}")


# ----------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """Named parameter tensors laid end to end in one flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]

    @classmethod
    def of(cls, params: Mapping[str, torch.Tensor]) -> Layout:
        names = tuple(params)
        shapes = tuple(tuple(params[n].shape) for n in names)
        offs, o = [], 0
        for s in shapes:
            offs.append(o)
            o += math.prod(s)
        return cls(names, shapes, tuple(offs))

    @property
    def size(self) -> int:
        return self.offsets[-1] + math.prod(self.shapes[-1]) if self.names else 0

    def span(self, name: str) -> slice:
        i = self.names.index(name)
        return slice(self.offsets[i], self.offsets[i] + math.prod(self.shapes[i]))

    def flatten(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """A flat vector; names missing from ``tensors`` are zero (tangent vectors)."""
        out = torch.zeros(self.size, dtype=torch.float64)
        for n, t in tensors.items():
            out[self.span(n)] = t.reshape(-1).to(torch.float64)
        return out

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: theta[..., self.span(n)].reshape(*theta.shape[:-1], *s) for n, s in zip(self.names, self.shapes)}

    def block_norms(self, v: torch.Tensor) -> dict[str, float]:
        """‖v restricted to each named tensor‖² as a share of ‖v‖²."""
        tot = float((v * v).sum()) or 1.0
        return {n: float((v[self.span(n)] ** 2).sum()) / tot for n in self.names}


# ----------------------------------------------------------------------------- inputs
def output_width(cfg: Config) -> int:
    return cfg.d_model if cfg.outputs_stream else cfg.vocab


def outputs_per_sequence(cfg: Config, n: int) -> int:
    return n * output_width(cfg)


def _cover(t: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
    """Overwrite k random slots of ``t`` with a random permutation of 0..k−1, so every
    value in 0..k−1 occurs (unseen embedding rows would be spurious flat directions)."""
    flat = t.reshape(-1).clone()
    slots = torch.randperm(flat.numel(), generator=g)[:k]
    flat[slots] = torch.randperm(k, generator=g)
    return flat.reshape(t.shape)


def generic_inputs(
    cfg: Config, n_params: int, seed: int, factor: float = 3.0, n: int | None = None, batch: int | None = None
) -> dict:
    """Inputs with rows = batch·(outputs per sequence) ≥ factor·P.  Token sequences have
    length n_ctx (every learned position is used) and every token / token type occurs."""
    n = cfg.n_ctx if n is None else n
    per = outputs_per_sequence(cfg, n)
    if batch is None:
        batch = max(1, math.ceil(factor * n_params / per))
        if not cfg.attention_only:
            batch = max(batch, math.ceil(cfg.vocab / n), math.ceil(max(cfg.n_types, 1) / n))
    g = generator(seed)
    if cfg.attention_only:
        return {"x": torch.randn(batch, n, cfg.d_model, generator=g, dtype=torch.float64)}
    tokens = _cover(torch.randint(0, cfg.vocab, (batch, n), generator=g), cfg.vocab, g)
    out = {"tokens": tokens}
    if cfg.n_types:
        out["token_types"] = _cover(torch.randint(0, cfg.n_types, (batch, n), generator=g), cfg.n_types, g)
    return out


def input_rows(inputs: dict) -> int:
    return next(iter(inputs.values())).shape[0]


# ----------------------------------------------------------------------------- problem
@dataclass
class Problem:
    """A model at one parameter point, its flat layout, and the inputs J is taken over."""

    model: Model
    layout: Layout
    theta: torch.Tensor
    inputs: dict
    seed: int
    notes: list[str] = field(default_factory=list)

    @property
    def cfg(self) -> Config:
        return self.model.cfg

    @property
    def P(self) -> int:
        return self.layout.size

    @property
    def batch(self) -> int:
        return input_rows(self.inputs)

    @property
    def seq_len(self) -> int:
        return next(iter(self.inputs.values())).shape[1]

    @property
    def rows(self) -> int:
        return self.batch * outputs_per_sequence(self.cfg, self.seq_len)

    def forward_flat(self, theta: torch.Tensor, inputs: dict | None = None) -> torch.Tensor:
        inputs = self.inputs if inputs is None else inputs
        return self.model.family.forward(self.layout.unflatten(theta), self.cfg, inputs).reshape(-1)

    def params(self) -> dict[str, torch.Tensor]:
        return self.layout.unflatten(self.theta)


def make_problem(cfg: Config, seed: int = 0, factor: float = 3.0, batch: int | None = None) -> Problem:
    """Parameters from ``seed``, inputs from ``seed + 1``.  ``batch``: a number of sequences, or
    None (rows ≥ factor·P)."""
    model = build_config(cfg, seed, device="cpu", dtype=torch.float64)
    layout = Layout.of(model.params)
    theta = layout.flatten(model.params)
    if cfg.experts:  # each expert sees only a top_k/E share of the tokens
        factor = factor * max(1.0, cfg.experts / cfg.top_k)
    inputs = generic_inputs(cfg, layout.size, seed + 1, factor=factor, batch=batch)
    return Problem(model, layout, theta, inputs, seed)


# ----------------------------------------------------------------------------- genericity
@dataclass
class Genericity:
    """Data-dependent degeneracies of the sampled inputs (each creates flat directions
    that are not symmetries of the architecture)."""

    dead: dict[str, list[int]] = field(default_factory=dict)  # ReLU units never positive
    always_active: dict[str, list[int]] = field(default_factory=dict)  # ReLU units never negative
    unrouted: dict[str, list[int]] = field(default_factory=dict)  # experts never in any top-k
    # per MoE layer and expert: directions (c × d) orthogonal to every input routed to it
    unreached: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not (
            any(self.dead.values())
            or any(self.always_active.values())
            or any(self.unrouted.values())
            or any(self.unreached.values())
        )

    def lines(self) -> list[str]:
        out = []
        for label, d in (
            ("dead ReLU units", self.dead),
            ("always-active ReLU units", self.always_active),
            ("experts never routed", self.unrouted),
        ):
            for k, v in d.items():
                if v:
                    out.append(f"{label} in {k}: {v}")
        for k, per in self.unreached.items():
            for e, dirs in per.items():
                out.append(f"expert {e} in {k}: its routed inputs miss {dirs.shape[0]} stream direction(s)")
        return out


def genericity(problem: Problem) -> Genericity:
    """Record every ReLU unit's sign pattern and every expert's routing over the inputs."""
    cfg, params = problem.cfg, problem.params()
    out = Genericity()
    if cfg.attention_only:
        return out
    captured: dict[str, torch.Tensor] = {}
    import gauge_audit.models.layers as L

    orig_mlp = L.mlp

    def spy(params_, prefix, cfg_, x, e=None):
        if e is not None:
            captured.setdefault("_in_" + prefix, x)
        if cfg_.act == "relu":
            w = params_[f"{prefix}.W_in"] if e is None else params_[f"{prefix}.W_in"][e]
            z = x @ w
            b = params_.get(f"{prefix}.b_in")
            if b is not None:
                z = z + (b if e is None else b[e])
            key = prefix if e is None else f"{prefix}[expert {e}]"
            captured[key] = z.reshape(-1, z.shape[-1])
        return orig_mlp(params_, prefix, cfg_, x, e)

    trace: dict = {}
    L.mlp = spy
    try:
        with torch.no_grad():
            problem.model.family.forward(params, cfg, problem.inputs, trace)
    finally:
        L.mlp = orig_mlp
    routing = trace.get("routing", [])
    for key, z in captured.items():
        if key.startswith("_in_"):
            continue
        if cfg.experts:
            # only tokens routed to this expert count
            layer = int(key.split(".")[1])
            e = int(key.split("expert ")[1].rstrip("]"))
            sel = (routing[layer] == e).any(-1).reshape(-1)
            z = z[sel]
        out.dead[key] = [int(i) for i in torch.nonzero((z <= 0).all(0)).flatten()]
        out.always_active[key] = [int(i) for i in torch.nonzero((z > 0).all(0)).flatten()]
    # the layer each routing record belongs to (a stack with dense layers records only its MoE ones)
    for layer, r in zip(trace.get("routing_layers", range(len(routing))), routing):
        used = set(int(i) for i in r.unique())
        pre = f"blocks.{layer}.moe"
        out.unrouted[pre] = [e for e in range(cfg.experts) if e not in used]
        # an expert whose routed inputs leave stream directions unseen (few distinct inputs,
        # e.g. a tiny vocabulary with top-1 routing) cannot tell its readers' components there
        x = captured["_in_" + pre].reshape(-1, cfg.d_model)
        per = {}
        for e in sorted(used):
            xe = x[(r == e).any(-1).reshape(-1)]
            _, sv, vh = torch.linalg.svd(xe, full_matrices=True)
            rank = int((sv > 1e-10 * sv[0]).sum()) if sv.numel() else 0
            if rank < cfg.d_model:
                per[e] = vh[rank:]
        out.unreached[pre] = per
    return out


# ----------------------------------------------------------------------------- dense J
def project_outputs(y: torch.Tensor, proj: torch.Tensor | None) -> torch.Tensor:
    """Each position's outputs (… × width) replaced by d' fixed combinations (proj: … × d' × width)."""
    return y if proj is None else torch.einsum("...dw,...w->...d", proj, y)


def _seq_fn(problem: Problem):
    """One sequence's outputs as a function of the *named* parameter tensors, optionally
    compressed per position (a row sketch S·J, :func:`project_outputs`).

    Differentiating with respect to the dict (not the flat θ that is sliced into it) matters
    for speed: the reverse-mode adjoint of each slice of a flat vector is a full-length zero
    vector plus an add, so a flat argument costs (number of tensors) × P per Jacobian row."""
    fam, cfg, width = problem.model.family, problem.cfg, output_width(problem.cfg)

    def f(params, one, proj=None):
        y = fam.forward(params, cfg, {k: v[None] for k, v in one.items()}).reshape(-1, width)
        return project_outputs(y, proj).reshape(-1)

    return f


def jacobian_pieces(problem: Problem, chunk: int | None = None, proj: torch.Tensor | None = None):
    """Blocks of rows of J (reverse mode per sequence, vmapped over ``chunk`` sequences), per
    named parameter tensor: yields (sequences done, {name: rows × numel}).  J itself is never
    held.  ``proj`` (batch × n × d' × width) replaces each position's outputs by d' fixed
    combinations."""
    f = _seq_fn(problem)
    per = problem.seq_len * (output_width(problem.cfg) if proj is None else proj.shape[2])
    if chunk is None:  # ~16 sequences per vmapped call is fastest on CPU; keep a block near 128 MiB
        chunk = max(1, min(16, int(16e6 // (per * problem.P))))
    jac = vmap(jacrev(f), in_dims=(None, 0) if proj is None else (None, 0, 0))
    params, b = problem.params(), problem.batch
    for i in range(0, b, chunk):
        args = (params, {k: v[i : i + chunk] for k, v in problem.inputs.items()})
        d = jac(*args) if proj is None else jac(*args, proj[i : i + chunk])
        yield min(b, i + chunk), {name: t.reshape(t.shape[0] * per, -1) for name, t in d.items()}


def jacobian_rows(problem: Problem, chunk: int | None = None, proj: torch.Tensor | None = None):
    """Blocks of rows of J: yields (sequences done, rows × P block), columns in θ's order."""
    for done, pieces in jacobian_pieces(problem, chunk, proj):
        yield done, torch.cat([pieces[name] for name in problem.layout.names], dim=1)


def dense_jacobian(problem: Problem, chunk: int | None = None, quiet: bool = False) -> torch.Tensor:
    """J (rows × P), all of it."""
    parts = []
    with bar(total=problem.batch, desc="Jacobian rows", unit="seq", disable=quiet) as pb:
        for done, block in jacobian_rows(problem, chunk=chunk):
            parts.append(block)
            pb.update(done - pb.n)
    return torch.cat(parts)


# ----------------------------------------------------------------------------- rank
@dataclass
class Spectrum:
    singular_values: torch.Tensor  # descending, length P (zeros padded if rows < P)
    rank: int
    threshold: float  # absolute: between s[rank-1] and s[rank]
    gap_ratio: float  # s[rank-1] / s[rank]  (s[P] := the noise floor P·ε·s[0])
    second_gap: float  # the next-largest gap ratio (how much cleaner the chosen gap is)
    noise_floor: float

    @property
    def nullity(self) -> int:
        return len(self.singular_values) - self.rank


def numerical_rank(s: torch.Tensor, min_gap: float = MIN_GAP) -> Spectrum:
    """Rank with the threshold in the largest relative gap of the spectrum.

    The spectrum is extended by one virtual value, the float64 noise floor P·ε·s₀
    (what an exactly rank-deficient J's zero singular values round to), so that a
    full-rank J is recognised when its smallest singular value stands clear of it.
    """
    s = s.to(torch.float64)
    P = s.numel()
    if P == 0 or float(s[0]) == 0.0:
        raise GaugeAuditError("the Jacobian is identically zero: nothing to measure")
    floor = P * EPS64 * float(s[0])
    ext = torch.cat([s, torch.tensor([floor], dtype=torch.float64)])
    ext = torch.clamp(ext, min=float(s[0]) * 1e-300)
    ratios = ext[:-1] / ext[1:]
    # a gap below the noise floor separates noise from noise: not a rank decision
    valid = ext[:-1] > floor
    ratios = torch.where(valid, ratios, torch.zeros_like(ratios))
    order = torch.argsort(ratios, descending=True)
    i = int(order[0])
    best = float(ratios[i])
    second = float(ratios[int(order[1])]) if P > 1 else 1.0
    if best < min_gap:
        raise GaugeAuditError(
            f"no clear gap in the singular-value spectrum (largest relative gap {best:.3g} < "
            f"{min_gap:.0e}); the numerical rank is not well defined at this point"
        )
    thr = math.sqrt(float(ext[i]) * float(ext[i + 1]))
    return Spectrum(s, i + 1, thr, best, second, floor)


def singular_values(J: torch.Tensor, quiet: bool = False) -> torch.Tensor:
    """All P singular values of J (rows ≥ P: via R of a QR factorisation, then SVD of R)."""
    t0 = time.time()
    m, P = J.shape
    rate = matmul_gflops() * 1e9
    if m > P:  # Householder QR: 2·m·P² − 2P³/3 flops
        R = timed_call(
            torch.linalg.qr,
            J,
            mode="r",
            desc="QR of J",
            disable=quiet,
            expected_seconds=(2 * m * P * P - 2 * P**3 / 3) / rate,
        ).R
    else:
        R = J
    # values-only SVD of the P × P factor: ≈ 8P³/3 flops (bidiagonalisation), at about half the rate
    s = timed_call(torch.linalg.svdvals, R, desc="SVD", disable=quiet, expected_seconds=16 * P**3 / 3 / rate)
    if s.numel() < P:
        s = torch.cat([s, torch.zeros(P - s.numel(), dtype=s.dtype)])
    progress(f"SVD of {m}×{P}: {time.time() - t0:.1f} s", quiet or time.time() - t0 < 2)
    return s


def null_basis(J: torch.Tensor, rank: int) -> torch.Tensor:
    """Orthonormal basis (P × nullity) of the numerical null space."""
    m, P = J.shape
    R = torch.linalg.qr(J, mode="r").R if m > P else J
    _, _, vh = torch.linalg.svd(R, full_matrices=True)
    return vh[rank:].T.contiguous()


# ----------------------------------------------------------------------------- products
def jvp_rows(problem: Problem, V: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """J·vᵢ for the rows vᵢ of V (k × P), without forming J: (k × rows)."""
    f = problem.forward_flat
    out = []

    def one(v):
        return jvp(f, (problem.theta,), (v,))[1]

    batched = vmap(one)
    for i in range(0, V.shape[0], chunk):
        out.append(batched(V[i : i + chunk]))
    return torch.cat(out) if out else torch.zeros(0, problem.rows, dtype=torch.float64)


def vjp_rows(problem: Problem, U: torch.Tensor) -> torch.Tensor:
    """Jᵀ·uᵢ for the rows uᵢ of U (k × rows): (k × P)."""
    _, pull = vjp(problem.forward_flat, problem.theta)  # type: ignore[misc]  # torch types vjp as if has_aux=True (3-tuple)
    return vmap(lambda u: pull(u)[0])(U)
