"""Hexagon arch profiles (issue 22, deliverable 1): what each arch sets in each upstream version, checked against
numbers read from the sources (May: ggml-org/ggml bb4dc86a, October: llama.cpp 0c1e57098bba), and what a session
on such a device does: a v68 device under 2026-10 opens none, under 2026-05 runs every matmul on HVX (no HMX in
its skel), and a DSP crash names the skel of the device's arch."""

from __future__ import annotations

import pytest

from cli_utils import kazeia_clean as _kazeia
from kazeia.backends.htp.archs import KNOWN_ARCHS, arch_profile, parse_arch, session_refusal
from kazeia.backends.htp.host.crash_record import crash_record
from kazeia.backends.htp.settings import HtpSettings
from kazeia.errors import KazeiaError

MiB = 1 << 20


def test_each_arch_sets_what_the_sources_say():
    # CMakeLists.txt build_htp_skel: May v68 v69 v73 v75 v79 v81; October v73 v75 v79 v81
    assert [a for a in KNOWN_ARCHS if arch_profile(a, "2026-05").skel] == [68, 69, 73, 75, 79, 81]
    assert [a for a in KNOWN_ARCHS if arch_profile(a, "2026-10").skel] == [73, 75, 79, 81]
    # May htp/CMakeLists.txt HTP_HMX_VERSIONS v73 v75 v79 v81
    assert [a for a in KNOWN_ARCHS if arch_profile(a, "2026-05").hmx] == [73, 75, 79, 81]
    # hvx-base.h: `#if __HVX_ARCH__ < 79` -> qf32 adds
    assert [a for a in KNOWN_ARCHS if not arch_profile(a, "2026-10").ieee_f32_add] == [68, 69, 73, 75]
    assert not arch_profile(75, "2026-05").ieee_f32_add and arch_profile(79, "2026-05").ieee_f32_add
    # htp-ops.h HTP_OP_MAX_VMEM_DEFAULT (3355443200u) from v75; ggml_hexagon_init: 3000 * MiB below
    assert arch_profile(75, "2026-10").vmem_bytes == 3355443200 == 3200 * MiB
    assert arch_profile(73, "2026-10").vmem_bytes == arch_profile(69, "2026-05").vmem_bytes == 3000 * MiB
    # htp-ctx.h HTP_MAX_MMAPS: 16 (May), 64 (October); October's prep_op_bufs defragments once
    assert (arch_profile(79, "2026-05").mmap_slots, arch_profile(79, "2026-10").mmap_slots) == (16, 64)
    assert arch_profile(79, "2026-10").defrag and not arch_profile(79, "2026-05").defrag
    # opt_dma64 = opt_arch > 79 (October only)
    assert [a for a in KNOWN_ARCHS if arch_profile(a, "2026-10").dma64] == [81]
    assert not any(arch_profile(a, "2026-05").dma64 for a in KNOWN_ARCHS)


@pytest.mark.parametrize("text, arch", [("v79", 79), ("V73", 73), ("75", 75), (" v68 ", 68)])
def test_arch_values_are_read_as_ggml_hexagon_init_reads_them(text, arch):
    assert parse_arch(text) == arch
    assert HtpSettings.from_env({"GGML_HEXAGON_ARCH": text}).arch == arch


@pytest.mark.parametrize("text", ["v70", "zz", "v", "vv79", "7" * 40, "-73", "0x49"])
def test_an_arch_kazeia_does_not_model_is_one_line(text):
    with pytest.raises(KazeiaError) as e:
        HtpSettings.from_env({"GGML_HEXAGON_ARCH": text})
    assert "\n" not in str(e.value) and "GGML_HEXAGON_ARCH" in str(e.value)


def test_only_october_below_v73_refuses_the_session():
    assert [a for a in KNOWN_ARCHS if session_refusal(a, "2026-10")] == [68, 69]
    assert not any(session_refusal(a, "2026-05") for a in KNOWN_ARCHS)
    line = session_refusal(68, "2026-10")
    assert "\n" not in line and "libggml-htp-v68.so" in line and "kazeia's hypothesis" in line


def test_a_crash_names_the_skel_of_the_devices_arch():
    assert any('"./libggml-htp-v73.so"' in s for s in crash_record("bus-error", arch=73))
    assert not any("v75" in s for s in crash_record("bus-error", arch=81))


def _matmul_paths(stderr: str) -> set[str]:
    return {line.split()[4] for line in stderr.splitlines()
            if line.startswith("KZOP") and " MUL_MAT " in line and "(blk." in line}  # May leaves the lm_head on the CPU


@pytest.mark.slow
def test_a_v68_device(q4b1):
    """Under 2026-10: no session, one line, exit 2. Under 2026-05 (a v68 skel without HMX: op_matmul ->
    op_matmul_hvx) the 38-token prefill that overflows HMX's VTCM on v79 runs every Q4_0 MUL_MAT on HVX."""
    args = ("run", "-m", q4b1, "-dev", "HTP0", "--n-prompt", "38", "-n", "1", "--temp", "0", "--oplog")
    october = _kazeia(*args, "--htp-arch", "v68")
    assert october.returncode == 2 and "no session" in october.stderr
    assert len([s for s in october.stderr.splitlines() if s.strip()]) == 1, october.stderr
    may = _kazeia(*args, "--htp-arch", "v68", "--htp-profile", "2026-05")
    assert may.returncode == 0, may.stderr[-2000:]
    assert _matmul_paths(may.stderr) == {"HTP0/hvx"}
    v79 = _kazeia(*args, "--htp-profile", "2026-05")
    assert "HTP0/hmx" in _matmul_paths(v79.stderr) or v79.returncode == 3


# --- VMEM: the host's budget for what one batch maps -----------------------------------------------------------

def test_octobers_op_queue_memory_from_its_structs():
    """htp-ops.h: htp_buf_desc 24 B, htp_tensor 56 B (u64 + 3 u32 + 2 u16 + 2 x 4 u32), htp_op_desc 232 B
    (2 u32 + 16 + 32 i32 + 10 + 4 + 2 u16), htp_prof_desc 48 B (4 + 8 u32); 14 tensors per op; OPBATCH 1280 x
    OPQUEUE 32, rounded to 4 KiB, plus the 4 KiB guard page of ggml_hexagon_shared_buffer."""
    from kazeia.backends.htp import october_shm_bytes

    block = 24 * 16 + 1280 * (56 * 14 + 232 + 48)
    assert block == 1_362_304 and october_shm_bytes(1280, 32) == 43_593_728 + 4096
    assert october_shm_bytes(1, 1) == 8192  # 1448 B -> one page, plus the guard page


@pytest.mark.parametrize("env, want", [
    ({}, 3_355_443_200 - 43_597_824),
    ({"GGML_HEXAGON_ARCH": "v73"}, 3000 * MiB - 43_597_824),
    ({"KAZEIA_HTP_PROFILE": "2026-05", "GGML_HEXAGON_ARCH": "v73"}, 3000 * MiB),
    ({"KAZEIA_HTP_PROFILE": "2026-05"}, 3_355_443_200),
    ({"GGML_HEXAGON_VMEM": "512"}, 512 * MiB - 43_597_824),
    ({"GGML_HEXAGON_VMEM": "512", "GGML_HEXAGON_OPBATCH": "1", "GGML_HEXAGON_OPQUEUE": "1"}, 512 * MiB - 8192),
])
def test_the_vmem_budget_per_version_and_arch(env, want):
    assert HtpSettings.from_env(env).max_vmem == want


@pytest.mark.parametrize("raw", ["0", "-1", "x", "70000", "9" * 30])
def test_a_hostile_vmem_or_mbuf_is_one_line(raw):
    for name in ("GGML_HEXAGON_VMEM", "GGML_HEXAGON_MBUF"):
        with pytest.raises(KazeiaError) as e:
            HtpSettings.from_env({name: raw})
        assert name in str(e.value) and "\n" not in str(e.value)


def test_weights_are_mapped_in_chunks_of_mbuf():
    """llama.cpp allocates device weights in buffers of at most get_max_size (GGML_HEXAGON_MBUF): a batch maps the
    chunks its weights are in, not the whole file."""
    import numpy as np

    from kazeia.backends.htp.msg import OpBatch, vmem_span
    from kazeia.graph import builder as gb
    from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, make_tensor

    weights = Buffer("weights", np.zeros(5 * (1 << 29), dtype=np.uint8), BufferUsage.WEIGHTS)  # 2.5 GiB, not touched
    w0 = make_tensor(GGMLType.F32, (256, 4), buffer=weights, offset=0)
    w2 = make_tensor(GGMLType.F32, (256, 4), buffer=weights, offset=(1 << 31) + 4096)
    assert vmem_span(w0, 1 << 30) == ((weights, 0), 1 << 30)
    assert vmem_span(w2, 1 << 30) == ((weights, 2), 1 << 29)
    assert vmem_span(w2, 4 << 30) == (weights, 5 << 29)
    compute = Buffer("compute", np.zeros(1 << 20, dtype=np.uint8), BufferUsage.COMPUTE)

    def matmul(w, name):
        node = gb.mul_mat(w, make_tensor(GGMLType.F32, (256, 8), buffer=compute, offset=0), name)
        node.buffer, node.offset = compute, 65536
        return node

    for limit, fits in (((1 << 30) + (1 << 29) + (1 << 20), True), ((1 << 30) + (1 << 29), False)):
        b = OpBatch(vmem_limit=limit)
        b.add_op(matmul(w0, "a"), 0, None)
        assert b.vmem == (1 << 30) + (1 << 20)  # chunk 0 of the weights and the compute buffer
        assert b.fits(matmul(w2, "b"), 1280, 8192) == fits  # + chunk 2 (0.5 GiB)
        assert b.fits(matmul(w0, "c"), 1280, 8192)  # nothing new to map


@pytest.mark.slow
def test_an_op_over_the_vmem_budget(q4b1):
    """2026-10 aborts on the host (GGML_ABORT in enqueue_op: one line, exit 3) when one op maps more than the
    budget; 2026-05 has no such check (its batch takes the op, and the DSP maps what it can)."""
    args = ("run", "-m", q4b1, "-dev", "HTP0", "--n-prompt", "8", "-n", "1", "--temp", "0")
    october = _kazeia(*args, env={"GGML_HEXAGON_VMEM": "48"})
    assert october.returncode == 3 and "op does not fit into empty batch" in october.stderr, october.stderr
    may = _kazeia(*args, "--htp-profile", "2026-05", env={"GGML_HEXAGON_VMEM": "48"})
    assert may.returncode == 0, may.stderr[-2000:]


@pytest.mark.parametrize("arch, dies", [(73, True), (69, True), (75, False), (79, False)])
def test_a_mapping_past_hap_mmaps_2_gib_aborts_the_dsp_on_v73_and_older(arch, dies):
    """main.c mmap_buf (both versions, llama.cpp #21071): below v75 HAP_mmap takes at most 2 GiB a buffer and the DSP
    aborts on a larger one. The host's weight buffers are cut at GGML_HEXAGON_MBUF (1 GiB by default), so only an
    MBUF above 2048 MiB reaches it."""
    import numpy as np

    from kazeia.backends.htp.device import Dsp
    from kazeia.backends.htp.msg import DspFault, OpBatch
    from kazeia.backends.htp.ops.executor import Executor
    from kazeia.backends.htp.profiles import get_profile
    from kazeia.graph import builder as gb
    from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, make_tensor

    weights = Buffer("weights", np.zeros(5 * (1 << 29), dtype=np.uint8), BufferUsage.WEIGHTS)  # 2.5 GiB, untouched
    compute = Buffer("compute", np.zeros(1 << 20, dtype=np.uint8), BufferUsage.COMPUTE)
    w = make_tensor(GGMLType.F32, (256, 4), buffer=weights, offset=0)
    node = gb.mul_mat(w, make_tensor(GGMLType.F32, (256, 8), buffer=compute, offset=0), "m")
    node.buffer, node.offset = compute, 65536
    profile = get_profile("2026-10")
    for mbuf, over in ((1 << 30, False), (3 << 30, True)):
        settings = HtpSettings.from_env({"GGML_HEXAGON_ARCH": f"v{arch}", "GGML_HEXAGON_MBUF": str(mbuf >> 20)})
        dsp = Dsp(settings, profile, Executor(settings, profile))
        batch = OpBatch(mbuf=mbuf)
        op = batch.add_op(node, 0, None)
        if over and dies:
            with pytest.raises(DspFault, match="exceeds 2GB limit for HAP_mmap"):
                dsp._map_buffers(batch, op)
        else:
            dsp._map_buffers(batch, op)
        assert (dsp.mmap_max is not None) == (arch <= 73)
