"""One device, one answer (issue 34): the emulated NPU's outputs are the same bits on every host.

`test_digests_travel` runs a matrix of configurations (upstream versions 2026-05 with its death and with a gate,
2026-10 and robust; prefill at M 5, 38, 130 and a decode step; qwen3, qwen35, gemma3 and lfm2; flash attention on
and off) with `kazeia run --dump '.*'` and compares a sha256 over every op's output blob with the digests
committed in tests/data/htp_digests.json. Another machine (another CPU family, BLAS, thread count) running this
test checks the same bits. `test_host_switches_leave_the_bits` reruns a subset under -t 1/2/3, OPENBLAS_CORETYPE,
OPENBLAS_NUM_THREADS=1, KAZEIA_SIMD=0, KAZEIA_NO_BIND=1, KAZEIA_ISA=avx2 (the kernels as an AVX2-only host
compiles them) and numpy's SIMD dispatch lowered to the x86-64 baseline (NPY_DISABLE_CPU_FEATURES, as on a host
without AVX2), and requires identical digests.

The models are made by `kazeia make-model` from fixed seeds. To record the digests after a deliberate change of the
device model's numerics: RECORD_HTP_DIGESTS=1 pytest tests/test_htp_digests.py -k travel (and say so in the
commit: the file is the contract).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from pathlib import Path

import pytest

from cli_utils import kazeia_clean

pytestmark = pytest.mark.slow

DIGESTS = Path(__file__).parent / "data" / "htp_digests.json"
RACE = {"KAZEIA_HTP_RACE_SEED": "7"}

# name -> make-model arguments
MODELS = {
    "qwen3-4b-2l": ["--preset", "qwen3-4b", "--layers", "2", "--vocab", "1024", "--type", "q4_0"],
    "qwen35": ["--preset", "tiny", "--arch", "qwen35", "--type", "q4_0"],
    "gemma3": ["--preset", "tiny", "--arch", "gemma3", "--type", "q4_0"],
    "lfm2": ["--preset", "tiny", "--arch", "lfm2", "--type", "q4_0"],
    "qwen3-q4_k_m": ["--preset", "tiny", "--arch", "qwen3", "--type", "q4_k_m"],
}

GATE = """format = 1
[[rule]]
name = "ffn_down-hvx-m33-64"
op = "MUL_MAT"
k = 9728
m = [33, 64]
action = "hvx"
"""

# name -> (model, profile, prompt tokens, extra run arguments)
MATRIX = {
    "qwen3-2026-10-m5": ("qwen3-4b-2l", "2026-10", 5, []),
    "qwen3-2026-10-m38": ("qwen3-4b-2l", "2026-10", 38, []),
    "qwen3-2026-10-m130": ("qwen3-4b-2l", "2026-10", 130, []),
    "qwen3-2026-10-m130-nofa": ("qwen3-4b-2l", "2026-10", 130, ["-fa", "off"]),
    "qwen3-robust-m38": ("qwen3-4b-2l", "robust", 38, []),
    "qwen3-robust-m130": ("qwen3-4b-2l", "robust", 130, []),
    "qwen3-2026-05-m5": ("qwen3-4b-2l", "2026-05", 5, []),
    "qwen3-2026-05-m38-death": ("qwen3-4b-2l", "2026-05", 38, []),
    "qwen3-2026-05-m38-gated": ("qwen3-4b-2l", "2026-05", 38, ["--gates", "{gate}"]),
    "qwen3-2026-05-m130-nofa": ("qwen3-4b-2l", "2026-05", 130, ["-fa", "off"]),
    "qwen35-2026-10-m38": ("qwen35", "2026-10", 38, []),
    "qwen35-robust-m130": ("qwen35", "robust", 130, []),
    "qwen35-2026-05-m38": ("qwen35", "2026-05", 38, []),
    "gemma3-2026-10-m38": ("gemma3", "2026-10", 38, []),
    "gemma3-2026-05-m130": ("gemma3", "2026-05", 130, []),
    "lfm2-2026-10-m38": ("lfm2", "2026-10", 38, []),
    "lfm2-2026-05-m64": ("lfm2", "2026-05", 64, []),
    "qwen3-q4_k_m-2026-10-m38": ("qwen3-q4_k_m", "2026-10", 38, []),
}

# the subset rerun under every host switch (config, then the switches)
SWITCHED = ("qwen3-2026-10-m130", "qwen3-2026-10-m130-nofa", "qwen3-2026-05-m38-gated", "qwen35-robust-m130",
            "gemma3-2026-10-m38")  # (qwen35: softplus's log1p; gemma3: GEGLU's tanh: backends/libm.py)
SWITCHES = {  # name -> (environment, run arguments)
    "-t 1": ({}, ["-t", "1"]),
    "-t 3": ({}, ["-t", "3"]),
    "OPENBLAS_CORETYPE=Sandybridge": ({"OPENBLAS_CORETYPE": "Sandybridge"}, []),
    "OPENBLAS_CORETYPE=Haswell": ({"OPENBLAS_CORETYPE": "Haswell"}, []),
    "OPENBLAS_CORETYPE=SkylakeX": ({"OPENBLAS_CORETYPE": "SkylakeX"}, []),
    "OPENBLAS_CORETYPE=Zen": ({"OPENBLAS_CORETYPE": "Zen"}, []),
    "OPENBLAS_NUM_THREADS=1": ({"OPENBLAS_NUM_THREADS": "1"}, []),
    "KAZEIA_SIMD=0": ({"KAZEIA_SIMD": "0"}, []),
    "KAZEIA_NO_BIND=1": ({"KAZEIA_NO_BIND": "1"}, []),
    "KAZEIA_ISA=avx2": ({"KAZEIA_ISA": "avx2"}, []),  # the kernels as an AVX2-only host compiles them
    "numpy baseline SIMD": ({"NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR"}, []),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("digest_models")
    out = {}
    for name, args in MODELS.items():
        path = d / f"{name}.gguf"
        r = kazeia_clean("make-model", *args, "-o", str(path))
        assert r.returncode == 0, r.stderr
        out[name] = path
    (d / "gate.toml").write_text(GATE)
    out["gate"] = d / "gate.toml"
    return out


def run_digest(models: dict[str, Path], config: str, tmp: Path, env: dict[str, str] | None = None,
               extra: list[str] | None = None) -> str:
    """sha256 over (op id, output blob) of every op `kazeia run` dumped for the configuration."""
    model, profile, n_prompt, args = MATRIX[config]
    args = [a.format(gate=models["gate"]) for a in args]
    out = tmp / "dump"
    r = kazeia_clean("run", "-m", str(models[model]), "-ngl", "99", "-dev", "HTP0", "--htp-profile", profile,
                     "--temp", "0", "-n", "2", "--n-prompt", str(n_prompt), *args, *(extra or []),
                     "--dump-limit", "0", "--dump-no-context", "--dump", ".*", str(out),
                     env={**RACE, **(env or {})})
    assert r.returncode in (0, 3), r.stderr[-2000:]  # 3: the 2026-05 death is part of the configuration
    h = hashlib.sha256()
    ops = 0
    for manifest in sorted(out.glob("*/manifest.json")):
        m = json.loads(manifest.read_text())
        values = (m.get("output") or {}).get("values") or {}
        h.update(f"{m['id']}:{m.get('status')}:{values.get('blob')}:{r.returncode}\n".encode())
        ops += 1
    shutil.rmtree(out)  # the dumps hold every op's weights too
    assert ops > 0, f"{config}: nothing dumped"
    return h.hexdigest()


def _cpu() -> str:
    """The CPU that records the digests: its model name and vector extensions (for the file's reader)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    isa = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni") if f in flags]
    return f"{name} ({platform.machine()}: {' '.join(isa)})"


def test_digests_travel(models, tmp_path):
    got = {c: run_digest(models, c, tmp_path / c) for c in MATRIX}
    if os.environ.get("RECORD_HTP_DIGESTS") == "1":
        DIGESTS.write_text(json.dumps({"recorded_on": _cpu(), "digests": got}, indent=1, sort_keys=True) + "\n")
    want = json.loads(DIGESTS.read_text())["digests"]
    differ = [c for c in MATRIX if got[c] != want.get(c)]
    assert not differ, f"device bits differ from the committed digests for {differ}"


@pytest.mark.parametrize("config", SWITCHED)
def test_host_switches_leave_the_bits(models, tmp_path, config):
    base = run_digest(models, config, tmp_path / "base")
    differ = []
    for i, (name, (env, extra)) in enumerate(SWITCHES.items()):
        if run_digest(models, config, tmp_path / f"s{i}", env=env or None, extra=extra) != base:
            differ.append(name)
    assert not differ, f"{config}: the device's bits change under {differ}"
