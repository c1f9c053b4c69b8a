"""The device's bound float32 kernels (dev_ops.py) are bitwise the numpy_ops kernels they restate, over many
sizes, layouts and special values; an executor running its ops bound (executor.FastOp: compute, scratch copies
in one native call, shortcut effect) leaves the general path's dst, VTCM bytes and shortcut."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import settings as kazeia_settings
from kazeia.backends.htp.device import Dsp
from kazeia.backends.htp.msg import OpBatch, OpContext, OpDesc
from kazeia.backends.htp.ops import bound_ops as dev_ops
from kazeia.backends.htp.ops import executor as X
from kazeia.backends.htp.profiles import get_profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.numpy_ops import KERNELS
from kazeia.graph.alloc import Placement
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, array, make_tensor

F32, I32 = GGMLType.F32, GGMLType.I32
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -3e38, 3e38, 88.8, -104.0, 1e-30], np.float32)


def _place(tensors, rng, pad=0):
    size = pad + sum(-(-t.nbytes // 128) * 128 for t in tensors) + 256
    buf = Buffer("compute", np.zeros(size, dtype=np.uint8), BufferUsage.COMPUTE)
    off = pad
    for t in tensors:
        t.buffer, t.offset = buf, off
        off += -(-t.nbytes // 128) * 128
        if t.type == F32:
            v = array(t)
            v[...] = (rng.standard_normal(v.shape) * rng.choice([1e-20, 1e-3, 1.0, 30.0, 1e18])).astype(np.float32)
            flat = v.reshape(-1)
            k = min(flat.size, SPECIAL.size)
            if rng.random() < 0.5:
                flat[rng.choice(flat.size, k, replace=False)] = SPECIAL[:k]
    return Placement(buf, None)  # as an allocator stamps a placement


def _same_as_kernel(node):
    run = dev_ops.compute_for(node)
    assert run is not None, node
    with np.errstate(all="ignore"):
        run()
        got = np.array(array(node))
        array(node)[...] = 7.0
        KERNELS[node.op](X.DspOps(), node)
    assert got.tobytes() == np.array(array(node)).tobytes(), node


def _bound_and_kernel(run, node, state):
    """(the starting bytes, the bound run's result, the kernel's result) of `node`, both runs from the same bytes of
    `state`: the tensor the op changes besides dst (its source, for an op in place; dst itself, for a store that
    writes some rows)."""
    before = np.array(array(state))
    with np.errstate(all="ignore"):
        run()
        got = np.array(array(node))
        array(state)[...] = before
        KERNELS[node.op](X.DspOps(), node)
    return before, got, np.array(array(node))


@pytest.mark.parametrize("seed", range(3))
def test_rms_norm_glu_rope_are_the_kernels(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        k = int(rng.choice([1, 7, 64, 128, 129, 1000, 2560, 4096, 5003]))
        rows, tok = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        x = make_tensor(F32, (k, rows, tok), "x")
        norm = make_tensor(F32, (k, rows, tok), "norm", op="RMS_NORM", src=(x,),
                           params={"eps": float(rng.choice([1e-6, 1e-5, 0.0]))})
        g, u = make_tensor(F32, (k, tok), "g"), make_tensor(F32, (k, tok), "u")
        glu = make_tensor(F32, (k, tok), "glu", op="GLU", src=(g, u),
                          params={"glu_op": "SWIGLU", "swapped": int(rng.integers(0, 2))})
        d = int(rng.choice([64, 128, 80]))
        nd = int(rng.choice([d, d // 2, 32]))
        q = make_tensor(F32, (d, rows, tok), "q")
        pos = make_tensor(I32, (tok,), "pos")
        rope = make_tensor(F32, (d, rows, tok), "rope", op="ROPE", src=(q, pos),
                           params={"n_dims": nd, "mode": 2, "freq_base": float(rng.choice([1e4, 1e6])),
                                   "freq_scale": float(rng.choice([1.0, 0.25])), "ext_factor": 0.0,
                                   "attn_factor": float(rng.choice([1.0, 0.7]))})
        _place([x, norm, g, u, glu, q, pos, rope], rng)
        array(pos)[...] = rng.integers(0, 40000, tok)
        for node in (norm, glu, rope):
            _same_as_kernel(node)
        array(pos)[...] = rng.integers(0, 40000, tok)  # new positions: new tables
        _same_as_kernel(rope)


@pytest.mark.parametrize("nd", [128, 64])
def test_a_decodes_rope_in_place_is_the_kernel(nd):
    """A decode's Q and K rope in place (the allocator gives the rope its source's buffer): the bound run (one
    native pass where the kernels run) leaves the kernel's bytes, over two tokens' positions."""
    rng = np.random.default_rng(11)
    q = make_tensor(F32, (128, 32, 1), "q")
    pos = make_tensor(I32, (1,), "pos")
    rope = make_tensor(F32, (128, 32, 1), "rope", op="ROPE", src=(q, pos),
                       params={"n_dims": nd, "mode": 2, "freq_base": 1e6, "freq_scale": 1.0, "ext_factor": 0.0,
                               "attn_factor": 1.0})
    _place([q, pos], rng)
    rope.buffer, rope.offset = q.buffer, q.offset
    run = dev_ops.compute_for(rope)
    assert run is not None
    for p in (5, 40000):
        array(pos)[...] = p
        x, got, want = _bound_and_kernel(run, rope, q)
        assert got.tobytes() == want.tobytes()
        assert not np.array_equal(got, x)


@pytest.mark.parametrize("cache_type", [GGMLType.F16, F32])
@pytest.mark.parametrize("id_type", [GGMLType.I64, I32])
def test_set_rows_is_the_kernel(cache_type, id_type):
    """A KV-cache store of one row (a decode) and of several (a prefill, duplicate ids included): the bound run
    writes the kernel's bytes (numpy's fp16 cast: values past 65504, NaN), and raises the kernel's IndexError."""
    rng = np.random.default_rng(7)
    for n_rows in (1, 3, 37):
        src = make_tensor(F32, (1024, n_rows), "k_cur")
        ids = make_tensor(id_type, (n_rows,), "k_idxs")
        cache = make_tensor(cache_type, (1024, 256), "cache_k_l0")
        node = make_tensor(cache_type, (1024, 256), "cache_k_l0 (set)", op="SET_ROWS", src=(src, ids))
        _place([src, ids, cache], rng)
        node.buffer, node.offset = cache.buffer, cache.offset  # SET_ROWS writes into the cache view
        for _ in range(3):  # new rows and ids each token, into the same views
            array(src)[...] = (rng.standard_normal(array(src).shape) * 100).astype(np.float32)
            array(src)[0, 0, 0, :4] = [np.nan, 70000.0, -65520.0, 1e-8]
            array(ids)[...] = rng.integers(0, 256, n_rows)
            if n_rows > 2:
                array(ids)[0, 0, 0, 1] = array(ids)[0, 0, 0, 0]
            before, got, want = _bound_and_kernel(dev_ops.compute_for(node), node, node)
            assert got.tobytes() == want.tobytes()
            assert not np.array_equal(got, before)
        array(ids)[0, 0, 0, 0] = 256
        run = dev_ops.compute_for(node)
        with pytest.raises(IndexError, match="out of range"):
            run()
        with pytest.raises(IndexError, match="out of range"):
            KERNELS["SET_ROWS"](X.DspOps(), node)


def test_other_modes_and_overlaps_are_left_to_the_kernels():
    rng = np.random.default_rng(9)
    q, pos = make_tensor(F32, (128, 4), "q"), make_tensor(I32, (1,), "pos")
    norm_rope = make_tensor(F32, (128, 4), "r", op="ROPE", src=(q, pos),
                            params={"n_dims": 128, "mode": 0, "freq_base": 1e4, "freq_scale": 1.0})
    shifted = make_tensor(F32, (128, 4), "r2", op="ROPE", src=(q, pos),
                          params={"n_dims": 128, "mode": 2, "freq_base": 1e4, "freq_scale": 1.0})
    _place([q, pos, norm_rope, shifted], rng)
    shifted.offset = q.offset + 256  # overlapping x, not x itself
    assert dev_ops.compute_for(norm_rope) is None and dev_ops.compute_for(shifted) is None


@pytest.mark.parametrize("seed", range(3))
def test_rope_in_place_is_the_kernel(seed):
    """A NEOX rope whose dst is its source's own memory (a decode's Q and K): the bound closure's bits are the general
    kernel's, partial rotation (dims past n_dims kept) included."""
    rng = np.random.default_rng(seed)
    for _ in range(20):
        d = int(rng.choice([64, 128, 80]))
        nd = int(rng.choice([d, d // 2, 32]))
        rows, tok = int(rng.integers(1, 33)), int(rng.integers(1, 4))
        q, pos = make_tensor(F32, (d, rows, tok), "q"), make_tensor(I32, (tok,), "pos")
        rope = make_tensor(F32, (d, rows, tok), "rope", op="ROPE", src=(q, pos),
                           params={"n_dims": nd, "mode": 2, "freq_base": float(rng.choice([1e4, 1e6])),
                                   "freq_scale": 1.0, "ext_factor": 0.0, "attn_factor": float(rng.choice([1.0, 0.7]))})
        _place([q, pos, rope], rng)
        rope.offset = q.offset
        array(pos)[...] = rng.integers(0, 40000, tok)
        run = dev_ops.compute_for(rope)
        assert run is not None
        _, got, want = _bound_and_kernel(run, rope, q)
        assert got.tobytes() == want.tobytes()


def _program(rng):
    x, w = make_tensor(F32, (2560, 1), "x"), make_tensor(F32, (2560,), "w")
    q, qw, pos = make_tensor(F32, (128, 32, 1), "q"), make_tensor(F32, (128,), "qw"), make_tensor(I32, (1,), "p")
    g, u = make_tensor(F32, (9728, 1), "g"), make_tensor(F32, (9728, 1), "u")
    rp = {"n_dims": 128, "mode": 2, "freq_base": 1e6, "freq_scale": 1.0, "ext_factor": 0.0, "attn_factor": 1.0}
    nodes = [make_tensor(F32, (2560, 1), "n", op="RMS_NORM", src=(x,), params={"eps": 1e-6})]
    nodes.append(make_tensor(F32, (2560, 1), "m", op="MUL", src=(nodes[0], w)))
    nodes.append(make_tensor(F32, (128, 32, 1), "qn", op="RMS_NORM", src=(q,), params={"eps": 1e-6}))
    nodes.append(make_tensor(F32, (128, 32, 1), "qm", op="MUL", src=(nodes[2], qw)))
    nodes.append(make_tensor(F32, (128, 32, 1), "r", op="ROPE", src=(nodes[3], pos), params=rp))
    nodes.append(make_tensor(F32, (9728, 1), "s", op="GLU", src=(g, u), params={"glu_op": "SWIGLU", "swapped": 0}))
    nodes.append(make_tensor(F32, (2560, 1), "a", op="ADD", src=(nodes[1], x)))
    return [x, w, q, qw, pos, g, u], nodes


def test_bound_ops_leave_the_general_paths_bytes(monkeypatch):
    settings = HtpSettings.from_env(env={}, profile="robust")
    rng = np.random.default_rng(3)
    leaves, nodes = _program(rng)
    first = _place(leaves + nodes, rng)
    runs = []
    for bound in (True, False):
        with monkeypatch.context() as m:
            m.setenv("KAZEIA_NO_BIND", "0" if bound else "1")  # off: the general path, every layer
            kazeia_settings.reload()
            placement = first
            ex = X.Executor(settings, get_profile("robust"))
            dsp = Dsp(settings, get_profile("robust"), ex)
            trng = np.random.default_rng(5)
            out = []
            for step in range(4):
                if step == 2:  # the tensors move: bound again
                    placement = _place(leaves + nodes, np.random.default_rng(8), pad=512)
                for t in leaves:
                    if t.type == F32:
                        array(t)[...] = trng.standard_normal(array(t).shape).astype(np.float32)
                array(leaves[4])[...] = step * 7
                octx = OpContext(src1_spad_src=3, src1_spad_kind="q8x4x2")
                for i, node in enumerate(nodes):
                    # ring images pending over the spads, as an HVX matmul leaves them
                    off = int(trng.integers(0, settings.vtcm_bytes - 600_000))
                    dsp.vtcm.write_deferred(off, trng.integers(0, 256, 500_000, dtype=np.uint8))
                    with np.errstate(all="ignore"):
                        rec = ex.execute(dsp, octx, OpDesc(i, node, [0, 1], 2, 0, placement), OpBatch())
                    out.append((rec.path, rec.status, octx.src1_spad_src, np.array(array(node)).tobytes()))
                out.append(dsp.vtcm.mem.tobytes())
            runs.append(out)
            if bound:
                assert all(b.fast for b in ex._bound.values())
            else:
                assert len(ex._bound) == 0  # nothing kept: the general path ran every op
    kazeia_settings.reload()
    assert runs[0] == runs[1]
