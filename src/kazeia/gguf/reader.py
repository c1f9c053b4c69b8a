"""Reading GGUF files: one bounds-checked pass over the header that also reads the values, over a memory map.

The scan walks the header with every length checked against the bytes that remain before anything is
read or allocated, so a corrupt count or dimension cannot make us loop or allocate past what the file
could hold. Numeric arrays are read with numpy straight from the map, and string arrays (the vocabulary
and merges, ~100k entries) too: numpy finds the length prefixes and one decode + split makes the strings,
no per-element objects as gguf-py's reader builds (1.7 s for SmolLM2's vocabulary, ~0.02 s here). Values
are those gguf-py's `contents()` gives (python scalars, str, lists; tested). Weight data stays in the map (zero-copy).
Every problem becomes a `GGUFError` that names the file and the problem.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kazeia.errors import GGUFError
from kazeia.limits import InputLimitError, open_regular

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4
MAX_NAME = 64  # GGML_MAX_NAME, including the terminating NUL
MAX_KEY = 65535

# value type -> (struct code, size) for scalars; 8 = string, 9 = array
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4),
            7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_STRING, _ARRAY = 8, 9
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_KNOWN_TYPES = frozenset(int(t) for t in GGML_QUANT_SIZES)
_U64 = struct.Struct("<Q")
LAZY_MIN = 1 << 16  # numeric arrays longer than this stay views on the map until someone asks for them
MAX_STRING_ARRAY = 1 << 22  # strings in one array (the largest real vocabulary, Gemma 3's, has 262,144 tokens)


class LazyArray:
    """A numeric metadata array left in the memory map: nothing is read or allocated until `tolist()` (which
    GGUFFile.get calls). A hostile file's 64M-element array under a key kazeia never asks for costs nothing."""

    def __init__(self, buf: memoryview, dtype: str, count: int, offset: int):
        self._buf, self._dtype, self.count, self._offset = buf, dtype, count, offset

    def __len__(self) -> int:
        return self.count

    def tolist(self) -> list:
        return np.frombuffer(self._buf, dtype=self._dtype, count=self.count, offset=self._offset).tolist()

    def __repr__(self) -> str:
        return f"<GGUF array of {self.count} {self._dtype} in the map>"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: GGMLQuantizationType
    ne: tuple[int, int, int, int]
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass
class GGUFFile:
    path: str
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data: np.ndarray  # uint8 memmap of the whole file
    alignment: int

    def get(self, key: str, default: Any = None) -> Any:
        v = self.metadata.get(key, default)
        if isinstance(v, LazyArray):
            v = self.metadata[key] = v.tolist()
        return v

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(self.path, f"missing required key '{key}'")
        return self.metadata[key]

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))


class _Cursor:
    def __init__(self, path: str, buf: memoryview, pos: int = 0):
        self.path, self.buf, self.pos = path, buf, pos

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(self.path, f"truncated header: {what} needs {n} bytes at offset {self.pos}, "
                                       f"file has {len(self.buf)}")

    def unpack(self, code: str, size: int, what: str):
        self.need(size, what)
        v = struct.unpack_from("<" + code, self.buf, self.pos)[0]
        self.pos += size
        return v

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.unpack("Q", 8, what + " length")
        if limit is not None and n > limit:
            raise GGUFError(self.path, f"absurd {what} length {n}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(self.path, f"{what} is not valid UTF-8 at offset {self.pos - n}") from None

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        """Read one value (checked like skip_value) as gguf-py's contents() gives it."""
        if vtype in _SCALARS:
            code, size = _SCALARS[vtype]
            return self.unpack(code, size, f"value of '{key}'")
        if vtype == _STRING:
            return self.string(f"string of '{key}'")
        if vtype != _ARRAY:
            raise GGUFError(self.path, f"unknown value type {vtype} for key '{key}'")
        if depth > 4:
            raise GGUFError(self.path, f"array nesting too deep in '{key}'")
        etype = self.unpack("I", 4, f"array type of '{key}'")
        count = self.unpack("Q", 8, f"array count of '{key}'")
        if etype in _SCALARS:
            self.need(count * _SCALARS[etype][1], f"array '{key}' of {count} elements")
            offset = self.pos
            self.pos += count * _SCALARS[etype][1]
            if count > LAZY_MIN:
                return LazyArray(self.buf, _NP[etype], count, offset)
            return np.frombuffer(self.buf, dtype=_NP[etype], count=count, offset=offset).tolist()
        if etype == _STRING:
            if count * 8 > len(self.buf) - self.pos:
                raise GGUFError(self.path, f"absurd array count {count} for '{key}' (file too small)")
            if count > MAX_STRING_ARRAY:
                raise GGUFError(self.path, f"array '{key}' holds {count} strings, more than kazeia reads from one "
                                           f"array ({MAX_STRING_ARRAY}; the largest real vocabulary has 262,144)")
            return self._strings(count, key)
        if etype == _ARRAY:
            if count * 12 > len(self.buf) - self.pos:
                raise GGUFError(self.path, f"absurd array count {count} for '{key}' (file too small)")
            return [self.value(_ARRAY, key, depth + 1) for _ in range(count)]
        raise GGUFError(self.path, f"unknown array element type {etype} in '{key}'")

    def _strings(self, count: int, key: str) -> list[str]:
        """`count` length-prefixed strings from the map: one tight loop finds where each starts, then numpy
        puts a NUL where each length prefix was and the whole array is decoded and split by one C call each
        (SmolLM2's 49k tokens + 49k merges: ~25 ms instead of ~90 ms for a decode per string)."""
        first = self.pos
        starts = self._string_starts(count, key)
        if count == 0:
            return []
        region = np.frombuffer(self.buf, dtype=np.uint8, count=self.pos - first, offset=first).copy()
        heads = np.asarray(starts, dtype=np.int64) - first - 8
        region[heads] = 0
        keep = np.ones(region.size, dtype=bool)
        keep[(heads[:, None] + np.arange(1, 8)).ravel()] = False
        joined = region[keep]
        # a NUL inside a string, or bytes that are not UTF-8, take the per-string path (which names the string)
        if np.count_nonzero(joined == 0) == count:
            try:
                return joined.tobytes().decode("utf-8").split("\x00")[1:]
            except UnicodeDecodeError:
                pass
        return self._strings_one_by_one(starts, key)

    def _string_starts(self, count: int, key: str) -> list[int]:
        """Offsets of the `count` strings' bytes, every length checked against what the file holds; leaves
        self.pos after the last string."""
        fast = self._short_string_starts(count)
        if fast is not None:
            return fast
        buf, end = self.buf, len(self.buf)
        length = _U64.unpack_from
        starts = []
        p = self.pos
        for _ in range(count):
            if p + 8 > end:
                self.pos = p
                self.need(8, f"string length of '{key}'")
            (n,) = length(buf, p)
            p += 8
            if n > end - p:
                self.pos = p
                self.need(n, f"string of '{key}'")
            starts.append(p)
            p += n
        self.pos = p
        return starts

    def _short_string_starts(self, count: int) -> list[int] | None:
        """The common case found with numpy: every string shorter than 256 bytes, so each u64 length prefix
        is one byte then seven zeros. Candidate prefixes are the offsets followed by seven zero bytes; they
        are the array's strings exactly when the first one is here and each one's length leads to the
        next. Any doubt (a long string, zero runs inside strings) returns None: the loop decides."""
        first, avail = self.pos, len(self.buf) - self.pos
        w = min(avail, count * 32 + 8)
        while w >= 8:
            b = np.frombuffer(self.buf, dtype=np.uint8, count=w, offset=first)
            zero = b == 0
            head = zero[1:w - 6].copy()                    # head[h]: bytes h+1 .. h+7 are all zero
            for j in range(2, 8):
                head &= zero[j:w - 7 + j]
            cand = np.flatnonzero(head)[:count]
            nxt = cand + 8 + b[cand].astype(np.int64)
            linked = cand.size > 0 and cand[0] == 0
            broken = np.flatnonzero(nxt[:-1] != cand[1:]) if linked else np.zeros(1, dtype=np.int64)
            if linked and broken.size == 0 and cand.size == count and nxt[-1] <= w:
                self.pos = first + int(nxt[-1])
                return (cand + (first + 8)).tolist()
            reach = int(nxt[broken[0]]) if linked and broken.size else (int(nxt[-1]) if linked else 0)
            if not linked or reach < w - 8 or w == avail:
                return None                                # the chain breaks inside the window: not this case
            w = min(avail, 2 * w)                          # the chain runs past the window: look further
        return None

    def _strings_one_by_one(self, starts: list[int], key: str) -> list[str]:
        buf, length = self.buf, _U64.unpack_from
        out = []
        for i, p in enumerate(starts):
            (n,) = length(buf, p - 8)
            try:
                out.append(str(buf[p:p + n], "utf-8"))
            except UnicodeDecodeError:
                raise GGUFError(self.path, f"string #{i} of '{key}' is not valid UTF-8 at offset {p}") from None
        return out

    def skip_value(self, vtype: int, key: str, depth: int = 0) -> None:
        if vtype in _SCALARS:
            self.need(_SCALARS[vtype][1], f"value of '{key}'")
            self.pos += _SCALARS[vtype][1]
        elif vtype == _STRING:
            n = self.unpack("Q", 8, f"string length of '{key}'")
            self.need(n, f"string of '{key}'")
            self.pos += n
        elif vtype == _ARRAY:
            if depth > 4:
                raise GGUFError(self.path, f"array nesting too deep in '{key}'")
            etype = self.unpack("I", 4, f"array type of '{key}'")
            count = self.unpack("Q", 8, f"array count of '{key}'")
            if etype in _SCALARS:
                self.need(count * _SCALARS[etype][1], f"array '{key}' of {count} elements")
                self.pos += count * _SCALARS[etype][1]
            elif etype in (_STRING, _ARRAY):
                min_size = 8 if etype == _STRING else 12
                if count * min_size > len(self.buf) - self.pos:
                    raise GGUFError(self.path, f"absurd array count {count} for '{key}' (file too small)")
                for _ in range(count):
                    self.skip_value(etype, key, depth + 1)
            else:
                raise GGUFError(self.path, f"unknown array element type {etype} in '{key}'")
        else:
            raise GGUFError(self.path, f"unknown value type {vtype} for key '{key}'")


def _scan_header(path: str, buf: memoryview,
                 header_only: bool = False) -> tuple[int, dict[str, Any], dict[str, TensorInfo], int]:
    """Walk the whole header with bounds checks, reading it: (version, metadata, tensors, alignment).
    `header_only`: the data section may be absent (a file cut after its header); every other check holds.
    Raises GGUFError on the first problem."""
    if len(buf) < 4 or bytes(buf[:4]) != GGUF_MAGIC:
        got = bytes(buf[:4])
        raise GGUFError(path, f"bad magic {got!r} (expected b'GGUF'): not a GGUF file")
    c = _Cursor(path, buf, 4)
    version = c.unpack("I", 4, "version")
    if version not in (2, 3):
        hint = " (big-endian files are not supported)" if version & 0xFFFF == 0 and version else ""
        raise GGUFError(path, f"unsupported GGUF version {version}{hint}")
    n_tensors = c.unpack("Q", 8, "tensor count")
    n_kv = c.unpack("Q", 8, "key/value count")
    remaining = len(buf) - c.pos
    if n_kv * 13 > remaining:  # key length + 1 char + value type, at least
        raise GGUFError(path, f"absurd key/value count {n_kv} for a file of {len(buf)} bytes")
    if n_tensors * 24 > remaining:  # name length + n_dims + type + offset, at least
        raise GGUFError(path, f"absurd tensor count {n_tensors} for a file of {len(buf)} bytes")
    alignment = 32
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.string(f"key #{i}", MAX_KEY)
        vtype = c.unpack("I", 4, f"value type of '{key}'")
        if key in metadata:
            raise GGUFError(path, f"duplicate key '{key}'")
        metadata[key] = c.value(vtype, key)
        if key == "general.alignment":
            if vtype != 4:  # llama.cpp's gguf_init_from_file_impl accepts only GGUF_TYPE_UINT32
                raise GGUFError(path, f"general.alignment must be of type uint32 (value type {vtype})")
            alignment = metadata[key]
            if alignment <= 0 or alignment & (alignment - 1):
                raise GGUFError(path, f"general.alignment {alignment} is not a power of two")
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = c.string(f"tensor name #{i}", 1 << 16)
        if name in names:
            raise GGUFError(path, f"duplicate tensor name '{name}'")
        names.add(name)
        n_dims = c.unpack("I", 4, f"n_dims of '{name}'")
        if n_dims == 0 or n_dims > MAX_DIMS:
            raise GGUFError(path, f"tensor '{name}' has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        c.need(8 * n_dims, f"dims of '{name}'")
        dims = struct.unpack_from(f"<{n_dims}Q", buf, c.pos)
        c.pos += 8 * n_dims
        n = 1
        for d in dims:
            if d == 0 or d > 1 << 40:
                raise GGUFError(path, f"tensor '{name}' has an absurd dimension {d}")
            n *= d
        if not header_only and n > 8 * len(buf) + 1024:  # even 1-bit types could not hold this many elements
            raise GGUFError(path, f"tensor '{name}' has {n} elements, more than the file could hold")
        ttype = c.unpack("I", 4, f"type of '{name}'")
        if ttype not in _KNOWN_TYPES:
            raise GGUFError(path, f"tensor '{name}' has unknown tensor type {ttype}")
        infos.append((name, dims, ttype, c.unpack("Q", 8, f"offset of '{name}'")))
    # the data section starts at the next multiple of the alignment; every tensor must lie inside the file
    data_start = (c.pos + alignment - 1) // alignment * alignment
    tensors: dict[str, TensorInfo] = {}
    expected = 0  # llama.cpp's rule: each tensor's data follows the previous one's, padded to the alignment
    for name, dims, ttype, offset in infos:
        qtype = GGMLQuantizationType(ttype)
        bs, ts = GGML_QUANT_SIZES[qtype]
        if dims[0] % bs:
            raise GGUFError(path, f"tensor '{name}' row length {dims[0]} is not a multiple of the "
                                  f"{qtype.name} block size {bs}")
        nbytes = dims[0] // bs * ts
        for d in dims[1:]:
            nbytes *= d
        start = data_start + offset
        if start + nbytes > len(buf) and not header_only:
            raise GGUFError(path, f"tensor '{name}' data [{start}, {start + nbytes}) runs past the end of "
                                  f"file ({len(buf)} bytes)")
        if offset % alignment:
            raise GGUFError(path, f"tensor '{name}' data offset {offset} is not a multiple of general.alignment "
                                  f"{alignment} (llama.cpp refuses the file)")
        if offset != expected:
            raise GGUFError(path, f"tensor '{name}' has data offset {offset}, expected {expected} (llama.cpp "
                                  f"requires the tensors' data in header order, each padded to {alignment} bytes)")
        expected += (nbytes + alignment - 1) // alignment * alignment
        if len(name.encode()) >= MAX_NAME:
            raise GGUFError(path, f"tensor name '{name[:40]}...' is longer than {MAX_NAME - 1} bytes")
        ne = tuple(int(d) for d in dims) + (1,) * (4 - len(dims))
        tensors[name] = TensorInfo(name, qtype, ne, start, nbytes)
    return version, metadata, tensors, alignment


def load_gguf(path: str | os.PathLike, header_only: bool = False) -> GGUFFile:
    """Open, validate and memory-map a GGUF file. Raises GGUFError with a one-line reason. `header_only`: only
    the header is read and the data section may be missing (kazeia check); `data` then must not be used."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise GGUFError(path, "no such file")
    if os.path.isdir(path):
        raise GGUFError(path, "is a directory, not a GGUF file")
    try:
        f = open_regular(path, "GGUF file")  # a FIFO or a device would block or never end
    except InputLimitError:
        raise GGUFError(path, "is not a regular file (a FIFO, socket or device), not a GGUF file") from None
    try:
        with f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                head = f.read(4)
                if head != GGUF_MAGIC:
                    raise GGUFError(path, f"bad magic {head!r} (expected b'GGUF'): not a GGUF file")
                raise GGUFError(path, f"truncated header: file has only {size} bytes")
            mm = np.memmap(f, dtype=np.uint8, mode="r")  # the descriptor fstat checked (the map outlives it)
    except OSError as e:
        raise GGUFError(path, f"cannot read the file ({e.strerror or e})") from None
    version, metadata, tensors, alignment = _scan_header(path, memoryview(mm), header_only)
    return GGUFFile(path, version, metadata, tensors, mm, alignment)
