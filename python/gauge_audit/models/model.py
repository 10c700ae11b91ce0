"""The :class:`Model` handle the checkers use: a configuration, one parameter point, its family.

Below both the checkpoint reader (whose ``Checkpoint.model`` returns one) and the registry of
named models (whose ``build`` returns one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

import torch

from ..errors import GaugeAuditError
from ..runtime import generator
from .config import Config
from .lazy import Params, params_device, params_dtype


@dataclass
class Model:
    """A configuration plus one parameter point.  ``forward`` never mutates ``params``."""

    name: str
    cfg: Config
    params: Params
    family: ModuleType
    # Set once every parameter is known to be finite (checked when read from a checkpoint, or by
    # numeric.require_finite), so the check is not repeated.
    _finite: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return params_device(self.params)

    @property
    def dtype(self) -> torch.dtype:
        return params_dtype(self.params)

    def forward(self, params: Params, inputs: dict, trace: dict | None = None) -> torch.Tensor:
        dtype = params_dtype(params)
        moved = {
            k: (v.to(self.device, dtype) if v.is_floating_point() else v.to(self.device)) for k, v in inputs.items()
        }
        return self.family.forward(params, self.cfg, moved, trace)

    def sample_inputs(self, seed: int, batch: int = 4, n: int | None = None) -> dict:
        n = min(self.cfg.n_ctx, 16) if n is None else n
        if n > self.cfg.n_ctx and self.cfg.pos == "learned":
            raise GaugeAuditError(f"sequence length {n} exceeds n_ctx {self.cfg.n_ctx}")
        return self.family.sample_inputs(self.cfg, generator(seed), batch, n)
