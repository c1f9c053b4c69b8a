"""Replayed op batches (htp/host/batch.py) and the scheduler's graph plans (engine/scheduler.py GraphPlan).

Oracles: every batch the host sends equals the batch `OpBatch.add_op` builds, op by op from empty, of the same
nodes (all its tables, the private ones too); a decode with replays and plans sends the same batches (numbers,
ops, boundaries), places the same nodes with the same reasons and gives the same logits bit for bit as one with
KAZEIA_NO_BIND=1 (the op by op build and the general scheduler path); a node whose sources changed between two
tokens makes the host build the batch op by op from there, and so does a graph the allocator placed anew.
"""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import settings
from kazeia.backends.cpu import CpuBackend
from kazeia.backends.htp.backend import HtpBackend
from kazeia.backends.htp.msg import OpBatch
from kazeia.backends.htp.settings import HtpSettings
from kazeia.engine.context import Context, Model
from kazeia.engine.scheduler import Router, Scheduler


def _tables(b: OpBatch) -> tuple:
    ops = [(o.index, o.node.name, tuple(o.src), o.dst, o.graph_index, o.name,
            [(f.node.name, tuple(f.src), f.dst) for f in o.fused]) for o in b.ops]
    tens = [(d.index, id(d.tensor), d.addr, d.size, d.type, d.ne, d.nb, d.flags, d.buffer_index) for d in b.tensors]
    return (b.seq, ops, tens, [id(x) for x in b.buffers], b.vmem, b._by_data, b._by_tensor, b._buf_index)


def _rebuilt(b: OpBatch) -> OpBatch:
    ref = OpBatch(seq=b.seq, check_type=b.check_type)
    for o in b.ops:
        op = ref.add_op(o.node, o.graph_index)
        for f in o.fused:  # 2026-10: the nodes the host merged into it (host/fusion.py), in order
            ref.fuse(op, f.node, o.name)
    return ref


def _decode(model: str, opbatch: int, n: int, replay: bool, monkeypatch, perturb: str | None = None,
            cpu_ops: str | None = None):
    """(tables of every batch sent and every synchronize, placements per token, logits per token) of n
    one-token decodes."""
    with monkeypatch.context() as mp:
        mp.setenv("KAZEIA_NO_BIND", "0" if replay else "1")
        settings.reload()
        m = Model.load(model)
        htp = HtpBackend(HtpSettings(opbatch=opbatch))
        ctx = Context(m, Scheduler([htp, CpuBackend()], Router.from_args(cpu_ops)), n_ctx=64, n_ubatch=8)
        sent: list[tuple] = []
        sync = htp.synchronize

        def synchronize() -> None:  # every wait the scheduler asks for, with what the host holds then
            sent.append(("sync", htp.host.open_ops, len(htp.host.in_flight)))
            sync()

        htp.synchronize = synchronize

        def seen(_be, batch: OpBatch) -> None:
            assert _tables(batch) == _tables(_rebuilt(batch))
            sent.append(_tables(batch)[:2])

        htp.add_batch_start_hook(seen)
        places, logits = [], []
        for i, t in enumerate([5, 17, 99, 3, 250, 7][:n]):
            if perturb == "src" and i == 3:  # a node's source list is a new list (same tensors): replays stop there
                node = [x for x in ctx.last_graph.nodes if x.op == "MUL_MAT"][3]
                node.src = list(node.src)
            if perturb == "route" and i == 3:  # ops move to the CPU: the waits before them cut recorded batches
                ctx.scheduler.router.cpu_ops = {"GLU"}
            logits.append(ctx.decode([t]))
            places.append([(p.node, p.op, p.backend, p.reason, p.index) for p in ctx.scheduler.placements])
    settings.reload()
    return sent, places, logits


@pytest.mark.parametrize("opbatch, perturb, cpu_ops", [(5, None, "ROPE,GLU"), (5, "src", None), (1024, None, None),
                                                       (1024, "src", "ROPE,GLU"), (1024, "route", None)])
def test_replays_send_the_batches_the_op_by_op_build_sends(tiny_qwen3_q4, monkeypatch, opbatch, perturb, cpu_ops):
    a = _decode(tiny_qwen3_q4, opbatch, 6, True, monkeypatch, perturb, cpu_ops)
    b = _decode(tiny_qwen3_q4, opbatch, 6, False, monkeypatch, perturb, cpu_ops)
    batches = [x for x in a[0] if x[0] != "sync"]
    assert len(batches) > 6 if opbatch == 5 or cpu_ops else len(batches) >= 6
    assert a[0] == b[0] and a[1] == b[1]
    for x, y in zip(a[2], b[2]):
        np.testing.assert_array_equal(x, y)


def test_a_changed_node_is_built_op_by_op(tiny_qwen3_q4, monkeypatch):
    """The op whose sources changed and every op after it in its batch come from add_op (not the record)."""
    built: list[str] = []
    original, original_fuse = OpBatch.add_op, OpBatch.fuse

    def add_op(self, node, *args):
        built.append(node.name)
        return original(self, node, *args)

    def fuse(self, op, node, name):  # 2026-10: a node merged into the last op is built too, by try_fuse
        built.append(node.name)
        return original_fuse(self, op, node, name)

    m = Model.load(tiny_qwen3_q4)
    htp = HtpBackend(HtpSettings())
    ctx = Context(m, Scheduler([htp, CpuBackend()]), n_ctx=64, n_ubatch=8)
    ctx.decode([5])
    ctx.decode([6])  # recorded by now
    monkeypatch.setattr(OpBatch, "add_op", add_op)
    monkeypatch.setattr(OpBatch, "fuse", fuse)
    ctx.decode([7])
    assert built == []  # all replayed
    nodes = [x for x in ctx.last_graph.nodes if x.op == "MUL_MAT" and x.name in {p.node for p in
                                                                                 ctx.scheduler.placements
                                                                                 if p.backend == "HTP0"}]
    nodes[2].src = list(nodes[2].src)
    ctx.decode([8])
    assert built and built[0] == nodes[2].name


def test_a_graph_placed_anew_is_described_where_it_is(tiny_qwen3_q4):
    """When the allocator places a reused graph anew (a bigger plan: a new compute buffer), its tensors get the
    descriptors of their new places (the record was made under the old placement stamp), and every batch equals
    add_op's build of the same nodes."""
    m = Model.load(tiny_qwen3_q4)
    htp = HtpBackend(HtpSettings())
    ctx = Context(m, Scheduler([htp, CpuBackend()]), n_ctx=64, n_ubatch=8)
    sent: list[OpBatch] = []
    htp.add_batch_start_hook(lambda _be, batch: sent.append(batch))
    ctx.decode([5])
    ctx.decode([6])
    graph, before = ctx.last_graph, ctx.last_graph.placement
    htp_nodes = {p.node for p in ctx.scheduler.placements if p.backend == "HTP0"}
    node = [x for x in graph.nodes if x.op == "MUL_MAT" and x.name in htp_nodes][4]
    old_addr = node.data_addr
    ctx.allocator.reserve(ctx._build(16, ctx.kv.size, 16).graph)  # a bigger worst case: a new compute buffer
    sent.clear()
    ctx.decode([7])
    assert ctx.last_graph is graph and graph.placement is not before and node.data_addr != old_addr
    assert sent and all(_tables(b) == _tables(_rebuilt(b)) for b in sent)
    assert any(d.tensor is node and d.addr == node.data_addr for b in sent for d in b.tensors)
