"""kazeia replay --op-stream: a device's op log (KZOP or GGML_HEXAGON_VERBOSE lines, shapes only) rebuilt on the
HTP model in order on one device. The VERBOSE lines are the emulator's own, printed by a real run (upstream's
format); the KZOP stream is the seed session's shapes (docs/seed.md). A profile's prediction is checked against
what that profile does when it runs the model itself."""

from __future__ import annotations

import pytest

from kazeia.backends.htp.settings import HtpSettings
from kazeia.debug.op_stream import parse_stream, replay_stream
from kazeia.debug.runner import run
from kazeia.engine.session import RunSpec

SEED_STREAM = """\
KZOP RMS_NORM dst=[2560,38,1,1] src0=f32[2560,38]
KZOP MUL dst=[2560,38,1,1] src0=f32[2560,38] src1=f32[2560,1] s1_amax=1.3
KZOP MUL_MAT dst=[4096,38,1,1] src0=q4_0[2560,4096] src1=f32[2560,38] s1_amax=3.1
KZOP ROPE dst=[128,32,38,1] src0=f32[128,32] src1=i32[38,1]
KZOP FLASH_ATTN_EXT dst=[128,32,38,1] src0=f32[128,38] src1=f16[128,256]
KZOP MUL_MAT dst=[2560,38,1,1] src0=q4_0[4096,2560] src1=f32[4096,38] s1_amax=2.0
KZOP MUL_MAT dst=[9728,38,1,1] src0=q4_0[2560,9728] src1=f32[2560,38] s1_amax=2.0
KZOP MUL_MAT dst=[2560,38,1,1] src0=q4_0[9728,2560] src1=f32[9728,38] s1_amax=2.0
KZOP ADD dst=[2560,38,1,1] src0=f32[2560,38] src1=f32[2560,38]
"""


def test_verbose_lines_of_a_real_run_rebuild_its_matmuls(tiny_qwen3_q4, capfd):
    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=36, device="HTP0", htp_profile="robust",
                   env={"GGML_HEXAGON_VERBOSE": "1"})
    run(spec)
    text = capfd.readouterr().err
    ops = parse_stream(text)
    mm = [o for o in ops if o.op == "MUL_MAT"]
    assert mm and all(o.case is not None for o in mm)
    assert mm[0].case["k"] == 256 and mm[0].case["n"] == 36
    res = replay_stream(ops, HtpSettings.from_env(profile="robust", faults=["hmx-bias-stale"]))
    line, why = res.first_wrong[0].line_no, res.first_wrong[1]
    assert line == mm[0].line_no and "all outputs are exactly 0" in why
    assert "no fault" in replay_stream(ops, HtpSettings.from_env(profile="robust")).lines()[-1]


def test_small_kzop_stream_follows_the_flash_attention_scale():
    ops = parse_stream("KZOP FLASH_ATTN_EXT dst=[64,4,40,1] src0=f32[64,40] src1=f16[64,256]\n"
                       "KZOP MUL_MAT dst=[256,40,1,1] src0=q4_0[256,256] src1=f32[256,40] s1_amax=2.0\n")
    res = replay_stream(ops, HtpSettings.from_env(profile="robust", faults=["hmx-bias-stale"]))
    assert res.first_wrong[0].line_no == 2 and "1/sqrt(64)" in res.first_wrong[1]


@pytest.mark.slow
def test_seed_stream_dies_in_ffn_down_under_2026_05_only():
    ops = parse_stream(SEED_STREAM)
    assert [o.op for o in ops if o.case is None] == ["ROPE"]
    old = replay_stream(ops, HtpSettings.from_env(profile="2026-05"), judge_outputs=False)
    assert old.death is not None and old.death[0].line_no == 8 and "stack-overflow" in old.death[1]
    new = replay_stream(ops, HtpSettings.from_env(profile="robust"), judge_outputs=False)
    assert new.death is None and len(new.ran) == 8
