"""Replaying a dumped op: alone on any backend, or with its HTP batch context, judged against float64.

`replay(dump, device=..., htp_profile=..., with_context=...)` rebuilds the op's tensors at their original
buffer offsets and addresses (so in-place aliasing and the HTP's descriptor de-duplication are what they
were), runs it, and compares its output with `ref` (float64, run on the same inputs) using the per-op
thresholds of test-backend-ops, and with the output the dump recorded.

Alone, the op runs in a fresh device: fresh VTCM, a batch of one op. That answers "do these inputs (values
and shapes) make this op fail?". With context (HTP dumps taken at completion), the VTCM contents and DSP
state at the start of the op's batch are restored, the memory the batch read is put back at the original
addresses, and the ops that preceded it in its batch are rerun first, in the same order and with the same
descriptor indexes. That answers "does this op fail because of what ran before it in the batch?". The two
answers side by side separate a value-triggered fault from a context-triggered one.

The parts: `materialize` (the dumped tensors rebuilt at their addresses), `alone` (a run in a fresh device, and
the float64 reference), `with_context` (the batch rerun on the restored device state), `results` (what a replay
found, in words) and `run` (the entry point). Every output is judged by kazeia.debug.judge.
"""

from kazeia.debug.replay.materialize import materialize
from kazeia.debug.replay.results import Execution, ReplayResult, format_result
from kazeia.debug.replay.run import dump_threshold, htp_settings_for, replay

__all__ = ["Execution", "ReplayResult", "dump_threshold", "format_result",
           "htp_settings_for", "materialize", "replay"]
