"""The original team's host-side OPLOG and DUMP (backends/htp/oplog.py), the host/DSP timing model behind what they
read (backends/htp/timing.py), ggml-alloc's reserve-then-reuse plan that puts the attention output where the KQ
mask was, and -ngl placement.

- OPLOG lines in their format, statistics from ggml_nbytes bytes at the data pointer: NaN-blind before their fix,
  with nan=/inf= after it; a view's gaps are read too.
- The timing model: a pinned KAZEIA_HTP_RACE_SEED reproduces every enqueue-time read; other seeds read other
  bytes; no seed changes a single bit of any op's output.
- DUMP: raw bytes plus a one-line description, for the ops whose description matches.
- The reserve plan: a 10-token graph runs at the addresses of the worst-case plan, where the first flash
  attention output starts on the F32 mask when both have the same worst-case size.
"""

from __future__ import annotations

import io
import os
import re
from contextlib import redirect_stderr

import numpy as np
import pytest

from kazeia.backends.htp.host.oplog import kzop_line, s1_stats
from kazeia.debug.runner import run
from kazeia.engine.session import RunSpec
from kazeia.errors import KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.tensor import Buffer, GGMLType, make_tensor

F32, Q4_0 = GGMLType.F32, GGMLType.Q4_0


def _f32(ne, values) -> object:
    t = make_tensor(F32, ne, name="x")
    t.buffer, t.offset = Buffer.zeros("b", t.nbytes), 0
    t.buffer.data[:] = np.asarray(values, dtype=np.float32).view(np.uint8)
    return t


def test_kzop_line_is_the_teams_format():
    w = make_tensor(Q4_0, (4096, 2560), name="blk.0.attn_output.weight")
    vals = np.zeros(4096 * 38, dtype=np.float32)
    vals[7] = -9.81
    x = _f32((4096, 38), vals)
    node = gb.mul_mat(w, x)
    assert kzop_line(node, post_fix=False) == \
        "KZOP MUL_MAT dst=[2560,38,1,1] src0=q4_0[4096,2560] src1=f32[4096,38] s1_amax=9.8"
    assert kzop_line(node, post_fix=True).endswith("s1_amax=9.8 nan=0 inf=0")


def test_their_first_amax_skips_nan_and_the_fix_counts_it():
    raw = np.array([1.5, np.nan, -0.5, np.nan], dtype=np.float32).view(np.uint8)
    assert s1_stats(raw, post_fix=False) == " s1_amax=1.5"  # `v > amax` is false for NaN: two NaN unseen
    assert s1_stats(raw, post_fix=True) == " s1_amax=1.5 nan=2 inf=0"
    mask = np.array([0.0, -np.inf, -np.inf], dtype=np.float32).view(np.uint8)
    assert s1_stats(mask, post_fix=False) == " s1_amax=inf"  # fabsf(-inf) > amax: an infinity does show
    assert s1_stats(mask, post_fix=True) == " s1_amax=inf nan=0 inf=2"


def test_statistics_read_nbytes_from_the_data_pointer_gaps_included():
    """A view with gaps: ggml_nbytes spans bytes that are not its elements, and the OPLOG reads them."""
    base = _f32((8, 4), np.r_[np.ones(4), np.full(4, np.nan), np.ones(4), np.full(4, np.nan), np.ones(16)])
    view = gb.view_2d(base, 4, 2, base.nb[1])  # the first 4 of each row of 8: the NaN are in the gaps
    view.buffer, view.offset = base.buffer, base.offset
    w = make_tensor(GGMLType.F32, (4, 16), name="w")
    line = kzop_line(gb.mul_mat(w, view), post_fix=True)
    assert line.endswith("s1_amax=1.0 nan=4 inf=0")  # 4 NaN read between the view's rows


def _kzop(model: str, seed: int | None, n_prompt: int = 40, **env) -> tuple[list[str], np.ndarray]:
    e = {"GGML_HEXAGON_OPBATCH": "1", "GGML_HEXAGON_OPLOG": "2", **env}
    if seed is not None:
        e["KAZEIA_HTP_RACE_SEED"] = str(seed)
    err = io.StringIO()
    with redirect_stderr(err):
        res = run(RunSpec(model=model, n_prompt=n_prompt, device="HTP0", env=e))
    assert res.ok, res.signature()
    return [ln for ln in err.getvalue().splitlines() if ln.startswith("KZOP")], res.logits


def test_the_race_seed_pins_the_reads_and_never_the_results(tiny_qwen3_q4):
    logs = {s: _kzop(tiny_qwen3_q4, s) for s in range(6)}
    again, logits0 = _kzop(tiny_qwen3_q4, 0)
    assert again == logs[0][0]  # pinned: the same reads, line for line
    assert len({tuple(lg) for lg, _ in logs.values()}) > 1  # other seeds: the host read other bytes
    for _, logits in logs.values():  # and no op computed anything else
        assert np.array_equal(logits.view(np.uint32), logits0.view(np.uint32))
    lines = logs[0][0]
    assert all(re.fullmatch(r"KZOP \w+ dst=\[[\d,]+\]( src0=\w+\[[\d,]+\])?( src1=\w+\[[\d,]+\])?"
                            r"( s1_amax=\S+ nan=\d+ inf=\d+)?", ln) for ln in lines), lines[:5]


def test_dump_writes_the_bytes_and_a_description(tiny_qwen3_q4, tmp_path):
    e = {"GGML_HEXAGON_DUMP": r"MUL_MAT .* weight=blk\.0\.attn_output", "KAZEIA_HTP_DUMP_DIR": str(tmp_path),
         "KAZEIA_HTP_RACE_SEED": "1"}
    with redirect_stderr(io.StringIO()):
        assert run(RunSpec(model=tiny_qwen3_q4, n_prompt=12, device="HTP0", env=e)).ok
    assert sorted(os.listdir(tmp_path)) == ["kz_act.bin", "kz_act.txt"]  # one match: layer 0's attention output
    desc = (tmp_path / "kz_act.txt").read_text().strip()
    assert desc.startswith("MUL_MAT node_") and "f32[256,12,1,1]" in desc and "nbytes=12288" in desc
    assert os.path.getsize(tmp_path / "kz_act.bin") == 256 * 12 * 4


def test_a_small_graph_runs_at_the_reserved_plans_addresses(tmp_path):
    """The May graph (an F32 mask and its F16 cast, what the seed ran). n_ctx = n_head x head_dim: the worst-case
    F32 mask [n_ctx, n_ubatch] and flash attention output
    [head_dim x n_head, n_ubatch] have one size, and best fit gives the output the mask's freed block; a 10-token
    graph then has its attention output (the o_proj's src1) start on the bytes of its own mask."""
    from kazeia.backends.cpu import CpuBackend
    from kazeia.engine.context import Context, Model
    from kazeia.engine.scheduler import Scheduler
    from kazeia.gguf.writer import preset, write_model

    path = str(tmp_path / "m.gguf")
    write_model(preset("tiny", arch="qwen3", wtype="f32"), path)  # 4 heads x 64 = 256
    ctx = Context(Model.load(path), Scheduler([CpuBackend()]), n_ctx=256, n_ubatch=64, kq_mask_cast=True)
    assert ctx.allocator.plans == 1  # the worst case, at creation
    ctx.decode(list(range(10, 20)))
    g = ctx.last_graph
    assert ctx.allocator.plans == 1  # the 10-token graph fit the reserved plan
    mask = next(t for t in g.leafs if t.name == "attn_inp_kq_mask")
    fa = next(n for n in g.nodes if n.op == "FLASH_ATTN_EXT")
    o_proj = next(n for n in g.nodes if n.op == "MUL_MAT" and n.src[0].weight_name == "blk.0.attn_output.weight")
    assert fa.offset == mask.offset and o_proj.src[1].offset == mask.offset
    assert mask.nbytes <= o_proj.src[1].nbytes  # the mask's bytes lie at the start of the o_proj's src1
    with pytest.raises(KazeiaError):
        ctx.decode(list(range(300)))  # more than the context: refused before any plan
    assert ctx.allocator.plans == 1


def _placements(model: str, ngl: int | None) -> dict[str, str]:
    from kazeia.cli.common import open_session
    from kazeia.cli.main import build_parser

    argv = ["run", "-m", model, "-dev", "HTP0", "--n-prompt", "8"] + (["-ngl", str(ngl)] if ngl is not None else [])
    s = open_session(build_parser("run").parse_args(argv))
    s.ctx.decode(list(range(10, 18)))
    return {p.node: p.backend for p in s.scheduler.placements}


def test_ngl_puts_the_last_layers_on_the_device(tiny_qwen3_q4):
    full = _placements(tiny_qwen3_q4, None)
    assert _placements(tiny_qwen3_q4, 99) == full and full["ffn_out-0"] == "HTP0" and full["result_norm"] == "HTP0"
    one = _placements(tiny_qwen3_q4, 1)
    assert one["ffn_out-0"] == one["Qcur-0"] == one["node_25"] == "CPU"  # layer 0 (its attention too)
    assert one["ffn_out-1"] == one["Qcur-1"] == "HTP0" and one["result_norm"] == "CPU"  # output layer: N > 2 only
    assert _placements(tiny_qwen3_q4, 2)["result_norm"] == "CPU" and _placements(tiny_qwen3_q4, 3) == full
    assert set(_placements(tiny_qwen3_q4, 0).values()) == {"CPU"}


def _dump_o_proj_0(model: str, tmp, seed: int | None) -> np.ndarray:
    d = tmp / f"dump{seed}"
    e = {"GGML_HEXAGON_OPBATCH": "1", "GGML_HEXAGON_DUMP": r"weight=blk\.0\.attn_output", "KAZEIA_HTP_DUMP_DIR": str(d)}
    if seed is not None:
        e["KAZEIA_HTP_RACE_SEED"] = str(seed)
    with redirect_stderr(io.StringIO()):
        res = run(RunSpec(model=model, n_prompt=38, device="HTP0", htp_profile="2026-05", env=e))
    assert res.death and res.death["faulting"] == "ffn_out-0"
    return np.fromfile(d / "kz_act.bin", dtype=np.float32)


@pytest.mark.slow
def test_the_seed_dump_is_the_kq_mask_or_the_finished_output(q4b2, tmp_path):
    """The seed's o_proj (layer 0, 38 tokens): an enqueue-time dump holds the F32 KQ mask's 38 x 256 values (741
    zeros, 8987 -inf) in a field of zeros (94.2 %), unless the attention had finished by then; the timing decides
    which, never a third thing."""
    mask_run, fresh_run = _dump_o_proj_0(q4b2, tmp_path, 0), _dump_o_proj_0(q4b2, tmp_path, 29)  # (seeds that race so)
    assert mask_run.size == 4096 * 38
    assert int((mask_run == 0).sum()) == 146661 and int(np.isneginf(mask_run).sum()) == 8987
    assert round(float((mask_run == 0).mean()) * 100, 1) == 94.2
    head = mask_run[:256 * 38].reshape(38, 256)  # the mask's rows: token t sees cells 0..t
    assert all((head[t, : t + 1] == 0).all() and np.isneginf(head[t, t + 1:]).all() for t in range(38))
    assert np.isfinite(fresh_run).all() and (fresh_run != 0).mean() > 0.99  # the attention output
    unpinned = _dump_o_proj_0(q4b2, tmp_path, None)
    assert np.array_equal(unpinned, mask_run) or np.array_equal(unpinned, fresh_run)


@pytest.mark.parametrize("env, says", [
    ({"KAZEIA_HTP_RACE_SEED": "-5"}, "KAZEIA_HTP_RACE_SEED=-5 must be"),
    ({"KAZEIA_HTP_RACE_SEED": str(1 << 64)}, "must be an integer in 0 .. 2**64-1"),
    ({"KAZEIA_HTP_RACE_SEED": "abc"}, "is not an integer"),
    ({"GGML_HEXAGON_OPLOG": "3"}, "must be 0, 1"),
    ({"GGML_HEXAGON_DUMP": "("}, "is not a valid regular expression"),
    ({"KAZEIA_HTP_DUMP_LIMIT": "0"}, "must be >= 1"),
])
def test_bad_switches_are_one_line_errors(env, says):
    from kazeia.backends.htp.settings import HtpSettings

    with pytest.raises(KazeiaError, match=re.escape(says)):
        HtpSettings.from_env(env=env)
    assert HtpSettings.from_env(env={"KAZEIA_HTP_RACE_SEED": str((1 << 64) - 1)}).race_seed == (1 << 64) - 1
