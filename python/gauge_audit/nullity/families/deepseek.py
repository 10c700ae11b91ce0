"""Families of DeepSeek-V3 (multi-head latent attention, sigmoid-routed MoE; models/deepseek.py).

What survives of the gauge group, derived per layer (h heads, latents of rank r_Q, r_KV):

* latent-rotation, so(r) per latent: c = n(x W_D + b_D)⊙γ is an RMSNorm, and n commutes with every
  orthogonal O (rms(yO) = rms(y)): W_D·O, b_D·O and the latent's readers W_U[h] ↦ D_γ⁻¹Oᵀ D_γ·W_U[h]
  (for c_KV: W_UK and W_UV of every head together; for c_Q: W_UQ) keep c·W_U.  A general element of
  GL(r) does not pass the norm: the latent keeps O(r), not GL(r).
* latent-norm-scale, (ℝ≠0)^r per latent: γ ↦ γ⊙s with the readers' rows divided by s.
* latent-input-scale (ε-broken, 1 per latent): W_D, b_D ×c — n(c·y) = n(y) only at ε = 0.
* mla-nope-gl, GL(d_nope) per head: q_h^nope·k_h^nopeᵀ = (c_Q W_UQ[h]^nope M)(c_KV W_UK[h] M⁻ᵀ)ᵀ.
* mla-rope-commutant, d_rope per layer (not per head): the RoPE key k^rope = x W_KR is shared, so one
  element N of the RoPE commutant (per plane a·I + b·J) acts on W_KR for all heads at once, every
  head's rope query columns taking N⁻ᵀ.  Per-head freedom on the rope part is gone.
* mla-vo-gl, GL(d_v) per head: W_UV[h]·N, N⁻¹·W_O[h].
* Stream (pre-RMSNorm, untied): stream-rotation so(d), norm-scale (2L+1)·d, stream-scale (ε-broken).
* FFN: swiglu-scaling per unit of every dense FFN, routed expert and shared expert.
* Router (V3): the score-correction bias b only selects (gates use the raw sigmoid scores), and selection
  is locally constant at a generic point: router-bias-selection, E per MoE layer.  With top_k = 1
  and norm_topk_prob the gate is identically ρ, so the router weights only select too (router-top1).
  The sigmoid has no shift invariance: the softmax router's router-offset is gone.  (V2's softmax
  router keeps it: router-offset, d per MoE layer; its gates are never renormalised, so no top-1 family.)

No special points depend on the weights: the latent rotation is conjugated by D_γ, not restricted by
it, so γ ∝ 1 adds nothing.  The counts assume generic factorisations — every latent and head width
at most what reads and writes it (r ≤ d; d_nope ≤ min(r_Q or d, r_KV); d_v ≤ min(r_KV, d);
d_rope ≤ r_Q or d; r_Q ≤ h·(d_nope + d_rope); r_KV ≤ h·(d_nope + d_v)); wider configurations,
where more directions are unread, are refused rather than mis-counted.
"""

from __future__ import annotations

import torch

from ...errors import GaugeAuditError
from ...models.deepseek import DeepseekConfig, as_latent, ffn_units, norm_readers, stream_writers
from ...models.layers import rope_planes
from ..measure import Genericity, Problem
from .base import Family, Rows, make_family
from .readers import reader_rows, reader_value, stream_map_vector


def _eps_kind(eps: float) -> str:
    return "exact" if eps == 0 else "eps-broken"


def require_generic_widths(cfg: DeepseekConfig) -> None:
    """The widths under which the counts below are the whole group (see the module doc)."""
    d, h, rq, rkv = cfg.d_model, cfg.n_heads, cfg.q_lora_rank, cfg.kv_lora_rank
    q_in = rq or d
    for ok, what in (
        (rq <= d and rkv <= d, "a latent wider than d_model"),
        (cfg.nope_dim <= min(q_in, rkv), "d_nope wider than the latents it pairs"),
        (cfg.v_dim <= min(rkv, d), "d_v wider than the latent or d_model"),
        (cfg.d_head <= q_in, "d_rope wider than the query's input"),
        (rq <= h * (cfg.nope_dim + cfg.d_head), "r_Q wider than the queries it feeds"),
        (rkv <= h * (cfg.nope_dim + cfg.v_dim), "r_KV wider than the keys and values it feeds"),
    ):
        if not ok:
            raise GaugeAuditError(f"deepseek nullity theory: {what} leaves unread directions it does not count")


def _latents(cfg: DeepseekConfig) -> list[tuple[str, str, list[str]]]:
    """(name, its norm weight, its readers) of each latent of a layer."""
    out = [("KV", "kv_norm", ["W_UK", "W_UV"])]
    return ([("Q", "q_norm", ["W_UQ"])] if cfg.q_lora_rank else []) + out


def latent_families(problem: Problem) -> list[Family]:
    cfg, p = problem.cfg, problem.params()
    cfg = as_latent(cfg)
    rot, scale, inp = Rows(problem.layout), Rows(problem.layout), Rows(problem.layout)
    n_rot = n_scale = 0
    for i in range(cfg.n_layers):
        a = f"blocks.{i}.attn"
        for name, norm, readers in _latents(cfg):
            r, g = p[f"{a}.{norm}"].shape[0], p[f"{a}.{norm}"]
            for j in range(r):
                for k in range(j + 1, r):
                    A = torch.zeros(r, r, dtype=torch.float64)
                    A[j, k], A[k, j] = 1.0, -1.0
                    v = rot.new()
                    rot.at(v, f"{a}.W_D{name}")[...] = p[f"{a}.W_D{name}"] @ A
                    if f"{a}.b_D{name}" in p:
                        rot.at(v, f"{a}.b_D{name}")[...] = p[f"{a}.b_D{name}"] @ A
                    C = A * g[None, :] / g[:, None]  # D_γ⁻¹·A·D_γ
                    for w in readers:
                        rot.at(v, f"{a}.{w}")[...] = -(C @ p[f"{a}.{w}"])
                    n_rot += 1
                v = scale.new()
                scale.at(v, f"{a}.{norm}")[j] = g[j]
                for w in readers:
                    scale.at(v, f"{a}.{w}")[:, j, :] = -p[f"{a}.{w}"][:, j, :]
                n_scale += 1
            v = inp.new()
            for t in (f"{a}.W_D{name}", f"{a}.b_D{name}"):
                if t in p:
                    inp.at(v, t)[...] = p[t]
    per = "r_Q(r_Q−1)/2 + r_KV(r_KV−1)/2" if cfg.q_lora_rank else "r_KV(r_KV−1)/2"
    return [
        make_family(
            problem.layout,
            "latent-rotation",
            f"L·({per})",
            n_rot,
            rot,
            """The latent's RMSNorm commutes with every rotation O: W_D·O, b_D·O and the readers
            D_γ⁻¹·Oᵀ·D_γ·W_U keep c·W_U.  Generator A ∈ so(r): dW_D = W_D·A, dW_U = −D_γ⁻¹A D_γ·W_U.""",
        ),
        make_family(
            problem.layout,
            "latent-norm-scale",
            "L·(r_Q + r_KV)" if cfg.q_lora_rank else "L·r_KV",
            n_scale,
            scale,
            """γ_i ×s and row i of every reader of the latent ÷s.""",
        ),
        make_family(
            problem.layout,
            "latent-input-scale",
            "L·(1 + [r_Q > 0])",
            inp.matrix().shape[0],
            inp,
            """n(c·y) = n(y) at ε = 0: a latent's down-projection (and bias) ×c.""",
            kind=_eps_kind(cfg.latent_eps),
        ),
    ]


def _query(cfg: DeepseekConfig, a: str) -> str:
    return f"{a}.W_UQ" if cfg.q_lora_rank else f"{a}.W_Q"


def attention_families(problem: Problem) -> list[Family]:
    cfg, p = problem.cfg, problem.params()
    cfg = as_latent(cfg)
    nope, rdim, vdim, h = cfg.nope_dim, cfg.d_head, cfg.v_dim, cfg.n_heads
    QK, RC, VO = Rows(problem.layout), Rows(problem.layout), Rows(problem.layout)
    for i in range(cfg.n_layers):
        a = f"blocks.{i}.attn"
        wq = _query(cfg, a)
        for hd in range(h):
            for x in range(nope):
                for y in range(nope):
                    v = QK.new()  # A = E_xy on the nope block of head hd
                    QK.at(v, wq)[hd][:, y] = p[wq][hd][:, x]
                    QK.at(v, f"{a}.W_UK")[hd][:, x] = -p[f"{a}.W_UK"][hd][:, y]
            for x in range(vdim):
                for y in range(vdim):
                    v = VO.new()
                    VO.at(v, f"{a}.W_UV")[hd][:, y] = p[f"{a}.W_UV"][hd][:, x]
                    VO.at(v, f"{a}.W_O")[hd][x, :] = -p[f"{a}.W_O"][hd][y, :]
        for pi, pj in rope_planes(cfg):
            eye = torch.zeros(rdim, rdim, dtype=torch.float64)
            eye[pi, pi] = eye[pj, pj] = 1.0
            J = torch.zeros(rdim, rdim, dtype=torch.float64)
            J[pi, pj], J[pj, pi] = 1.0, -1.0
            for A in (eye, J):
                v = RC.new()
                RC.at(v, wq)[..., nope:] = p[wq][..., nope:] @ A  # every head's rope query columns
                RC.at(v, f"{a}.W_KR")[...] = -p[f"{a}.W_KR"] @ A.T
                if f"{a}.b_KR" in p:
                    RC.at(v, f"{a}.b_KR")[...] = -p[f"{a}.b_KR"] @ A.T
    L = cfg.n_layers
    return [
        make_family(
            problem.layout,
            "mla-nope-gl",
            "L·h·d_nope²",
            L * h * nope * nope,
            QK,
            """Per head: the nope query columns ·M, W_UK[h]·M⁻ᵀ keep q^nope·k^nopeᵀ.""",
            in_gmax=True,
        ),
        make_family(
            problem.layout,
            "mla-rope-commutant",
            "L·d_rope",
            L * rdim,
            RC,
            """One RoPE-commutant element per layer (per plane a·I + b·J): every head's rope query
            columns ·N and the shared key W_KR, b_KR ·N⁻ᵀ.  The key is shared, so not per head.""",
        ),
        make_family(
            problem.layout,
            "mla-vo-gl",
            "L·h·d_v²",
            L * h * vdim * vdim,
            VO,
            """Per head: W_UV[h]·N, N⁻¹·W_O[h].""",
            in_gmax=True,
        ),
    ]


def stream_families(problem: Problem) -> list[Family]:
    cfg, p = problem.cfg, problem.params()
    cfg = as_latent(cfg)
    d = cfg.d_model
    readers = {n: [(w, b) for w, b in rs if w in p] for n, rs in norm_readers(cfg).items()}
    writers = [w for w in stream_writers(cfg) if w in p]
    out = []
    NS = Rows(problem.layout)
    for n, rs in readers.items():
        for k in range(d):
            v = NS.new()
            NS.at(v, f"{n}.w")[k] = p[f"{n}.w"][k]
            for w, _ in rs:
                reader_rows(NS, v, w)[k] = -reader_value(p, w)[k]
    out.append(
        make_family(
            problem.layout,
            "norm-scale",
            "2L·d" if cfg.tied else "(2L+1)·d",
            len(readers) * d,
            NS,
            """Per pre-norm: γ⊙s and its readers (the latent and RoPE-key projections, router,
            experts, shared experts, the unembedding) diag(s)⁻¹·W.""",
        )
    )
    if not cfg.tied:
        SR = Rows(problem.layout)
        for j in range(d):
            for k in range(j + 1, d):
                A = torch.zeros(d, d, dtype=torch.float64)
                A[j, k], A[k, j] = 1.0, -1.0
                stream_map_vector(problem, SR, SR.new(), A, readers, writers)
        out.append(
            make_family(
                problem.layout,
                "stream-rotation",
                "d(d−1)/2",
                d * (d - 1) // 2,
                SR,
                """Writers W·A; every pre-norm's readers −D_γ⁻¹A D_γ·W (RMSNorm commutes with O(d)).""",
            )
        )
    SS = Rows(problem.layout)
    v = SS.new()
    for w in writers:
        SS.at(v, w)[...] = p[w]
    if cfg.tied:
        SS.at(v, "ln_final.w")[...] = -p["ln_final.w"]
    out.append(
        make_family(
            problem.layout,
            "stream-scale",
            "1",
            1,
            SS,
            """Every writer ×c: every reader is an RMSNorm — exact only at ε = 0.""",
            kind=_eps_kind(cfg.norm_eps),
        )
    )
    return out


def ffn_families(problem: Problem, gen: Genericity) -> list[Family]:
    cfg, p = problem.cfg, problem.params()
    cfg = as_latent(cfg)
    SC, RB, RT, UN, UR, RO = (Rows(problem.layout) for _ in range(6))
    for pre, e, width in ffn_units(cfg):
        if e is not None and e in gen.unrouted.get(pre, []):
            continue  # its parameters are all flat (unrouted-experts)
        for k in range(width):
            v = SC.new()
            for name, sign in ((f"{pre}.W_in", 1.0), (f"{pre}.W_out", -1.0)):
                t, dt = p[name], SC.at(v, name)
                t, dt = (t, dt) if e is None else (t[e], dt[e])
                if name.endswith("W_in"):
                    dt[:, k] = t[:, k]
                else:
                    dt[k] = sign * t[k]
    for i in range(cfg.n_layers):
        if not cfg.moe_layer(i):
            continue
        m = f"blocks.{i}.moe"
        if cfg.router == "softmax":  # one vector added to every expert's column: softmax ignores it
            for r in range(cfg.d_model):
                RO.at(RO.new(), f"{m}.W_router")[r, :] = 1.0
        for e in range(cfg.experts if cfg.router == "sigmoid" else 0):
            RB.at(RB.new(), f"{m}.b_router")[e] = 1.0
            if cfg.top_k == 1 and cfg.router_renorm:
                for r in range(cfg.d_model):
                    RT.at(RT.new(), f"{m}.W_router")[r, e] = 1.0
        for e in gen.unrouted.get(m, []):
            for name in (f"{m}.W_gate", f"{m}.W_in", f"{m}.W_out"):
                for flat in range(p[name][e].numel()):
                    UN.at(UN.new(), name)[e].view(-1)[flat] = 1.0
            if cfg.router == "sigmoid" and not (cfg.top_k == 1 and cfg.router_renorm):
                for r in range(cfg.d_model):  # a sigmoid score enters only its own expert's gate
                    UN.at(UN.new(), f"{m}.W_router")[r, e] = 1.0
    for m, per in gen.unreached.items():
        for e, dirs in per.items():
            for a in dirs:
                for name in (f"{m}.W_in", f"{m}.W_gate"):
                    for col in range(p[name].shape[-1]):
                        UR.at(UR.new(), name)[e][:, col] = a
    fams = [
        make_family(
            problem.layout,
            "swiglu-scaling",
            "Σ units of dense FFNs, routed and shared experts",
            len(SC.rows),
            SC,
            """Each SwiGLU unit is linear in its up-projection: W_in[:, k]·s, W_out[k]/s.""",
        ),
        make_family(
            problem.layout,
            "router-bias-selection",
            "E per MoE layer",
            len(RB.rows),
            RB,
            """The score-correction bias enters only the choice of experts (the gates use the raw
            sigmoid scores), which is locally constant at a generic point.""",
        ),
        make_family(
            problem.layout,
            "router-offset",
            "L_MoE·d",
            len(RO.rows),
            RO,
            """DeepSeek-V2's softmax router: c added to every expert's router column adds x·c to every
            logit, which the softmax, the group ranking and the top-k ignore (the gates are softmax
            scores).""",
        ),
        make_family(
            problem.layout,
            "router-top1",
            "L_MoE·d·E",
            len(RT.rows),
            RT,
            """top_k = 1 with norm_topk_prob: the gate is s/s·ρ = ρ, so the router only selects.""",
        ),
        make_family(
            problem.layout,
            "unrouted-experts",
            "all parameters of experts never in a top-k",
            len(UN.rows),
            UN,
            """An expert that the sample never routes to has no effect on it.""",
            kind="data",
        ),
        make_family(
            problem.layout,
            "expert-unreached-readers",
            "(d − rank of its routed inputs)·(reader width)",
            len(UR.rows),
            UR,
            """An expert whose routed inputs all lie in a proper subspace cannot see its readers'
            (W_in, W_gate) components orthogonal to it.""",
            kind="data",
        ),
    ]
    return fams


def deepseek_families(problem: Problem, gen: Genericity) -> list[Family]:
    cfg = problem.cfg
    cfg = as_latent(cfg)
    require_generic_widths(cfg)
    if cfg.vocab < cfg.d_model:
        raise GaugeAuditError("deepseek nullity theory: vocab < d_model adds first-block families it does not model")
    return [
        *latent_families(problem),
        *attention_families(problem),
        *stream_families(problem),
        *ffn_families(problem, gen),
    ]
