"""The `2026-10` profile's host and DSP rules, each against numbers derived from the October source
(llama.cpp 0c1e57098bba, ggml/src/ggml-hexagon), not from kazeia's own output:

- ggml-hexagon.cpp env parsing: OPBATCH 1280, OPQUEUE 32; NHMX / MM_SELECT / FA_SELECT / GDN_SELECT / OPFUSION;
  USE_HMX and OPSTAGE are no longer read.
- precompute_matmul_params_impl + supported_mul_mat: HMX when M > 4 and its solver fits, else HVX, else CPU; no
  row limit (Qwen3's 151936-row lm_head runs on the HTP).
- flush_pending / synchronize / get_tensor_async / graph_compute: a non-OK response is logged "dsp-rsp <NAME>",
  kept sticky, and aborts the next synchronize or output read ("<where> failed : dsp-error <NAME>"; llama_decode
  reads the logits with ggml_backend_tensor_get_async on the backend that computed them); no 0x2e.
- matmul-ops.c: hmx_mm_2d_f32 checks its layout against ctx->vtcm_size (main.c vtcm_alloc's grant) and returns -1
  -> INTERNAL-ERROR; the HVX kernels return VTCM-TOO-SMALL.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from cli_utils import kazeia_clean as kazeia
from kazeia.backends.htp import HtpSettings, matmul_node, plan_for_node, supports_op
from kazeia.backends.htp.host.session import HostSession
from kazeia.errors import KazeiaError


def test_october_switches_and_their_defaults():
    s = HtpSettings.from_env({})
    assert s.profile == "2026-10" and (s.opbatch, s.opqueue) == (1280, 32)  # opt_opbatch, opt_opqueue
    may = HtpSettings.from_env({"KAZEIA_HTP_PROFILE": "2026-05"})
    assert (may.opbatch, may.opqueue) == (1024, 16)
    assert not HtpSettings.from_env({"GGML_HEXAGON_NHMX": "0"}).hmx_enabled
    assert not HtpSettings.from_env({"GGML_HEXAGON_MM_SELECT": "1"}).hmx_enabled
    assert HtpSettings.from_env({"GGML_HEXAGON_MM_SELECT": "1"}).fa_hmx_enabled  # FA has its own switch
    assert not HtpSettings.from_env({"GGML_HEXAGON_FA_SELECT": "1"}).fa_hmx_enabled
    # USE_HMX is gone in October: ignored (and reported), while 2026-05 still obeys it
    s = HtpSettings.from_env({"GGML_HEXAGON_USE_HMX": "0", "GGML_HEXAGON_OPSTAGE": "3"})
    assert s.hmx_enabled and s.ignored == ("GGML_HEXAGON_USE_HMX", "GGML_HEXAGON_OPSTAGE")
    assert "no longer exist" in s.ignored_warning()
    assert not HtpSettings.from_env({"GGML_HEXAGON_USE_HMX": "0", "KAZEIA_HTP_PROFILE": "2026-05"}).hmx_enabled
    # ggml_hexagon_is_fusion_enabled: 0 none, 1 all, else the bit of each fusion
    f = HtpSettings.from_env({"GGML_HEXAGON_OPFUSION": "12"})
    assert f.fusion_enabled("RMS_NORM+MUL") and f.fusion_enabled("MUL_MAT+ADD") and not f.fusion_enabled("MUL_MAT_NX")
    assert not HtpSettings.from_env({"GGML_HEXAGON_OPFUSION": "0"}).fusion_enabled("RMS_NORM+MUL")
    assert HtpSettings.from_env({"GGML_HEXAGON_DEVICES": "[0,1],2"}).devices == 2
    assert HtpSettings.from_env({"GGML_HEXAGON_DEVICES": "99"}).devices == 16  # clamped, as upstream


@pytest.mark.parametrize("name,value", [
    ("GGML_HEXAGON_OPFUSION", "-3"), ("GGML_HEXAGON_OPFUSION", "1e9"), ("GGML_HEXAGON_NHMX", "x"),
    ("GGML_HEXAGON_NHMX", "-1"), ("GGML_HEXAGON_MM_SELECT", "3"), ("GGML_HEXAGON_FA_SELECT", "9" * 40),
    ("GGML_HEXAGON_GDN_SELECT", "-1"), ("GGML_HEXAGON_DEVICES", "[[0]]"), ("GGML_HEXAGON_DEVICES", "a,b"),
    ("KAZEIA_HTP_VTCM_GRANT", "1"), ("KAZEIA_HTP_VTCM_GRANT", str(1 << 40)),
])
def test_hostile_switch_values_are_refused_in_one_line(name, value):
    with pytest.raises(KazeiaError) as e:
        HtpSettings.from_env({name: value})
    assert "\n" not in str(e.value) and name in str(e.value)


def test_hostile_switch_value_exits_2_from_the_command_line(tmp_path):
    r = kazeia("run", "-dev", "HTP0", "-p", "hi", "-n", "1", env={"GGML_HEXAGON_OPFUSION": "oops"})
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "GGML_HEXAGON_OPFUSION" in r.stderr


def test_routing_hmx_from_m5_then_hvx_then_cpu():
    """ffn_down of Qwen3-4B (K 9728, N 2560, Q4_0): M 4 -> HVX (quant-block, prefetch 4, 6,070,272 B), M 5 -> HMX
    (32 x 288, 7,997,440 B); at 2 MiB the HMX solver finds nothing for M >= 33: HVX with 4 threads (one row per M
    chunk), and nothing with 6 (the 6 weight prefetch rings alone need 6 x 389,120 B), so the CPU."""
    node = matmul_node(38, 9728, 2560, "q4_0")
    s = HtpSettings.from_env({})
    got = {m: plan_for_node(node, s, m=m) for m in (4, 5, 38)}
    assert (got[4].path, got[4].used, got[4].info["kernel"], got[4].info["n_prefetch"]) == (
        "hvx", 6_070_272, "quant-block", 4)
    assert (got[5].path, got[5].mc, got[5].nc, got[5].used) == ("hmx", 32, 288, 7_997_440)
    small = HtpSettings.from_env({}, vtcm_bytes=2 * 1024 * 1024)
    four = HtpSettings.from_env({"GGML_HEXAGON_NHVX": "4"}, vtcm_bytes=2 * 1024 * 1024)
    p6, p4 = plan_for_node(node, small), plan_for_node(node, four)
    assert p6.path == "cpu" and not supports_op(node, small)
    assert (p4.path, p4.mc) == ("hvx", 1) and supports_op(node, four)
    assert 6 * 2 * (9728 // 32) * 640 > 2 * 1024 * 1024 > 4 * 2 * (9728 // 32) * 640


def test_no_row_limit_on_mul_mat():
    """May refused quantized weights over 16384 rows (the lm_head); October has no row limit."""
    lm_head = matmul_node(1, 2560, 151936, "q4_0")
    assert supports_op(lm_head, HtpSettings.from_env({}))
    assert not supports_op(lm_head, HtpSettings.from_env({"KAZEIA_HTP_PROFILE": "2026-05"}))
    assert not supports_op(lm_head, HtpSettings.from_env({"GGML_HEXAGON_MM_SELECT": "0"}))


def test_sticky_error_texts():
    """flush_pending's log line and synchronize's abort, word for word as ggml-hexagon.cpp formats them."""
    from kazeia.backends.htp.host.session import StickyError

    e = StickyError(2, "ffn_out-0", "MUL_MAT", 3).abort("HTP0", "synchronize")
    assert str(e).startswith("ggml-hex: HTP0 synchronize failed : dsp-error INTERNAL-ERROR ")
    assert (e.status, e.faulting, e.aborted_in) == ("INTERNAL-ERROR", "ffn_out-0", "synchronize")
    assert HostSession.check_graph_compute  # (graph_compute's refusal: exercised end to end below)


def test_a_misfit_only_the_dsp_sees_is_a_status_abort_not_a_crash(tiny_qwen3_q4):
    """The DSP granted less VTCM than the host planned for: a kernel returns a status, the rest of the batch runs,
    the host logs dsp-rsp and aborts when llama_decode reads the logits the HTP computed (the lm_head runs there:
    get-tensor-async), with upstream's text; no dspqueue_read 0x2e."""
    r = kazeia("run", "-m", tiny_qwen3_q4, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "1",
               "--fault", "vtcm-grant-short", "--vtcm", str(1024 * 1024 + 256 * 1024))
    assert r.returncode == 3, r.stderr[-1500:]
    assert "ggml-hex: HTP0 dspcall : dsp-rsp " in r.stderr
    assert "get-tensor-async failed : dsp-error " in r.stderr and "0x0000002e" not in r.stderr
    ok = kazeia("run", "-m", tiny_qwen3_q4, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "1",
                "--vtcm", str(1024 * 1024 + 256 * 1024))
    assert ok.returncode == 0, ok.stderr[-1500:]


def test_same_inputs_same_bits(tiny_qwen3_q4):
    outs = []
    for _ in range(2):
        r = kazeia("run", "-m", tiny_qwen3_q4, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "4",
                   "--temp", "0")
        assert r.returncode == 0, r.stderr[-1500:]
        outs.append(r.stdout)
    assert outs[0] == outs[1]


def test_october_hvx_numerics_against_a_sequential_oracle():
    """32-element activation groups and one fp32 accumulator per output, blocks in K order (hvx-mm-kernels-tiled.h),
    restated here with Python integers and numpy float32 scalars, one block at a time."""
    from gguf import GGMLQuantizationType as T
    from gguf import quantize

    from kazeia.backends.htp.host.repack import RepackedWeight
    from kazeia.backends.htp.hvx.dot_sequential import hvx_matmul_sequential, quantize_activations_2026_10

    rng = np.random.default_rng(3)
    K, N, M = 320, 9, 3
    for qt in (T.Q4_0, T.Q8_0):
        raw = quantize(rng.standard_normal((N, K)).astype(np.float32), qt).reshape(N, -1)
        x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
        y = hvx_matmul_sequential(RepackedWeight.from_ggml(raw, qt, K), x)
        q, d = quantize_activations_2026_10(x)
        ts = raw.shape[1] // (K // 32)
        blk = raw.reshape(N, K // 32, ts)
        dw = blk[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float32)
        if qt == T.Q4_0:
            codes = np.concatenate([blk[:, :, 2:] & 15, blk[:, :, 2:] >> 4], axis=2).astype(np.int64) - 8
        else:
            codes = blk[:, :, 2:].view(np.int8).astype(np.int64)
        for m in range(M):
            for n in range(N):
                acc = np.float32(0)
                for b in range(K // 32):
                    ia = int((codes[n, b] * q[m, b * 32:(b + 1) * 32].astype(np.int64)).sum())
                    acc = np.float32(acc + np.float32(np.float32(ia) * np.float32(d[m, b] * dw[n, b])))
                assert y[m, n] == acc, (qt, m, n)


@pytest.mark.slow
def test_upgrade_on_the_seed_scenario_says_fixed_with_both_plans(q4b2, tmp_path):
    """The seed's crash (ffn_down at M = 38 overflows May's plan by 256 B and re-enters) is fixed in 2026-10: the
    report names the op, both plans (May 64 x 160, 8,388,864 B; October 64 x 128, 7,817,216 B: htp-2026-10.md §4.1,
    re-derived in test_htp_hmx_solver.py), and the logits of the October run against REF."""
    out = tmp_path / "upg"
    r = kazeia("upgrade", "-m", q4b2, "-ngl", "99", "--n-prompt", "38", "-o", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("# Upgrade 2026-05 -> 2026-10: fixed")
    assert "ffn_out-0 under 2026-05: hmx mc=64 nc=160, 8,388,864 of 8,388,608 B" in r.stdout
    assert "ffn_out-0 under 2026-10: hmx mc=64 nc=128, 7,817,216 of 8,388,608 B" in r.stdout
    d = json.loads((out / "upgrade.json").read_text())
    assert d["verdict"] == "fixed" and d["before"]["outcome"] == "device death" and d["after"]["outcome"] == "completes"
    assert d["after"]["logits_nmse"] < 2e-3  # the whole-model threshold compare uses
    assert (out / "upgrade.html").read_text().startswith("<!doctype html>")
    left = kazeia("upgrade", "-m", q4b2, "-ngl", "99", "--n-prompt", "38", "-o", str(tmp_path / "left"), "--quiet",
                  env={"KAZEIA_HTP_VTCM_GRANT": str(6 * 1024 * 1024)})
    assert left.returncode == 1 and "op error" in left.stdout, left.stderr[-2000:]


def _ranges(xs: list[int]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for x in xs:
        if out and out[-1][1] == x - 1:
            out[-1][1] = x
        else:
            out.append([x, x])
    return [tuple(r) for r in out]


@pytest.mark.parametrize("threads", [6, 8])
def test_mul_mat_add_fusion_keeps_the_plan_or_is_not_taken(threads):
    """try_fuse_mul_mat_add's no-shrink rule on Qwen3-4B's ffn_down (K 9728) and o_proj (K 4096), N 2560: fused for
    M = 5..54 and 65..96 (ffn_down), 5..15 (o_proj), nowhere else up to 256 (htp-2026-10.md §1.4, whose author
    scanned the October formulas with threads 6 and 8)."""
    from kazeia.backends.htp.host.fusion import mul_mat_add_plan_allows
    from kazeia.graph.tensor import GGMLType, make_tensor

    s = HtpSettings.from_env({"GGML_HEXAGON_NHVX": str(threads)})
    got = {}
    for name, k in (("ffn_down", 9728), ("o_proj", 4096)):
        got[name] = _ranges([m for m in range(1, 257) if mul_mat_add_plan_allows(
            matmul_node(m, k, 2560), make_tensor(GGMLType.F32, (2560, m), name="residual"), s)])
    # M = 1..4: HVX with one activation row fuses too (can_fuse: n_hmx > 0 or src1_nrows == 1)
    assert got == {"ffn_down": [(1, 1), (5, 54), (65, 96)], "o_proj": [(1, 1), (5, 15)]}


def _greedy(model: str, env: dict[str, str]):
    from kazeia.debug.runner import run
    from kazeia.engine.session import RunSpec

    spec = RunSpec(model=model, n_prompt=38, device="HTP0", n_predict=3, env=env)
    r = run(spec)
    assert r.ok, r.error or r.death
    return r


def test_fusion_changes_what_is_sent_not_the_values(tiny_qwen3_q4, monkeypatch):
    """OPFUSION on (the default) and off give bitwise the same logits and tokens (the fused kernels compute what
    the separate ops compute, in the same order), both within the whole-model bound against REF; with fusion on,
    the host sends fewer ops and the trace names the fused ops."""
    from kazeia.debug.judge import nmse
    from kazeia.debug.runner import run
    from kazeia.engine.session import RunSpec

    on = _greedy(tiny_qwen3_q4, {})
    off = _greedy(tiny_qwen3_q4, {"GGML_HEXAGON_OPFUSION": "0"})
    assert on.tokens == off.tokens and np.array_equal(on.logits, off.logits)
    ref = run(RunSpec(model=tiny_qwen3_q4, n_prompt=38, device="REF", n_predict=3))
    for r in (on, off):
        assert nmse(np.asarray(r.logits, np.float64), np.asarray(ref.logits, np.float64)) < 2e-3
    only_rms = _greedy(tiny_qwen3_q4, {"GGML_HEXAGON_OPFUSION": "4"})
    assert np.array_equal(only_rms.logits, on.logits)


def test_fused_ops_are_logged_under_upstream_names(tiny_qwen3_q4):
    args = ("run", "-m", tiny_qwen3_q4, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "1")
    on = kazeia(*args, env={"GGML_HEXAGON_VERBOSE": "1"})
    off = kazeia(*args, env={"GGML_HEXAGON_VERBOSE": "1", "GGML_HEXAGON_OPFUSION": "0"})
    assert on.returncode == 0 and off.returncode == 0, on.stderr[-1500:]
    names = {ln.split(" fused ")[1].split(" ")[0] for ln in on.stderr.splitlines() if " fused " in ln}
    assert {"RMS_NORM+MUL", "MUL_MAT_NX"} <= names, names
    assert " fused " not in off.stderr
    # a fused node gets no execute-op line of its own: fewer lines with fusion on
    count = [sum(" execute-op " in ln for ln in r.stderr.splitlines()) for r in (on, off)]
    assert count[0] < count[1]
    assert on.stdout == off.stdout


def test_investigate_names_the_status_the_op_and_the_mechanism(tiny_qwen3_q4, tmp_path):
    """The DSP is granted less VTCM than the host planned for: investigate's verdict names the op that set the
    status, the status, where the host aborted and the mechanism, and validates a workaround by a rerun."""
    from kazeia.debug.investigate import investigate
    from kazeia.engine.session import RunSpec

    spec = RunSpec(model=tiny_qwen3_q4, n_prompt=38, device="HTP0", vtcm=1024 * 1024 + 256 * 1024,
                   faults=["vtcm-grant-short"])
    inv = investigate(spec, str(tmp_path / "inv"), progress=lambda s: None)
    assert inv.fault_found
    v = inv.verdict
    assert "returned INTERNAL-ERROR on the DSP" in v and "aborted in get-tensor-async" in v, v
    assert "host/DSP VTCM disagreement" in v and "granted 262,144 B" in v, v
    assert inv.gate and inv.gate["validated"], inv.gate
    assert (tmp_path / "inv" / "report.md").is_file()


def test_the_cost_model_prices_october_paths_and_fusion():
    """HMX from M = 5 and the fused ADD / MUL reach the modeled rates: an 8-token prefill of the 36-layer Qwen3-4B
    shapes is priced on HMX under 2026-10 (HVX under robust, where HMX starts at 32), and fusion removes the folded
    ops' time; the plans priced are the ones the backend runs (plan_for_node)."""
    from kazeia.backends.htp import graph_seconds
    from kazeia.debug.modeled import modeled_prefill_tps
    from kazeia.graph.tensor import GGMLType
    from kazeia.models.base import ModelArgs
    from kazeia.models.shapes import prefill_graphs

    qwen3_4b = ModelArgs(arch="qwen3", n_layer=36, n_embd=2560, n_ff=9728, n_head=32, n_head_kv=8, head_dim=128,
                         n_rot=128, n_vocab=151936, n_ctx_train=40960, rope_freq_base=1e6, rope_freq_scale=1.0,
                         rms_eps=1e-6, tied_embeddings=True)
    october, robust = HtpSettings.from_env({}), HtpSettings.from_env({"KAZEIA_HTP_PROFILE": "robust"})
    (g,) = prefill_graphs(qwen3_4b, 8, GGMLType.Q4_0, 512)
    _, costs = graph_seconds(g.nodes, october)
    mm = [c for c in costs if c.op == "MUL_MAT" and c.where.startswith("HTP0")]
    # (the last layer's FFN and the lm_head see the one output row: HVX)
    assert mm and all(c.where == "HTP0/hmx" for c in mm if c.name != "result_output" and not c.name.endswith("-35"))
    _, costs_r = graph_seconds(g.nodes, robust)
    assert all(c.where == "HTP0/hvx" for c in costs_r if c.op == "MUL_MAT" and c.where.startswith("HTP0"))
    fused = [c for c in costs if c.where == "HTP0/fused"]
    assert {c.op for c in fused} == {"ADD", "MUL"}
    unfused = HtpSettings.from_env({"GGML_HEXAGON_OPFUSION": "0"})
    assert modeled_prefill_tps(qwen3_4b, 8, october) > modeled_prefill_tps(qwen3_4b, 8, unfused)


def test_a_full_queue_reads_the_error_and_graph_compute_fails(tiny_qwen3_q4):
    """With one batch in flight (OPQUEUE=1) the host reads responses while it enqueues: the error turns sticky in
    the middle of the graph, and graph_compute's last check returns GGML_STATUS_FAILED (ggml-hexagon.cpp:
    ggml_backend_hexagon_graph_compute) before any synchronize; the message keeps the session's first failing op."""
    r = kazeia("run", "-m", tiny_qwen3_q4, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "1",
               "--fault", "vtcm-grant-short", "--vtcm", str(1024 * 1024 + 256 * 1024),
               env={"GGML_HEXAGON_OPQUEUE": "1", "GGML_HEXAGON_OPBATCH": "4"})
    assert r.returncode == 3, r.stderr[-1500:]
    assert "graph_compute returned GGML_STATUS_FAILED" in r.stderr and "failed : dsp-error" not in r.stderr
    assert "first failing op: Qcur-0 (INTERNAL-ERROR" in r.stderr


def test_a_dsp_death_still_reads_as_0x2e_now_at_synchronize(tiny_qwen3_q4):
    """A DSP abort kills the process as in May; with no flush at graph end the host learns it at synchronize, after
    the whole graph was enqueued (the failed batch holds every op of it)."""
    r = kazeia("run", "-m", tiny_qwen3_q4, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "1",
               "--inject-death-at", "5")
    assert r.returncode == 3 and "ggml-hex: dspqueue_read failed: 0x0000002e" in r.stderr, r.stderr[-1500:]
    assert "last op enqueued when the error was read: result_output" in r.stderr


@pytest.mark.slow
def test_a_budget_the_host_refuses(q4b2):
    """--vtcm 2097152: the host's HMX solver finds nothing for Qwen3-4B's ffn_down at M = 38, so the op is not sent
    to HMX and nothing fails. With 4 HVX threads the HVX solver fits (M chunks of one row): HTP0/hvx. With the default
    6 threads even HVX does not fit (6 weight prefetch rings of 389,120 B), so October's supports_op leaves the op to
    the CPU: the source says so, where htp-2026-10.md §1.4 expected HVX."""
    from kazeia.debug.runner import run
    from kazeia.engine.session import RunSpec

    for env, where in (({"GGML_HEXAGON_NHVX": "4"}, ("HTP0", "hvx")), ({}, ("CPU", "cpu"))):
        r = run(RunSpec(model=q4b2, n_prompt=38, device="HTP0", vtcm=2 * 1024 * 1024, env=env))
        assert r.ok, r.error or r.death
        got = {p["node"]: (p["backend"], p["reason"]) for p in r.placements}
        assert got["ffn_out-0"][0] == where[0], got["ffn_out-0"]


def test_traces_name_the_fused_op(tiny_qwen3_q4, tmp_path):
    out = tmp_path / "t.jsonl"
    r = kazeia("trace", "-m", tiny_qwen3_q4, "--n-prompt", "38", "-dev", "HTP0", "--quiet", "-o", str(out))
    assert r.returncode == 0, r.stderr[-1500:]
    recs = [json.loads(ln) for ln in out.read_text().splitlines()]
    fused = {(x["name"], x["fused"]) for x in recs if x.get("fused")}
    assert ("norm-0", "RMS_NORM+MUL") in fused and ("attn_norm-0", "RMS_NORM+MUL") in fused
    assert any(name == "MUL_MAT_NX" for _, name in fused)


@pytest.mark.parametrize("m,path", [(1, "default"), (38, "default"), (38, "hvx")])
def test_gate_validation_cases_read_finished_outputs(tiny_qwen3_q4, m, path):
    """gate --auto's child runs a MUL_MAT twice in one batch and reads both outputs: under 2026-10 the batch is
    only sent at synchronize, so the child synchronizes first (an unsynchronized read saw zeros)."""
    from kazeia.debug.gate.child import Cases, _case
    from kazeia.engine.context import Model

    cases = Cases(Model.load(tiny_qwen3_q4), "MUL_MAT", "blk.0.ffn_down.weight", m, 0)
    got = _case(cases, m, path, HtpSettings.from_env({}))
    assert got["ok"], got


def test_an_abort_says_where_the_host_waited(tiny_qwen3_q4):
    """The lm_head on the CPU: the CPU waits for the HTP's result_norm (a split boundary: synchronize), so the abort
    is synchronize's; with the lm_head on the HTP it is the logits read (get-tensor-async)."""
    base = ("run", "-m", tiny_qwen3_q4, "-dev", "HTP0", "-ngl", "99", "--n-prompt", "38", "-n", "1",
            "--fault", "vtcm-grant-short", "--vtcm", str(1024 * 1024 + 256 * 1024))
    cpu_head = kazeia(*base, "--cpu-nodes", "^result_output$")
    htp_head = kazeia(*base)
    assert cpu_head.returncode == htp_head.returncode == 3
    assert "HTP0 synchronize failed : dsp-error INTERNAL-ERROR" in cpu_head.stderr, cpu_head.stderr[-800:]
    assert "HTP0 get-tensor-async failed : dsp-error INTERNAL-ERROR" in htp_head.stderr, htp_head.stderr[-800:]


def test_descriptors_are_reused_only_for_the_same_type_in_october():
    """ggml_hexagon_opbatch::same_shape (#25968): a tensor at the same address with the same ne and nb but another
    type gets its own descriptor under 2026-10; May reused the first one."""
    from kazeia.backends.htp.msg import OpBatch
    from kazeia.graph.tensor import Buffer, GGMLType, make_tensor

    buf = Buffer.zeros("compute", 4096)
    a = make_tensor(GGMLType.F32, (16, 4), name="a")
    b = make_tensor(GGMLType.I32, (16, 4), name="b")
    for t in (a, b):
        t.buffer, t.offset = buf, 0
    may, oct_ = OpBatch(), OpBatch(check_type=True)
    assert may.add_tensor(a) == may.add_tensor(b) == 0
    assert (oct_.add_tensor(a), oct_.add_tensor(b)) == (0, 1)


def test_htp_plan_no_hmx_means_nhmx_0_in_october(capsys):
    from kazeia.cli.main import main as cli_main

    assert cli_main(["htp", "plan", "--m", "38", "--k", "9728", "--n", "2560", "--no-hmx", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["path"] == "hvx" and "NHMX=0" in d["refusal"]


def test_attention_without_flash_attention_runs_kq_on_batched_hmx(tiny_qwen3_q4):
    """-fa off: KQ is a batched F16 MUL_MAT (heads of src1 sharing a KV head); October plans it for HMX
    (HMX_F16_BATCHED: htp_mm_hmx_solve_batched_params, else the per-head 2-D plan) from 5 rows a head, and the run
    stays within REF's whole-model bound."""
    from kazeia.debug.compare import compare
    from kazeia.engine.session import RunSpec

    r = compare(RunSpec(model=tiny_qwen3_q4, n_prompt=38, device="HTP0", flash_attn=False), "isolated")
    rows = {x.name: x for x in r.rows["isolated"]}
    assert rows["kq-0"].backend == "HTP0" and rows["kq-0"].path == "hmx", rows["kq-0"]
    assert r.ok, r.first_failure
    assert r.logits_nmse["isolated"] is None or r.logits_nmse["isolated"] < 2e-3


def test_faults_of_the_other_code_generation_are_refused():
    from kazeia.backends.htp import HtpBackend

    with pytest.raises(KazeiaError, match="dma-unbalanced.*2026-05 code"):
        HtpBackend(HtpSettings.from_env({}, faults=["dma-unbalanced"]))
    with pytest.raises(KazeiaError, match="vtcm-grant-short.*2026-10 code"):
        HtpBackend(HtpSettings.from_env({"KAZEIA_HTP_PROFILE": "robust"}, faults=["vtcm-grant-short"]))


def test_upgrade_counts_wrong_numbers_as_a_fault(tmp_path):
    """A run that completes with logits past the whole-model bound against REF is a failing run, as compare judges
    it: the tiny hybrid model at 20 tokens drifts to NMSE 5.3e-3 under 2026-05 (May's HVX matmuls with 128-element
    activation groups; robust gives the same; no single op is out of tolerance in isolation), and 2026-10's HMX
    path from M = 5 keeps it within the bound: the upgrade "fixes" it, it does not leave it "unchanged"."""
    from kazeia.debug.judge import WHOLE_MODEL_NMSE
    from kazeia.debug.upgrade import upgrade
    from kazeia.engine.session import RunSpec
    from kazeia.gguf.writer import preset, write_model

    path = str(tmp_path / "t35.gguf")
    write_model(preset("tiny", arch="qwen35", wtype="q4_0"), path)
    u = upgrade(RunSpec(model=path, n_prompt=20, device="HTP0"), "2026-05", "2026-10")
    assert u.before.outcome == "wrong numbers" and u.before.logits_nmse > WHOLE_MODEL_NMSE, u.before
    assert u.after.outcome == "completes" and u.after.logits_nmse < WHOLE_MODEL_NMSE
    assert u.verdict == "fixed" and u.exit_status == 0


def test_upgrade_never_calls_nan_logits_completes(tmp_path):
    """NaN is never "completes" (issue 37, row 1): the tiny Gemma 3 under 2026-05 gives 1,024 NaN logits (its NMSE
    against REF is NaN, which no bound comparison catches); the upgrade says wrong numbers -> completes: fixed."""
    from kazeia.debug.upgrade import upgrade
    from kazeia.engine.session import RunSpec
    from kazeia.gguf.writer import preset, write_model

    path = str(tmp_path / "g3.gguf")
    write_model(preset("tiny", arch="gemma3", wtype="q4_0"), path)
    u = upgrade(RunSpec(model=path, prompt="The capital of France is", device="HTP0"), "2026-05", "2026-10")
    assert u.before.outcome == "wrong numbers" and "logits are not finite" in u.before.mechanism, u.before
    assert u.after.outcome == "completes"
    assert u.verdict == "fixed"
