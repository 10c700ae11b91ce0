"""gauge-audit: settle claims about transformer gauge symmetries four ways.

Layers (imports point one way, top to bottom):

    runtime, errors            device / dtype / seed selection; the one error type
    models                     reference transformer families (torch), params as dicts
    actions                    gauge actions: pure functions params -> params
    claims                     the claim catalog (TOML data) and its loader
    numeric / precision /      the checkers: torch, mpmath, SymPy, Jacobian nullity,
    symbolic / nullity / formal  Lean
    gauge_fix                  canonical forms and compare (uses actions and numeric)
    rules                      transformation rules as data: one engine, the four checkers on a rule
    audit, report, testing     combine checker evidence into verdicts and reports; assertions for users' tests
    cli                        the `gauge-audit` command
"""

__version__ = "0.1.0"
