"""A Q8_0 KV cache (-ctk q8_0 -ctv q8_0), llama-cli's meaning: the K/V rows quantized by SET_ROWS, read by flash
attention. Each rule restated from its source:

- ggml-cpu arch/x86/quants.c quantize_row_q8_0 (ggml-cpu's from_float for SET_ROWS): d = fp16(amax / 127.f),
  q = round-to-nearest-even(x * (127.f / amax)), 0 when amax is 0.
- llama_init_from_model: a quantized V cache requires flash attention.
- 2026-10 ggml_hexagon_supported_set_rows / _flash_attn_ext: a Q8_0 destination (rows of >= 32) and Q8_0 K/V are
  the HTP's; the DSP quantizes as its activation quantizer (hvx_quantize_row_q8_0_f32) and dequantizes K/V rows to
  fp16(f32(q * d)) (hvx_dequantize_row_q8_0_f16). bb4dc86a (2026-05) takes F16 only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from kazeia.backends.htp import HtpSettings, supports_op
from kazeia.gguf.quants import Q8_0, dequantize
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType as T
from kazeia.graph.tensor import make_tensor

F32 = np.float32


def _kazeia(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_HEXAGON_", "KAZEIA_HTP_"))}
    return subprocess.run([sys.executable, "-m", "kazeia", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_cpu_quantizer_is_ggml_cpus_x86_quantize_row_q8_0():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 96)) * rng.uniform(1e-3, 50, (5, 1))).astype(np.float32)
    x[1, 32:64] = 0
    x[2, 5] = 127.5 / 127 * np.abs(x[2, :32]).max()  # a tie or two after the scaling
    got = Q8_0.quantize_rows(x).reshape(5, 3, 34)
    for r in range(5):
        for b in range(3):
            blk = x[r, 32 * b:32 * b + 32]
            amax = F32(np.abs(blk).max())
            d = np.float16(F32(amax / F32(127.0)))
            inv = F32(F32(127.0) / amax) if amax != 0 else F32(0)
            q = [int(np.rint(F32(v * inv))) for v in blk]
            assert got[r, b, :2].view(np.float16)[0] == d
            assert list(got[r, b, 2:].view(np.int8)) == q, (r, b)


def test_dsp_quantizer_writes_ggml_q8_0_blocks_of_the_activation_quantizer():
    from kazeia.backends.htp.hvx.dot_sequential import quantize_activations_2026_10, quantize_q8_0_rows

    x = (np.random.default_rng(2).standard_normal((4, 128)) * 3).astype(np.float32)
    raw = quantize_q8_0_rows(x)
    q, d = quantize_activations_2026_10(x)
    assert np.array_equal(dequantize(raw, T.Q8_0, np.float64), (q.reshape(4, 4, 32) * d[..., None]).reshape(4, 128))


def _node(op: str, kv: T, ne0: int = 64):
    k = make_tensor(kv, (ne0, 256), name="cache_k")
    if op == "SET_ROWS":
        return gb.set_rows(k, make_tensor(T.F32, (ne0, 4), name="k"), make_tensor(T.I64, (4,), name="idx"))
    q = make_tensor(T.F32, (ne0, 4, 8), name="q")
    kv3 = make_tensor(kv, (ne0, 256, 2), name="k3")
    mask = make_tensor(T.F16, (256, 4), name="mask")
    return gb.flash_attn_ext(q, kv3, kv3, mask, 0.125)


@pytest.mark.parametrize("op", ["SET_ROWS", "FLASH_ATTN_EXT"])
def test_the_htp_takes_a_q8_0_cache_in_october_only(op):
    october, may = HtpSettings.from_env({}), HtpSettings.from_env({"KAZEIA_HTP_PROFILE": "2026-05"})
    assert supports_op(_node(op, T.Q8_0), october) and not supports_op(_node(op, T.Q8_0), may)
    assert supports_op(_node(op, T.F16), october) and supports_op(_node(op, T.F16), may)
    if op == "SET_ROWS":
        assert supports_op(_node(op, T.Q8_0, ne0=32), october)  # the smallest Q8_0 row


def test_flash_attention_reads_q8_0_rows_as_the_dsps_fp16():
    from kazeia.backends.htp.ops.executor import DspOps
    from kazeia.graph.tensor import Buffer, BufferUsage, rows

    t = make_tensor(T.Q8_0, (64, 3), name="k")
    t.buffer, t.offset = Buffer.zeros("kv", t.nbytes, BufferUsage.ANY), 0
    x = (np.random.default_rng(3).standard_normal((3, 64)) * 2000).astype(np.float32)
    rows(t)[0, 0] = Q8_0.quantize_rows(x)
    exact = dequantize(rows(t)[0, 0], T.Q8_0, np.float64)  # d * q, exact
    got = DspOps().load_c(t)[0, 0]
    assert np.array_equal(got, exact.astype(np.float32).astype(np.float16).astype(np.float32))
    assert not np.array_equal(got, exact.astype(np.float32))  # (the fp16 rounding is visible at this scale)


def test_a_quantized_v_cache_needs_flash_attention(tiny_qwen3_q4):
    r = _kazeia("run", "-m", tiny_qwen3_q4, "-n", "1", "--n-prompt", "4", "-ctv", "q8_0", "-fa", "off")
    assert r.returncode == 2 and r.stderr.strip().endswith("requires flash attention (-fa on)"), r.stderr
    r = _kazeia("run", "-m", tiny_qwen3_q4, "-n", "1", "--n-prompt", "4", "-ctk", "q8_0", "-fa", "off")
    assert r.returncode == 0, r.stderr[-1500:]


@pytest.mark.slow
def test_a_q8_0_cache_on_every_device(tiny_qwen3_q4):
    """CPU and HTP0 against REF with -ctk q8_0 -ctv q8_0 at 38 tokens (prefill) and 1 (decode); under 2026-10 the
    cache's SET_ROWS and the flash attention run on the HTP, under 2026-05 on the CPU."""
    for dev, prof in (("CPU", "2026-10"), ("HTP0", "2026-10"), ("HTP0", "2026-05")):
        for n in ("38", "1"):
            r = _kazeia("compare", "-m", tiny_qwen3_q4, "-dev", dev, "-ngl", "99", "--n-prompt", n, "-ctk", "q8_0",
                        "-ctv", "q8_0", "--htp-profile", prof)
            assert r.returncode == 0 and "no op out of tolerance" in r.stdout, (dev, prof, n, r.stdout[-1500:])
    for prof, where in (("2026-10", "HTP0/"), ("2026-05", "CPU/")):
        r = _kazeia("run", "-m", tiny_qwen3_q4, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "1",
                    "-ctk", "q8_0", "-ctv", "q8_0", "--oplog", "--htp-profile", prof)
        ops = re.findall(r"^KZOP .* (?:SET_ROWS|FLASH_ATTN_EXT) (\S+)", r.stderr, re.M)
        assert ops and all(o.startswith(where) for o in ops), (prof, ops)


def test_the_cpu_writes_q8_0_through_store_too():
    """A CPY into a Q8_0 tensor (the CPU claims Q8_0 outputs for every op it writes) stores the same bytes SET_ROWS
    would: ggml-cpu's quantize_row_q8_0 of each row."""
    from kazeia.backends.cpu import CpuBackend
    from kazeia.engine.scheduler import Scheduler
    from kazeia.graph.alloc import GraphAllocator
    from kazeia.graph.builder import Graph
    from kazeia.graph.tensor import rows
    from oracle_utils import leaf

    x = (np.random.default_rng(4).standard_normal((3, 64)) * 5).astype(np.float32)
    src, dst = leaf(T.F32, (64, 3), x, name="x"), leaf(T.Q8_0, (64, 3), name="kv")
    out = gb.cpy(src, dst)
    g = Graph()
    g.expand(out)
    GraphAllocator().allocate(g)
    Scheduler([CpuBackend()]).compute(g)
    assert np.array_equal(rows(dst)[0, 0], Q8_0.quantize_rows(x))
