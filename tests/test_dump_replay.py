"""Op dumps (--dump) and replays (kazeia replay): what is dumped is what the op consumed and produced, replays
separate value-triggered from context-triggered faults, and bad dump files are refused cleanly.

Oracles are independent of the code under test: numpy arrays we wrote ourselves, gguf-py's reader and
dequantizer, and float64 matmuls in the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from kazeia.backends.cpu import CpuBackend
from kazeia.backends.htp.backend import HtpBackend
from kazeia.backends.htp.settings import HtpSettings
from kazeia.cli.main import main as kazeia_main
from kazeia.debug.dump import (
    VERSION,
    DumpHook,
    add_dump_args,
    compare_captures,
    find_pair,
    install_dump,
    load_dump,
    load_dumps,
    manifest_digest,
)
from kazeia.debug.judge import judge
from kazeia.debug.replay import replay
from kazeia.debug.runner import run
from kazeia.engine.scheduler import Scheduler
from kazeia.engine.session import RunSpec
from kazeia.errors import DumpFileError, KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.alloc import GraphAllocator
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, TFlag, array, make_tensor

# ----------------------------------------------------------------------------------------------------------
# helpers


def _backends(device: str, profile: str = "robust"):
    if device == "CPU":
        return [CpuBackend()]
    return [HtpBackend(HtpSettings.from_env(env={}, profile=profile)), CpuBackend()]


def _compute(graph: gb.Graph, device: str, hooks=(), profile: str = "robust") -> None:
    sched = Scheduler(_backends(device, profile))
    for h in hooks:
        sched.add_hook(h)
    sched.compute(graph)


def _q4_weight(name: str, values: np.ndarray):
    """A Q4_0 weight in its own WEIGHTS buffer (as the GGUF loader makes them), quantized by gguf-py."""
    q = gguf_quantize(values.astype(np.float32), GGMLType.Q4_0)
    buf = Buffer(name, np.ascontiguousarray(q).reshape(-1).view(np.uint8).copy(), BufferUsage.WEIGHTS)
    n, k = values.shape
    t = make_tensor(GGMLType.Q4_0, (k, n), name=name, flags=TFlag.WEIGHT, weight_name=name)
    t.buffer, t.offset = buf, 0
    return t, gguf_dequantize(q, GGMLType.Q4_0).astype(np.float64)


def _stale_shortcut_graph(seed: int = 0):
    """mm1 = W1 x (HVX: M < 32, quantizes x into VTCM and remembers x's descriptor), norm = RMS_NORM(y) (its
    spads overwrite VTCM; under 2026-05 it does not clear the shortcut), mm2 = W2 x (same src1 descriptor:
    under 2026-05 it trusts VTCM and multiplies the norm's bytes)."""
    K, M, N = 256, 8, 64
    rng = np.random.default_rng(seed)
    w1, _ = _q4_weight("w1", rng.standard_normal((N, K)))
    w2, w2f = _q4_weight("w2", rng.standard_normal((N, K)))
    x = make_tensor(GGMLType.F32, (K, M), name="x", flags=TFlag.INPUT)
    y = make_tensor(GGMLType.F32, (1024, 64), name="y", flags=TFlag.INPUT)
    g = gb.Graph()
    g.expand(gb.mul_mat(w1, x, name="mm1"))
    g.expand(gb.rms_norm(y, 1e-6, name="norm"))
    mm2 = gb.mul_mat(w2, x, name="mm2")
    mm2.flags |= TFlag.OUTPUT
    g.expand(mm2)
    GraphAllocator().allocate(g)
    xv = rng.standard_normal((M, K)).astype(np.float32)
    array(x)[0, 0] = xv
    array(y)[0, 0] = (rng.standard_normal((64, 1024)) * 10).astype(np.float32)
    expected = xv.astype(np.float64) @ w2f.T  # independent float64 oracle for mm2
    return g, expected


@pytest.fixture(scope="module")
def ffn_down_dump(q4b2, tmp_path_factory):
    """ffn_out-0 (ffn_down's MUL_MAT) of the 4B-shaped model, 38 tokens, HTP0 2026-05: the run dies in this op."""
    d = tmp_path_factory.mktemp("ffn_down_dump")
    hook = DumpHook(r"^ffn_out-0$", d)
    res = run(RunSpec(model=q4b2, n_prompt=38, device="HTP0", htp_profile="2026-05"), hooks=[hook])
    assert res.death is not None and res.death["faulting"] == "ffn_out-0"
    return load_dump(d), res


@pytest.fixture(scope="module")
def stale_dump(tmp_path_factory):
    d = tmp_path_factory.mktemp("stale_dump")
    g, expected = _stale_shortcut_graph()
    _compute(g, "HTP0", [DumpHook(r"^mm2$", d)], profile="2026-05")
    return d, expected


# ----------------------------------------------------------------------------------------------------------
# dumping


@pytest.mark.parametrize("device", ["CPU", "HTP0"])
def test_dump_of_non_contiguous_views_is_read_through_strides(tmp_path, device):
    base = make_tensor(GGMLType.F32, (16, 6), name="base", flags=TFlag.INPUT)
    # a column window (row stride 64 B, first element 16 B in) and a transposed view of it
    win = gb.view_2d(base, 8, 6, base.nb[1], offset=4 * 4, name="win")
    c1 = gb.cont(win, name="c_win")
    c2 = gb.cont(gb.transpose(win, name="win_t"), name="c_win_t")
    g = gb.Graph()
    g.expand(c1)
    g.expand(c2)
    GraphAllocator().allocate(g)
    vals = np.arange(6 * 16, dtype=np.float32).reshape(6, 16) * 0.5 - 7.0
    array(base)[0, 0] = vals
    _compute(g, device, [DumpHook(r"^c_win", tmp_path)])

    d1 = load_dump(tmp_path, "c_win")
    d2 = load_dump(tmp_path, "c_win_t")
    assert d1.backend == device and d2.backend == device
    src = d1.sources[0]
    assert src.ne == (8, 6, 1, 1) and src.nb[1] == 64 and not src.meta["contiguous"]
    np.testing.assert_array_equal(src.values[0, 0], vals[:, 4:12])
    np.testing.assert_array_equal(d2.sources[0].values[0, 0], vals[:, 4:12].T)
    np.testing.assert_array_equal(d1.output.values[0, 0], vals[:, 4:12])
    np.testing.assert_array_equal(d2.output.values[0, 0], vals[:, 4:12].T)
    # what "nbytes from the data pointer" would have read is a different thing (so the test can fail)
    naive = np.frombuffer(src.span.tobytes()[: 8 * 6 * 4], dtype=np.float32).reshape(6, 8)
    assert not np.array_equal(naive, vals[:, 4:12])
    # the raw span keeps the gap bytes too, at the view's offset
    assert src.span_start == src.meta["offset"]
    np.testing.assert_array_equal(src.span.view(np.float32)[:16], vals.reshape(-1)[4:20])
    for d in (d1, d2):
        for dev in ("CPU", "REF", "HTP0"):
            r = replay(d, device=dev)
            assert r.ok, r.verdict()
            assert r.alone.vs_ref.identical  # a copy is exact


@pytest.mark.slow
def test_weights_are_dumped_as_raw_blocks_with_their_gguf_name(ffn_down_dump, q4b2):
    d, _ = ffn_down_dump
    w = d.sources[0]
    assert w.weight_name == "blk.0.ffn_down.weight" and w.meta["type"] == "q4_0"
    assert "weight" in w.role
    raw = next(t for t in GGUFReader(q4b2).tensors if t.name == "blk.0.ffn_down.weight").data
    assert np.array_equal(w.values.reshape(-1), np.asarray(raw).reshape(-1).view(np.uint8))
    # device, profile and batch context are recorded
    assert d.htp_settings["profile"] == "2026-05" and d.htp_settings["vtcm_bytes"] == 8 * 1024 * 1024
    ctx = d.context
    assert ctx is not None and ctx["ops"][-1]["name"] == "ffn_out-0" and ctx["op_index"] == len(ctx["ops"]) - 1
    assert [o["name"] for o in ctx["ops"]][-3:] == ["ffn_gate-0", "ffn_up-0", "ffn_swiglu-0", "ffn_out-0"][-3:]


# ----------------------------------------------------------------------------------------------------------
# replay of the original team's fault


@pytest.mark.slow
def test_ffn_down_replay_alone_dies_the_same_way(ffn_down_dump):
    d, res = ffn_down_dump
    assert d.output is None and d.fault["kind"] == "stack-overflow"
    assert d.fault["cause"] == res.death["cause"]
    r = replay(d, device="HTP0", htp_profile="2026-05")
    assert r.alone.died is not None
    assert r.alone.same_death_as_recorded
    assert r.alone.died["message"] == "ggml-hex: dspqueue_read failed: 0x0000002e"
    assert not r.ok and "died (stack-overflow" in r.verdict()


@pytest.mark.slow
def test_ffn_down_replay_on_robust_passes(ffn_down_dump):
    d, _ = ffn_down_dump
    r = replay(d, htp_profile="robust")
    assert r.ok, r.verdict()
    assert r.alone.vs_ref.nmse < 5e-4 and r.alone.died is None


@pytest.mark.slow
def test_ffn_down_with_context_is_value_triggered(ffn_down_dump):
    d, _ = ffn_down_dump
    r = replay(d, with_context=True)
    assert r.context.descriptors_reproduced and r.context.inputs_reproduced
    assert r.alone.died is not None and r.context.died is not None
    assert r.diagnosis().startswith("value/shape-triggered")


# ----------------------------------------------------------------------------------------------------------
# a context-triggered fault: alone OK, with context wrong


def test_context_triggered_matmul_alone_ok_with_context_wrong(stale_dump):
    d, expected = stale_dump
    dump = load_dump(d)
    assert dump.context is not None and [o["name"] for o in dump.context["ops"]] == ["mm1", "norm", "mm2"]
    recorded = dump.output.values[0, 0].astype(np.float64)
    # the recorded run really was wrong (independent float64 oracle), and the dumped input is the real x
    assert judge(recorded, expected, 5e-4).ok is False
    r = replay(dump, with_context=True)
    assert r.alone.ok, r.alone.verdict()
    assert judge(r.alone.output[0, 0], expected, 5e-4).ok
    assert not r.context.ok and r.context.died is None and r.context.error is None
    assert r.context.vs_recorded.identical  # the context replay reproduces the wrong numbers bit for bit
    assert r.context.descriptors_reproduced and r.context.inputs_reproduced
    assert r.context.extra.get("src1_reused") is True
    assert r.diagnosis().startswith("context-triggered")
    v = r.verdict()
    assert v.startswith("alone: OK") and "; with context: FAIL: wrong numbers" in v
    # the MUL_MAT allowance for ggml's own int8 activation conversion (as `kazeia compare`), off with strict
    assert 0 < r.quant_allowance < 5e-4 and r.threshold == pytest.approx(5e-4 + r.quant_allowance)
    rs = replay(dump, strict=True)
    assert rs.threshold == 5e-4 and rs.quant_allowance == r.quant_allowance
    # the fixed profile clears the shortcut: with context it passes too
    r2 = replay(dump, with_context=True, htp_profile="robust")
    assert r2.alone.ok and r2.context.ok


def test_replay_cli_with_context_json(stale_dump, capsys):
    d, _ = stale_dump
    rc = kazeia_main(["replay", str(d), "--with-context", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["ok"] is False
    res = out["results"][0]
    assert res["alone"]["ok"] and not res["context"]["ok"]
    assert res["verdict"].startswith("alone: OK") and "with context: FAIL" in res["verdict"]
    rc = kazeia_main(["replay", str(d), "-dev", "CPU"])
    text = capsys.readouterr().out
    assert rc == 0 and "alone: OK" in text and "recorded output vs ref: WRONG" in text
    rc = kazeia_main(["replay", str(d), "-dev", "CPU", "--with-context"])
    assert rc == 2 and "needs -dev HTP0" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------
# enqueue-time vs completion-time captures


def test_enqueue_capture_differs_on_htp_and_equals_on_cpu(tiny_qwen3_q4, tmp_path):
    regex = r"^(ffn_swiglu|ffn_out)-0$"
    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=12, device="HTP0")
    run(spec, hooks=[DumpHook(regex, tmp_path / "htp", at="both")])
    run(spec.with_(device="CPU"), hooks=[DumpHook(regex, tmp_path / "cpu", at="both")])

    dumps = load_dumps(tmp_path / "htp")
    down = next(x for x in dumps if x.name == "ffn_out-0" and x.capture == "complete")
    swiglu = next(x for x in dumps if x.name == "ffn_swiglu-0" and x.capture == "complete")
    early = find_pair(dumps, down)
    assert early is not None and early.capture == "enqueue" and "NOT what the op consumed" in \
        early.manifest["capture_note"]
    assert down.device["batch"] == swiglu.device["batch"]  # producer in the same batch
    # completion-time: the input is exactly what the producer wrote
    np.testing.assert_array_equal(down.sources[1].values, swiglu.output.values)
    # enqueue-time: the producer had not run yet: zeros and leftovers of earlier tenants of that address
    diff = compare_captures(early, down)
    assert not diff.inputs_identical
    src1 = next(t for t in diff.tensors if t.what.startswith("src1"))
    assert src1.n_diff > 0.9 * src1.n
    assert src1.stats_a.zeros > 0.3 * src1.n and src1.stats_b.zeros == 0
    assert any("DIFFERS" in line for line in diff.describe())

    cdumps = load_dumps(tmp_path / "cpu")
    cdown = next(x for x in cdumps if x.name == "ffn_out-0" and x.capture == "complete")
    cearly = find_pair(cdumps, cdown)
    assert cearly.manifest["synchronous"] is True
    cdiff = compare_captures(cearly, cdown)
    assert cdiff.inputs_identical


# ----------------------------------------------------------------------------------------------------------
# CPU runs, all devices


def test_cpu_run_dumps_replay_on_every_device(tiny_qwen3, tmp_path):
    # Qcur's ROPE, the first flash attention (unnamed in llama.cpp: ggml's node_<index>), layer 1's ffn RMS_NORM,
    # its ffn_down MUL_MAT, the K cache store
    names = ["Qcur-0#2", "node_25", "norm-1#3", "ffn_out-1", "cache_k_l0 (view)"]
    hook = DumpHook("^(" + "|".join(re.escape(n) for n in names) + ")$", tmp_path)
    res = run(RunSpec(model=tiny_qwen3, n_prompt=9, device="CPU"), hooks=[hook])
    assert res.ok
    dumps = load_dumps(tmp_path)
    assert sorted(d.name for d in dumps) == sorted(names)
    assert {d.manifest["node"]["op"] for d in dumps} >= {"ROPE", "FLASH_ATTN_EXT", "RMS_NORM", "SET_ROWS"}
    for d in dumps:
        assert d.backend == "CPU" and d.context is None
        r = replay(d)  # on the recorded device: the same numbers
        assert r.ok and r.alone.vs_recorded.identical, (d.name, r.verdict())
        assert r.recorded_vs_ref.ok
        assert replay(d, device="REF").ok
        rh = replay(d, device="HTP0")
        assert rh.ok or rh.alone.error and "does not support" in rh.alone.error, (d.name, rh.verdict())


def test_cli_glue_adds_flags_and_limit(tiny_qwen3, tmp_path):
    import argparse

    p = argparse.ArgumentParser()
    add_dump_args(p)
    args = p.parse_args(["--dump", "^norm-", str(tmp_path), "--dump-limit", "2"])
    spec = RunSpec(model=tiny_qwen3, n_prompt=5, device="CPU")
    from kazeia.engine.session import build_context

    ctx = build_context(spec)
    hook = install_dump(args, ctx.scheduler)
    assert hook is not None and install_dump(p.parse_args([]), ctx.scheduler) is None
    run(spec, ctx=ctx)
    assert hook.limit_reached and len(load_dumps(tmp_path)) == 2


# ----------------------------------------------------------------------------------------------------------
# bad dump files


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _entry(root: Path) -> Path:
    return next(p for p in root.iterdir() if (p / "manifest.json").is_file())


def _rewrite_manifest(root: Path, **changes) -> None:
    mp = _entry(root) / "manifest.json"
    m = json.loads(mp.read_text())
    m.update(changes)
    m["digest"] = manifest_digest(m)
    mp.write_text(json.dumps(m))


class _Evil:
    """Unpickling this creates a file: loading a dump must never do it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_bad_dump_files_are_dump_file_errors(stale_dump, tmp_path, capsys):
    good, _ = stale_dump
    load_dump(good)

    def blobs(root: Path) -> list[Path]:
        m = json.loads((_entry(root) / "manifest.json").read_text())
        return [root / m["sources"][1]["values"]["file"]]

    # one flipped byte in an array
    r = _copy(good, tmp_path / "flip")
    b = blobs(r)[0]
    raw = bytearray(b.read_bytes())
    raw[-3] ^= 0x40
    b.write_bytes(bytes(raw))
    with pytest.raises(DumpFileError, match="content hash"):
        load_dump(r)
    # truncated array
    r = _copy(good, tmp_path / "trunc")
    b = blobs(r)[0]
    b.write_bytes(b.read_bytes()[:100])
    with pytest.raises(DumpFileError, match="corrupt or truncated"):
        load_dump(r)
    # truncated manifest
    r = _copy(good, tmp_path / "truncman")
    mp = _entry(r) / "manifest.json"
    mp.write_bytes(mp.read_bytes()[:200])
    with pytest.raises(DumpFileError, match="not valid JSON"):
        load_dump(r)
    # a hand-edited manifest
    r = _copy(good, tmp_path / "edited")
    mp = _entry(r) / "manifest.json"
    mp.write_text(mp.read_text().replace('"mm2"', '"mmX"', 1))
    with pytest.raises(DumpFileError, match="digest"):
        load_dump(r)
    # foreign files
    r = _copy(good, tmp_path / "foreign")
    (r / "index.json").write_text(json.dumps({"format": "polygraphy-run", "version": 1}))
    with pytest.raises(DumpFileError, match="not a kazeia op dump"):
        load_dumps(r)
    r = tmp_path / "binary"
    r.mkdir()
    (r / "manifest.json").write_bytes(os.urandom(300))
    with pytest.raises(DumpFileError):
        load_dump(r)
    with pytest.raises(DumpFileError, match="no index.json"):
        load_dump(tmp_path)
    # a pickled object array in place of a blob is refused, and nothing from it runs
    r = _copy(good, tmp_path / "pickle")
    marker = tmp_path / "pwned"
    b = blobs(r)[0]
    np.save(b, np.array([_Evil(str(marker))], dtype=object), allow_pickle=True)
    with pytest.raises(DumpFileError):
        load_dump(r)
    assert not marker.exists()
    # from the future
    r = _copy(good, tmp_path / "future")
    _rewrite_manifest(r, version=VERSION + 1)
    with pytest.raises(DumpFileError, match=f"version {VERSION + 1} is newer"):
        load_dump(r)
    r = _copy(good, tmp_path / "future_index")
    idx = json.loads((r / "index.json").read_text())
    idx["version"] = VERSION + 1
    (r / "index.json").write_text(json.dumps(idx))
    with pytest.raises(DumpFileError, match="newer"):
        load_dumps(r)
    # on the command line: one line, exit 2, no traceback
    rc = kazeia_main(["replay", str(tmp_path / "flip")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_second_run_appends_to_a_dump_directory(tmp_path):
    for i in range(2):
        g, _ = _stale_shortcut_graph(seed=i)
        _compute(g, "CPU", [DumpHook(r"^mm2$", tmp_path)])
    dumps = load_dumps(tmp_path)
    assert [d.id for d in dumps] == ["0001-mm2", "0002-mm2"]
    assert not np.array_equal(dumps[0].sources[1].values, dumps[1].sources[1].values)
    with pytest.raises(KazeiaError, match="choose one"):
        load_dump(tmp_path, "mm2")


def test_dump_directory_must_be_new_or_a_dump(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(KazeiaError, match="not empty"):
        DumpHook("x", tmp_path)
    with pytest.raises(KazeiaError, match="valid regular expression"):
        DumpHook("(", tmp_path / "new")
