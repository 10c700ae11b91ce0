"""The single error type of gauge-audit.

Anything raised as :class:`GaugeAuditError` is a user-facing problem (bad input,
unknown name, singular group element, malformed claim file).  The CLI prints its
message on one line to stderr and exits with status 2; it never shows a traceback.
An error that collects several problems (every field error of a claim file) carries
one line per problem in :attr:`GaugeAuditError.lines`; the CLI prints each on its own line.
"""


class GaugeAuditError(Exception):
    """A user-facing error: one line per problem (usually exactly one)."""

    def __init__(self, message: str, *more: str):
        self.lines = [" ".join(str(m).split()) for m in (message, *more)]
        super().__init__("\n".join(self.lines))
