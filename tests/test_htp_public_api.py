"""The HTP backend's small public surface for forensic tools: snapshot()/restore() of the device state,
add_batch_start_hook(), open_batch() (a recorded batch rebuilt) and weights_for(node); and supports_op refusing
what the backend cannot run end to end (MXFP4)."""

from __future__ import annotations

import numpy as np

from kazeia.backends.base import Hook
from kazeia.backends.htp.backend import HtpBackend
from kazeia.backends.htp.host.support import supports_op
from kazeia.backends.htp.settings import HtpSettings
from kazeia.engine.session import RunSpec, build_context, prompt_ids
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType, TFlag, make_tensor, rows


def _htp_run(model: str, n: int = 40, hooks=()):
    spec = RunSpec(model=model, n_prompt=n, device="HTP0")
    ctx = build_context(spec)
    for h in hooks:
        ctx.scheduler.add_hook(h)
    ctx.decode(prompt_ids(spec, ctx.model))
    return next(b for b in ctx.scheduler.backends if isinstance(b, HtpBackend))


def test_snapshot_restore_round_trip(tiny_qwen3_q4):
    be = _htp_run(tiny_qwen3_q4)
    state = be.snapshot()
    assert state.vtcm.any()  # a run leaves bytes in VTCM
    fresh = HtpBackend(be.settings)
    assert not fresh.snapshot().vtcm.any()
    assert fresh.restore(state) == []
    again = fresh.snapshot()
    assert np.array_equal(again.vtcm, state.vtcm) and again.registers() == state.registers()
    state.vtcm[:] = 0  # a snapshot is a copy, not a view of the device
    assert fresh.snapshot().vtcm.any()
    small = HtpBackend(HtpSettings(vtcm_bytes=be.settings.vtcm_bytes // 2))
    notes = small.restore(again)
    assert notes and "restored the first" in notes[0]
    assert np.array_equal(small.snapshot().vtcm, again.vtcm[: small.settings.vtcm_bytes])


def test_batch_start_hook_sees_every_batch_before_its_first_op(tiny_qwen3_q4):
    seen = []

    class Binder(Hook):
        def bind_backend(self, backend):
            if not seen:
                backend.add_batch_start_hook(lambda be, batch: seen.append((be, batch.seq, len(batch.ops))))

        def on_start(self, node, info):
            if info.backend == "HTP0":
                assert seen and seen[-1][1] == info.batch  # its batch started first

    be = _htp_run(tiny_qwen3_q4, hooks=(Binder(),))
    assert seen and all(b is be for b, _, _ in seen) and all(n > 0 for _, _, n in seen)


def test_weights_for_is_the_repack_of_the_nodes_weight(tiny_qwen3_q4):
    nodes = []

    class Grab(Hook):
        def on_complete(self, node, info):
            if node.op == "MUL_MAT" and info.backend == "HTP0" and node.src[0].weight_name:
                nodes.append(node)

    be = _htp_run(tiny_qwen3_q4, hooks=(Grab(),))
    assert nodes
    for node in nodes[:3]:
        w = node.src[0]
        rw = be.weights_for(node)
        assert rw.qtype == w.type and (rw.k, rw.n) == (w.ne[0], w.ne[1])
        assert np.array_equal(rw.ggml.reshape(w.ne[1], -1), rows(w)[0, 0].reshape(w.ne[1], -1))


def test_open_batch_rebuilds_descriptors_and_synchronize_runs_it(tiny_qwen3_q4):
    x = make_tensor(GGMLType.F32, (256, 40), name="x")
    w = make_tensor(GGMLType.F32, (256,), name="w")
    node = gb.mul(gb.rms_norm(x, 1e-6), w)
    g = gb.Graph()
    g.expand(node)
    from kazeia.graph.alloc import GraphAllocator

    GraphAllocator().allocate(g)
    be = HtpBackend(HtpSettings())
    done = []

    class Done(Hook):
        def on_complete(self, n, info):
            done.append((n.name, info.batch))

    be.hooks.append(Done())
    ops = [(n, i) for i, n in enumerate(g.nodes) if n.is_computed]
    batch = be.open_batch(7, ops)
    assert batch.seq == 7 and [op.node for op in batch.ops] == [n for n, _ in ops]
    assert batch.ops[1].src[0] == batch.ops[0].dst  # the second op reads the first one's descriptor
    be.synchronize()
    assert [b for _, b in done] == [7, 7]


def test_supports_op_refuses_mxfp4_which_the_repack_cannot_hold():
    s = HtpSettings()
    x = make_tensor(GGMLType.F32, (256, 40), name="x")
    for t, accepted in ((GGMLType.Q4_0, True), (GGMLType.MXFP4, False)):
        w = make_tensor(t, (256, 64), name="w", flags=TFlag.WEIGHT, weight_name="w")
        assert supports_op(gb.mul_mat(w, x), s) is accepted, t.name
