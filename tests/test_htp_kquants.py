"""Q4_K and Q6_K weights on October 2026's HTP, each rule restated here from the October source (llama.cpp
0c1e57098bba, ggml/src/ggml-hexagon) with Python integers and numpy float32 scalars, one element or block at a time:

- ggml-hexagon.cpp repack_q4_K_tiled: D = fp16(f32(d) * sc), M = fp16(-f32(dmin) * m) (get_scale_min_k4), codes 0..15;
  repack_q6_K_tiled: S = fp16(f32(d) * sc) per 16 elements, codes q - 32.
- hmx-mm-kernels-tiled.h: Q4_K through the Q4_1 dequantizer, fp16(fp16(q * D) + M); Q6_K fp16((q - 32) * S).
- hvx-mm-kernels-tiled.h: quantize_block_f32_q8_1_tiled's block sum s_a = fp16(f32(f32(amax * f32(1/127)) * sum q));
  tiled_vec_dot_q4_1_32x1 (Q4_1 and Q4_K): t = f32(isum * f32(D * d_a)), t = f32(t + f32(M * s_a)), acc += t;
  tiled_vec_dot_q6_k_32x1: acc += f32(f32(isum_lo * f32(S_lo * d_a)) + f32(isum_hi * f32(S_hi * d_a))).
- ggml_hexagon_supported_mul_mat: Q4_K / Q6_K weights (K % 256) are the HTP's under 2026-10, not under 2026-05.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from cli_utils import kazeia_clean as _kazeia
from kazeia.backends.htp.host.kquants import KQuantWeight
from kazeia.backends.htp.host.repack import RepackedWeight
from kazeia.backends.htp.hvx.dot_sequential import hvx_matmul_sequential, quantize_activations_2026_10
from kazeia.gguf.kquantize import quantize_q4_k, quantize_q6_k

F32 = np.float32


def _f16(x) -> float:
    return float(np.float16(F32(x)))  # numpy's float32 -> float16: IEEE round to nearest even


def _f16_bits(raw: np.ndarray, at: int) -> float:
    return float(raw[at:at + 2].copy().view(np.float16)[0])


def _scale_min_k4(j: int, q: np.ndarray) -> tuple[int, int]:
    """ggml's get_scale_min_k4, line for line."""
    if j < 4:
        return int(q[j]) & 63, int(q[j + 4]) & 63
    return (int(q[j + 4]) & 0xF) | ((int(q[j - 4]) >> 6) << 4), (int(q[j + 4]) >> 4) | ((int(q[j]) >> 6) << 4)


def _q4_k_tile(block: np.ndarray, j: int) -> tuple[float, float, list[int]]:
    """repack_q4_K_tiled for sub-block j of one Q4_K block: (D, M, the 32 codes in element order)."""
    sc, m = _scale_min_k4(j, block[4:16])
    d, dmin = _f16_bits(block, 0), _f16_bits(block, 2)
    big_d, big_m = _f16(F32(d) * F32(sc)), _f16(F32(-dmin) * F32(m))
    qs = block[16 + (j // 2) * 32: 16 + (j // 2) * 32 + 32]
    return big_d, big_m, [(int(b) >> (4 * (j & 1))) & 15 for b in qs]


def _q6_k_tile(block: np.ndarray, e: int) -> tuple[float, int]:
    """(S, q - 32) of element e of one Q6_K block (q6_K_get_quant / dequantize_row_q6_K's layout)."""
    h, r = divmod(e, 128)
    j, lane = divmod(r, 32)
    ql = int(block[h * 64 + lane + (32 if j in (1, 3) else 0)])
    low = (ql >> 4) if j >= 2 else (ql & 15)
    high = (int(block[128 + h * 32 + lane]) >> (2 * j)) & 3
    sc = int(block[192 + e // 16].astype(np.int8))
    return _f16(F32(_f16_bits(block, 208)) * F32(sc)), (low | (high << 4)) - 32


def _weights(qtype: T, n: int, k: int, seed: int) -> tuple[np.ndarray, KQuantWeight]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * rng.uniform(0.01, 2, (n, 1)) + rng.uniform(-0.5, 0.5, (n, 1)))
    raw = (quantize_q4_k if qtype == T.Q4_K else quantize_q6_k)(x.astype(np.float32))
    return raw, KQuantWeight(qtype, k, raw)


def _activations(m: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)) * rng.uniform(0.1, 30, (m, 1))).astype(np.float32)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_hmx_weight_values_are_the_tiles_dequantized(qtype):
    raw, w = _weights(qtype, 5, 512, seed=4)
    w16 = w.w16
    bpr = raw.shape[1] // 2  # bytes per 256-block are 144 / 210: two blocks a row
    for n in range(5):
        for e in range(0, 512, 7):
            block = raw[n, (e // 256) * bpr:(e // 256 + 1) * bpr]
            if qtype == T.Q4_K:
                big_d, big_m, codes = _q4_k_tile(block, (e % 256) // 32)
                want = _f16(F32(_f16(F32(codes[e % 32]) * F32(big_d))) + F32(big_m))
            else:
                s, q = _q6_k_tile(block, e % 256)
                want = _f16(F32(q) * F32(s))
            assert w16[n, e] == want, (n, e)
    # and the values are the weight's: within fp16 of ggml's own dequantization
    ref = gq.dequantize(raw, qtype)
    assert np.abs(w16 - ref).max() <= 2 ** -9 * np.abs(ref).max()


def _q8_1_sum(x: np.ndarray, q: np.ndarray) -> float:
    """quantize_block_f32_q8_1_tiled's s of one 32-element group."""
    amax = F32(np.abs(x).max())
    return _f16(F32(F32(amax * (F32(1.0) / F32(127.0))) * F32(int(q.astype(np.int64).sum()))))


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q4_1], ids=lambda t: t.name)
def test_hvx_dot_in_octobers_order(qtype):
    m, k, n = 3, 512, 9
    if qtype == T.Q4_1:
        raw = gq.quantize(np.random.default_rng(5).standard_normal((n, k)).astype(np.float32), T.Q4_1).reshape(n, -1)
        w = RepackedWeight.from_ggml(raw, T.Q4_1, k)
    else:
        raw, w = _weights(qtype, n, k, seed=5)
    x = _activations(m, k, seed=6)
    y = hvx_matmul_sequential(w, x)
    q, d = quantize_activations_2026_10(x)  # the q8_0 quantizer's quants and d_a (checked in test_htp_2026_10.py)
    for mi in range(m):
        for ni in range(n):
            acc = F32(0)
            for b in range(k // 32):
                qa = q[mi, 32 * b:32 * b + 32].astype(np.int64)
                da = F32(d[mi, b])
                if qtype == T.Q6_K:
                    block = raw[ni, (b // 8) * 210:(b // 8 + 1) * 210]
                    tiles = [_q6_k_tile(block, (b % 8) * 32 + e) for e in range(32)]
                    lo = sum(tiles[e][1] * int(qa[e]) for e in range(16))
                    hi = sum(tiles[e][1] * int(qa[e]) for e in range(16, 32))
                    t_lo = F32(F32(lo) * F32(F32(tiles[0][0]) * da))
                    t_hi = F32(F32(hi) * F32(F32(tiles[16][0]) * da))
                    acc = F32(acc + F32(t_lo + t_hi))
                    continue
                if qtype == T.Q4_K:
                    big_d, big_m, codes = _q4_k_tile(raw[ni, (b // 8) * 144:(b // 8 + 1) * 144], b % 8)
                else:  # Q4_1: d, m, codes of the ggml block itself
                    blk = raw[ni, b * 20:(b + 1) * 20]
                    big_d, big_m = _f16_bits(blk, 0), _f16_bits(blk, 2)
                    codes = [int(c) & 15 for c in blk[4:]] + [int(c) >> 4 for c in blk[4:]]
                isum = sum(c * int(a) for c, a in zip(codes, qa))
                sa = _q8_1_sum(x[mi, 32 * b:32 * b + 32], q[mi, 32 * b:32 * b + 32])
                t = F32(F32(isum) * F32(F32(big_d) * da))
                t = F32(t + F32(F32(big_m) * F32(sa)))
                acc = F32(acc + t)
            assert y[mi, ni] == acc, (qtype, mi, ni)


@pytest.fixture(scope="module")
def tiny_q4_k_m(tmp_path_factory) -> str:
    from kazeia.gguf.writer import preset, write_model

    path = str(tmp_path_factory.mktemp("kq") / "tiny-q4_k_m.gguf")
    write_model(preset("tiny", wtype="q4_k_m", n_layer=4, tied=False), path)
    return path


def _matmul_places(stderr: str) -> dict[str, set[str]]:
    """{weight type: the devices/paths its MUL_MATs ran on} from the KZOP lines."""
    out: dict[str, set[str]] = {}
    for line in stderr.splitlines():
        if line.startswith("KZOP") and " MUL_MAT " in line and "src0=q" in line:
            fields = line.split()
            wtype = next(f for f in fields if f.startswith("src0=")).split("=")[1].split("[")[0]
            out.setdefault(wtype, set()).add(fields[4])
    return out


@pytest.mark.slow
def test_a_q4_k_m_model_runs_its_k_quants_on_the_htp_in_october_only(tiny_q4_k_m):
    """Prefill (38 rows: HMX) and decode (1 row: HVX) of every Q4_K and Q6_K weight on the HTP under 2026-10, the
    logits within REF's whole-model bound; under 2026-05 (whose supports_op takes neither) on the CPU."""
    r = _kazeia("compare", "-m", tiny_q4_k_m, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38")
    assert r.returncode == 0 and "no op out of tolerance" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    run = _kazeia("run", "-m", tiny_q4_k_m, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "2", "--temp", "0",
                  "--oplog")
    assert run.returncode == 0, run.stderr[-2000:]
    assert _matmul_places(run.stderr) == {"q4_k": {"HTP0/hmx", "HTP0/hvx"}, "q6_k": {"HTP0/hmx", "HTP0/hvx"}}
    may = _kazeia("run", "-m", tiny_q4_k_m, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "2", "--temp", "0",
                  "--oplog", "--htp-profile", "2026-05")
    assert may.returncode == 0, may.stderr[-2000:]
    assert _matmul_places(may.stderr) == {"q4_k": {"CPU/cpu"}, "q6_k": {"CPU/cpu"}}


def test_q8_1_block_sums_are_octobers():
    """s_a from the fp32 amax times f32(1/127) (October), over 64k groups: kazeia's image holds exactly that; a sum
    made from the fp16 d_a instead would give other bits for some of them (the test tells the two apart; May's
    amax / 127 gives October's bits on all of these)."""
    from kazeia.backends.htp.hvx.dot_sequential import quantize_q8_1_2026_10
    from kazeia.backends.htp.hvx.quant import parse_q8_1x4x2

    x = _activations(64, 32 * 1024, seed=7)
    _, _, s = parse_q8_1x4x2(quantize_q8_1_2026_10(x), x.shape[1], 64)
    q, d = quantize_activations_2026_10(x)
    amax = np.abs(x.reshape(64, -1, 32)).max(axis=-1)
    sums = q.reshape(64, -1, 32).astype(np.int32).sum(axis=-1).astype(np.float32)
    october = ((amax * (F32(1.0) / F32(127.0))) * sums).astype(np.float16).astype(np.float32)
    assert np.array_equal(s, october)
    assert not np.array_equal((d * sums).astype(np.float16).astype(np.float32), october)


def test_scale_products_round_as_the_hosts_fp32_to_fp16():
    """D = fp16(f32(d) * sc) and M = fp16(-f32(dmin) * m) over every finite fp16 d (normal, subnormal; products that
    overflow, land in fp16's subnormals or on ties) and random scale bytes: the bits numpy's IEEE conversion gives
    (GGML_FP32_TO_FP16 on the host)."""
    from kazeia.backends.htp.host.kquants import q4_k_as_q4_1
    from kazeia.gguf.quants import _q4k_scales_mins

    rng = np.random.default_rng(8)
    bits = np.arange(0, 0x7C00, dtype=np.uint16)
    bits = np.concatenate([bits, bits | 0x8000, [0x7C00, 0xFC00, 0x7E00, 0x7C01]]).astype(np.uint16)
    raw = rng.integers(0, 256, (bits.size, 144), dtype=np.uint8)
    raw[:, 0:2] = bits.reshape(-1, 1).view(np.uint8)
    raw[:, 2:4] = rng.permutation(bits).reshape(-1, 1).view(np.uint8)
    got = q4_k_as_q4_1(raw)[:, :, 0:4].copy().view(np.uint16)  # (n, 8, 2): D, M bits
    sc, mn = _q4k_scales_mins(raw[:, 4:16])
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        want_d = (d * sc.astype(np.float32)).astype(np.float16)
        want_m = ((-dmin) * mn.astype(np.float32)).astype(np.float16)
    for g, w in ((got[..., 0], want_d), (got[..., 1], want_m)):
        nan = np.isnan(w)
        assert np.array_equal(g[~nan], w.view(np.uint16)[~nan]) and np.all((g[nan] & 0x7C00) == 0x7C00)
        assert np.all(g[nan] & 0x3FF)


def test_htp_plan_takes_k_quants_under_october_only():
    """bb4dc86a's ggml_hexagon_supported_mul_mat lists Q4_0, Q4_1, Q8_0, IQ4_NL, MXFP4 (and F16): a May plan of a
    K-quant is refused in one line; October plans it (HMX at M 38, HVX at M 4)."""
    import json

    r = _kazeia("htp", "plan", "--m", "38", "--k", "9728", "--n", "2560", "--type", "q4_k", "--htp-profile", "2026-05")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "K-quant" in r.stderr, r.stderr
    for m, path in ((38, "hmx"), (4, "hvx")):
        r = _kazeia("htp", "plan", "--m", str(m), "--k", "9728", "--n", "2560", "--type", "q6_k", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["path"] == path, r.stderr
