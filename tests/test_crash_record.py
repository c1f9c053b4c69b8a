"""cDSP crash records: the emulator's death leaves one in upstream's logcat format, a pasted record (any logcat
prefix) is parsed, and its Bad VA lands on the VTCM plan map of the op that died: the area, the HMX deep-load
run and the 4 MiB bank boundary it crosses. The death comes from a real HMX matmul run on the HTP model with
the `vtcm-bank-crossing` fault, at VTCM sizes no other test uses; the placement is checked against the plan's
own deep-load list, computed independently of the fault."""

from __future__ import annotations

import pytest

from kazeia.backends.htp.hmx.deep_loads import BANK_BYTES, bank_crossings
from kazeia.backends.htp.host.crash_record import VTCM_VA, crash_record, parse_crash
from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_for_node
from kazeia.debug.crashmap import place_bad_va
from kazeia.debug.oracle.backends import BackendSpec
from kazeia.debug.oracle.mul_mat import mul_mat_case
from kazeia.debug.oracle.ops import build_case
from kazeia.debug.oracle.run import run_case
from kazeia.debug.oracle.verdicts import DEATH

# a record in the layout public reports quote, with the other line prefix and this test's own values
_PREFIX = "adsprpc:dsp: CDSP:platform_qdi_driver.c:792:0x191:1: "
PASTED = "11-04 16:53:41.367  2780  2902 V adsprpc : " + "\n".join(_PREFIX + s for s in [
    "###### Process on cDSP CRASHED!!!!!!! ######",
    "--------------------- Crash Details are furnished below -----------",
    'Process "/frpc/f0123450 llama-cli" crashed in thread "hmx-worker" due to precise exception occurrence',
    'Crashed Shared Object "./libggml-htp-v73.so" load address : 0x30020000',
    "Fault PC   :    0x30031234", "LR         :    0x30030010", "SP         :    0xA12340",
    "Bad VA     :    0xD8400040", "SSR        :    0x1970601", "Error code :    0x2601", "Call trace :",
    "[<30031234>] some_kernel+0x34:     (./libggml-htp-v73.so)"])


def test_pasted_record_is_parsed_with_any_prefix():
    p = parse_crash(PASTED)
    assert (p.process, p.thread) == ("/frpc/f0123450 llama-cli", "hmx-worker")
    assert (p.fault_pc, p.lr, p.sp, p.bad_va, p.ssr, p.error_code) == (
        0x30031234, 0x30030010, 0xA12340, 0xD8400040, 0x1970601, 0x2601)
    assert p.load_address == 0x30020000 and p.fault_location() == "some_kernel+0x34 (./libggml-htp-v73.so)"
    assert parse_crash("ggml-hex: dspqueue_read failed: 0x0000002e\n") is None


def test_emulated_record_round_trips():
    lines = crash_record("bus-error", {"vtcm_offset": 0x400000})
    assert lines[0].endswith("Process on cDSP0 CRASHED!!!!!!! ########################################")
    p = parse_crash("\n".join(lines))
    assert p.bad_va == VTCM_VA + 0x400000 and p.error_code == 0x2601
    assert p.fault_location().startswith("core_dot_chunk_fp16+0x")
    so = parse_crash("\n".join(crash_record("stack-overflow", {"stack_used": 66048})))
    assert so.fault_location().startswith("op_matmul+0x") and so.error_code == 0x2601


@pytest.mark.parametrize("vtcm", [8 << 20, 12 << 20, (8 << 20) + (3 << 18)])
def test_bank_crossing_death_places_bad_va_on_the_plan(vtcm):
    case = mul_mat_case("q4_0", m=3072, n=44, k=2560)
    settings = HtpSettings.from_env(profile="robust", vtcm_bytes=vtcm, faults=["vtcm-bank-crossing"])
    plan = plan_for_node(build_case(case).out, settings)
    crossings = bank_crossings(plan)
    res = run_case(case, BackendSpec("HTP0", profile="robust", vtcm=vtcm, faults=("vtcm-bank-crossing",)))
    if not crossings:
        assert res.status != DEATH
        return
    assert res.status == DEATH, res.reason
    record = res.death["crash_record"]
    crash = parse_crash("\n".join(record))
    assert crash.error_code == 0x2601
    pl = place_bad_va(crash.bad_va, plan)
    assert pl.offset % BANK_BYTES == 0 and pl.offset > 0
    assert pl.area is not None and pl.area_range[0] <= pl.offset < pl.area_range[1]
    assert pl.loads, pl.lines()
    first = crossings[0]
    assert any(d["offset"] == first.offset and d["size"] == first.size for d in pl.loads)
    assert "crosses a 4 MiB bank boundary" in " ".join(pl.lines())


def test_bad_va_outside_vtcm_is_said_so():
    plan = plan_for_node(build_case(mul_mat_case("q4_0", m=256, n=40, k=256)).out, HtpSettings())
    assert "not inside VTCM" in place_bad_va(0x1000, plan).lines()[0]
