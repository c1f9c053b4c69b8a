"""Reads that cannot block and expansions sized first (issue 36): every file kazeia reads is opened without
blocking and checked with fstat before any read (limits.open_regular), so a FIFO, socket, device or directory is
one line; a compressed dump blob is sized from its zip directory and array header, and checked against the
machine's memory, before anything is decompressed."""

from __future__ import annotations

import os
import time
import tracemalloc

import numpy as np
import pytest

from cli_utils import kazeia_clean
from kazeia.debug.dump.blobs import BlobStore
from kazeia.errors import KazeiaError
from kazeia.limits import InputLimitError, TextLimits, open_regular, read_bytes, read_text


@pytest.mark.parametrize("kind", ["fifo", "dir", "device"])
def test_special_files_are_one_line_before_any_read(tmp_path, kind):
    path = {"fifo": tmp_path / "f", "dir": tmp_path, "device": "/dev/zero"}[kind]
    if kind == "fifo":
        os.mkfifo(path)  # no writer: a plain open() would wait for ever
    t0 = time.perf_counter()
    for read in (lambda: read_text(str(path), TextLimits("device log")), lambda: read_bytes(path, "blob", 1 << 20),
                 lambda: open_regular(path, "GGUF file")):
        with pytest.raises(InputLimitError, match="not a regular file") as e:
            read()
        assert "\n" not in str(e.value)
    assert time.perf_counter() - t0 < 2


def test_a_file_over_its_limit_is_refused_before_it_is_read(tmp_path):
    p = tmp_path / "big.log"
    p.write_bytes(b"x" * 4096)
    with pytest.raises(InputLimitError, match="4096 bytes, more than a device log may hold"):
        read_text(str(p), TextLimits("device log", max_bytes=1000))


def test_oracle_replay_with_a_fifo_beside_it_is_one_line(tmp_path):
    np.arange(64, dtype=np.float32).tofile(tmp_path / "X.bin")
    os.mkfifo(tmp_path / "X.txt")  # the dump description the replay reads first
    t0 = time.perf_counter()
    r = kazeia_clean("oracle", "--replay", str(tmp_path / "X.bin"), "--seed", "1", timeout=60)
    assert r.returncode not in (0, None) and time.perf_counter() - t0 < 30
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "X.txt: not a regular file" in lines[0], r.stderr


def test_a_compressed_blob_is_sized_before_it_is_expanded(tmp_path, monkeypatch):
    store = BlobStore(tmp_path)
    ref = store.put(np.zeros(10_000_000, dtype=np.float32), compress=True)  # 40 MB that compress to ~40 KB
    assert (tmp_path / ref["file"]).stat().st_size < 1 << 20
    monkeypatch.setattr("kazeia.memory.available_bytes", lambda: 16 << 20)  # a machine with 16 MiB free
    tracemalloc.start()
    try:
        with pytest.raises(KazeiaError, match="needs 0.04 GiB but only 0.02 GiB"):
            store.get(ref, "dump 0001")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak >> 20} MiB allocated: the blob was expanded before the check"
    monkeypatch.undo()
    assert store.get(ref, "dump 0001").shape == (10_000_000,)  # with the memory, the same blob loads


def test_a_blob_whose_zip_expands_past_its_manifest_is_refused(tmp_path):
    store = BlobStore(tmp_path)
    ref = store.put(np.zeros(1_000_000, dtype=np.float32), compress=True)
    small = dict(ref, shape=[1000])  # the manifest names a 4 KB array; the zip expands to 4 MB
    with pytest.raises(KazeiaError, match="expands to 4000128 bytes, the manifest's float32\\[1000\\] is 4000"):
        store.get(small, "dump 0002")
