"""kazeia.debug.judge, the one judge of compare, replay, oracle, bisect and investigate.

The expectations come from test-backend-ops.cpp (the callback of ggml_backend_compare_graph_backend and the
tests' max_nmse_err), transcribed independently in tests/oracle_utils.py (its `nmse`) and here: NaN first, an
infinity is +-inf or |x| >= FLT_MAX and must be matched with the same sign, NMSE = sum((a-b)^2)/sum(a^2) with a =
the backend under test. Every tool must give the same verdict on the same arrays.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kazeia.debug.judge import (
    FAIL,
    FLT_MAX,
    OK,
    REF_INVALID,
    WHOLE_MODEL_NMSE,
    judge,
    judge_logits,
    node_threshold,
    nonfinite,
    op_threshold,
)
from kazeia.graph import builder as gb
from kazeia.graph.tensor import GGMLType, TFlag, make_tensor
from oracle_utils import nmse as independent_nmse

RNG = np.random.default_rng(0)
B = RNG.standard_normal(1000)
A = B + 1e-3 * RNG.standard_normal(1000)


def test_nan_in_output_fails_whatever_the_threshold():
    a = B.copy()
    a[5] = np.nan
    v = judge(a, B, 1.0, name_a="HTP0")
    assert v.status == FAIL and v.kind == "nan" and v.nmse == math.inf
    assert v.reason.startswith("NaN at index 5 (1 of 1000; HTP0=nan REF=")


def test_nan_in_reference_is_reference_invalid_never_the_backend():
    b = B.copy()
    b[3] = np.nan
    for got in (A, b):  # whatever the backend produced, NaN included
        v = judge(got, b, 1e-7)
        assert v.status == REF_INVALID and v.reference_invalid and "reference invalid" in v.reason
        assert v.nmse is None and not v.ok


@pytest.mark.parametrize("inf", [np.inf, FLT_MAX, np.float64(FLT_MAX) * 2])
def test_an_infinity_is_inf_or_at_least_flt_max(inf):
    b = np.array([1.0, np.inf, -np.inf, 2.0])
    a = np.array([1.0, inf, -inf, 2.0])
    assert judge(a, b, 0.0).status == OK  # matched infinities, the finite rest exact
    assert nonfinite(a)


def test_inf_mismatch_and_sign_mismatch():
    b = np.array([1.0, np.inf, 3.0])
    v = judge(np.array([1.0, 2.0, 3.0]), b, 1.0)
    assert v.status == FAIL and v.kind == "inf" and v.reason.startswith("inf mismatch at index 1")
    v = judge(np.array([1.0, -np.inf, 3.0]), b, 1.0)
    assert v.status == FAIL and v.reason.startswith("inf sign mismatch at index 1")
    v = judge(np.array([1.0, FLT_MAX, 3.0]), np.array([1.0, 2.0, 3.0]), 1.0)
    assert v.status == FAIL and v.n_inf_mismatch == 1  # FLT_MAX alone is an infinity the reference lacks
    assert not nonfinite(np.array([np.nextafter(np.float32(FLT_MAX), 0)]))


def test_nmse_is_test_backend_ops_formula_with_a_the_backend():
    want = float(np.sum((A - B) ** 2) / np.sum(A * A))
    v = judge(A, B, 5e-4)
    assert v.status == OK and v.kind == "nmse"
    assert v.nmse == pytest.approx(want, rel=1e-12) == pytest.approx(independent_nmse(A, B), rel=1e-12)
    assert v.nmse != pytest.approx(float(np.sum((A - B) ** 2) / np.sum(B * B)), rel=1e-9)  # not b's energy
    assert v.max_abs == pytest.approx(float(np.abs(A - B).max()))
    v = judge(A, B, want / 2, op="MUL_MAT")
    assert v.status == FAIL and v.reason == f"[MUL_MAT] NMSE {want:.3g} > {want / 2:.3g}"


def test_exact_threshold_zero_and_all_zero_output():
    assert judge(B, B, 0.0).status == OK and judge(B, B, 0.0).identical
    assert judge(np.nextafter(B, 10), B, 0.0).status == FAIL  # threshold 0 means bit-exact
    assert judge(np.zeros(4), np.zeros(4), 0.0).status == OK  # 0/0 counts as 0
    v = judge(np.zeros(4), np.ones(4), 1.0)
    assert v.status == FAIL and v.kind == "zero" and v.nmse == math.inf and "all-zero" in v.reason


def test_bytes_and_shapes():
    raw = np.arange(16, dtype=np.uint8)
    assert judge(raw, raw.copy(), 0.0).status == OK
    other = raw.copy()
    other[3] ^= 1
    assert judge(raw, other, 1.0).reason == "bytes differ"
    assert judge(np.zeros(3), np.zeros(4), 1.0).kind == "shape"


def test_logits_use_the_whole_model_threshold():
    ref = RNG.standard_normal((1, 64))
    assert judge_logits(ref * (1 + 1e-3), ref).ok
    v = judge_logits(ref * 0.5, ref)
    assert not v.ok and v.threshold == WHOLE_MODEL_NMSE and v.reason.startswith("[logits] NMSE")
    assert judge_logits(None, ref) is None


def test_op_thresholds_are_test_backend_ops_table_plus_kazeia_rules():
    assert op_threshold("MUL_MAT") == 5e-4 and op_threshold("FLASH_ATTN_EXT") == 5e-4
    assert op_threshold("SOFT_MAX") == 1e-6 and op_threshold("RMS_NORM") == 1e-7
    assert op_threshold("CPY") == 0.0  # test_cpy: one type
    assert op_threshold("CPY", converts=True) == 1e-6  # test_cpy: two float types
    assert op_threshold("SET_ROWS", converts=True) == 1e-7  # test_set_rows: F32 -> F16
    assert op_threshold("GET_ROWS") == 0.0 and op_threshold("CONT") == 0.0  # kazeia: exact within one type
    w = make_tensor(GGMLType.Q4_0, (64, 32), name="w", flags=TFlag.WEIGHT)
    e = make_tensor(GGMLType.F32, (64, 32), name="e")
    x = make_tensor(GGMLType.F32, (64, 8), name="x")
    h = make_tensor(GGMLType.F16, (64, 8), name="h")
    ids = make_tensor(GGMLType.I32, (4,), name="ids")
    assert node_threshold(gb.mul_mat(w, x)) == 5e-4
    assert node_threshold(gb.soft_max_ext(gb.mul_mat(e, x), None, 1.0)) == 1e-6
    assert node_threshold(gb.add(x, x)) == 1e-7
    assert node_threshold(gb.cont(gb.transpose(x))) == 0.0
    assert node_threshold(gb.get_rows(e, ids)) == 0.0
    assert node_threshold(gb.get_rows(w, ids)) == 1e-7  # dequantizing: a conversion
    assert node_threshold(gb.cpy(x, h)) == 1e-6  # F32 -> F16: test_cpy's non-quantized pair
    assert node_threshold(gb.cpy(x, make_tensor(GGMLType.F32, (64, 8), name="y"))) == 0.0


def test_every_tool_says_the_same_on_the_same_arrays():
    """compare's rows, replay's executions, the oracle's cases and the bisect judges all hold this Verdict."""
    from kazeia.debug import compare, oracle
    from kazeia.debug.bisect.judges import numeric_failure_samples
    from kazeia.debug.replay.results import Execution

    assert compare.judge is judge and oracle.judge is judge
    ex = Execution("alone", "HTP0", vs_ref=judge(A, B, 1e-9, name_a="HTP0"))
    assert not ex.ok and ex.vs_ref.reason in ex.verdict()
    samples = numeric_failure_samples()
    assert any(s.startswith("[logits] NaN") for s in samples) and any("NMSE" in s for s in samples)


@pytest.mark.parametrize("case", range(12))
def test_the_all_finite_pass_gives_the_general_verdict(case, monkeypatch):
    """judge's one-pass path for all-finite outputs (`_finite_verdict`) gives the verdict, reason and numbers the
    general checks give, and steps aside for NaN, inf, FLT_MAX itself, all-zero and identical outputs."""
    import kazeia.debug.judge as J

    rng = np.random.default_rng(case)
    for _ in range(40):
        n = int(rng.integers(1, 400))
        a = rng.standard_normal(n) * 10 ** rng.uniform(-5, 5)
        b = a + rng.standard_normal(n) * 10 ** rng.uniform(-12, 1)
        kind = int(rng.integers(0, 7))
        if kind == 1:
            a[rng.integers(n)] = np.nan
        elif kind == 2:
            b[rng.integers(n)] = -np.inf
        elif kind == 3:
            a[0] = 3.4028234663852886e38
        elif kind == 4:
            b = a.copy()
        elif kind == 5:
            a[:] = 0
        threshold = 10 ** rng.uniform(-10, -1)
        fast = J.judge(a, b, threshold, op="X")
        with monkeypatch.context() as m:
            m.setattr(J, "_finite_verdict", lambda *args: None)
            assert J.judge(a, b, threshold, op="X") == fast
