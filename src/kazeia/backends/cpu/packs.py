"""Packed copies of the CPU GEMV's weights (kernels/gemv/pack.py's layout), kept as files and memory-mapped.

Why: the decode streams every weight once a token. From the file's own rows the zmm GEMV reads 16 interleaved
rows and gathers their scales lane by lane: about 70 % of a streaming read of the same mapped file. From the packed
copy it reads one sequential stream and loads 16 scales at once: 96-98 % (bench/README, issue 38). llama.cpp's
CPU backend repacks Q4_0 the same way (ggml-cpu/repack.cpp, q4_0_8x8) into memory at every load; here the copy is
a file in the cache, mapped like the model, so the weights stay memory-mapped and the second run packs nothing.

- One file per weight, named by the model file's real path, the weight's byte offset, shape and kind, and the
  layout version. Its 4 KiB header records the model file's size, mtime and inode: a changed or replaced model
  makes the copy stale, and it is packed again.
- Written to a temporary name and renamed (another process may be packing the same weight).
- When a process writes its first copy, the copies whose model file is gone or has changed are deleted (and the
  temporary files of writers that died): the store holds at most one copy of the weights of the model files that
  exist. A copy is never written where it would leave less than 1 GiB of the disk free.
- Only weights of at least MIN_BYTES, where the native kernels run (in zmm or ymm: both read the layout); any
  failure (no space, a read-only cache, KAZEIA_PACK_DIR=off) leaves the GEMV on the file's rows: same bits.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from kazeia import settings
from kazeia.backends.cpu.kernels.gemv.ir import BLOCK_BYTES, PACK_ROWS
from kazeia.backends.cpu.kernels.gemv.pack import pack_rows, packed_nbytes
from kazeia.native.compile import available

LAYOUT = "k16-v2"      # the layout's name in every key and header (bump when pack.py's layout changes)
HEADER = 4096          # bytes before the packed rows (page-aligned rows)
MAGIC = b"KAZEIA-PACK\n"
MIN_BYTES = 1 << 20    # smaller weights stay in the caches across tokens: no stream to straighten
SUFFIX = ".pk16"
TMP = ".tmp"           # a copy being written: .<name>.<pid>.tmp
KEEP_FREE = 1 << 30    # disk space a copy never takes


def pack_dir() -> Path | None:
    """Where packed copies are kept, or None (KAZEIA_PACK_DIR=off)."""
    d = settings.get().pack_dir
    if d == "off":
        return None
    return Path(d) if d else Path.home() / ".cache" / "kazeia" / "packed"


def _source_stat(path: str) -> dict | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _header(path: str, offset: int, raw: np.ndarray, kind: str, stat: dict) -> dict:
    return {"layout": LAYOUT, "source": path, "offset": offset, "rows": raw.shape[0], "row_bytes": raw.shape[1],
            "kind": kind, **stat}


def _read_header(f: Path) -> dict | None:
    try:
        with open(f, "rb") as fh:
            head = fh.read(HEADER)
        if not head.startswith(MAGIC):
            return None
        return json.loads(head[len(MAGIC):].rstrip(b"\0").decode())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def packed_copy(raw: np.ndarray, kind: str, source: str, offset: int) -> np.ndarray | None:
    """The mapped packed copy of `raw` ((N, row_bytes) uint8 rows of `kind` blocks at byte `offset` of the model
    file `source`), packed now if there is none or it is stale; None where the GEMV reads the file's rows."""
    if not available() or kind not in BLOCK_BYTES or raw.nbytes < MIN_BYTES \
            or raw.shape[0] < PACK_ROWS or raw.strides != (raw.shape[1], 1):
        return None
    d = pack_dir()
    stat = _source_stat(source)
    if d is None or stat is None:
        return None
    path = os.path.realpath(source)
    want = _header(path, offset, raw, kind, stat)
    name = hashlib.sha256(json.dumps([want[k] for k in ("layout", "source", "offset", "rows", "row_bytes", "kind")])
                          .encode()).hexdigest()[:32] + SUFFIX
    f = d / name
    nbytes = packed_nbytes(kind, raw.shape[0], raw.shape[1] // BLOCK_BYTES[kind])
    try:
        if _read_header(f) != want or f.stat().st_size != HEADER + nbytes:
            _write(d, f, raw, kind, want, nbytes)
        return np.memmap(f, dtype=np.uint8, mode="r", offset=HEADER, shape=(nbytes,))
    except (OSError, ValueError):
        return None


def _write(d: Path, f: Path, raw: np.ndarray, kind: str, header: dict, nbytes: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    head = MAGIC + json.dumps(header).encode()
    if len(head) > HEADER:
        raise ValueError("pack header too long")
    if shutil.disk_usage(d).free < nbytes + KEEP_FREE:
        raise OSError("no room for a packed copy")
    tmp = d / f".{f.name}.{os.getpid()}{TMP}"
    try:
        with open(tmp, "wb") as fh:  # the blocks reserved first: a full disk is an OSError here, not a SIGBUS later
            os.posix_fallocate(fh.fileno(), 0, HEADER + nbytes)
        out = np.memmap(tmp, dtype=np.uint8, mode="r+", shape=(HEADER + nbytes,))
        out[:len(head)] = np.frombuffer(head, dtype=np.uint8)
        pack_rows(raw, kind, out[HEADER:])
        out.flush()  # on the disk before its name is: a crash never leaves a named copy with a valid header only
        del out
        os.replace(tmp, f)
    finally:
        tmp.unlink(missing_ok=True)
    if d not in _pruned:  # once a process and place: the first copy written starts a model's packing
        _pruned.add(d)
        prune(d)


_pruned: set[Path] = set()


def prune(d: Path) -> int:
    """Delete the copies in `d` whose model file is gone or has changed (and leftovers of interrupted writes);
    returns how many went."""
    gone = 0
    for f in list(d.glob("*" + SUFFIX)) + list(d.glob(".*" + TMP)):
        if f.name.endswith(TMP):
            if _writer_alive(f.name):
                continue
        else:
            h = _read_header(f)
            if h is not None and h.get("layout") == LAYOUT and \
                    _source_stat(h.get("source", "")) == {k: h.get(k) for k in ("size", "mtime_ns", "ino")}:
                continue
        try:
            f.unlink()
            gone += 1
        except OSError:
            pass
    return gone


def _writer_alive(name: str) -> bool:
    """Whether the process that is writing the temporary copy `name` (.<copy>.<pid>.tmp) still runs."""
    try:
        pid = int(name[:-len(TMP)].rsplit(".", 1)[1])
        if pid <= 0:
            return False
        os.kill(pid, 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True
