"""Reference transformer families in torch (one small file per family).

Parameters are plain ``dict[str, Tensor]`` with per-head W_Q, W_K, W_V, W_O
(no fused QKV); see :mod:`.layers` for the layout.
"""

from .config import ACTS, NORMS, Config, validate
from .families import FAMILIES, family_of, param_shapes, parameter_count, plain_stack
from .model import Model
from .registry import NAMED, build, build_config, config_of, model_names

__all__ = [
    "ACTS",
    "NORMS",
    "Config",
    "validate",
    "FAMILIES",
    "family_of",
    "param_shapes",
    "parameter_count",
    "plain_stack",
    "NAMED",
    "Model",
    "build",
    "build_config",
    "config_of",
    "model_names",
]
