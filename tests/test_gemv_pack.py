"""The CPU GEMV's packed weights (issue 38): kernels/gemv/pack.py's layout, checked against a loop that writes it
byte by byte from its description; the GEMV and the GEMM reading the packed copy give the bits they give from the
file's rows (in zmm or ymm: test_isa_variants compares those and the portable twin); packs.py keeps the copies as
files, reuses them, packs again when the model file changes, deletes the copies of gone files, and leaves the GEMV
on the file where it cannot write. A whole decode with and without packed copies gives the same logits."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

from kazeia import settings
from kazeia.backends.cpu import packs
from kazeia.backends.cpu.kernels.gemv.ir import BLOCK_BYTES, PACK_ROWS
from kazeia.backends.cpu.kernels.gemv.pack import pack_rows, packed_nbytes
from kazeia.backends.cpu.qmatmul import WeightSet
from kazeia.native.compile import available
from kazeia.native.threads import set_threads, threads

KINDS = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q8_0": T.Q8_0}
needs_native = pytest.mark.skipif(not available(), reason="the packed copies are read by the native kernels")


def _pack_by_loop(raw: np.ndarray, kind: str) -> bytes:
    """pack.py's layout, written from its docstring one row and block at a time."""
    bb = BLOCK_BYTES[kind]
    scale_bytes = 4 if kind == "q4_1" else 2
    nb = raw.shape[1] // bb
    out = bytearray()
    for g in range(raw.shape[0] // PACK_ROWS):
        for j in range(nb):
            blk = [bytes(raw[PACK_ROWS * g + r, j * bb:(j + 1) * bb]) for r in range(PACK_ROWS)]
            for s in range(0, scale_bytes, 2):  # d of the 16 rows, then m
                out += b"".join(x[s:s + 2] for x in blk)
            for p in range((bb - scale_bytes) // 2):  # word p of every row
                out += b"".join(x[scale_bytes + 2 * p:scale_bytes + 2 * p + 2] for x in blk)
    return bytes(out)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_packed_layout_is_the_one_its_docstring_describes(kind):
    rng = np.random.default_rng(1)
    raw = quantize(rng.standard_normal((37, 96)).astype(np.float32), KINDS[kind])  # 2 whole groups and 5 rows
    pk = pack_rows(raw, kind)
    assert pk.nbytes == packed_nbytes(kind, 37, 3) == 2 * 3 * PACK_ROWS * BLOCK_BYTES[kind]
    assert pk.tobytes() == _pack_by_loop(raw, kind)


def _same_bits_from_the_pack(kind: str, ms: tuple[int, ...], seed: int) -> None:
    """WeightSet.matmul with the packed copy gives the bits it gives from the file's rows, at 1 and 2 threads, for
    shapes with tails of 8 and 5 rows past the last 16-row group, and none."""
    rng = np.random.default_rng(seed)
    before = threads()
    try:
        for nthreads in (1, 2):
            set_threads(nthreads)
            for k, n in ((256, 72), (2560, 1136), (512, 29), (4096, 48), (96, 16)):
                raw = quantize(rng.standard_normal((n, k)).astype(np.float32), KINDS[kind])
                packed = WeightSet([(raw, KINDS[kind], k)])
                packed.use_packed([pack_rows(raw, kind)])
                for m in ms:
                    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10)).astype(np.float32)
                    want = WeightSet([(raw, KINDS[kind], k)]).matmul(x)
                    assert packed.matmul(x).tobytes() == want.tobytes(), (kind, k, n, m, nthreads)
    finally:
        set_threads(before)


@needs_native
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_gemv_gives_the_same_bits_from_the_packed_copy(kind):
    _same_bits_from_the_pack(kind, (1, 2, 3, 4), 38)


@needs_native
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_gemm_gives_the_same_bits_from_the_packed_copy(kind):
    """The prefill GEMM (M > 4) unpacks its panels from the packed copy where one is whole, from the file's rows
    elsewhere (rows past the last 16-row group, the last partial panel)."""
    _same_bits_from_the_pack(kind, (5, 37), 39)


def test_a_packed_copy_of_the_wrong_size_is_refused():
    raw = quantize(np.ones((32, 64), dtype=np.float32), T.Q4_0)
    s = WeightSet([(raw, T.Q4_0, 64)])
    with pytest.raises(ValueError, match="packed copy"):
        s.use_packed([np.zeros(7, dtype=np.uint8)])


# --- the store -------------------------------------------------------------------------------------------------

@pytest.fixture
def model_file(tmp_path):
    """A file holding Q4_0 rows (2 MiB) at byte offset 4096, mapped as a model's weights are."""
    rng = np.random.default_rng(5)
    raw = quantize(rng.standard_normal((512, 4096)).astype(np.float32), T.Q4_0)
    path = tmp_path / "m.gguf"
    path.write_bytes(b"\0" * 4096 + raw.tobytes())
    return path, raw.shape


def _rows(path, shape):
    return np.memmap(path, dtype=np.uint8, mode="r", offset=4096, shape=shape)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty KAZEIA_PACK_DIR of the test's own."""
    d = tmp_path / "packs"
    monkeypatch.setenv("KAZEIA_PACK_DIR", str(d))
    settings.reload()
    return d


@needs_native
def test_the_store_packs_once_reuses_and_repacks_a_changed_model(model_file, store):
    path, shape = model_file
    first = packs.packed_copy(_rows(path, shape), "q4_0", str(path), 4096)
    assert first is not None and first.tobytes() == pack_rows(np.asarray(_rows(path, shape)), "q4_0").tobytes()
    (f,) = store.glob("*" + packs.SUFFIX)
    made = f.stat().st_mtime_ns
    again = packs.packed_copy(_rows(path, shape), "q4_0", str(path), 4096)
    assert again.tobytes() == first.tobytes() and f.stat().st_mtime_ns == made  # read, not written

    data = bytearray(path.read_bytes())
    data[4096 + 5] ^= 0xFF  # the model changes (new bytes, a new mtime)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(made + 10**9, made + 10**9))
    fresh = packs.packed_copy(_rows(path, shape), "q4_0", str(path), 4096)
    assert fresh.tobytes() == pack_rows(np.asarray(_rows(path, shape)), "q4_0").tobytes() != first.tobytes()


@needs_native
def test_the_store_deletes_the_copies_of_gone_models(model_file, store):
    path, shape = model_file
    assert packs.packed_copy(_rows(path, shape), "q4_0", str(path), 4096) is not None
    path.unlink()
    (store / ("0" * 32 + packs.SUFFIX)).write_bytes(b"not a pack")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (store / f".{'1' * 32}{packs.SUFFIX}.{int(dead.stdout)}{packs.TMP}").write_bytes(b"half written")
    (store / f".{'2' * 32}{packs.SUFFIX}.{os.getpid()}{packs.TMP}").write_bytes(b"being written")  # a live writer
    assert packs.prune(store) == 3  # the gone model's copy, the unreadable file, the dead writer's leftover
    assert [f.name for f in store.iterdir()] == [f".{'2' * 32}{packs.SUFFIX}.{os.getpid()}{packs.TMP}"]


def test_no_copy_where_the_store_is_off_unwritable_or_full(model_file, tmp_path, monkeypatch):
    path, shape = model_file
    monkeypatch.setenv("KAZEIA_PACK_DIR", "off")
    settings.reload()
    assert packs.packed_copy(_rows(path, shape), "q4_0", str(path), 4096) is None
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("KAZEIA_PACK_DIR", str(blocked / "packs"))  # under a regular file: cannot be made
    settings.reload()
    assert packs.packed_copy(_rows(path, shape), "q4_0", str(path), 4096) is None
    monkeypatch.setenv("KAZEIA_PACK_DIR", str(tmp_path / "packs"))
    settings.reload()
    monkeypatch.setattr(packs, "KEEP_FREE", 1 << 62)  # a disk that would be left too full
    assert packs.packed_copy(_rows(path, shape), "q4_0", str(path), 4096) is None
    assert not list((tmp_path / "packs").iterdir())


@needs_native
def test_a_decode_gives_the_same_logits_with_and_without_packed_weights(q4b2, tmp_path, monkeypatch):
    """The CPU device packs the weights of a mapped model (the 2-layer Qwen3-4B-shaped Q4_0: every weight over
    packs.MIN_BYTES) and the logits of a prompt (the GEMM) and of two decoded tokens (the GEMV) keep their bits."""
    from kazeia.engine.session import RunSpec, build_context  # the engine sits above the backends

    out = {}
    for name, where in (("packed", str(tmp_path / "packs")), ("file", "off")):
        monkeypatch.setenv("KAZEIA_PACK_DIR", where)
        settings.reload()
        ctx = build_context(RunSpec(model=q4b2, device="CPU", n_prompt=1))
        logits = [ctx.decode(list(range(7, 20)))[-1]]
        for _ in range(2):
            logits.append(ctx.decode([int(np.argmax(logits[-1]))])[-1])
        out[name] = [x.tobytes() for x in logits]
    assert len(list((tmp_path / "packs").glob("*" + packs.SUFFIX))) == 2 * 7 + 1  # 7 weights a layer, the lm_head
    assert out["packed"] == out["file"]
