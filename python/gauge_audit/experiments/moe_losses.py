"""MoE auxiliary losses before and after every applicable gauge action.

On the reference MoE model (random generic weights, float64) each true action that applies is
sampled (κ = 10) and applied; the router logits of every MoE layer are recorded before and after
and these are computed from them:

* Switch load-balancing loss (Fedus et al. 2021, eq. 4): E·Σ_e f_e·P_e, f_e the fraction of the
  top-k assignments sent to expert e, P_e the mean router probability of e;
* GShard's (Lepikhin et al. 2020): the same with f_e the top-1 fraction;
* router z-loss (Zoph et al. 2022, ST-MoE eq. 5): mean over tokens of (log Σ_e exp logit_e)².

Tolerance: the losses are smooth in the logits except through the dispatch counts f_e, which are
exact while no top-k choice changes; a logit changes by at most the action's tolerance
κ·L·K·ε (numeric.tolerance), the probabilities by at most twice that (softmax is 1-Lipschitz in
ℓ∞ → ℓ1 up to 2), so the loss changes by at most 4·E·tol relative (z-loss: 2·tol·max|lse|
relative to its value).  A change above 10³ times that bound is a change of the loss.
"""

from __future__ import annotations

import torch

from ..actions import ACTIONS
from ..actions.blockwise import transformed
from ..models import build
from ..numeric import statistical_tolerance, tolerance, verdict_for
from ..runtime import generator
from .registry import FAILS, HOLDS, UNDECIDED, Finding, experiment

MODEL = "moe-tiny"
KAPPA = 10.0


def losses(logits: list[torch.Tensor], top_k: int) -> dict:
    """Switch and GShard load-balancing losses and the router z-loss, summed over MoE layers."""
    out = {"switch": 0.0, "gshard": 0.0, "z": 0.0, "lse_max": 0.0}
    for lg in logits:
        lg = lg.reshape(-1, lg.shape[-1]).to(torch.float64)
        E = lg.shape[-1]
        probs = torch.softmax(lg, -1)
        P = probs.mean(0)
        top = lg.topk(top_k, -1).indices
        f_k = torch.zeros(E, dtype=torch.float64).scatter_add_(
            0, top.flatten(), torch.ones(top.numel(), dtype=torch.float64)
        )
        f_k = f_k / top.numel()
        f_1 = torch.bincount(top[:, 0], minlength=E).to(torch.float64) / len(lg)
        out["switch"] += float(E * (f_k * P).sum())
        out["gshard"] += float(E * (f_1 * P).sum())
        lse = torch.logsumexp(lg, -1)
        out["z"] += float((lse**2).mean())
        out["lse_max"] = max(out["lse_max"], float(lse.abs().max()), float(lg.abs().max()))
    return out


def _gating_changes(before, after, relabel, top_k: int) -> dict:
    """Softmax probabilities (aligned by the action's expert relabelling), top-k sets and the top-1
    (hard, argmax) choice: largest probability change and tokens whose choice changed."""
    probs, topk, top1 = 0.0, 0, 0
    for l, (a, b) in enumerate(zip(before, after)):
        E = a.shape[-1]
        old_of_new = relabel(l, torch.arange(E))
        aligned = torch.empty_like(b)
        aligned[..., old_of_new] = b
        probs = max(probs, float((torch.softmax(aligned, -1) - torch.softmax(a, -1)).abs().max()))
        ka, kb = a.topk(top_k, -1).indices.sort(-1).values, relabel(l, b.topk(top_k, -1).indices).sort(-1).values
        topk += int((ka != kb).any(-1).sum())
        top1 += int((a.argmax(-1) != relabel(l, b.argmax(-1))).sum())
    return {"probs_change": probs, "topk_changed": topk, "top1_changed": top1}


def _run(model, params, inputs):
    trace: dict = {}
    with torch.no_grad():
        y = model.forward(params, inputs, trace).to(torch.float64)
    return y, trace["router_logits"]


def measure(seed: int = 0) -> dict:
    """Every true applicable action on the MoE model: output check and the three losses' changes."""
    model = build(MODEL, seed=seed, device="cpu")
    cfg = model.cfg
    inputs = model.sample_inputs(seed, batch=2, n=8)
    n = next(iter(inputs.values())).shape[1]
    y0, logits0 = _run(model, model.params, inputs)
    base = losses(logits0, cfg.top_k)
    rows = []
    for i, action in enumerate(ACTIONS.values()):
        # the composite is the product of the others: each factor is measured on its own
        if action.name == "composite" or action.applies(cfg) is not None or not action.expected_holds(cfg):
            continue
        el = action.sample(cfg, model.params, generator(seed + 1 + i), KAPPA)
        new = transformed(action, cfg, model.params, el)
        relabel = action.expert_relabel or (lambda el, layer, idx: idx)
        y1, logits1 = _run(model, new, inputs)
        after = losses(logits1, cfg.top_k)
        gating = _gating_changes(
            logits0, logits1, lambda l, idx, el=el, relabel=relabel: relabel(el, l, idx), cfg.top_k
        )
        err = float((y1 - y0).abs().max() / y0.abs().max())
        t, _ = tolerance(model, el.kappa, torch.float64, n)
        t_stat, _ = statistical_tolerance(model, el.kappa, torch.float64, n, y0.numel())
        verdict = verdict_for(err, t_stat, t, gating["topk_changed"])
        rel = {k: abs(after[k] - base[k]) / abs(base[k]) for k in ("switch", "gshard", "z")}
        bound = {
            "switch": 4 * cfg.experts * t,
            "gshard": 4 * cfg.experts * t,
            "z": 2 * t * base["lse_max"] ** 2 / max(base["z"], 1e-300),
        }
        rows.append(
            {
                "action": action.name,
                "output": verdict,
                "output_error": err,
                "kappa": el.kappa,
                **gating,
                **{f"{k}_rel_change": rel[k] for k in rel},
                **{f"{k}_bound": bound[k] for k in bound},
                **{f"{k}_changed": rel[k] > 1e3 * bound[k] for k in rel},
            }
        )
    return {"model": MODEL, "experts": cfg.experts, "top_k": cfg.top_k, "base": base, "rows": rows}


def _measured(seed: int) -> dict:
    key = seed
    if key not in _CACHE:
        _CACHE[key] = measure(seed)
    return _CACHE[key]


_CACHE: dict[int, dict] = {}


def _fmt(r: dict, k: str) -> str:
    return f"{r['action']}: {k} Δ {r[k + '_rel_change']:.2e} (bound {r[k + '_bound']:.1e})"


@experiment("wiki-load-balance-breaks")
def wiki_load_balance_breaks(seed: int, full: bool) -> Finding:
    """'负载均衡损失：可能打破规范对称性': does the load-balancing loss change under a gauge action?"""
    m = _measured(seed)
    rows = [r for r in m["rows"] if r["output"].startswith("HOLDS")]
    if not rows:
        return Finding(UNDECIDED, "no true action held on the MoE model", m)
    broken = [r for r in rows if r["switch_changed"] or r["gshard_changed"]]
    z_broken = [r["action"] for r in rows if r["z_changed"]]
    worst = max(
        rows, key=lambda r: max(r["switch_rel_change"] / r["switch_bound"], r["gshard_rel_change"] / r["gshard_bound"])
    )
    tail = (
        f"; the router z-loss (not a load-balancing loss) does change under {', '.join(z_broken)}"
        if z_broken
        else "; the router z-loss is invariant too"
    )
    if broken:
        return Finding(
            HOLDS,
            f"the load-balancing loss changes under {', '.join(r['action'] for r in broken)}: "
            + "; ".join(_fmt(r, "switch") for r in broken[:3]),
            m,
        )
    return Finding(
        FAILS,
        f"Switch and GShard load-balancing losses are invariant under all {len(rows)} true actions "
        f"on {m['model']} ({', '.join(r['action'] for r in rows)}); largest: {_fmt(worst, 'switch')}" + tail,
        m,
        counterexample=f"{m['model']}, seed {seed}: every gauge action leaves the load-balancing loss "
        f"unchanged to ≤ {worst['switch_rel_change']:.1e} relative",
    )


@experiment("wiki-routing-no-new-symmetry")
def wiki_routing_no_new_symmetry(seed: int, full: bool) -> Finding:
    """'路由不引入新的对称性': are there symmetries that act on the router and experts only?"""
    m = _measured(seed)
    own = [r for r in m["rows"] if r["action"] in ("router-offset", "expert-perm") and r["output"].startswith("HOLDS")]
    if not own:
        return Finding(HOLDS, "no symmetry acting on the router or the experts alone holds on the MoE model", m)
    text = "; ".join(f"{r['action']} keeps the output to {r['output_error']:.1e} relative" for r in own)
    return Finding(
        FAILS,
        f"routing adds symmetries outside G_max (which acts on attention only): {text}; "
        f"router-offset is (ℝ^{{d_model}}, +) per MoE router, expert-perm S_E per MoE block",
        m,
        counterexample=f"{m['model']}, seed {seed}: W_router[:, e] ↦ W_router[:, e] + c for every e "
        "leaves the function unchanged",
    )
