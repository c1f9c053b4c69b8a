"""check's load-time buffer rules (debug/check/buffers.py), from the header alone: the HTP buffer type's sizes
(October's tiled rows), llama.cpp #21071's 2 GiB per HAP_mmap on v73 and older, and the post-October 256 MiB cap
that #29123's thread reports (llama.cpp #29197). Oracles: the thread's own number and upstream's arithmetic."""

from __future__ import annotations

import pytest

from cli_utils import kazeia_clean
from kazeia.backends.htp import alloc_size
from kazeia.debug.check.buffers import AFTER_OCTOBER_MAX, weight_buffers
from kazeia.gguf.reader import load_gguf
from kazeia.graph.tensor import GGMLType as T


def test_the_tiled_q6k_output_is_the_buffer_the_thread_reports():
    # Qwen3.5-4B's Q6_K output.weight (2560 x 248320): "buffer size 556236800 exceeds max_bufsize 268435456"
    assert alloc_size(T.Q6_K, (2560, 248320, 1, 1), 521_472_000, "2026-10") == 556_236_800
    assert alloc_size(T.Q6_K, (2560, 248320, 1, 1), 521_472_000, "2026-05") == 521_472_000  # May: ggml's bytes
    assert alloc_size(T.Q4_0, (2560, 9728, 1, 1), 14_008_320, "2026-10") == 14_008_320     # same as the blocks
    assert alloc_size(T.Q4_0, (2500, 100, 1, 1), 140_800, "2026-10") == 2528 // 32 * 18 * 128  # K, N up to 32
    assert alloc_size(T.F16, (2560, 100, 1, 1), 512_000, "2026-10") == 512_000


@pytest.fixture(scope="module")
def qwen35_4b(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("q35") / "q35_4b.gguf")
    r = kazeia_clean("make-model", "--preset", "qwen35-4b", "--type", "q4_0", "--vocab", "248320", "--header-only",
                     "-o", path)
    assert r.returncode == 0, r.stderr
    return path


def test_buffers_are_cut_at_the_cap_in_file_order(qwen35_4b):
    f = load_gguf(qwen35_4b, header_only=True)
    b = weight_buffers(f, "2026-10", 1 << 30)
    assert all(s <= 1 << 30 for s in b.sizes) and len(b.sizes) >= 2
    assert sum(b.sizes) == sum(-(-s // 128) * 128 for _, s in b.tensor_sizes)
    assert [n for n, _ in b.over(AFTER_OCTOBER_MAX)] == ["output.weight (tied: token_embd.weight)"]


@pytest.mark.slow  # five CLI runs
def test_check_names_the_mapping_rule_and_the_post_october_cap(qwen35_4b):
    r = kazeia_clean("check", "-m", qwen35_4b)
    assert r.returncode in (0, 1), r.stderr
    out = r.stdout
    assert "v68/v69/v73: HAP_mmap maps at most 2 GiB a buffer (llama.cpp #21071" in out and "within it" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("after 2026-10"))
    assert "#29197" in line and "256 MiB" in line and "output.weight" in line and "not modelled as a profile" in line
    big = kazeia_clean("check", "-m", qwen35_4b, "--htp-arch", "v73", "--htp-profile", "2026-10",
                       env={"GGML_HEXAGON_MBUF": "3072"})
    assert "a buffer exceeds it: the DSP aborts" in big.stdout
    newer = kazeia_clean("check", "-m", qwen35_4b, "--htp-arch", "v79", env={"GGML_HEXAGON_MBUF": "3072"})
    assert "HAP_mmap" not in newer.stdout  # the 2 GiB rule is v73 and older's


@pytest.mark.slow
def test_a_small_model_meets_no_buffer_rule(tmp_path):
    path = str(tmp_path / "q4b2.gguf")
    assert kazeia_clean("make-model", "--preset", "qwen3-4b", "--layers", "2", "--vocab", "1024", "--header-only",
                        "-o", path).returncode == 0
    out = kazeia_clean("check", "-m", path).stdout
    assert "after 2026-10" not in out and "cannot load" not in out
