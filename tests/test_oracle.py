"""kazeia oracle (kazeia.debug.oracle, kazeia.cli.oracle): test-backend-ops style single-op sweeps.

The expectations come from outside the code under test: which MUL_MATs run on HMX follows the gate order of
upstream's op_matmul (matmul-ops.c), which of them overflow VTCM is recomputed in oracle_utils from
hmx-matmul-ops.c's hmx_matmul_q_f32 (chunk search with 256 B of overhead, areas rounded to 2048 B) and
cross-checked with kazeia.backends.htp.plan.plan_matmul, and REF's products are compared with a float64
product computed here from the raw block bytes.
"""

from __future__ import annotations

import csv
import json
import os
import time

import numpy as np
import pytest

from kazeia.backends import numpy_ops
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_matmul
from kazeia.backends.ref import RefBackend
from kazeia.cli.main import main as cli_main
from kazeia.debug import oracle as O
from kazeia.errors import KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType, make_tensor
from oracle_utils import hmx_q_layout_bytes

VTCM = 8 * 1024 * 1024
QUANT = ("q4_0", "q4_1", "q8_0")


# ---------------------------------------------------------------------------------------------------
# first principles, from upstream (not from kazeia.backends.htp)


def hmx_q_overflows(m_tok: int, k: int, n_w: int, qtype: str, vtcm: int = VTCM) -> bool:
    """True when hmx_matmul_q_f32's layout is larger than VTCM (the kernel then returns -1)."""
    return hmx_q_layout_bytes(m_tok, k, n_w, qtype, vtcm) > vtcm


def runs_on_hmx(c: O.Case) -> bool:
    """op_matmul's gates in order (matmul-ops.c: op_matmul) for a quantized or F16 weight."""
    t, m, n, k = c["type_a"], c["m"], c["n"], c["k"]
    if m % 32 or t not in QUANT + ("f16",):
        return False
    if (t in QUANT and k % 256) or (t == "f16" and k % 32):
        return False
    batched = tuple(c["bs"]) != (1, 1) or tuple(c["nr"]) != (1, 1)
    if (batched and t != "f16") or c["view"] in ("transposed", "permuted"):
        return False
    return n >= 32


def htp_supports_mul_mat(c: O.Case) -> bool:
    """Upstream's ggml_hexagon_supported_mul_mat: quantized weights (repacked) with 2-D src1 of <= 1024 rows,
    F16 weights not permuted with <= 1024 src1 rows, nothing else (no F32 weights)."""
    src1_rows = c["n"] * c["bs"][0] * c["nr"][0] * c["bs"][1] * c["nr"][1]
    if c["type_a"] in QUANT:
        return src1_rows <= 1024 and c["n"] == src1_rows and c["view"] != "permuted"
    if c["type_a"] == "f16":
        return src1_rows <= 1024 and (c["view"] != "permuted" or c["per"][0] == 0)
    return False


def expected_death(c: O.Case) -> bool:
    return c.op == "MUL_MAT" and c["type_a"] in QUANT and runs_on_hmx(c) and hmx_q_overflows(c["n"], c["k"],
                                                                                             c["m"], c["type_a"])


def known_upstream_defect(c: O.Case) -> bool:
    """The quantized HMX kernel of this snapshot is not given src1's row stride (reads n*k floats from the data
    pointer) and reads src1 as f32 whatever its type: the 2026-05 profile models both, so a strided or F16
    activation on that path gives wrong numbers there; robust reads src1 through its stride and type."""
    return (c.op == "MUL_MAT" and c["type_a"] in QUANT and runs_on_hmx(c)
            and (c["view"] == "rows" or c["type_b"] == "f16"))


def test_first_principles_overflow_is_the_ffn_down_window():
    """Qwen3-4B Q4_0 with 8 MiB: only ffn_down (K=9728, N=2560) overflows, for exactly 33..64 tokens."""
    shapes = [(m, k) for m, k, _ in O.QWEN3_4B]
    over = {(m, k): [n for n in range(1, 1025) if n >= 32 and hmx_q_overflows(n, k, m, "q4_0")] for m, k in shapes}
    assert over.pop((2560, 9728)) == list(range(33, 65))
    assert all(v == [] for v in over.values())
    # the doc's example, and kazeia's plan arithmetic agrees on every token count
    for n in range(32, 1025):
        p = plan_matmul(n, 9728, 2560, "q4_0", vtcm_size=VTCM, profile="2026-05")
        assert (p.status == "overflow") == hmx_q_overflows(n, 9728, 2560, "q4_0"), n
    p = plan_matmul(38, 9728, 2560, "q4_0", vtcm_size=VTCM, profile="2026-05")
    assert (p.mc, p.nc, p.used) == (64, 160, 8_388_864)


# ---------------------------------------------------------------------------------------------------
# cases and grids (no running)


@pytest.mark.slow
def test_case_names_round_trip_and_filter():
    cases = O.make_cases(quick=True)
    names = [c.name for c in cases]
    assert len(set(names)) == len(names)
    assert {c.op for c in cases} == set(O.OPS)
    for c in cases:
        assert O.parse_case(c.name) == c
    c = O.mul_mat_case("q4_0", 2560, 38, 9728)
    assert c.name == "MUL_MAT(type_a=q4_0,type_b=f32,m=2560,n=38,k=9728,bs=[1,1],nr=[1,1],view=contig)"
    rows_case = O.mul_mat_case("q8_0", 576, 40, 1536, view="rows", k_v=1600)
    assert O.parse_case(rows_case.name)["k_v"] == 1600
    sel = O.make_cases(["mul_mat"], types=["q4_1"], pattern=r"k=1536,")
    assert sel and all("type_a=q4_1" in s.name and "k=1536," in s.name for s in sel)
    for bad in (lambda: O.make_cases(["NOPE"]), lambda: O.make_cases(types=["q5_k"]),
                lambda: O.parse_case("MUL_MAT type_a"), lambda: O.make_cases(pattern="(")):
        with pytest.raises(KazeiaError):
            bad()


def _ns(cases, t, m, k, view="contig"):
    return {c["n"] for c in cases if c.op == "MUL_MAT" and c["type_a"] == t and c["m"] == m and c["k"] == k
            and c["view"] == view and c["type_b"] == "f32" and tuple(c["bs"]) == (1, 1)}


@pytest.mark.slow
def test_default_mul_mat_grid_covers_the_models_and_the_edges():
    cases = O.make_cases(["MUL_MAT"])
    for t in O.MM_TYPES:
        for m, k, _ in O.QWEN3_4B + O.SMOLLM2_135M:
            ns = _ns(cases, t, m, k)
            assert {1, 32, 33, 64, 65} <= ns, (t, m, k)
    edges = {n for t in range(32, 1025, 32) for n in (t - 1, t, t + 1) if n <= 1024}
    assert edges <= _ns(cases, "q4_0", 576, 1536)  # SmolLM2 ffn_down: every 32-tile neighbourhood
    down = _ns(cases, "q4_0", 2560, 9728)
    assert set(range(30, 71)) <= down and max(down) == 1024
    assert {n for n in edges if n <= 320} <= down
    views = {c["view"] for c in cases}
    assert views == {"contig", "rows", "transposed", "permuted"}
    assert any(c["view"] == "rows" and c["k_v"] > c["k"] and c["n"] >= 32 for c in cases)
    quant_k = {c["k"] for c in cases if c["type_a"] in QUANT}
    assert any(k % 256 for k in quant_k) and 576 in quant_k
    assert any(c["type_b"] == "f16" for c in cases)


def test_case_for_node_replays_a_graph_matmul():
    w = make_tensor(GGMLType.Q4_0, (1536, 576), name="w")
    x = make_tensor(GGMLType.F32, (1600, 40), name="x")
    node = gb.mul_mat(w, gb.view_2d(x, 1536, 40, x.nb[1]))
    assert O.case_for_node(node) == O.mul_mat_case("q4_0", 576, 40, 1536, view="rows", k_v=1600)
    node = gb.mul_mat(w, make_tensor(GGMLType.F32, (1536, 7)))
    assert O.case_for_node(node) == O.mul_mat_case("q4_0", 576, 7, 1536)
    assert O.case_for_node(gb.scale(x, 2.0)) is None


# ---------------------------------------------------------------------------------------------------
# the checks


def _dequant64(raw: np.ndarray, qtype: str, k: int) -> np.ndarray:
    """float64 values of ggml blocks (ggml-common.h layouts), row by row."""
    bs, ts = {"q4_0": (32, 18), "q4_1": (32, 20), "q8_0": (32, 34)}[qtype]
    b = raw.reshape(raw.shape[0], k // bs, ts)
    f16 = lambda off: b[..., off:off + 2].copy().view(np.float16)[..., 0].astype(np.float64)  # noqa: E731
    d = f16(0)
    if qtype == "q8_0":
        q = b[..., 2:].view(np.int8).astype(np.float64)
        return (d[..., None] * q).reshape(raw.shape[0], k)
    qs = b[..., 4 if qtype == "q4_1" else 2:].astype(np.int64)
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float64)
    if qtype == "q4_0":
        return (d[..., None] * (q - 8)).reshape(raw.shape[0], k)
    return (d[..., None] * q + f16(2)[..., None]).reshape(raw.shape[0], k)


@pytest.mark.parametrize("qtype", QUANT)
def test_ref_gives_no_nan_on_extreme_but_finite_scales(qtype):
    m, n, k = 64, 40, 512
    case = O.mul_mat_case(qtype, m, n, k, init="extreme")
    inputs = O.case_inputs(case, seed=5)
    w = _dequant64(inputs["a"].reshape(m, -1), qtype, k)
    d = np.abs(inputs["a"].reshape(m, k // 32, -1)[..., :2].copy().view(np.float16).astype(np.float64))
    assert np.isfinite(w).all() and d.max() == 65504.0 and ((d > 0) & (d < 2.0**-14)).any()  # really extreme
    out = O.reference_output(case, seed=5)
    assert not np.isnan(out).any()
    want = inputs["b"].reshape(n, k).astype(np.float64) @ w.T
    rel = np.sum((out.reshape(n, m) - want) ** 2) / np.sum(want**2)
    assert rel < 1e-24
    assert O.run_case(case, "REF", seed=5).status == O.OK


def test_nan_in_the_reference_is_reported_as_reference_invalid(monkeypatch):
    def nan_value(self, t):
        return np.full(t.ne[::-1], np.nan)

    monkeypatch.setattr(RefBackend, "value", nan_value)
    r = O.run_case(O.Case.make("SCALE", type="f32", ne=(64, 3, 1, 1), s=0.5, b=0.0, view="contig"), "CPU", 1)
    assert r.status == O.REF_INVALID and not r.passed and "reference" in r.reason


def test_run_case_is_reproducible_per_seed():
    c = O.mul_mat_case("q4_1", 576, 40, 1536)
    r1, r2, r3 = (O.run_case(c, "HTP0", s) for s in (3, 3, 4))
    assert r1.status == r2.status == r3.status == O.OK and r1.path == "hmx"
    assert r1.nmse == r2.nmse != r3.nmse
    assert O.case_inputs(c, 3)["b"].tobytes() == O.case_inputs(c, 3)["b"].tobytes()


# ---------------------------------------------------------------------------------------------------
# sweeps


@pytest.fixture(scope="module")
def robust_quick():
    return O.run_sweep(O.make_cases(quick=True), O.BackendSpec("HTP0", profile="robust"), seed=11, jobs=2)


@pytest.mark.slow
def test_robust_passes_every_quick_case(robust_quick):
    res = {r.name: r for r in robust_quick.results}
    assert len(res) == len(O.make_cases(quick=True))
    for c in O.make_cases(quick=True):
        r = res[c.name]
        if c.op == "MUL_MAT" and not htp_supports_mul_mat(c):
            assert r.status == O.NOT_SUPPORTED, r.line()  # e.g. F32 weights: no HTP matmul for them
        elif c.op == "GET_ROWS" and c["type"] != "f32":
            assert r.status == O.NOT_SUPPORTED, r.line()
        else:
            assert r.status in (O.OK, O.NOT_SUPPORTED), r.line()
            assert r.status == O.OK or c.op != "MUL_MAT", r.line()
    hmx = [r for r in robust_quick.results if r.path == "hmx"]
    assert hmx and all(r.status == O.OK for r in hmx)


@pytest.mark.slow
def test_2026_05_kills_exactly_the_overflowing_plans():
    cases = [c for c in O.make_cases(["MUL_MAT"], types=["q4_0"], pattern=r"m=2560,n=\d+,k=9728,") if c["n"] <= 100]
    cases += [c for c in O.make_cases(["MUL_MAT"], quick=True) if c not in cases]
    want = {c.name for c in cases if expected_death(c)}
    down = {c["n"] for c in cases if expected_death(c) and c["view"] == "contig"}
    assert down == set(range(33, 65))  # every n of the window is in the grid, and nothing else dies
    for c in cases:  # kazeia's plan arithmetic says the same
        if runs_on_hmx(c) and c["type_a"] in QUANT:
            p = plan_matmul(c["n"], c["k"], c["m"], c["type_a"], vtcm_size=VTCM, profile="2026-05")
            assert (p.status == "overflow") == (c.name in want), c.name
    sweep = O.run_sweep(cases, O.BackendSpec("HTP0", profile="2026-05"), seed=2, jobs=2)
    deaths = {r.name for r in sweep.results if r.status == O.DEATH}
    assert deaths == want
    for r in sweep.results:
        c = O.parse_case(r.name)
        if r.status == O.DEATH:
            assert r.death["message"] == "ggml-hex: dspqueue_read failed: 0x0000002e"
            assert r.reason.startswith(r.death["message"]) and "stack overflow" in r.death["cause"]
            assert any("VTCM overflow" in line for line in r.log)
        elif known_upstream_defect(c):
            assert r.status == O.FAIL, r.line()
        else:
            assert r.status in (O.OK, O.NOT_SUPPORTED), r.line()
    assert not sweep.ok and len(sweep.results) == len(cases)
    assert f"{len(sweep.passed)}/{len(sweep.tested)} tests passed" in sweep.summary_lines()[0]


@pytest.mark.slow
def test_cpu_passes_everything_quick():
    sweep = O.run_sweep(O.make_cases(quick=True), "CPU", seed=13, jobs=2)
    bad = [r.line() for r in sweep.results if r.status != O.OK]
    assert not bad, bad
    assert sweep.ok and len(sweep.passed) == len(sweep.tested) == len(O.make_cases(quick=True))


def _patch_add(monkeypatch, action):
    """ADD kernel that runs `action` for the 33-row cases (in the worker: the patch is inherited by fork)."""
    orig = numpy_ops.KERNELS["ADD"]

    def add(be, node):
        if node.ne[1] == 33:
            action()
        return orig(be, node)

    monkeypatch.setitem(numpy_ops.KERNELS, "ADD", add)


@pytest.mark.parametrize("how,code", [("os._exit", "exit status 17"), ("SystemExit", "exit status 3")])
def test_a_case_that_kills_its_worker_is_marked_and_the_sweep_goes_on(monkeypatch, how, code):
    def die():
        if how == "os._exit":
            os._exit(17)
        raise SystemExit(3)

    _patch_add(monkeypatch, die)
    cases = O.make_cases(["ADD"], quick=True)
    sweep = O.run_sweep(cases, "CPU", seed=1, jobs=2)
    assert [r.name for r in sweep.results] == [c.name for c in cases]
    for c, r in zip(cases, sweep.results):
        if c["ne_a"][1] == 33:
            assert r.status == O.CRASH and code in r.reason, r.line()
        else:
            assert r.status == O.OK, r.line()
    assert any(r.status == O.CRASH for r in sweep.results) and sum(r.passed for r in sweep.results) >= 2


@pytest.mark.slow
def test_a_hanging_case_times_out_and_the_sweep_goes_on(monkeypatch):
    _patch_add(monkeypatch, lambda: time.sleep(3600))
    cases = O.make_cases(["ADD"], quick=True)
    sweep = O.run_sweep(cases, "CPU", seed=1, jobs=2, timeout=10)
    for c, r in zip(cases, sweep.results, strict=True):
        assert r.status == (O.TIMEOUT if c["ne_a"][1] == 33 else O.OK), r.line()


# ---------------------------------------------------------------------------------------------------
# the command


def test_cli_reports_csv_and_json(tmp_path, capsys):
    csv_path, json_path = tmp_path / "o.csv", tmp_path / "o.json"
    rc = cli_main(["oracle", "-b", "CPU", "-o", "SCALE,CPY", "--quick", "--seed", "5", "-j", "1", "--no-progress",
                   "--csv", str(csv_path), "--json", str(json_path), "--show-all"])
    out = capsys.readouterr().out
    n = len(O.make_cases(["SCALE", "CPY"], quick=True))
    assert rc == 0 and f"{n}/{n} tests passed" in out and "Backend CPU: OK" in out and "seed 5" in out
    assert "  SCALE(type=f32,ne=[2560,1,1,1],s=0.125,b=0.0,view=contig): OK" in out
    with open(csv_path) as f:
        recs = list(csv.DictReader(f))
    assert len(recs) == n and set(O.CSV_FIELDS[:16]) <= set(recs[0])
    assert {r["op_name"] for r in recs} == {"SCALE", "CPY"} and all(r["passed"] == "1" for r in recs)
    d = json.loads(json_path.read_text())
    assert d["ok"] and d["seed"] == 5 and d["passed"] == n


@pytest.mark.slow
def test_cli_device_death_line_and_exit_status(capsys):
    rc = cli_main(["oracle", "-o", "MUL_MAT", "--types", "q4_0", "--htp-profile", "2026-05", "-p",
                   r"m=2560,n=(32|38),k=9728,.*contig", "-j", "1", "--no-progress", "--seed", "1"])
    out = capsys.readouterr().out
    assert rc == 1
    assert ("MUL_MAT(type_a=q4_0,type_b=f32,m=2560,n=38,k=9728,bs=[1,1],nr=[1,1],view=contig): DEVICE DEATH "
            "ggml-hex: dspqueue_read failed: 0x0000002e") in out
    assert "n=32,k=9728" not in out.split("Failing tests:")[1]
    assert cli_main(["oracle", "-o", "ADD", "--quick", "--list"]) == 0
    assert capsys.readouterr().out.count("ADD(") == len(O.make_cases(["ADD"], quick=True))


def test_2026_05_hmx_ignores_src1_stride_and_type():
    cases = [c for c in O.make_cases(["MUL_MAT"], quick=True) if known_upstream_defect(c)]
    assert cases
    sweep = O.run_sweep(cases, O.BackendSpec("HTP0", profile="2026-05"), seed=3, jobs=0)
    bad = [r for r in sweep.results if r.status != O.FAIL and r.status != O.DEATH]
    assert not bad, [r.line() for r in bad]
