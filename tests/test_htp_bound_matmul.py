"""A bound HVX matmul (matmul_bound.py: pointers, scratch and dst runs worked out once per node) leaves the bytes
of the general path (matmul_hvx.HvxPath, run for every call when op_matmul is not bound): dst, every VTCM byte,
the src1 shortcut and the record, over a sequence of matmuls that reuse src1, change it, move tensors, feed
values the native quantizer does not take, and run with VTCM starting from random bytes. The fused native
quantizer (kernels/quant.py q8x4x2_image) gives the numpy quantizer's image, padded rows included."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia import native as native_kernels
from kazeia.backends.htp.device import Dsp
from kazeia.backends.htp.hvx import quant as Q
from kazeia.backends.htp.msg import OpBatch, OpContext, OpDesc
from kazeia.backends.htp.ops.executor import Executor
from kazeia.backends.htp.ops.matmul import MatmulUnit, WeightStore
from kazeia.backends.htp.profiles import get_profile
from kazeia.backends.htp.settings import HtpSettings
from kazeia.graph.alloc import Placement
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, TFlag, array, make_tensor, rows

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="no native HTP kernels on this host")

SETTINGS = HtpSettings.from_env(env={}, profile="robust")
BLOCK = {GGMLType.Q4_0: 18, GGMLType.Q8_0: 34, GGMLType.IQ4_NL: 18}


def _weight(qtype, k, n, rng):
    w = make_tensor(qtype, (k, n), f"w{qtype.name}{k}x{n}", flags=TFlag.WEIGHT, weight_name="w")
    raw = rng.integers(0, 256, (n, k // 32, BLOCK[qtype]), dtype=np.uint8)
    raw[..., :2] = rng.uniform(1e-3, 2e-2, (n, k // 32, 1)).astype(np.float16).view(np.uint8)  # finite fp16 scales
    w.buffer, w.offset = Buffer("weights", raw.reshape(-1).copy(), BufferUsage.WEIGHTS), 0
    assert rows(w).shape[-1] == k // 32 * BLOCK[qtype]
    return w


def _place(tensors, pad=0) -> Placement:
    """Place the tensors in a new compute buffer, as an allocator would: returns their placement stamp."""
    size = pad + sum(-(-t.nbytes // 128) * 128 for t in tensors) + 128
    buf = Buffer("compute", np.zeros(size, dtype=np.uint8), BufferUsage.COMPUTE)
    off = pad
    for t in tensors:
        t.buffer, t.offset = buf, off
        off += -(-t.nbytes // 128) * 128
    return Placement(buf, None)


class _Device:
    """One emulated DSP running MUL_MAT ops: bound (op_matmul) or general (every call through _run_dsp_plan)."""

    def __init__(self, bound: bool, seed: int):
        self.ex = Executor(SETTINGS, get_profile("robust"), WeightStore())
        self.dsp = Dsp(SETTINGS, get_profile("robust"), self.ex)
        self.dsp.vtcm.write(0, np.random.default_rng(seed).integers(0, 256, self.dsp.vtcm.size, dtype=np.uint8))
        self.bound = bound
        self.octx = OpContext()

    def run(self, node, src1_desc, placement):
        op = OpDesc(index=0, node=node, src=[0, src1_desc], dst=9, graph_index=0, placement=placement)
        unit: MatmulUnit = self.ex.matmul
        if self.bound:
            rec = unit.op_matmul(self.dsp, self.octx, op, OpBatch())
        else:
            rec = unit._run_dsp_plan(self.dsp, self.octx, op, unit._plan(node))
        return rec, np.array(array(node)), (self.octx.src1_spad_src, self.octx.src1_spad_kind)


@pytest.mark.parametrize("qtype", list(BLOCK))
@pytest.mark.parametrize("m", [1, pytest.param(3, marks=pytest.mark.slow)])  # (the quick loop: M=1, a decode)
def test_bound_matmul_is_the_general_path(qtype, m):
    rng = np.random.default_rng(m * 7 + len(qtype.name))
    f32 = GGMLType.F32
    w1, w2 = _weight(qtype, 2560, 96, rng), _weight(qtype, 2560, 33, rng)  # 33: an odd N (adjacent tree row)
    w3 = _weight(qtype, 480, 64, rng)  # K=480: quants of a padded super-block, still inside the row stride
    x, x3 = make_tensor(f32, (2560, m), "x"), make_tensor(f32, (480, m), "x3")
    nodes = [make_tensor(f32, (w.ne[1], m), f"y{i}", op="MUL_MAT", src=(w, xx))
             for i, (w, xx) in enumerate([(w1, x), (w2, x), (w3, x3), (w1, x)])]
    placement = _place([x, x3, *nodes])
    devices = [_Device(True, 5), _Device(False, 5)]
    for step in range(6):
        for t in (x, x3):
            v = array(t)
            v[...] = (rng.standard_normal(v.shape) * rng.choice([1e-3, 1.0, 200.0])).astype(np.float32)
        if step == 2:
            array(x)[0, 0, m - 1, 17] = np.nan  # the native quantizer refuses: the numpy one runs
        if step == 3:
            array(x3)[0, 0, 0, 3] = 70000.0
        if step == 4:  # the tensors move: the bindings are made again
            placement = _place([x, x3, *nodes], pad=1024)
            array(x)[...] = rng.standard_normal(array(x).shape).astype(np.float32)
            array(x3)[...] = rng.standard_normal(array(x3).shape).astype(np.float32)
        for i, node in enumerate(nodes):
            desc = 1 if node.src[1] is x else 2  # nodes 0, 1 (and 3) share src1: the shortcut reuses it
            with np.errstate(all="ignore"):
                a, b = (d.run(node, desc, placement) for d in devices)
            assert a[0].status == b[0].status and a[0].detail == b[0].detail, (step, i)
            assert a[1].tobytes() == b[1].tobytes(), (step, i)
            assert a[2] == b[2], (step, i)
        # VTCM read only now: reading lands the deferred ring images, which the next ops' writes must handle
        assert np.array_equal(devices[0].dsp.vtcm.mem, devices[1].dsp.vtcm.mem), step
        devices[0].octx = OpContext()  # a new batch: the shortcut starts empty
        devices[1].octx = OpContext()
    assert any(b is not None for b in devices[0].ex.matmul._bound.values())


@pytest.mark.parametrize("group", [32, 64, 128])
def test_fused_quantizer_is_the_numpy_image(group, monkeypatch):
    rng = np.random.default_rng(group)
    cases = []
    for k in (224, 256, 480, 736, 2560, 9728):  # 224, 480, 736: padded super-blocks that fit the stride
        for m in (1, 2, 5):
            x = np.clip(rng.standard_normal((m, k)) * rng.choice([1e-6, 1e-2, 1.0, 3e4]), -65504, 65504)
            x = x.astype(np.float32)
            x[0, : int(rng.integers(0, 40))] = 0.0
            cases.append((x, rng.integers(0, 256, (m, Q.q8x4x2_row_size(k)), dtype=np.uint8)))
    bad = cases[4][0].copy()
    bad[1, 5] = np.inf
    native = []
    for x, prev in cases:
        img = prev.copy()
        assert Q.quantize_q8x4x2_into(x, group, img)
        native.append(img)
    img = cases[4][1].copy()
    assert not Q.quantize_q8x4x2_into(bad, group, img) and np.array_equal(img, cases[4][1])  # untouched
    with native_kernels.portable_only():  # the numpy quantizer
        for (x, prev), got in zip(cases, native):
            assert got.tobytes() == Q.quantize_q8x4x2(x, group, prev=prev).tobytes()
