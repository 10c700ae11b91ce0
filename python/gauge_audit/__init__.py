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

import os

__version__ = "0.1.0"

# SymPy memoises its expression constructors in an LRU cache of SYMPY_CACHE_SIZE entries (1000 by
# default), sized when SymPy is first imported.  The symbolic checkers build the same block
# identities again for every candidate correction of a rule; with 20 000 entries the rule audit of
# claims/examples/catalog_as_rules.toml spends a fifth less time in them (6.7 s → 5.4 s).  The
# cache changes no result.  A size set by the user, or SymPy imported before this package, is left
# as it is.
os.environ.setdefault("SYMPY_CACHE_SIZE", "20000")
