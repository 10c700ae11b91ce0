"""High-precision cross-check: an independent mpmath implementation of the reference
transformers, the gauge actions re-implemented exactly, certified (interval-arithmetic)
counterexamples for the false rules, the referee's concrete test, and the
floating-point error study.

Public API (each returns a dataclass with ``to_json()``; none changes mpmath's global
precision — every function works inside :func:`workdps`):

    check_action(action, model=None, dps=(30, 50, 100), seed=0, kappa=10, certify=False) -> ActionPrecision
    torch_agreement(model_name, seed=0, dps=30) -> Agreement
    certify_rule(rule, seed=0) -> Certificate          (rules: CERTIFIABLE)
    referee_test(seed=0, dps=50, sequences=100) -> RefereeResult
    run_study(...) -> ErrorStudy;  plot_study(study, path);  eps24_verdict / wiki_1e12_verdict(study)
    claim_verdict(claim_id, seed=0) -> PrecisionVerdict  (claims: CLAIMS)
"""

from .block import workdps
from .certify import CERTIFIABLE, Certificate, certify_all, certify_rule, value_g3_residuals
from .error_study import ErrorStudy, eps24_verdict, plot_study, run_study, wiki_1e12_verdict
from .referee import RefereeResult, referee_test
from .residual import (
    ActionPrecision,
    Agreement,
    check_action,
    default_model,
    false_actions,
    torch_agreement,
    true_actions,
)
from .verdicts import CLAIMS, PrecisionVerdict, claim_verdict

__all__ = [
    "workdps",
    "CERTIFIABLE",
    "Certificate",
    "certify_all",
    "certify_rule",
    "value_g3_residuals",
    "ErrorStudy",
    "eps24_verdict",
    "plot_study",
    "run_study",
    "wiki_1e12_verdict",
    "RefereeResult",
    "referee_test",
    "ActionPrecision",
    "Agreement",
    "check_action",
    "default_model",
    "false_actions",
    "torch_agreement",
    "true_actions",
    "CLAIMS",
    "PrecisionVerdict",
    "claim_verdict",
]
