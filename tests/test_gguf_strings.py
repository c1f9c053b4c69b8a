"""String arrays (vocabulary, merges) read by kazeia's reader against gguf-py's own reader on files gguf-py's
writer made: the numpy path for short strings and the per-string loop it falls back to (long strings, empty
strings, NUL bytes inside strings, runs of zeros that look like length prefixes), and bad UTF-8 named by index."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from hypothesis import given, settings
from hypothesis import strategies as st

from kazeia.errors import GGUFError
from kazeia.gguf.reader import load_gguf


def _write(path, arrays: dict[str, list[str]]) -> None:
    w = GGUFWriter(str(path), "llama")
    for key, values in arrays.items():
        w.add_array(key, values)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _same_as_gguf_py(path, keys) -> None:
    ours, theirs = load_gguf(str(path)), GGUFReader(str(path))
    for k in keys:
        want = theirs.fields[k].contents() if k in theirs.fields else None   # gguf-py writes no empty array
        assert ours.get(k) == want, k
    assert ours.get("general.architecture") == "llama"      # the reader goes on at the right offset


CASES = {
    "short": [f"tok{i}" for i in range(3000)],
    "unicode": ["Ġthe", "é", "日本語", "🙂", "a b"] * 200,
    "long": ["x" * 300, "y", "z" * 70000, "w"],
    "empty": ["", "", "a", "", "bc", ""],
    "nul": ["a\x00b", "\x00\x00\x00\x00\x00\x00\x00\x00\x00", "c"],
    "one": ["only"],
    "none": [],
}


@pytest.mark.parametrize("case", list(CASES))
def test_string_arrays_read_as_gguf_py_reads_them(case, tmp_path):
    path = tmp_path / "s.gguf"
    _write(path, {"tokenizer.ggml.tokens": CASES[case], "tokenizer.ggml.merges": ["a b", "ab c"]})
    _same_as_gguf_py(path, ["tokenizer.ggml.tokens", "tokenizer.ggml.merges"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("ab\x00é🙂 "), max_size=12) |
                st.text(alphabet="q", min_size=250, max_size=260), max_size=40))
def test_any_string_array_reads_as_gguf_py_reads_it(tmp_path_factory, values):
    path = tmp_path_factory.mktemp("h") / "s.gguf"
    _write(path, {"tokenizer.ggml.tokens": values})
    _same_as_gguf_py(path, ["tokenizer.ggml.tokens"])


def test_bad_utf8_names_the_string(tmp_path):
    path = tmp_path / "s.gguf"
    _write(path, {"tokenizer.ggml.tokens": ["good", "QQQQ", "also"]})
    raw = bytearray(path.read_bytes())
    at = raw.index(b"QQQQ")
    raw[at:at + 2] = b"\xff\xfe"
    assert struct.unpack_from("<Q", raw, at - 8)[0] == 4
    path.write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match=r"string #1 of 'tokenizer.ggml.tokens' is not valid UTF-8"):
        load_gguf(str(path))
