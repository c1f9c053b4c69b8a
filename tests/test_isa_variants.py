"""The CPU device's quantized paths give the same bits whatever the kernels are compiled for (issue 38): the native
kernels for this host (AVX-512 where it has it), the same kernels compiled as for an AVX2-only host
(KAZEIA_ISA=avx2), and the portable twins (KAZEIA_SIMD=0, the oracle). The quantized dots are exact integer sums
and their float parts run in one order, so the outputs must agree bit for bit; each variant runs in its own
process (the switches are read once). The CPU's f32 BLAS paths are not held to this (they follow the host).
Each process also reads the weights from their packed copy (gemv/pack.py), which must give its bits. The GEMV
(M <= 4, the decode) and the GEMM (prefill) agree across all three: their portable twins run the native kernels'
operations in their order, FMAs included (kernels/gemv/portable.py, kernels/gemm/portable.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = r"""
import hashlib, sys
MS = tuple(int(v) for v in sys.argv[1].split(","))
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize
from kazeia.backends.cpu.kernels.gemv.pack import pack_rows
from kazeia.backends.cpu.qmatmul import WeightSet, weight_matmul
from kazeia.native.threads import set_threads

set_threads(2)
rng = np.random.default_rng(38)
h = hashlib.sha256()
for qtype in (T.Q4_0, T.Q4_1, T.Q8_0):
    for k, n in ((256, 72), (2560, 136), (4096, 40), (512, 29)):  # (zmm: groups of 16 rows, of 8, and 29's 5 tail rows)
        raw = quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
        packed = WeightSet([(raw, qtype, k)])  # the same rows read from their packed copy (gemv/pack.py)
        packed.use_packed([pack_rows(raw, qtype.name.lower())])
        for m in MS:  # the GEMV (M <= 4) or the GEMM
            x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10)).astype(np.float32)
            y = np.ascontiguousarray(weight_matmul(raw, qtype, k, x))
            assert packed.matmul(x).tobytes() == y.tobytes(), ("packed", qtype.name, k, n, m)
            h.update(y.tobytes())
print(h.hexdigest())
"""


GEMV_MS, GEMM_MS = "1,2,3,4", "5,37,130"


def _digest(env: dict[str, str], ms: str) -> str:
    r = subprocess.run([sys.executable, "-c", PROBE, ms], env={**os.environ, **env}, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


@pytest.fixture(scope="module")
def digests(tmp_path_factory) -> dict[str, str]:
    cache = {"KAZEIA_CACHE_DIR": str(tmp_path_factory.mktemp("native"))}  # (each variant compiles its own objects)
    variants = {"native": cache, "avx2": {**cache, "KAZEIA_ISA": "avx2"}, "portable": {**cache, "KAZEIA_SIMD": "0"}}
    return {(name, part): _digest(env, ms) for name, env in variants.items()
            for part, ms in (("gemv", GEMV_MS), ("gemm", GEMM_MS))}


@pytest.mark.slow  # three processes, each compiling or jitting its kernels
def test_the_native_kernels_give_the_same_bits_compiled_for_avx512_or_avx2(digests):
    for part in ("gemv", "gemm"):
        assert digests["native", part] == digests["avx2", part], part


@pytest.mark.slow
def test_the_portable_gemv_gives_the_native_bits(digests):
    assert digests["portable", "gemv"] == digests["native", "gemv"]


@pytest.mark.slow
def test_the_portable_gemm_gives_the_native_bits(digests):
    assert digests["portable", "gemm"] == digests["native", "gemm"]
