"""Which reference architectures a claim's ``params`` select (``family``, ``norm``, ``tied`` …):
shared by the plain checkers and the rule checkers, below both.
"""

from __future__ import annotations

from ..models.config import Config


def _one_of(value, allowed) -> bool:
    return value in (allowed if isinstance(allowed, (list, tuple)) else (allowed,))


def matches_params(cfg: Config, params) -> bool:
    """Does a reference architecture have the features the claim's params name?  (``family``,
    ``pos`` and ``norm_placement`` take a name or a list of names.)"""
    for key in ("family", "pos", "norm_placement"):
        if key in params and not _one_of(getattr(cfg, key), params[key]):
            return False
    norm, affine = params.get("norm"), params.get("norm_affine")
    if norm is not None and not cfg.norm.startswith(norm):
        return False
    if affine is not None and (cfg.norm in ("layernorm", "rmsnorm")) != bool(affine):
        return False
    if "tied" in params and cfg.tied != bool(params["tied"]):
        return False
    if "activation" in params and cfg.act != params["activation"]:
        return False
    if "n_experts" in params and not cfg.experts:
        return False
    return True
