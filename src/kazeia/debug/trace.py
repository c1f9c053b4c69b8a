"""kazeia's op trace (--oplog, `kazeia trace`): one KZOP line per EXECUTED op, with NaN-aware statistics.

Unlike the original team's enqueue-time OPLOG (GGML_HEXAGON_OPLOG, backends/htp/host/oplog.py, which the HTP host
prints in enqueue_op from whatever memory holds then), a line is written when the op has completed on its device
(for the HTP: when the DSP finished it, inside the batch), so the statistics describe the data the op
really consumed and produced. Inputs are measured at op start (an op working in place would otherwise
overwrite them), the output at completion. Lines go to stderr and, as JSON, to a JSONL file.
"""

from __future__ import annotations

import json
import sys
from typing import IO

from kazeia.backends.base import Hook, OpInfo
from kazeia.debug.stats import Stats, tensor_stats
from kazeia.errors import KazeiaError
from kazeia.graph.tensor import Tensor, type_name


class NonFiniteStop(KazeiaError):
    """Raised by the trace when --stop-on-nonfinite sees an op output holding NaN or inf."""

    exit_code = 1

    def __init__(self, node: str, op: str, stats: Stats, index: int):
        super().__init__(f"first non-finite output: {node} ({op}, node #{index}): {stats.short()}")
        self.node, self.op, self.stats, self.index = node, op, stats, index


def _new_nonfinite(out: Stats, ins: list[Stats | None]) -> bool:
    """A NaN in the output, or an infinity none of the op's sources held: the -inf of a KQ mask that an op
    copies (the mask's F16 cast) is not a new non-finite value; a NaN never has a right to be there."""
    if out.nan:
        return True
    return bool(out.pinf + out.ninf) and not any(s is not None and s.pinf + s.ninf for s in ins)


def tensor_label(t: Tensor) -> str:
    w = f"({t.weight_name})" if t.weight_name else ""
    return f"{type_name(t.type)}[{','.join(str(x) for x in t.ne)}]{w}"


class TraceHook(Hook):
    def __init__(self, stream: IO[str] | None = sys.stderr, jsonl: IO[str] | None = None,
                 stop_on_nonfinite: bool = False, input_stats: bool = True) -> None:
        self.stream = stream
        self.jsonl = jsonl
        self.stop_on_nonfinite = stop_on_nonfinite
        self.input_stats = input_stats
        self._inputs: dict[int, list[Stats | None]] = {}
        self.records: list[dict] = []
        self.count = 0
        self.ubatch = 0  # set by the caller between graphs

    def on_start(self, node: Tensor, info: OpInfo) -> None:
        if self.input_stats:
            # (a ggml_cast lists its own result as src[1]: that is no input, only the bytes it will overwrite)
            self._inputs[id(node)] = [tensor_stats(s) if s is not None and s is not node and not s.weight_name
                                      else None for s in node.src]

    def on_complete(self, node: Tensor, info: OpInfo) -> None:
        out = tensor_stats(node)
        ins = self._inputs.pop(id(node), [None] * len(node.src))
        rec = {
            "seq": self.count, "ubatch": self.ubatch, "index": info.index, "name": node.name, "op": node.desc(),
            "backend": info.backend, "path": info.path, "batch": info.batch,
            "dst": tensor_label(node),
            "src": [tensor_label(s) if s is not None else None for s in node.src],
            "src_stats": [s.to_dict() if s else None for s in ins],
            "dst_stats": out.to_dict() if out else None,
        }
        for k in ("status", "hmx_fallback", "src1_reused", "mc", "nc", "fused"):  # fused: 2026-10's op name
            if k in info.extra:
                rec[k] = info.extra[k]
        if node.route_rule:  # the gate-policy rule that routed it (engine/policy.py)
            rec["rule"] = node.route_rule
        self.count += 1
        self.records.append(rec)
        if self.stream is not None:
            self.stream.write(self.format(rec, ins, out) + "\n")
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(rec) + "\n")
        if self.stop_on_nonfinite and out is not None and _new_nonfinite(out, ins):
            if self.stream is not None:
                self.stream.flush()
            raise NonFiniteStop(node.name, node.desc(), out, info.index)

    def on_fault(self, node: Tensor, info: OpInfo) -> None:
        rec = {"seq": self.count, "ubatch": self.ubatch, "index": info.index, "name": node.name, "op": node.desc(),
               "backend": info.backend, "path": "FAULT", "batch": info.batch, "fault": info.extra}
        self.records.append(rec)
        if self.stream is not None:
            self.stream.write(f"KZOP #{info.index} {node.name} {node.desc()} {info.backend} FAULT batch={info.batch} "
                              f"{info.extra.get('kind')}: {info.extra.get('cause')}\n")
        if self.jsonl is not None:
            self.jsonl.write(json.dumps(rec) + "\n")

    @staticmethod
    def format(rec: dict, ins: list[Stats | None], out: Stats | None) -> str:
        srcs = " ".join(f"src{i}={s}" for i, s in enumerate(rec["src"]) if s)
        parts = [f"KZOP #{rec['index']} {rec['name']} {rec['op']} {rec['backend']}/{rec['path']}",
                 f"batch={rec['batch']}" if rec["batch"] is not None else "",
                 f"fused={rec['fused']}" if rec.get("fused") else "",
                 f"rule={rec['rule']}" if rec.get("rule") else "", f"dst={rec['dst']} {srcs}"]
        for i, s in enumerate(ins):
            if s is not None:
                parts.append(f"| s{i}: {s.short()}")
        if out is not None:
            parts.append(f"| dst: {out.short()}")
        return " ".join(p for p in parts if p)
