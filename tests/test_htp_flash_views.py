"""HTP flash attention reads its KV cache views straight into C order and multiplies P by V per block through
views: the same bits as the formulation with explicit contiguous copies (restated here, its products in the
device model's order computed by oracle_utils), on cache-shaped strided F16 K/V, GQA, masks and both paths."""

import numpy as np
import pytest

from kazeia.backends.htp.fp16 import round_fp16
from kazeia.backends.htp.kernels.expf import exp_rule_numpy
from kazeia.backends.htp.ops.executor import DspOps
from kazeia.backends.htp.ops.flash_attn import flash_attn
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, Tensor, array, make_tensor
from oracle_utils import ordered_products


def _grouped(a, b, hkv):
    """The device model's product order (oracle_utils.ordered_products), head h against KV matrix h // (H/Hkv)."""
    h, t = a.shape[:2]
    a = np.ascontiguousarray(a).reshape(hkv, (h // hkv) * t, a.shape[-1])
    b = b.reshape(hkv, *b.shape[-2:])
    y = [ordered_products(a[i], b[i].T, canonical_nan=False) for i in range(hkv)]
    return np.stack(y).reshape(h, t, -1)


def _reference(q, k, v, mask, scale, use_hmx):
    hkv = k.shape[0]
    v = np.ascontiguousarray(v)[:, None]
    kt = np.ascontiguousarray(k.transpose(0, 2, 1))[:, None]
    s = _grouped(round_fp16(q), kt, hkv)
    s = round_fp16(s * scale) if use_hmx else s * scale
    s = s + mask[None, : s.shape[1], : s.shape[2]]
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isneginf(m), 0.0, m).astype(np.float32)
        p = exp_rule_numpy((s - m).astype(np.float32))
    l = p.sum(axis=-1, keepdims=True, dtype=np.float32)
    if use_hmx:
        p16 = round_fp16(p)
        o = np.zeros(q.shape[:-1] + (v.shape[-1],), dtype=np.float32)
        for j in range(0, p.shape[-1], 128):
            o += round_fp16(_grouped(np.ascontiguousarray(p16[..., j:j + 128]),
                                     np.ascontiguousarray(v[:, :, j:j + 128]), hkv))
    else:
        o = _grouped(p, v, hkv)
    return (o / np.where(l == 0, 1.0, l)).transpose(1, 0, 2)


def _cache_view(buf, offset, d, n_kv, hkv, n_cells):
    """A KV cache view as llama.cpp makes it: ne [D, n_kv, Hkv], a cell holds every head's row."""
    return Tensor(GGMLType.F16, (d, n_kv, hkv, 1), (2, 2 * d * hkv, 2 * d, 2 * d * hkv * n_cells), "kv",
                  buffer=buf, offset=offset)


@pytest.mark.parametrize("t_q,n_kv,h,hkv,use_hmx", [
    (1, 256, 32, 8, True), (1, 256, 32, 8, False), (3, 384, 6, 3, True), (40, 128, 4, 4, True),
    (1, 64, 9, 3, False),
])
def test_flash_attention_is_the_copying_formulation(t_q, n_kv, h, hkv, use_hmx):
    rng = np.random.default_rng(n_kv + t_q)
    d, cells = 128, 512
    kv_bytes = 2 * d * hkv * cells
    buf = Buffer("cache", np.zeros(2 * kv_bytes, np.uint8), BufferUsage.ANY)
    cache = buf.data[: 2 * kv_bytes].view(np.float16)
    cache[:] = (rng.standard_normal(cache.size) * 2).astype(np.float16)
    k, v = _cache_view(buf, 0, d, n_kv, hkv, cells), _cache_view(buf, kv_bytes, d, n_kv, hkv, cells)
    comp = Buffer("compute", np.zeros(1 << 22, np.uint8), BufferUsage.COMPUTE)
    q = make_tensor(GGMLType.F32, (d, t_q, h), "q")
    mask = make_tensor(GGMLType.F16, (n_kv, t_q), "mask")
    out = make_tensor(GGMLType.F32, (d, h, t_q), "fa", op="FLASH_ATTN_EXT", src=(q, k, v, mask),
                      params={"scale": 1 / np.sqrt(d), "max_bias": 0.0, "softcap": 0.0})
    off = 0
    for t in (q, mask, out):
        t.buffer, t.offset = comp, off
        off += -(-t.nbytes // 128) * 128
    array(q)[...] = rng.standard_normal(array(q).shape).astype(np.float32)
    vis = np.arange(n_kv)[None, :] <= (n_kv - t_q + np.arange(t_q))[:, None]
    array(mask)[0, 0] = np.where(vis, 0.0, -np.inf).astype(np.float16)
    flash_attn(DspOps(), out, use_hmx=use_hmx)
    f32 = [np.asarray(array(t), dtype=np.float32) for t in (q, k, v, mask)]
    want = _reference(f32[0][0], f32[1][0], f32[2][0], f32[3][0, 0], np.float32(out.params["scale"]), use_hmx)
    assert array(out)[0].tobytes() == np.ascontiguousarray(want).tobytes()
