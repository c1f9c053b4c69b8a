"""Child process of `kazeia gate --auto`: `python -m kazeia.debug.gate.child JOB.json`.

Runs one class's cases (M, path), a MUL_MAT's or a short conv's (SSM_CONV), with the model's own weight
(memory-mapped) and seeded random activations on a fresh HTP session with the job's settings, twice in a row in
one batch, and on REF (float64), and judges both outputs with the forensic tools' judge. One JSON line per case
on stdout as soon as it is done, so the parent keeps what was judged if the process dies afterwards (a death of
the process is the failure of the case it was running).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from kazeia.backends.cpu import CpuBackend
from kazeia.backends.htp import HtpBackend, HtpSettings
from kazeia.backends.ref import RefBackend, WeightCache
from kazeia.debug.gate.classes import conv_node
from kazeia.debug.judge import judge, op_threshold
from kazeia.debug.outcome import COMPLETES, WRONG, of_exception
from kazeia.engine.context import Model
from kazeia.errors import DeviceDeathError, DeviceOpError, KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Buffer, GGMLType, Tensor, array, make_tensor
from kazeia.limits import read_json_object
from kazeia.native.threads import apply_threads


class Cases:
    """The inputs and REF's outputs of one child's cases, one op and weight.

    A MUL_MAT's activations for M = m are the first m rows of one seeded matrix of the child's largest M, so REF
    (float64, the weight dequantized once) is computed once, at that M, and each case is judged against its rows
    (a matmul's row depends on its own input row only). A short conv's inputs are seeded per M, its REF computed
    per M (a cheap op)."""

    def __init__(self, model: Model, op: str, weight: str, m_max: int, seed: int) -> None:
        self.op, self.w, self.seed = op, model.weights[weight], seed
        self.weights = WeightCache()
        self._ref: dict[int, np.ndarray] = {}
        self.rows = None
        if op == "MUL_MAT":
            self.rows = np.random.default_rng(seed).standard_normal((m_max, self.w.ne[0])).astype(np.float32)

    def nodes(self, m: int) -> list[Tensor]:
        """Two nodes of the class in a row, on one input: MUL_MATs of the weight with M = m rows, or SSM_CONVs of
        the kernel over m new tokens (their state columns first)."""
        w = self.w
        if self.op == "MUL_MAT":
            x = make_tensor(GGMLType.F32, (w.ne[0], m), name="gate_x")
        else:
            x = conv_node(w, m).src[0]
        x.buffer, x.offset = Buffer.zeros("gate_x", x.nbytes), 0
        if self.rows is not None:
            array(x)[...] = self.rows[:m]
            return [gb.mul_mat(w, x, f"gate_case{i}") for i in range(2)]
        array(x)[...] = np.random.default_rng(self.seed + m).standard_normal(array(x).shape).astype(np.float32)
        return [gb.ssm_conv(x, w, f"gate_case{i}") for i in range(2)]

    def reference(self, m: int, node: Tensor) -> np.ndarray:
        """REF's output of the case's node (M = m)."""
        if self.rows is None:
            if m not in self._ref:
                self._ref[m] = self._compute(node)
            return self._ref[m]
        top = len(self.rows)
        if top not in self._ref:
            self._ref[top] = self._compute(self.nodes(top)[0])
        return self._ref[top][..., :m, :]

    def _compute(self, node: Tensor) -> np.ndarray:
        g = Graph()
        if node.buffer is None:
            node.buffer, node.offset = Buffer.zeros(node.name, node.nbytes), 0
        g.expand(node)
        ref = RefBackend(self.weights)
        ref.begin_graph(g)
        ref.compute(node)
        return np.array(ref.value(node), dtype=np.float64)


def _case(cases: Cases, m: int, path: str, settings: HtpSettings) -> dict:
    """The class's op twice in a row in one batch of a fresh session (so what one op leaves to the next, a DMA
    completion, VTCM, the HMX scale, is judged too), each output against REF."""
    nodes = cases.nodes(m)
    g = Graph()
    for node in nodes:
        node.buffer, node.offset = Buffer.zeros(node.name, node.nbytes), 0
        node.route_path = "hvx" if path == "hvx" else None
        g.expand(node)
    want = cases.reference(m, nodes[0])
    backend = CpuBackend() if path == "cpu" else HtpBackend(settings)
    out = {"m": m, "path": path}
    try:
        backend.begin_graph(g)
        for node in nodes:
            backend.compute(node)
        backend.end_graph()
        backend.synchronize()  # the outputs are read next (2026-10's graph_compute returns without a flush)
    except (DeviceDeathError, DeviceOpError) as e:  # classed as every tool classes a run (debug/outcome.py)
        kind = of_exception(e)
        what = f"{getattr(e, 'kind', '') or ''} {e.cause}" if isinstance(e, DeviceDeathError) else str(e)
        return {**out, "ok": False, "outcome": kind, "evidence": f"{kind}: {what}"}
    verdicts = [judge(np.array(array(n), dtype=np.float64), want, op_threshold(cases.op), op=cases.op,
                      name_a=path) for n in nodes]
    bad = next((i for i, v in enumerate(verdicts) if not v.ok), None)
    v = verdicts[0 if bad is None else bad]
    where = "" if bad is None else (" (the first of two in a row)" if bad == 0 else " (the second of two in a row)")
    return {**out, "ok": bad is None, "outcome": COMPLETES if bad is None else WRONG, "nmse": v.nmse,
            "evidence": v.short() + where}


def main(argv: list[str]) -> int:
    job = read_json_object(argv[0], "child job")
    apply_threads(job)
    try:
        model = Model.load(job["model"])
        s = job["settings"]
        settings = HtpSettings.from_env(env={}, profile=s["profile"], vtcm_bytes=s["vtcm"], faults=s["faults"],
                                        overrides=s.get("env", {}))
    except KazeiaError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 2
    cases = Cases(model, job.get("op", "MUL_MAT"), job["weight"], max(m for m, _ in job["cases"]),
                  job.get("seed", 0))
    for m, path in job["cases"]:
        print(json.dumps({"start": [m, path]}), flush=True)
        print(json.dumps(_case(cases, m, path, settings)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
