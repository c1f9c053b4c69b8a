"""The one outcome of a run (debug/outcome.py), class by class, from RunResults as run / run_child return them; and
the tools that report an outcome take it from there (upgrade's sides, determinism's signature, gate's cases)."""

from __future__ import annotations

import numpy as np

from kazeia.debug import outcome as O
from kazeia.debug.determinism import _signature
from kazeia.debug.runner import RunResult
from kazeia.engine.nonfinite import NonFiniteLogitsError
from kazeia.errors import DeviceDeathError, DeviceHangError, DeviceOpError, KazeiaError

REF = np.linspace(-3, 3, 64, dtype=np.float32)[None]


def test_each_class():
    death = RunResult(ok=False, death={"message": "ggml-hex: dspqueue_read failed: 0x0000002e", "kind":
                                        "stack-overflow", "faulting": "ffn_out-0", "cause": "stack overflow"})
    o = O.classify(death, REF)
    assert o.kind == O.DEATH and o.op == "ffn_out-0" and o.host_line.endswith("0x0000002e") and o.failed
    hang = RunResult(ok=False, death={"message": "no response", "kind": "hang", "faulting": "ffn_out-0"})
    assert O.classify(hang).kind == O.HANG
    assert O.classify(RunResult(ok=False, error="child timed out after 600 s (hang)")).kind == O.HANG
    status = RunResult(ok=False, error="op failed", error_detail={"status": "INTERNAL-ERROR", "faulting": "Qcur-0",
                                                                  "aborted_in": "synchronize"})
    o = O.classify(status)
    assert o.kind == O.OP_ERROR and o.op == "Qcur-0" and "INTERNAL-ERROR" in o.summary
    assert O.classify(RunResult(ok=False, error="child exited with status 1: boom")).kind == O.ERROR


def test_numbers_nan_is_never_completes():
    nan = REF.copy()
    nan[0, ::2] = np.nan
    o = O.classify(RunResult(ok=True, logits=nan), REF)
    assert o.kind == O.WRONG and o.nonfinite == 32 and o.total == 64 and "32 of 64 logits are not finite" in o.summary
    assert O.classify(RunResult(ok=True, logits=nan)).kind == O.WRONG  # no reference needed to see a NaN
    far = REF + 0.5
    o = O.classify(RunResult(ok=True, logits=far), REF)
    assert o.kind == O.WRONG and o.nmse > 2e-3 and "past the whole-model bound" in o.summary
    near = REF * np.float32(1.0001)
    o = O.classify(RunResult(ok=True, logits=np.concatenate([far, near])), REF)  # the last row is judged
    assert o.ok and o.judged and o.nmse < 2e-3
    o = O.classify(RunResult(ok=True, logits=REF))
    assert o.ok and not o.judged and "not judged" in o.summary


def test_exceptions_and_the_tools_signatures():
    assert O.of_exception(DeviceHangError("h", code=0)) == O.HANG
    assert O.of_exception(DeviceDeathError("d", code=0x2E)) == O.DEATH
    assert O.of_exception(DeviceOpError("s")) == O.OP_ERROR
    assert O.of_exception(KazeiaError("x")) == O.ERROR
    # `kazeia run`'s non-finite logits (exit 4) carry the class the tools give a finished run with NaN logits
    nan_run = NonFiniteLogitsError("decode", np.full((1, 4), np.nan, np.float32), None)
    assert O.of_exception(nan_run) == O.classify(RunResult(ok=True, logits=np.full((1, 4), np.nan))).kind == O.WRONG
    assert O.of_exception(ValueError("not ours")) == O.ERROR
    nan = np.full((1, 4), np.nan, np.float32)
    assert _signature(RunResult(ok=True, logits=nan)) == "wrong numbers: 4 of 4 logits are not finite"
    assert _signature(RunResult(ok=True, logits=np.ones((1, 4), np.float32))) == "ok"
