"""llama.cpp #24963's hang: May's op_matmul ends a failed HMX matmul with `return op_matmul(octx);`. Compiled as a
call (the seed's build) every retry takes a frame and the stack overflows (0x2e); compiled as a jump (the injected
build variant `reentry-tail-call`) the same failing plan is retried forever and the host never gets a response."""

from __future__ import annotations

import pytest

from kazeia.debug.runner import run
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError

pytestmark = pytest.mark.slow  # 40-token prefills of a 4B-wide layer (a few seconds each)


def _spec(path: str, **kw) -> RunSpec:
    base = dict(model=path, device="HTP0", htp_profile="2026-05", n_prompt=40)
    return RunSpec(**{**base, **kw})


def test_the_tail_call_build_hangs_where_the_seeds_build_crashes(q4b2):
    crash = run(_spec(q4b2))
    hang = run(_spec(q4b2, faults=["reentry-tail-call"]))
    assert crash.death["kind"] == "stack-overflow" and crash.death["code"] == 0x2E
    assert hang.death["kind"] == "hang" and hang.death["crash_record"] is None
    assert hang.death["faulting"] == crash.death["faulting"] == "ffn_out-0"
    assert "no response" in hang.death["message"] and "hang" in hang.death["message"]
    assert "M=40 K=9728 N=2560" in hang.death["cause"]


@pytest.mark.parametrize("kw", [dict(ubatch=16), dict(htp_profile="robust")])
def test_what_avoids_the_crash_avoids_the_hang(q4b2, kw):
    """M < 32 takes HVX (no HMX plan to fail); robust falls back to HVX instead of re-entering."""
    assert run(_spec(q4b2, faults=["reentry-tail-call"], **kw)).ok


def test_october_has_no_reentry_to_compile(q4b2):
    with pytest.raises(KazeiaError, match="models 2026-05 code"):
        run(_spec(q4b2, htp_profile="2026-10", faults=["reentry-tail-call"]))
