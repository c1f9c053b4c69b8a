"""One switch, KAZEIA_NO_BIND=1, runs every general path (kazeia/identity.py): the scheduler's op-by-op placement, a
graph built anew for every micro-batch, the CPU's node-by-node calls bound per call, the HTP host's op-by-op batches,
the DSP's general op and matmul paths and run-by-run scratch writes. Bound is bitwise the unbound path: the same
logits, tokens and DSP log, on the CPU, on HTP0 robust and 2026-10, under 2026-05 with a gate, on a hybrid model
and with a fault whose race is pinned by its seed."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import settings
from kazeia.engine.session import RunSpec, build_context, prompt_ids
from kazeia.gguf.writer import preset, write_model

CASES = {
    "cpu": dict(device="CPU"),
    "htp-robust": dict(device="HTP0", htp_profile="robust"),
    "htp-2026-10": dict(device="HTP0", htp_profile="2026-10"),  # (its decode: the bound October HVX matmuls)
    "htp-2026-05-gated": dict(device="HTP0", htp_profile="2026-05", vtcm=262144, gates=["vtcm-plan"]),
    "htp-fault-race-7": dict(device="HTP0", htp_profile="robust", faults=["scatter-unretired"],
                             env={"KAZEIA_HTP_RACE_SEED": "7"}),
    "htp-hybrid": dict(device="HTP0", htp_profile="robust", model="hybrid"),
}


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("bind_hybrid") / "h.gguf")
    write_model(preset("tiny", arch="qwen35"), path)
    return path


def _run(spec: RunSpec, monkeypatch, bind: bool) -> tuple:
    with monkeypatch.context() as mp:
        mp.setenv("KAZEIA_NO_BIND", "0" if bind else "1")
        for k, v in spec.env.items():
            mp.setenv(k, v)
        settings.reload()
        ctx = build_context(spec)
        ids = prompt_ids(spec, ctx.model)
        logits = [np.array(ctx.decode(ids)[-1])]
        tokens = []
        for _ in range(3):
            tokens.append(int(np.argmax(logits[-1])))
            logits.append(np.array(ctx.decode([tokens[-1]])[-1]))
        log = next((b.dsp_log() for b in ctx.scheduler.backends if hasattr(b, "dsp_log")), [])
        kept = _kept(ctx)
    settings.reload()
    return np.stack(logits), tokens, log, kept


def _kept(ctx) -> int:
    """Entries the bound layers keep: the context's graphs, the scheduler's plans, the CPU's graph binds, the HTP
    host's batch records and the DSP's bound ops."""
    sched = ctx.scheduler
    n = len(ctx._graphs) + len(sched._plans) + len(sched._general_plans)
    for b in sched.backends:
        if hasattr(b, "_binds"):
            n += len(b._binds)
        if hasattr(b, "host"):
            n += len(b.host._records) + len(b.executor._bound)
    return n


@pytest.mark.parametrize("case", list(CASES))
def test_bound_is_bitwise_the_general_path(case, tiny_qwen3_q4, tiny_hybrid, monkeypatch):
    kw = dict(CASES[case])
    model = tiny_hybrid if kw.pop("model", None) == "hybrid" else tiny_qwen3_q4
    spec = RunSpec(model=model, n_prompt=40, ctx=256, ubatch=64, **kw)
    bound, unbound = _run(spec, monkeypatch, True), _run(spec, monkeypatch, False)
    assert bound[3] > 0 and unbound[3] == 0, (case, bound[3], unbound[3])  # the switch reached every layer
    assert bound[0].tobytes() == unbound[0].tobytes(), case
    assert bound[1:3] == unbound[1:3], case


def test_a_bound_mul_mat_nx_quantizes_its_src1_once(tiny_qwen3_q4, monkeypatch):
    """2026-10's MUL_MAT_NX (OPFUSION): once every node of the fused op is bound, its head quantizes the shared src1
    and runs each weight's dot from that image (matmul.py `_nx_members`); the other nodes then only report. The
    bits are test_bound_is_bitwise_the_general_path's "htp-2026-10" case; here, that the grouped run happened
    (after the first decode step, which binds every node running alone)."""
    from kazeia.backends.htp.hvx import bound as hb

    groups, members_alone = [], []
    run = hb.BoundHvxHostPlan.run

    def counted(self, ms=()):
        (groups if ms else members_alone).append(len(ms))
        return run(self, ms)
    monkeypatch.setattr(hb.BoundHvxHostPlan, "run", counted)
    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=40, ctx=256, ubatch=64, **CASES["htp-2026-10"])
    _run(spec, monkeypatch, True)
    assert groups and all(n >= 1 for n in groups)
    assert members_alone  # the first decode step binds: every node runs alone
