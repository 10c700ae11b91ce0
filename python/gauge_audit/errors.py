"""The single error type of gauge-audit.

Anything raised as :class:`GaugeAuditError` is a user-facing problem (bad input,
unknown name, singular group element, malformed claim file).  The CLI prints its
message on one line to stderr and exits with status 2; it never shows a traceback.
"""


class GaugeAuditError(Exception):
    """A user-facing error with a one-line message."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
