"""October 2026's host-side HVX matmul plan (backends/htp/vtcm/hvx_solver.py) against numbers derived from
upstream's `htp/matmul-ops.h` and `ggml-hexagon.cpp:ggml_hexagon_precompute_hvx_mm_params` outside kazeia: the
brief's M <= 4 sweep (../shared/docs/htp-2026-10.md §1.4) and one layout summed by hand."""

from __future__ import annotations

from kazeia.backends.htp.vtcm.matmul.hvx_2026_10 import plan

VTCM = 8 * 1024 * 1024
QWEN3_4B = [(2560, 4096), (2560, 1024), (4096, 2560), (2560, 9728), (9728, 2560), (9216, 2560), (2560, 8192),
            (2560, 32)]


def test_q_proj_one_token_four_threads_by_hand():
    """K=2560, N=4096, M=1 < 4 threads: quant-block, prefetch 16. Activations: 2560 -> 80 tiles of 1,152 B =
    92,160. Weights: 16 rows x 80 tiles x 640 B per thread x 4 = 3,276,800. Output slices: 16,384 B / 4 threads,
    x 4 = 16,384. Raw staging 10,240 (overlaps). Total 92,160 + 3,276,800 + 16,384 = 3,385,344."""
    p = plan("q4_0", 2560, 4096, 1, 4, VTCM)
    assert (p.kernel, p.n_prefetch, p.m_chunk) == ("quant-block", 16, 0)
    L = p.layout
    assert (L.src1, L.src0, L.dst, L.act_raw, L.total) == (92_160, 3_276_800, 16_384, 10_240, 3_385_344)


def test_every_qwen3_4b_matmul_fits_on_hvx_below_5_tokens():
    """The brief: all fit, tightest 8,376,320 B (q at M = 2 with 10 threads); the prefetch depth drops where needed."""
    plans = {(k, n, m, t): plan("q4_0", k, n, m, t, VTCM) for k, n in QWEN3_4B for m in (1, 2, 3, 4)
             for t in (4, 6, 8, 10)}
    assert all(p is not None and p.vtcm_bytes <= VTCM for p in plans.values())
    worst = max(plans, key=lambda key: plans[key].vtcm_bytes)
    assert worst == (2560, 4096, 2, 10) and plans[worst].vtcm_bytes == 8_376_320
    assert plans[(2560, 4096, 3, 10)].n_prefetch == 8  # 16 no longer fits at M = 3 with 10 threads


def test_nothing_fits_means_the_cpu():
    assert plan("q4_0", 9728, 2560, 4, 10, 1 << 20) is None  # the weight prefetch alone is larger than 1 MiB
    assert plan("q4_0", 2570, 4096, 1, 4, VTCM) is None  # K not a multiple of 32: no tiled kernel


def test_rows_are_chunked_when_the_activations_do_not_fit():
    """3,000 rows in 4 MiB, 6 threads: quant-row, prefetch 2 (M > 4). The fixed area is the weight prefetch,
    2 x 80 x 640 rounded to 256, x 6 = 614,400; each row costs its int8 tiles (92,160) plus its fp32 staging
    (10,240): (4,194,304 - 614,400) // 102,400 = 34 rows, even, and that layout fits (upstream steps down by 2
    from its estimate; it does not search for the largest chunk that would fit)."""
    p = plan("q4_0", 2560, 4096, 3000, 6, 4 << 20)
    assert (p.kernel, p.n_prefetch, p.m_chunk, p.layout.src0) == ("quant-row", 2, 34, 614_400)
    assert p.vtcm_bytes == 34 * 92_160 + 614_400 <= 4 << 20
