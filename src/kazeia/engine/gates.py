"""Routing gates: rules that send a node to another backend before placement asks `supports`.

A gate is a callable node -> backend name | None with a `reason` attribute, installed in the scheduler's
Router. `NodeShapeGate` sends named weights at an M range elsewhere. A device may offer gates of its own by name
(`Backend.make_gate`): the HTP's `vtcm-plan` (backends/htp/gates.py, the one `kazeia investigate` recommends for
the HMX VTCM-overflow fault) keeps on the CPU every MUL_MAT whose HMX plan would not fit. The engine builds them by
asking the run's backends, never by importing a device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kazeia.errors import KazeiaError
from kazeia.graph.tensor import Tensor
from kazeia.limits import safe_regex


@dataclass
class NodeShapeGate:
    """Weights whose GGUF name matches `weight_regex`, with src1 row count M in [m_lo, m_hi], go to `target`."""

    weight_regex: str
    m_lo: int
    m_hi: int
    target: str = "CPU"
    reason: str = "gate: known-bad shape"

    def __post_init__(self) -> None:
        self._re = safe_regex(self.weight_regex, "gate")

    def __call__(self, node: Tensor) -> str | None:
        if node.op != "MUL_MAT":
            return None
        w, x = node.src[0], node.src[1]
        if w.weight_name and self._re.search(w.weight_name) and self.m_lo <= x.ne[1] <= self.m_hi:
            return self.target
        return None

    def describe(self) -> str:
        return f"route to {self.target} MUL_MATs of /{self.weight_regex}/ with M in {self.m_lo}..{self.m_hi}"


DEVICE_GATES = ("vtcm-plan",)  # gates a device builds (Backend.make_gate), by the name --gate gives


def parse_gate(spec: str, backends: list | None = None):
    """`--gate vtcm-plan` or `--gate 'weight=REGEX,m=LO-HI'` (target CPU). A device's gate (DEVICE_GATES) is built by
    the first of `backends` that makes it, else None (no backend of this run would take those nodes); without
    `backends` it is only checked (the command line's parse)."""
    if spec in DEVICE_GATES:
        return next((g for b in backends or () if (g := b.make_gate(spec)) is not None), None)
    fields = dict(kv.split("=", 1) for kv in spec.split(",") if "=" in kv)
    try:
        lo, hi = (int(v) for v in fields["m"].split("-"))
        weight = fields["weight"]
    except (KeyError, ValueError):
        raise KazeiaError(f"bad --gate {spec!r}: use 'vtcm-plan' or 'weight=REGEX,m=LO-HI'") from None
    if not 1 <= lo <= hi:
        raise KazeiaError(f"bad --gate {spec!r}: m=LO-HI needs 1 <= LO <= HI (rows of the activation)")
    try:
        return NodeShapeGate(weight, lo, hi)
    except re.error as e:
        raise KazeiaError(f"bad --gate {spec!r}: weight={weight!r} is not a valid regular expression: {e}") from None
