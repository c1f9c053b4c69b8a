"""Shared fixtures: tiny synthetic models (written once per session) and the embedded default model."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/oracle_utils.py

# One BLAS/OpenMP thread (override with KAZEIA_TEST_THREADS): the machine's cores are shared, and a BLAS
# whose threads spin while another process holds the cores runs the models here 10-20x slower. Subprocesses
# (the CLI tests) inherit the environment variables.
_THREADS = os.environ.get("KAZEIA_TEST_THREADS", "1")
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _THREADS)
try:
    from threadpoolctl import threadpool_limits

    _limits = threadpool_limits(limits=int(_THREADS))  # numpy may already be loaded: limit it now as well
except ImportError:  # pragma: no cover
    pass

from kazeia.errors import KazeiaError  # noqa: E402
from kazeia.gguf.synth_tokenizer import MIN_VOCAB  # noqa: E402
from kazeia.gguf.writer import preset, write_model  # noqa: E402

HARNESS_VARS = ("KAZEIA_TEST_THREADS",)  # the test runner's own knobs, not switches of the code under test


@pytest.fixture(scope="session")
def _pack_dir(tmp_path_factory) -> str:
    """The session's KAZEIA_PACK_DIR: the packed GEMV weights of the models the tests write into temporary
    directories are kept (and pruned) there, not in the user's cache."""
    return str(tmp_path_factory.mktemp("packed"))


@pytest.fixture(autouse=True)
def _no_switches_from_the_caller(monkeypatch, _pack_dir):
    """Every test starts without the caller's GGML_HEXAGON_* and KAZEIA_* variables: the HTP settings, profiles,
    VTCM size, faults, caches and node ranges a test sees are the ones it sets (subprocesses inherit this), and
    KAZEIA_PACK_DIR is the session's."""
    from kazeia import settings

    for name in list(os.environ):
        if name.startswith(("GGML_HEXAGON_", "KAZEIA_")) and name not in HARNESS_VARS:
            monkeypatch.delenv(name)
    monkeypatch.setenv("KAZEIA_PACK_DIR", _pack_dir)
    settings.reload()
    yield
    monkeypatch.undo()
    settings.reload()


def _write(tmp_path_factory, name: str, **overrides) -> str:
    d = tmp_path_factory.mktemp(name)
    path = str(d / f"{name}.gguf")
    write_model(preset("tiny", **overrides), path)
    return path


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> str:
    """Tiny random Qwen3, F32 weights (2 layers, 256 wide, 4 heads x 64, 2 KV heads, vocab 1024)."""
    return _write(tmp_path_factory, "tiny_qwen3", arch="qwen3", wtype="f32")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    """Tiny random Llama with the same shapes, F32 weights."""
    return _write(tmp_path_factory, "tiny_llama", arch="llama", wtype="f32")


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> str:
    """Tiny random Qwen2 with the same shapes, F32 weights, q/k/v biases."""
    return _write(tmp_path_factory, "tiny_qwen2", arch="qwen2", wtype="f32")


@pytest.fixture(scope="session")
def tiny_gemma3(tmp_path_factory) -> str:
    """Tiny random Gemma 3 (6 layers: five sliding-window layers of window 8, then a global one), F32 weights."""
    return _write(tmp_path_factory, "tiny_gemma3", arch="gemma3", wtype="f32")


@pytest.fixture(scope="session")
def tiny_phi3(tmp_path_factory) -> str:
    """Tiny random Phi-3 (fused QKV and gate/up), F32 weights; full rotary and no LongRoPE factors, which
    transformers' GGUF loader does not read (the converter-written file of tests/data has both)."""
    return _write(tmp_path_factory, "tiny_phi3", arch="phi3", wtype="f32", n_rot=0, rope_factors=False)


@pytest.fixture(scope="session")
def tiny_lfm2(tmp_path_factory) -> str:
    """Tiny random LFM2 (short conv, attention, short conv, attention), F32 weights."""
    return _write(tmp_path_factory, "tiny_lfm2", arch="lfm2", wtype="f32")


@pytest.fixture(scope="session")
def tiny_qwen3_narrow_heads(tmp_path_factory) -> str:
    """Qwen3 whose q width differs from the hidden size (4 heads x 32 = 128 != 256), like Qwen3-4B; untied."""
    return _write(tmp_path_factory, "tiny_qwen3_nh", arch="qwen3", wtype="f32", head_dim=32, tied=False, seed=3)


@pytest.fixture(scope="session")
def tiny_qwen3_q4(tmp_path_factory) -> str:
    """The tiny Qwen3 with Q4_0 matrices (the make-model default)."""
    return _write(tmp_path_factory, "tiny_qwen3_q4", arch="qwen3", wtype="q4_0")


@pytest.fixture(scope="session")
def mini_gguf(tmp_path_factory) -> str:
    """The smallest valid model file we can make (one layer, 32 wide, minimal vocabulary): ~50 KB."""
    return _write(tmp_path_factory, "mini", arch="llama", wtype="f32", n_layer=1, n_embd=32, n_ff=32, n_head=2,
                  n_head_kv=1, head_dim=16, n_vocab=MIN_VOCAB, n_ctx=64)


@pytest.fixture(scope="session")
def default_model() -> str:
    from kazeia.engine.default_model import default_model_path

    try:
        return default_model_path()
    except KazeiaError as e:
        pytest.skip(f"default model not installed: {e}")


@pytest.fixture(scope="session")
def q4b1(tmp_path_factory) -> str:
    """The Qwen3-4B-shaped model with one layer, Q4_0 (`kazeia make-model --preset qwen3-4b --layers 1 --vocab
    32768`: a synthetic tokenizer keeps the file and the lm_head small; `q4b2_real` has the real one)."""
    path = str(tmp_path_factory.mktemp("q4b1") / "q4b1.gguf")
    write_model(preset("qwen3-4b", n_layer=1, n_vocab=32768), path)
    return path


@pytest.fixture(scope="session")
def q4b2(tmp_path_factory) -> str:
    """The Qwen3-4B-shaped model with two layers, Q4_0, vocabulary 32768 (synthetic tokenizer)."""
    path = str(tmp_path_factory.mktemp("q4b2") / "q4b2.gguf")
    write_model(preset("qwen3-4b", n_layer=2, n_vocab=32768), path)
    return path


@pytest.fixture(scope="session")
def q4b2_real(tmp_path_factory) -> str:
    """The seed's model: `kazeia make-model --preset qwen3-4b --layers 2` (Q4_0, the real Qwen3 tokenizer and
    chat template, 151936 embedding rows; 338 MB, ~20 s to write)."""
    from kazeia.gguf.hf_vocab import qwen3_tokenizer_dir

    try:
        qwen3_tokenizer_dir()
    except KazeiaError as e:
        pytest.skip(str(e))
    path = str(tmp_path_factory.mktemp("q4b2_real") / "q4b2_real.gguf")
    write_model(preset("qwen3-4b", n_layer=2), path)
    return path


POISONED_WEIGHT = "blk.1.ffn_down.weight"


@pytest.fixture(scope="session")
def nan_weight_model(tiny_qwen3, tmp_path_factory) -> str:
    """The tiny Qwen3 (F32) with one NaN in blk.1.ffn_down.weight: its logits are NaN (issue 13)."""
    import shutil

    import numpy as np

    from kazeia.gguf.reader import load_gguf

    path = str(tmp_path_factory.mktemp("nan") / "nan_weight.gguf")
    shutil.copy(tiny_qwen3, path)
    info = load_gguf(path).tensors[POISONED_WEIGHT]
    with open(path, "r+b") as f:
        f.seek(info.offset + 4 * 1000)
        f.write(np.float32(np.nan).tobytes())
    return path
