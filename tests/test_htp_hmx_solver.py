"""October 2026's host-side HMX plan (backends/htp/vtcm/hmx_solver.py) against numbers derived from upstream's
`htp/matmul-ops.h` (llama.cpp 0c1e57098bba) outside kazeia: the plans of ../shared/docs/htp-2026-10.md §1.4
(computed there by a separate restatement of the same header), and one layout summed by hand below."""

from __future__ import annotations

import pytest

from kazeia.backends.htp.vtcm.matmul.hmx_2026_10 import hmx_eligible, layout_2d, solve_2d

VTCM = 8 * 1024 * 1024


def test_ffn_down_at_38_tokens_by_hand():
    """K=9728, N=2560, M=38 (pipelined: M > 32), 6 threads. Group A: scales 2048 + activations 64 x 2K = 1,245,184.
    Group B, twice (pipelined): weights (128/32)(9728/32) x 640 = 778,240; outputs 64 x 128 x 2 = 16,384; dequant
    scratch 128 x 2K = 2,490,368 -> 6,569,984. Group C: min(6 x 64 x K x 4, max(6 x 4 x K x 4, B)) = B.
    Total 2,048 + 1,245,184 + 6,569,984 = 7,817,216 (May's plan: 8,388,864, over 8 MiB by 256 B)."""
    s = solve_2d("q4_0", 9728, 2560, 38, 6, VTCM)
    assert (s.m_chunk, s.n_chunk, s.pipeline) == (64, 128, True)
    L = layout_2d("q4_0", 9728, 64, 128, True, s.act_threads)
    assert (L.act, L.weight, L.dst, L.scratch, L.group_b) == (1_245_184, 778_240, 16_384, 2_490_368, 6_569_984)
    assert s.vtcm_bytes == L.total == 7_817_216


@pytest.mark.parametrize("k, n, plans", [
    (2560, 4096, {5: (32, 1184), 32: (32, 1184), 33: (64, 576), 64: (64, 576)}),   # Qwen3-4B q
    (2560, 1024, {5: (32, 1024), 33: (64, 576)}),                                   # k / v
    (4096, 2560, {5: (32, 736), 33: (64, 352)}),                                    # o_proj
    (9728, 2560, {5: (32, 288), 33: (64, 128), 300: (160, 96), 512: (256, 64)}),    # ffn_down
    (9216, 2560, {5: (32, 320), 33: (64, 128), 300: (192, 96)}),                     # Qwen3.5-4B ffn_down
    (2560, 32, {5: (32, 32), 33: (64, 32)}),                                        # ssm_alpha / ssm_beta
])
@pytest.mark.parametrize("threads", [4, 6, 8, 10])
def test_the_briefs_plans(k, n, plans, threads):
    for m, chunks in plans.items():
        s = solve_2d("q4_0", k, n, m, threads, VTCM)
        assert (s.m_chunk, s.n_chunk) == chunks, (k, n, m)


@pytest.mark.parametrize("k, n, slack", [(2560, 4096, 30_720), (4096, 2560, 79_872), (9728, 2560, 71_680),
                                         (9216, 2560, 34_816)])
def test_tightest_slack_over_m_5_to_512(k, n, slack):
    assert min(VTCM - solve_2d("q4_0", k, n, m, 6, VTCM).vtcm_bytes for m in range(5, 513)) == slack


def test_a_two_mib_budget_refuses_ffn_down_from_33_tokens():
    """No retry with a smaller chunk: the host refuses HMX (the op goes to HVX) for every M >= 33."""
    assert solve_2d("q4_0", 9728, 2560, 32, 6, 2 << 20) is not None
    assert all(solve_2d(w, 9728, 2560, m, 6, 2 << 20) is None for w in ("q4_0",) for m in (33, 38, 64, 512))


def test_hmx_takes_m_above_4():
    assert not hmx_eligible("q4_0", 2560, 4096, 4) and hmx_eligible("q4_0", 2560, 4096, 5)
    assert not hmx_eligible("q4_0", 2570, 4096, 38)  # K % 32
    assert not hmx_eligible("q4_0", 2560, 4096, 38, src1_f32=False)
    assert hmx_eligible("q4_0", 2560, 4090, 38)  # a repacked type's N is padded to 32
    assert not hmx_eligible("f16", 2560, 4090, 38) and not hmx_eligible("q4_0", 2560, 4096, 38, batched=True)


def test_600_plans_computed_by_the_october_header_itself():
    """tests/data/htp_2026_10_plans.json: answers of upstream's matmul-ops.h, compiled and run outside the repository
    (tests/data/README.md), for random types, shapes, VTCM sizes, thread counts and fused residuals."""
    import json
    import os

    from kazeia.backends.htp.vtcm.matmul.plan_2026_10 import plan_matmul_2026_10

    path = os.path.join(os.path.dirname(__file__), "data", "htp_2026_10_plans.json")
    rows = json.load(open(path, encoding="utf-8"))
    assert len(rows) == 600 and {r["upstream"][0] for r in rows} == {"hmx", "hvx", "cpu"}
    for r in rows:
        p = plan_matmul_2026_10(r["m"], r["k"], r["n"], r["type"], vtcm_size=r["vtcm"], n_threads=r["threads"],
                                src2_bytes=r["src2"])
        want = tuple(r["upstream"])
        if want[0] == "hmx":
            got = (p.path, p.mc, p.nc, p.info.get("act_threads"), p.used)
        elif want[0] == "hvx":
            got = (p.path, p.info.get("n_prefetch"), p.info.get("m_chunk"), p.used, p.info.get("kernel"))
        else:
            got = (p.path,)
        assert got == want, r


def test_300_batched_f16_plans_computed_by_the_october_header():
    """tests/data/htp_2026_10_plans_batched.json: upstream's grouped (HMX_F16_BATCHED) solver and its per-head 2-D
    fallback, compiled outside the repository, against kazeia's."""
    import json
    import os

    from kazeia.backends.htp.vtcm.matmul.plan_2026_10 import _hmx_batched

    path = os.path.join(os.path.dirname(__file__), "data", "htp_2026_10_plans_batched.json")
    rows = json.load(open(path, encoding="utf-8"))
    assert len(rows) == 300 and {r["upstream"][-1] for r in rows} == {"grouped", "per head"}
    for r in rows:
        found = _hmx_batched(r["k"], r["n"], r["m"], r["group"], r["threads"], r["vtcm"], 0)
        sol, _, how = found
        assert ["hmx", sol.m_chunk, sol.n_chunk, sol.act_threads, sol.vtcm_bytes, how] == r["upstream"], r
