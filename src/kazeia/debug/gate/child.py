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
from kazeia.backends.ref import RefBackend
from kazeia.debug.gate.classes import conv_node
from kazeia.debug.judge import judge, op_threshold
from kazeia.engine.context import Model
from kazeia.errors import DeviceDeathError, DeviceOpError, KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Buffer, GGMLType, array, make_tensor
from kazeia.native.threads import apply_threads


def _nodes(model: Model, op: str, weight: str, m: int, seed: int) -> list:
    """Two nodes of the class in a row, on one seeded random input: MUL_MATs of the weight with M = m rows, or
    SSM_CONVs of the kernel over m new tokens (their state columns first)."""
    w = model.weights[weight]
    x = make_tensor(GGMLType.F32, (w.ne[0], m), name="gate_x") if op == "MUL_MAT" else conv_node(w, m).src[0]
    x.buffer, x.offset = Buffer.zeros("gate_x", x.nbytes), 0
    array(x)[...] = np.random.default_rng(seed + m).standard_normal(array(x).shape).astype(np.float32)
    if op == "MUL_MAT":
        return [gb.mul_mat(w, x, f"gate_case{i}") for i in range(2)]
    return [gb.ssm_conv(x, w, f"gate_case{i}") for i in range(2)]


def _case(model: Model, op: str, weight: str, m: int, path: str, settings: HtpSettings, seed: int) -> dict:
    """The class's op twice in a row in one batch of a fresh session (so what one op leaves to the next, a DMA
    completion, VTCM, the HMX scale, is judged too), each output against REF."""
    nodes = _nodes(model, op, weight, m, seed)
    g = Graph()
    for node in nodes:
        node.buffer, node.offset = Buffer.zeros(node.name, node.nbytes), 0
        node.route_path = "hvx" if path == "hvx" else None
        g.expand(node)
    ref = RefBackend()
    ref.begin_graph(g)
    ref.compute(nodes[0])
    want = np.array(ref.value(nodes[0]), dtype=np.float64)
    backend = CpuBackend() if path == "cpu" else HtpBackend(settings)
    out = {"m": m, "path": path}
    try:
        backend.begin_graph(g)
        for node in nodes:
            backend.compute(node)
        backend.end_graph()
        backend.synchronize()  # the outputs are read next (2026-10's graph_compute returns without a flush)
    except DeviceDeathError as e:
        return {**out, "ok": False, "evidence": f"device died: {getattr(e, 'kind', '') or ''} {e.cause}"}
    except DeviceOpError as e:
        return {**out, "ok": False, "evidence": f"op failed: {e}"}
    verdicts = [judge(np.array(array(n), dtype=np.float64), want, op_threshold(op), op=op, name_a=path)
                for n in nodes]
    bad = next((i for i, v in enumerate(verdicts) if not v.ok), None)
    v = verdicts[0 if bad is None else bad]
    where = "" if bad is None else (" (the first of two in a row)" if bad == 0 else " (the second of two in a row)")
    return {**out, "ok": bad is None, "nmse": v.nmse, "evidence": v.short() + where}


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        job = json.load(f)
    apply_threads(job)
    try:
        model = Model.load(job["model"])
        s = job["settings"]
        settings = HtpSettings.from_env(env={}, profile=s["profile"], vtcm_bytes=s["vtcm"], faults=s["faults"],
                                        overrides=s.get("env", {}))
    except KazeiaError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 2
    for m, path in job["cases"]:
        print(json.dumps({"start": [m, path]}), flush=True)
        print(json.dumps(_case(model, job.get("op", "MUL_MAT"), job["weight"], m, path, settings,
                               job.get("seed", 0))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
