"""The content-addressed blob store of a dump: `blobs/<sha256>.npy|.npz`, each array stored once however many
dumps use it, verified against its hash when loaded (numpy files only, with allow_pickle=False)."""

from __future__ import annotations

import hashlib
import math
import os
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from kazeia.errors import DumpFileError, KazeiaError
from kazeia.limits import InputLimitError, open_regular
from kazeia.memory import check_fits
from kazeia.outputs import OutputError

MAX_BLOB_BYTES = 1 << 32  # the dump schema's largest tensor (debug/dump/schema.py MAX_TENSOR_BYTES)


def _check_npz_header(f, name: str, dtype: np.dtype, shape: tuple[int, ...], where: str) -> None:
    """A compressed blob (the open file `f`) is sized before anything is expanded: the zip's directory says how
    large `a.npy` expands to (header + data), the array header inside must be the one the manifest names, and the
    expansion must fit this machine's memory (memory.check_fits) -- a small file could otherwise decompress into
    any size."""
    nbytes = dtype.itemsize * math.prod(shape)
    with zipfile.ZipFile(f) as z:
        try:
            info = z.getinfo("a.npy")
        except KeyError:
            raise DumpFileError(f"{where}: blob {name} holds no array a.npy") from None
        if info.file_size > nbytes + (1 << 16):  # a .npy header is at most 64 KiB
            raise DumpFileError(f"{where}: blob {name} expands to {info.file_size} bytes, the manifest's "
                                f"{dtype}{list(shape)} is {nbytes}")
        with z.open(info) as a:
            version = np.lib.format.read_magic(a)
            hdr = np.lib.format.read_array_header_1_0(a) if version == (1, 0) else \
                np.lib.format.read_array_header_2_0(a)
    check_fits(f"{where}: blob {name}", nbytes)
    got_shape, fortran, got_dtype = hdr
    if tuple(got_shape) != tuple(shape) or got_dtype != dtype or fortran:
        raise DumpFileError(f"{where}: blob {name} holds {got_dtype}{list(got_shape)}, the manifest says "
                            f"{dtype}{list(shape)}")
    f.seek(0)


def array_digest(a: np.ndarray) -> str:
    """sha256 over dtype, shape and the C-order bytes: the name of a blob and its integrity check."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256()
    h.update(f"{a.dtype.str}|{','.join(str(x) for x in a.shape)}|".encode())
    h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.hexdigest()


class BlobStore:
    """`root/blobs/<sha256>.npy` (or .npz when compressed). Writes are atomic; an existing blob is reused."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.dir = self.root / "blobs"
        self._digests: dict[tuple, str] = {}  # (buffer address, offset, shape) of immutable weights -> digest

    def put(self, a: np.ndarray, compress: bool = False, cache_key: tuple | None = None) -> dict:
        a = np.ascontiguousarray(a)
        digest = self._digests.get(cache_key) if cache_key is not None else None
        if digest is None:
            digest = array_digest(a)
            if cache_key is not None:
                self._digests[cache_key] = digest
        ext = "npz" if compress else "npy"
        ref = {"blob": digest, "file": f"blobs/{digest}.{ext}", "dtype": a.dtype.str, "shape": list(a.shape)}
        path = self.root / ref["file"]
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    if compress:
                        np.savez_compressed(f, a=a)
                    else:
                        np.save(f, a, allow_pickle=False)
                os.replace(tmp, path)
            except OSError as e:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise OutputError(f"--dump: cannot write {path}: {e.strerror or e}") from None
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        ref["bytes"] = path.stat().st_size
        return ref

    def get(self, ref: dict, where: str) -> np.ndarray:
        """Load and verify one blob; anything wrong is a DumpFileError naming `where`."""
        try:
            rel = str(ref["file"])
            digest = str(ref["blob"])
            dtype, shape = np.dtype(ref["dtype"]), tuple(int(x) for x in ref["shape"])
        except (KeyError, TypeError, ValueError):
            raise DumpFileError(f"{where}: malformed blob reference in the manifest") from None
        if dtype.hasobject or not re.fullmatch(r"blobs/[0-9a-f]{64}\.(npy|npz)", rel) or not rel[6:70] == digest:
            raise DumpFileError(f"{where}: blob reference {rel!r} is not a kazeia blob")
        path = self.root / rel
        if not path.exists():
            raise DumpFileError(f"{where}: missing blob {path}")
        if dtype.hasobject or dtype.itemsize * math.prod(shape) > MAX_BLOB_BYTES:
            raise DumpFileError(f"{where}: blob {path.name} would hold {dtype}{list(shape)}, over the limit of "
                                f"{MAX_BLOB_BYTES} bytes")
        try:
            with open_regular(path, "dump blob") as f:  # (a FIFO or a device in blobs/ is one line)
                if rel.endswith(".npz"):
                    _check_npz_header(f, path.name, dtype, shape, where)  # before decompressing anything
                    with np.load(f, allow_pickle=False) as z:
                        a = z["a"]
                else:  # memory-mapped: a dump of many weights need not sit in RAM
                    a = np.load(path, mmap_mode="r", allow_pickle=False)
        except InputLimitError as e:
            raise DumpFileError(f"{where}: {e}") from None
        except KazeiaError:  # (DumpFileError, and check_fits: the expansion would not fit)
            raise
        except Exception as e:  # numpy raises ValueError/OSError/EOFError/zipfile errors on bad files
            raise DumpFileError(f"{where}: blob {path.name} is corrupt or truncated ({type(e).__name__})") from None
        if a.dtype != dtype or a.shape != shape:
            raise DumpFileError(f"{where}: blob {path.name} holds {a.dtype}{list(a.shape)}, the manifest says "
                                f"{dtype}{list(shape)}")
        if array_digest(a) != digest:
            raise DumpFileError(f"{where}: blob {path.name} does not match its content hash (corrupt)")
        return a

    def verify(self, ref: dict, where: str) -> None:
        """Existence, size and content hash of a blob loaded later (memory-mapped: nothing stays in RAM)."""
        self.check_present(ref, where)
        self.get(ref, where)

    def check_present(self, ref: dict, where: str) -> None:
        """Cheap check (existence and size) for blobs loaded later."""
        try:
            path = self.root / str(ref["file"])
            size = int(ref["bytes"])
        except (KeyError, TypeError, ValueError):
            raise DumpFileError(f"{where}: malformed blob reference in the manifest") from None
        if not path.is_file():
            raise DumpFileError(f"{where}: missing blob {path}")
        if path.stat().st_size != size:
            raise DumpFileError(f"{where}: blob {path.name} is {path.stat().st_size} B, expected {size} B "
                                f"(truncated or replaced)")
