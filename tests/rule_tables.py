"""Rule tables the rule tests share (the [claim.rule] shape, as dicts)."""

QK = {
    "scope": "kv-group",
    "elements": {"M": "GL(d_k)"},
    "maps": {"W_Q": "W_Q @ M", "b_Q": "b_Q @ M", "W_K": "W_K @ inv(transpose(M))", "b_K": "b_K @ inv(transpose(M))"},
}
SAME = {
    "scope": "kv-group",
    "elements": {"M": "GL(d_k)"},
    "maps": {"W_Q": "W_Q @ M", "b_Q": "b_Q @ M", "W_K": "W_K @ M", "b_K": "b_K @ M"},
}
VO = {
    "scope": "kv-group",
    "elements": {"N": "GL(d_v)"},
    "maps": {"W_V": "W_V @ N", "b_V": "b_V @ N", "W_O": "inv(N) @ W_O"},
}
WRITERS = {
    "W_E": "W_E @ R",
    "W_pos": "W_pos @ R",
    "W_O": "W_O @ R",
    "b_O": "b_O @ R",
    "W_out": "W_out @ R",
    "b_out": "b_out @ R",
}
READERS = {w: f"transpose(R) @ {w}" for w in ("W_Q", "W_K", "W_V", "W_in", "W_gate", "W_router", "W_U")}
PAPER = {"scope": "model", "elements": {"R": "SO1(d_model)"}, "maps": {**WRITERS, **READERS}}
