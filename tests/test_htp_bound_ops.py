"""The scratch bytes a bound node leaves in VTCM (scratch.ScratchBinding: views made once per node) are those of
the per-area rule restated here from the layout alone: thread t's first block of rows in half 0, its second in
half 1, rows padded to 128 B, cut to what the area says is written."""

from types import SimpleNamespace

import numpy as np
import pytest

from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.arena import Vtcm
from kazeia.backends.htp.vtcm.scratch import ScratchBinding, ScratchWriter, op_scratch
from kazeia.graph.alloc import Placement
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, array, make_tensor

SETTINGS = HtpSettings.from_env(env={}, profile="robust")
AREA_SOURCE = {"src0": 0, "src1": 1, "q": 0, "k": 1, "v": 2, "mask": 3}


def _place(tensors, rng, pad: int = 0):
    """Give the tensors consecutive 128 B-aligned places in one compute buffer (after `pad` bytes), random data."""
    size = pad + sum(-(-t.nbytes // 128) * 128 for t in tensors) + 128
    buf = Buffer("compute", rng.integers(0, 256, size, dtype=np.uint8), BufferUsage.COMPUTE)
    off = pad
    for t in tensors:
        t.buffer, t.offset = buf, off
        off += -(-t.nbytes // 128) * 128
    for t in tensors:  # finite floats (the bytes are copied as they are; this only keeps them readable)
        if t.type == GGMLType.F32:
            array(t)[...] = rng.standard_normal(array(t).shape).astype(np.float32)
    return Placement(buf, None)  # as an allocator stamps a placement


def _expected(node, sc, size: int, seed_bytes: np.ndarray) -> np.ndarray:
    mem = seed_bytes.copy()
    nrows = node.src[0].nrows if node.src else node.nrows
    per = -(-nrows // max(1, sc.n_threads))
    block = int(sc.info.get("rows_per_half") or 0)
    for area in sc.writes:
        n = area.written if area.written is not None else area.size
        if n <= 0:
            continue
        base, _, rest = area.name.partition("[")
        t, h = (int(rest.split("]")[0]), int(rest.split(".")[-1]) if "." in rest else 0) if rest else (0, 0)
        i = AREA_SOURCE.get(base)
        tensor = node.src[i] if i is not None and i < len(node.src) and node.src[i] is not None else node
        rows = np.ascontiguousarray(array(tensor)).reshape(-1, tensor.ne[0]).view(np.uint8)
        stride = -(-rows.shape[1] // 128) * 128
        start = min(t * per, nrows) + h * block
        k = max(1, -(-n // stride))
        sel = rows[start:start + k] if start < rows.shape[0] else rows[-k:]
        img = np.zeros((k, stride), np.uint8)
        img[: sel.shape[0], : rows.shape[1]] = sel
        mem[area.offset:area.offset + n] = img.reshape(-1)[:n]
    return mem


def _nodes():
    f32 = GGMLType.F32

    def t(ne, name, **kw):
        return make_tensor(f32, ne, name, **kw)

    x, w = t((2560, 1), "x"), t((2560,), "w")
    q, qw = t((128, 32, 1), "q"), t((128,), "qw")
    odd = t((100, 7), "odd")  # 400 B rows: padded to 512 B in VTCM (run by run)
    g, u = t((9728, 1), "gate"), t((9728, 1), "up")
    pos = make_tensor(GGMLType.I32, (1,), "pos")
    yield t((2560, 1), "norm", op="RMS_NORM", src=(x,), params={"eps": 1e-6}), [x]
    yield t((128, 32, 1), "qnorm", op="RMS_NORM", src=(q,), params={"eps": 1e-6}), [q]
    yield t((100, 7), "oddnorm", op="RMS_NORM", src=(odd,), params={"eps": 1e-6}), [odd]
    yield t((2560, 1), "mul", op="MUL", src=(x, w)), [x, w]
    yield t((128, 32, 1), "qmul", op="MUL", src=(q, qw)), [q, qw]
    yield t((2560, 1), "add", op="ADD", src=(x, x)), [x]
    yield t((9728, 1), "glu", op="GLU", src=(g, u), params={"glu_op": "SWIGLU", "swapped": False}), [g, u]
    rope = {"n_dims": 128, "mode": 2, "freq_base": 1e6, "freq_scale": 1.0}
    yield t((128, 32, 1), "rope", op="ROPE", src=(q, pos), params=rope), [q, pos]


@pytest.mark.parametrize("case", range(8))
def test_bound_scratch_writes_are_the_per_area_rule(case):
    node, inputs = list(_nodes())[case]
    rng = np.random.default_rng(case)
    placement = _place([*inputs, node], rng)
    sc = op_scratch(node, SETTINGS)
    assert sc.status == "ok" and sc.writes
    writer = ScratchWriter(SETTINGS, None)
    binding = ScratchBinding(writer.program(node, writer.layout(node)))
    seed = rng.integers(0, 256, SETTINGS.vtcm_bytes, dtype=np.uint8)
    bound, by_runs = Vtcm(SETTINGS.vtcm_bytes), Vtcm(SETTINGS.vtcm_bytes)
    bound.write(0, seed)
    by_runs.write(0, seed)
    dsp, dsp_runs = SimpleNamespace(vtcm=bound), SimpleNamespace(vtcm=by_runs)
    writer.write(dsp, node, sc, binding, placement)
    writer.write(dsp_runs, node, sc, binding.program)
    want = _expected(node, sc, SETTINGS.vtcm_bytes, seed)
    assert np.array_equal(bound.mem, want)
    assert np.array_equal(by_runs.mem, want)
    assert (binding.views is None) == (node.name == "oddnorm")  # the padded rows are not bound

    # new values in place: the kept views read them; the tensors moved: the binding is made again
    for t in (*inputs, node):
        if t.type == GGMLType.F32:
            array(t)[...] += 1
    writer.write(dsp, node, sc, binding, placement)
    assert np.array_equal(bound.mem, _expected(node, sc, SETTINGS.vtcm_bytes, seed))
    placement = _place([*inputs, node], rng, pad=4096)
    writer.write(dsp, node, sc, binding, placement)
    assert np.array_equal(bound.mem, _expected(node, sc, SETTINGS.vtcm_bytes, seed))


@pytest.mark.parametrize("op", ["ADD", "MUL"])
@pytest.mark.parametrize("b_ne", [(2560, 1, 1, 1), (2560, 3, 1, 1), (2560, 1, 2, 1), (1, 1, 1, 1)])
def test_bound_elementwise_is_the_kernel(op, b_ne):
    """An ADD / MUL bound to its ufunc writes the kernel's bits (NaN, inf, -0.0 and a dst on src0 included)."""
    from kazeia.backends.htp.ops.executor import DspOps, _elementwise_ufunc
    from kazeia.backends.numpy_ops import KERNELS

    rng = np.random.default_rng(len(b_ne) + b_ne[0])
    f32 = GGMLType.F32
    for inplace in (False, True):
        a, b = make_tensor(f32, (2560, 3, 2), "a"), make_tensor(f32, b_ne, "b")
        out = make_tensor(f32, (2560, 3, 2), "out", op=op, src=(a, b))
        _place([a, b, out], rng)
        if inplace:
            out.offset = a.offset
        for t in (a, b):
            v = array(t)
            v[...] = rng.standard_normal(v.shape).astype(np.float32) * 1e30
            special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], np.float32)
            v.reshape(-1)[:5] = special[: min(5, v.size)]
        snapshot = [np.array(array(t)) for t in (a, b)]
        fn = _elementwise_ufunc(out)
        assert fn is not None
        with np.errstate(all="ignore"):
            fn(array(a), array(b), out=array(out))
        got = np.array(array(out))
        array(a)[...], array(b)[...] = snapshot
        with np.errstate(all="ignore"):
            KERNELS[op](DspOps(), out)
        assert got.tobytes() == np.array(array(out)).tobytes()
