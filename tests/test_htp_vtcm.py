"""VTCM model of the emulated HTP backend: the HMX chunk search and layout, HVX spads, per-op scratch, the src1
shortcut table, the arena, and `kazeia htp plan`."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kazeia.backends.htp.hmx.deep_loads import bank_crossings, hmx_deep_loads
from kazeia.backends.htp.vtcm import arena as V
from kazeia.backends.htp.vtcm.matmul.dispatch import matmul_dispatch, plan_matmul
from kazeia.backends.htp.vtcm.matmul.hmx_2026_05 import hmx_failure_fallback, hmx_matmul_plan
from kazeia.backends.htp.vtcm.matmul.hvx_2026_05 import hvx_matmul_plan
from kazeia.backends.htp.vtcm.op_layouts import (
    act_scratch,
    argsort_scratch,
    binary_scratch,
    flash_attn_scratch,
    rope_scratch,
    softmax_scratch,
    unary_scratch,
)
from kazeia.backends.htp.vtcm.src1_shortcut import src1_cache_effect
from kazeia.cli.main import main as cli_main

MiB = 1024 * 1024
VT = 8 * MiB

# Qwen3-4B matmuls: name -> (K, N)
QWEN3_4B = {"attn_q": (2560, 4096), "attn_k": (2560, 1024), "attn_v": (2560, 1024), "attn_output": (4096, 2560),
            "ffn_gate": (2560, 9728), "ffn_up": (2560, 9728), "ffn_down": (9728, 2560)}


def _check_layout(areas, granule: int | None = None) -> None:
    """Areas follow each other without gaps or overlaps, from offset 0."""
    ptr = 0
    for a in areas:
        assert a.offset == ptr and a.size >= 0
        if granule and a.name != "scales":
            assert a.offset % granule == 0 and a.size % granule == 0
        ptr = a.end
    assert not V.overlaps(areas)


# ---------------------------------------------------------------------------------------------------------------
# acceptance numbers


def test_ffn_down_m38_overflows_by_256_bytes_in_2026_05():
    p = hmx_matmul_plan(38, 9728, 2560, "q4_0", VT, "2026-05")
    assert (p.path, p.mc, p.nc) == ("hmx", 64, 160)
    assert [a.name for a in p.areas] == ["qweight", "activation", "out0", "wt0", "wt1", "out1", "scales"]
    assert [a.size for a in p.areas] == [876_544, 1_245_184, 20_480, 3_112_960, 3_112_960, 20_480, 256]
    assert p.used == 8_388_864 == sum(a.size for a in p.areas)
    assert p.vtcm == VT and p.overflow == 256
    assert p.status == "overflow" and p.outcome == "reenter"
    assert p.estimate == 8_387_840  # the search believed it fits: only the qweight rounding (1,024 B) is missed
    assert p.row_stride == 9728 // 256 * 144
    _check_layout(p.areas, V.HMX_TILE_BYTES)
    # the full decision agrees: 2026-05 keeps HMX and loops
    d = plan_matmul(38, 9728, 2560, "q4_0", vtcm_size=VT, profile="2026-05")
    assert (d.path, d.used, d.overflow, d.outcome) == ("hmx", 8_388_864, 256, "reenter")


def test_attn_output_m38_fits():
    p = hmx_matmul_plan(38, 4096, 2560, "q4_0", VT, "2026-05")
    assert (p.mc, p.nc, p.used, p.overflow, p.status) == (64, 384, 7_799_040, 0, "ok")
    r = hmx_matmul_plan(38, 4096, 2560, "q4_0", VT, "robust")
    assert (r.mc, r.nc, r.areas, r.used) == (p.mc, p.nc, p.areas, p.used)


def test_robust_ffn_down_m38_fits():
    p = plan_matmul(38, 9728, 2560, "q4_0", vtcm_size=VT, profile="robust")
    assert p.path == "hmx" and p.fits and p.used <= VT and p.overflow == 0
    assert (p.mc, p.nc) == (64, 128)


@pytest.mark.slow
@pytest.mark.parametrize("profile", V.PROFILES)
def test_qwen3_4b_overflow_only_ffn_down_m33_to_64(profile):
    overflowing = {(name, m) for name, (k, n) in QWEN3_4B.items() for m in range(1, 1025)
                   if plan_matmul(m, k, n, "q4_0", vtcm_size=VT, profile=profile).overflow}
    if profile == "2026-05":
        assert overflowing == {("ffn_down", m) for m in range(33, 65)}
    else:
        assert overflowing == set()


@pytest.mark.parametrize("m,path", [(32, "hmx"), (33, "hmx"), (38, "hmx"), (64, "hmx"), (65, "hmx"), (31, "hvx")])
def test_qwen3_4b_ffn_down_edges(m, path):
    p = plan_matmul(m, 9728, 2560, vtcm_size=VT, profile="2026-05")
    assert p.path == path
    assert (p.overflow > 0) == (33 <= m <= 64)


def test_bank_crossing_of_attn_output_m38():
    p = plan_matmul(38, 4096, 2560, vtcm_size=VT, profile="2026-05")
    c = bank_crossings(p)
    assert [(d.kind, d.area, d.offset, d.end - 1) for d in c] == [("weight", "wt0", 0x3F4000, 0x403FFF)]
    loads = hmx_deep_loads(p)
    assert all(d.size <= 32 * V.HMX_TILE_BYTES for d in loads)
    # every load stays inside its own area
    for d in loads:
        a = p.area(d.area)
        assert a.offset <= d.offset and d.end <= a.end


# ---------------------------------------------------------------------------------------------------------------
# dispatch and fallback


@pytest.mark.parametrize("kw,path,word", [
    (dict(m=64, k=4096, n=2560), "hmx", "HMX"),
    (dict(m=31, k=4096, n=2560), "hvx", "M=31"),
    (dict(m=64, k=4096, n=2550), "hvx", "N=2550"),
    (dict(m=64, k=4000, n=2560), "hvx", "256"),
    (dict(m=64, k=4016, n=2560, qtype="f16"), "hvx", "32"),
    (dict(m=64, k=4064, n=2560, qtype="f16"), "hmx", "HMX"),
    (dict(m=64, k=4096, n=2560, batched=True), "hvx", "batched"),
    (dict(m=64, k=4096, n=2560, qtype="f16", batched=True), "hmx", "HMX"),
    (dict(m=64, k=4096, n=2560, permuted=True), "hvx", "permuted"),
    (dict(m=64, k=4096, n=2560, hmx_enabled=False), "hvx", "disabled"),
    (dict(m=64, k=4096, n=2560, hmx_built=False), "hvx", "arch"),
])
def test_dispatch(kw, path, word):
    got, reason = matmul_dispatch(**kw)
    assert got == path and word in reason


def test_hmx_failure_fallback_by_profile():
    assert hmx_failure_fallback("2026-05") == "reenter"
    assert hmx_failure_fallback("robust") == "hvx"
    # a VTCM too small for any chunking: 2026-05 loops, robust falls back to HVX
    old = plan_matmul(64, 9728, 2560, vtcm_size=MiB, profile="2026-05")
    assert (old.path, old.status, old.outcome) == ("hmx", "no_chunking", "reenter")
    new = plan_matmul(64, 9728, 2560, vtcm_size=MiB, profile="robust", n_threads=2)
    assert new.path == "hvx" and new.hmx_attempt is not None and new.hmx_attempt.status == "no_chunking"
    assert new.fits


def test_hvx_plan_layout_and_too_small():
    p = hvx_matmul_plan(38, 9728, 2560, "q4_0", n_threads=6, vtcm_size=VT)
    row = V.align_up(9728 + 38 * 16, 128)
    assert p.area("src1").offset == 0 and p.area("src1").size == V.align_up(38 * row, 256)
    assert [a.name for a in p.areas[1:7]] == [f"src0[{t}]" for t in range(6)]
    assert p.area("src0[0]").size == V.align_up(16 * V.align_up(9728 // 32 * 18, 128), 256)
    assert p.area("dst[5]").size == V.align_up(2 * 2560 * 4, 256)
    assert p.used == sum(a.size for a in p.areas) and p.fits
    _check_layout(p.areas)
    big = hvx_matmul_plan(1024, 9728, 2560, "q4_0", n_threads=6, vtcm_size=VT)
    assert big.status == "vtcm_too_small" and big.outcome == "dropped" and big.overflow == big.used - VT


def test_hvx_f16_paths():
    fast = hvx_matmul_plan(8, 128, 4096, "f16", 4, VT)
    assert fast.info["kernel"] == "f16-vtcm"
    slow = hvx_matmul_plan(8, 128, 4096, "f16", 4, VT, permuted=True)
    assert slow.info["kernel"] == "f16-ddr" and slow.area("src1").size == 4 * V.align_up(16 * 128 * 4, 256)


# ---------------------------------------------------------------------------------------------------------------
# arithmetic properties

shapes = st.tuples(st.integers(1, 1024), st.integers(1, 64).map(lambda x: 256 * x), st.integers(1, 512).map(
    lambda x: 32 * x), st.sampled_from(["q4_0", "q4_1", "q8_0", "iq4_nl", "mxfp4", "f16"]),
    st.integers(256 * 1024, 16 * MiB))


@settings(max_examples=150, deadline=None)
@given(shapes)
def test_hmx_plan_properties(shape):
    m, k, n, qt, vt = shape
    old = hmx_matmul_plan(m, k, n, qt, vt, "2026-05")
    new = hmx_matmul_plan(m, k, n, qt, vt, "robust")
    for p in (old, new):
        if p.status == "no_chunking":
            assert p.areas == () and p.mc is None
            continue
        _check_layout(p.areas, V.HMX_TILE_BYTES)
        assert p.used == sum(a.size for a in p.areas) == p.areas[-1].end
        assert p.mc % 32 == 0 and p.nc % 32 == 0 and p.mc <= V.align_up(m, 32) and p.nc <= n
        assert p.overflow == max(0, p.used - vt)
        assert 0 <= p.used - p.estimate < V.HMX_TILE_BYTES  # only the qweight rounding escapes the estimate
    assert new.status != "overflow" and new.used <= vt
    if old.status == "ok":  # robust changes nothing when the snapshot already fits
        assert (new.mc, new.nc, new.used) == (old.mc, old.nc, old.used)
    if qt == "f16":
        assert old.status != "overflow"  # every F16 area is a whole number of tiles


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100_000), st.sampled_from([1, 128, 256, 2048, 4096])), max_size=20))
def test_bump_allocator(reqs):
    b = V.BumpAllocator()
    for i, (size, g) in enumerate(reqs):
        a = b.alloc(f"a{i}", size, granule=g)
        assert a.size == V.align_up(size, g) and a.size - size < g and a.requested == size
    assert b.used == sum(a.size for a in b.areas)
    _check_layout(b.areas)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4096), st.integers(1, 2048), st.integers(1, 10), st.integers(MiB // 4, 16 * MiB))
def test_op_scratch_layouts(ne0, nrows, nt, vt):
    ops = [unary_scratch(ne0, nrows, nt, vt), binary_scratch((ne0, nrows), (ne0, nrows), nt, vt),
           binary_scratch((ne0, nrows), (ne0, 1), nt, vt, op="MUL"), act_scratch(ne0 * 4, nrows, nt, vt),
           softmax_scratch(ne0 * 4, nrows, nt, vt), rope_scratch(ne0, nrows, nt, vt),
           argsort_scratch(ne0, nrows, nt, vt)]
    for s in ops:
        _check_layout(s.areas)
        assert s.used == sum(a.size for a in s.areas)
        if s.status == "ok":
            assert s.used <= vt
            assert all(a.written is None or 0 <= a.written <= a.size for a in s.areas)
        else:
            assert s.writes == ()


def test_flash_attn_qwen3():
    h = flash_attn_scratch(128, 128, 38, 38, 32, 8, 6, VT)
    assert h.info["path"] == "hmx" and h.status == "ok" and h.used <= VT
    names = [a.name for a in h.areas]
    assert names.index("scales_id") + 1 == names.index("scales_qk")
    assert h.area("scales_id").size == h.area("scales_qk").size == 256
    _check_layout(h.areas)
    v = flash_attn_scratch(128, 128, 38, 38, 32, 8, 6, VT, hmx_enabled=False)
    assert v.info["path"] == "hvx" and [a.name for a in v.areas][:2] == ["q[0]", "q[1]"]
    _check_layout(v.areas)
    blk = np.frombuffer(V.hmx_scale_block(0.25), dtype=np.float16)
    assert blk.size == 128 and (blk[:64] == 0.25).all() and (blk[64:] == 0).all()


def test_unary_overwrites_quantized_src1():
    # the stale-shortcut hazard: RMS_NORM over 38 rows of 2560 writes the start of VTCM, where HVX matmul keeps
    # the quantized activations it may reuse in the same batch (2026-05: unary ops do not reset the shortcut)
    s = unary_scratch(2560, 38, 6, VT)
    first = s.areas[0]
    assert first.offset == 0 and first.written == 7 * 2560 * 4
    assert src1_cache_effect("RMS_NORM", "2026-05") == "stale"
    assert src1_cache_effect("RMS_NORM", "robust") == "reset"


@pytest.mark.parametrize("op,path,effect", [
    ("MUL_MAT", "hmx", "reset"), ("MUL_MAT", "hvx", "reuse"), ("SCALE", None, "stale"), ("ADD", None, "reset"),
    ("MUL", None, "reset"), ("GLU_SWIGLU", None, "reset"), ("SOFTMAX", None, "reset"), ("ROPE", None, "reset"),
    ("FLASH_ATTN_EXT", "hmx", "stale"), ("FLASH_ATTN_EXT", "hvx", "reset"), ("SET_ROWS", None, "keep"),
    ("GET_ROWS", None, "keep"), ("CPY", None, "keep"), ("ARGSORT", None, "stale"), ("CONCAT", None, "stale"),
    ("PAD", None, "stale"),
])
def test_src1_shortcut_table(op, path, effect):
    assert src1_cache_effect(op, "2026-05", path) == effect
    assert src1_cache_effect(op, "robust", path) == ("reset" if effect == "stale" else effect)


# ---------------------------------------------------------------------------------------------------------------
# the arena


def test_vtcm_arena():
    v = V.Vtcm(4096)
    v.write(100, b"\x01\x02\x03")
    assert v.read(99, 5) == b"\x00\x01\x02\x03\x00"
    f = v.view_f16(256, 8)
    f[:] = 1.5
    assert np.frombuffer(v.read(256, 16), dtype=np.float16).tolist() == [1.5] * 8  # a view, not a copy
    v.view_f32(512, 4)[2] = -2.0
    assert v.view_i8(520, 4).tolist() == list(np.array([-2.0], np.float32).view(np.int8))
    for bad in [(4090, 8), (-1, 1), (4096, 1)]:
        with pytest.raises(V.VtcmAccessError):
            v.read(*bad)
    with pytest.raises(V.VtcmAccessError):
        v.write(4095, b"ab")
    with pytest.raises(V.VtcmAccessError):
        v.area_view(V.Area("scales", 4000, 256))
    assert v.read(100, 3) == b"\x01\x02\x03"  # nothing is ever cleared
    assert V.Vtcm(64, fill=None, seed=1).read(0, 64) == V.Vtcm(64, fill=None, seed=1).read(0, 64)


# ---------------------------------------------------------------------------------------------------------------
# the command


def _plan_json(capsys, *args: str) -> dict:
    assert cli_main(["htp", "plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_json_matches_plan(capsys, monkeypatch):
    d = _plan_json(capsys, "--m", "38", "--k", "9728", "--n", "2560", "--htp-profile", "2026-05")
    p = plan_matmul(38, 9728, 2560, "q4_0", vtcm_size=VT, profile="2026-05")
    assert (d["path"], d["mc"], d["nc"], d["used"], d["vtcm"], d["overflow"]) == ("hmx", 64, 160, 8_388_864, VT, 256)
    assert [(a["name"], a["offset"], a["size"]) for a in d["areas"]] == [(a.name, a.offset, a.size) for a in p.areas]
    d = _plan_json(capsys, "--m", "38", "--k", "9728", "--n", "2560")  # default profile: 2026-10, the host's plan
    assert d["profile"] == "2026-10" and d["overflow"] == 0
    # htp-2026-10.md §4.1, re-derived from htp/matmul-ops.h (tests/test_htp_hmx_solver.py): 64 x 128, 7,817,216 B
    assert (d["path"], d["mc"], d["nc"], d["used"], d["act_threads"]) == ("hmx", 64, 128, 7_817_216, 6)
    d = _plan_json(capsys, "--m", "38", "--k", "9728", "--n", "2560", "--vtcm", "2097152", "--threads", "4")
    assert d["path"] == "hvx" and d["mc"] == 1 and "HMX solver finds no chunking" in d["refusal"]
    d = _plan_json(capsys, "--m", "38", "--k", "9728", "--n", "2560", "--vtcm", "2097152")  # 6 threads: no HVX fit
    assert d["path"] == "cpu" and d["used"] == 0 and "HVX solver fits nothing" in d["refusal"]
    monkeypatch.setenv("KAZEIA_HTP_PROFILE", "2026-05")
    monkeypatch.setenv("KAZEIA_HTP_VTCM", str(16 * MiB))
    d = _plan_json(capsys, "--m", "38", "--k", "9728", "--n", "2560")
    assert d["profile"] == "2026-05" and d["vtcm"] == 16 * MiB and d["overflow"] == 0
    d = _plan_json(capsys, "--m", "8", "--k", "4096", "--n", "2560", "--threads", "4", "--type", "q8_0")
    assert d["path"] == "hvx" and d["mc"] is None and d["n_threads"] == 4
    monkeypatch.setenv("GGML_HEXAGON_USE_HMX", "0")
    monkeypatch.setenv("GGML_HEXAGON_NHVX", "3")
    d = _plan_json(capsys, "--m", "64", "--k", "4096", "--n", "2560")
    assert d["path"] == "hvx" and d["n_threads"] == 3 and "disabled" in d["reason"]


def test_cli_text_and_errors(capsys):
    assert cli_main(["htp", "plan", "--m", "38", "--k", "4096", "--n", "2560", "--htp-profile", "2026-05"]) == 0
    out = capsys.readouterr().out
    assert "mc=64 nc=384" in out and "7,799,040" in out and "overflow  none" in out and "0x3f4000" in out
    assert cli_main(["htp", "plan", "--m", "0", "--k", "4096", "--n", "2560"]) == 2
    assert "error:" in capsys.readouterr().err


def test_cli_svg(tmp_path, capsys):
    bad, good = tmp_path / "bad.svg", tmp_path / "good.svg"
    assert cli_main(["htp", "plan", "--m", "38", "--k", "9728", "--n", "2560", "--htp-profile", "2026-05",
                     "--svg", str(bad)]) == 0
    assert cli_main(["htp", "plan", "--m", "38", "--k", "9728", "--n", "2560", "--svg", str(good)]) == 0
    capsys.readouterr()
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.parse(bad).getroot()
    assert root.tag == f"{ns}svg"
    red = [e for e in root.iter(f"{ns}rect") if e.get("fill") == "red"]
    assert len(red) == 1 and red[0].get("id") == "overflow"
    assert any(e.get("class") == "bank" for e in root.iter(f"{ns}line"))  # the 4 MiB boundary
    labels = " ".join(e.text or "" for e in root.iter(f"{ns}text"))
    assert "wt0" in labels and "overflow 256 B" in labels
    root = ET.parse(good).getroot()
    assert not [e for e in root.iter(f"{ns}rect") if e.get("fill") == "red"]


def test_cli_svg_draws_october_groups_overlapping(tmp_path, capsys):
    """2026-10's layout puts the fp32 activation staging (group C) over the weights/outputs/scratch (group B): the
    SVG draws it in a second lane over the same offsets, its title saying so; the table lists every area."""
    path = tmp_path / "oct.svg"
    assert cli_main(["htp", "plan", "--m", "38", "--k", "9728", "--n", "2560", "--htp-profile", "2026-10",
                     "--svg", str(path)]) == 0
    capsys.readouterr()
    ns = "{http://www.w3.org/2000/svg}"
    rects = {}
    for e in ET.parse(path).getroot().iter(f"{ns}rect"):
        t = e.find(f"{ns}title")
        if t is not None and t.text:
            rects[t.text.split()[0]] = (float(e.get("y")), float(e.get("height")), t.text)
    want = {"scales", "activation", "weight0", "weight1", "out0", "scratch0", "scratch1", "out1", "act_f32"}
    assert want <= set(rects)
    y_b, h_b, _ = rects["weight0"]
    y_c, h_c, title = rects["act_f32"]
    assert y_c == y_b + h_b and "overlaps" in title  # the lane below, same bytes
