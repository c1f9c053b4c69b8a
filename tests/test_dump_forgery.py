"""Forged dumps: a manifest edited and given a recomputed digest is still only input. Every field of a real dump
(an HTP0 MUL_MAT with its batch context, and its enqueue-time capture) is replaced in turn by hostile values
(a string where a number belongs, null, a float, a negative, 10**15, 1e15, an object, a list, a huge string);
loading and replaying the result either works or ends in one KazeiaError line, never another exception, and
never allocates what the forged sizes ask for. The issue's cases are checked by name: ne=[2560, 1e12],
vtcm_bytes=1e15, a string where a number belongs, node: null; and a flipped bit in the context blob is noticed
by a plain replay.
"""

from __future__ import annotations

import copy
import json
import re
import time
import tracemalloc
from pathlib import Path

import pytest

from kazeia.backends.base import Hook
from kazeia.debug.dump import load_dumps, manifest_digest
from kazeia.debug.replay import replay
from kazeia.debug.runner import run
from kazeia.engine.session import RunSpec
from kazeia.errors import DumpFileError, KazeiaError


class _Reader(Hook):
    def __init__(self, weight: str) -> None:
        self.weight, self.name = weight, None

    def on_start(self, node, info) -> None:
        if self.name is None and any(s is not None and s.weight_name == self.weight for s in node.src):
            self.name = node.name


@pytest.fixture(scope="module")
def dump_dir(tiny_qwen3_q4, tmp_path_factory) -> Path:
    """A dump of layer 0's ffn_down MUL_MAT on HTP0, with its batch context and its enqueue-time capture."""
    from kazeia.debug.dump import DumpHook

    spec = RunSpec(model=tiny_qwen3_q4, device="HTP0", n_prompt=6)
    finder = _Reader("blk.0.ffn_down.weight")
    run(spec, hooks=[finder])
    d = tmp_path_factory.mktemp("dump") / "d"
    run(spec, hooks=[DumpHook(f"^{re.escape(finder.name)}$", d, at="both")])
    return d


def _entries(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if (p / "manifest.json").is_file())


def _forge(src: Path, dst: Path, edit, edit_index=None) -> Path:
    """A copy of the dump whose manifests `edit(manifest)` changed, digests recomputed (the blobs are shared);
    `edit_index(index)` changes its index.json."""
    dst.mkdir()
    idx = json.loads((src / "index.json").read_text())
    if edit_index is not None:
        edit_index(idx)
    (dst / "index.json").write_text(json.dumps(idx))
    (dst / "blobs").symlink_to(src / "blobs")
    for e in _entries(src):
        m = json.loads((e / "manifest.json").read_text())
        edit(m)
        m["digest"] = manifest_digest(m)
        (dst / e.name).mkdir()
        (dst / e.name / "manifest.json").write_text(json.dumps(m))
    return dst


def _load_and_replay(d: Path, only: str | None = None) -> list:
    """What a user does with a dump: load it, replay every capture (or `only` that one), with its batch context
    when it has one."""
    out = []
    for dump in load_dumps(d):
        if only is not None and dump.id != only:
            continue
        out.append(replay(dump))
        if dump.capture == "complete" and dump.context is not None:
            out.append(replay(dump, with_context=True))
    return out


def _one_line_refusal(d: Path) -> str:
    with pytest.raises(KazeiaError) as ei:
        _load_and_replay(d)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    return msg


def _set(m: dict, path: list, value) -> None:
    x = m
    for k in path[:-1]:
        x = x[k]
    x[path[-1]] = value


# ---------------------------------------------------------------------------------------------------
# the cases


def test_the_unedited_dump_replays(dump_dir):
    results = _load_and_replay(dump_dir)
    assert len(results) == 3 and all(r.ok for r in results)


def test_a_trillion_rows_are_refused_before_allocating(dump_dir, tmp_path):
    def edit(m):
        m["node"]["ne"] = [2560, 1e12, 1, 1]
    tracemalloc.start()
    try:
        msg = _one_line_refusal(_forge(dump_dir, tmp_path / "f", edit))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "field node.ne[1] = 1000000000000.0: not an integer" in msg
    assert peak < 64 << 20

    def edit_int(m):
        m["node"]["ne"] = [2560, 10**12, 1, 1]
    msg = _one_line_refusal(_forge(dump_dir, tmp_path / "g", edit_int))
    assert "field node.ne" in msg and ("over the limit" in msg or "out of range" in msg)


def test_a_petabyte_vtcm_is_refused(dump_dir, tmp_path):
    def edit(m):
        m["device"]["htp"]["vtcm_bytes"] = 10**15
    msg = _one_line_refusal(_forge(dump_dir, tmp_path / "f", edit))
    assert "field device.htp.vtcm_bytes = 1000000000000000: out of range 65536 .. 1073741824 (the CLI's VTCM limit)" \
        in msg

    def edit_float(m):
        m["device"]["htp"]["vtcm_bytes"] = 1e15
    assert "vtcm_bytes = 1000000000000000.0: not an integer" in _one_line_refusal(_forge(dump_dir, tmp_path / "g",
                                                                                           edit_float))


def test_a_string_for_a_number_and_a_null_node(dump_dir, tmp_path):
    def edit(m):
        m["graph_index"] = "seven"
    assert "field graph_index = 'seven': not an integer" in _one_line_refusal(_forge(dump_dir, tmp_path / "f", edit))

    def null_node(m):
        m["node"] = None
    assert "field node = None: not an object" in _one_line_refusal(_forge(dump_dir, tmp_path / "g", null_node))


def test_a_flipped_bit_in_the_context_blob_is_noticed_by_a_plain_replay(dump_dir, tmp_path):
    import shutil

    d = tmp_path / "flip"
    shutil.copytree(dump_dir, d)
    m = json.loads((_entries(d)[0] / "manifest.json").read_text())
    region = max(m["context"]["memory"], key=lambda r: r["bytes"])  # a region only the context replay reads
    blob = d / region["file"]
    raw = bytearray(blob.read_bytes())
    raw[-5] ^= 0x10
    blob.write_bytes(bytes(raw))
    with pytest.raises(DumpFileError, match="does not match its content hash"):
        load_dumps(d)  # before any replay, with or without --with-context


# ---------------------------------------------------------------------------------------------------
# every field


def _fields(x, path=()) -> list[tuple[tuple, object]]:
    """(path, value) of every field: objects and lists too, and every leaf; a list's entries are represented by
    its first (the entries of one list share one schema)."""
    out = [(path, x)] if path else []
    if isinstance(x, dict):
        for k, v in x.items():
            out += _fields(v, (*path, k))
    elif isinstance(x, list) and x:
        out += _fields(x[0], (*path, 0))
    return out


def _hostile(v) -> list:
    if isinstance(v, bool):
        return ["yes", None]
    if isinstance(v, int):
        return ["7", None, 1e15, -1, 10**15]
    if isinstance(v, float):
        return ["x", None, True]
    if isinstance(v, str):
        return [0, None, "x" * 70000]
    if v is None:
        return [0, "x", {}]
    return [None, "x", 7]  # an object or a list


def _cases(dump_dir: Path) -> list[tuple[str, tuple, object]]:
    """Every field of the completion-time capture, and those only the enqueue-time capture has."""
    cases, seen = [], set()
    for path, v in _fields(json.loads((dump_dir / "index.json").read_text())):
        cases += [("index.json", path, h) for h in _hostile(v)]
    for e in sorted(_entries(dump_dir), key=lambda p: p.name.endswith(".enqueue")):
        m = json.loads((e / "manifest.json").read_text())
        for path, v in _fields(m):
            if path == ("digest",) or path in seen:
                continue  # the digest is recomputed by the forger (a wrong one is the plain corruption case)
            seen.add(path)
            cases += [(e.name, path, h) for h in _hostile(v)]
    return cases


@pytest.mark.slow
def test_every_manifest_field_forged(dump_dir, tmp_path):
    cases = _cases(dump_dir)
    kinds = {re.sub(r"\[\d+\]", "[]", ".".join(map(str, p))) for _, p, _ in cases}
    assert len(kinds) > 200  # node, device, settings, sources, output(s), context ops/tensors/memory/vtcm...
    outcomes = {"replayed": 0, "refused": 0}
    for n, (entry, path, value) in enumerate(cases):
        d = tmp_path / f"c{n}"

        def edit(m, entry=entry, path=path, value=value):
            if m["id"] == entry:
                _set(m, list(path), copy.deepcopy(value))

        def edit_index(idx, entry=entry, path=path, value=value):
            if entry == "index.json":
                _set(idx, list(path), copy.deepcopy(value))
        _forge(dump_dir, d, edit, edit_index)
        sized = isinstance(value, (int, float, str)) and not isinstance(value, bool) and len(str(value)) > 8
        if sized:  # the values that ask for a size: what they make the loader allocate is measured
            tracemalloc.start()
        t0 = time.monotonic()
        try:
            _load_and_replay(d, only=None if entry == "index.json" else entry)
            outcomes["replayed"] += 1
        except KazeiaError as e:
            assert "\n" not in str(e), (path, value, str(e))
            outcomes["refused"] += 1
        except Exception as e:  # noqa: BLE001 - the assertion names what escaped
            pytest.fail(f"{entry} {'.'.join(map(str, path))} = {value!r:.40}: {type(e).__name__}: {e}")
        finally:
            peak = tracemalloc.get_traced_memory()[1] if sized else 0
            tracemalloc.stop()
        assert peak < 256 << 20, (path, value, peak)
        assert time.monotonic() - t0 < 60, (path, value)
    assert outcomes["refused"] > len(cases) // 2 and outcomes["replayed"] > 0, outcomes
