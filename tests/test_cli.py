"""CLI smoke tests, each in a subprocess: `kazeia make-model` and `kazeia run`.

- make-model --preset qwen3-4b --layers 1 writes a file whose shapes (read back with gguf-py) are the real
  Qwen3-4B ones, and `kazeia run -m it -p hi -n 4` generates 4 tokens;
- the default model answers "Paris";
- --n-prompt N feeds exactly N prompt tokens;
- user mistakes (-dev FOO, no prompt, bad make-model shapes) are one-line errors with exit status 2.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from gguf import GGUFReader


def kazeia(*args: str, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "kazeia", *args], capture_output=True, text=True)
    if check_rc is not None:
        assert r.returncode == check_rc, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r


def stats(stderr: str) -> dict:
    m = re.search(r"prompt: (\d+) tokens.*generation: (\d+) tokens.*stop: (\w+)", stderr)
    assert m, stderr
    return {"prompt": int(m.group(1)), "generated": int(m.group(2)), "stop": m.group(3)}


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def qwen3_4b_one_layer(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("q4b") / "x.gguf")
    r = kazeia("make-model", "--preset", "qwen3-4b", "--layers", "1", "-o", path)
    summary = json.loads(r.stdout)
    assert summary["path"] == path and summary["n_layer"] == 1
    return path


@pytest.mark.slow
def test_make_model_qwen3_4b_shapes(qwen3_4b_one_layer):
    r = GGUFReader(qwen3_4b_one_layer)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert meta["general.architecture"] == "qwen3"
    assert meta["qwen3.block_count"] == 1
    assert meta["qwen3.embedding_length"] == 2560 and meta["qwen3.attention.key_length"] == 128
    assert meta["qwen3.attention.head_count"] == 32 and meta["qwen3.attention.head_count_kv"] == 8
    shapes = {t.name: [int(d) for d in t.shape] for t in r.tensors}
    assert shapes["blk.0.attn_q.weight"] == [2560, 4096]
    assert shapes["blk.0.attn_k.weight"] == [2560, 1024]
    assert shapes["blk.0.attn_output.weight"] == [4096, 2560]
    assert shapes["blk.0.ffn_down.weight"] == [9728, 2560]
    assert shapes["blk.0.attn_q_norm.weight"] == [128]
    assert shapes["token_embd.weight"] == [2560, meta["qwen3.vocab_size"]] == [2560, 151936]
    assert len(meta["tokenizer.ggml.tokens"]) == 151936  # the real Qwen3 tokenizer, padded as the converter pads
    assert "output.weight" not in shapes  # tied, like Qwen3-4B
    assert not any(n.startswith("blk.1.") for n in shapes)


@pytest.mark.slow
def test_run_qwen3_4b_one_layer(qwen3_4b_one_layer):
    r = kazeia("run", "-m", qwen3_4b_one_layer, "-p", "hi", "-n", "4")
    s = stats(r.stderr)
    assert s["prompt"] >= 1 and (s["generated"] == 4 or s["stop"] == "eos")
    assert r.stdout.startswith("hi")


@pytest.mark.slow
def test_run_default_model_paris(default_model):
    r = kazeia("run", "-p", "The capital of France is", "--temp", "0", "-n", "8")
    assert "Paris" in r.stdout[len("The capital of France is"):], r.stdout


@pytest.mark.parametrize("n", [1, 37, 130])
def test_n_prompt_gives_exactly_n_tokens(tiny_qwen3, n):
    r = kazeia("run", "-m", tiny_qwen3, "--n-prompt", str(n), "-n", "2", "--temp", "0", "-ub", "64")
    assert stats(r.stderr)["prompt"] == n


def test_n_prompt_library_matches():
    """The synthetic prompt itself: exactly n ids, in range, no control tokens, deterministic."""
    from kazeia.engine.generate import synthetic_prompt

    def is_control(t):
        return t % 7 == 0

    p = synthetic_prompt(50, 100, is_control)
    assert len(p) == 50 and all(0 <= t < 100 and not is_control(t) for t in p)
    assert p == synthetic_prompt(50, 100, is_control)


def test_ref_device_runs(tiny_llama):
    r = kazeia("run", "-m", tiny_llama, "-dev", "REF", "-p", "hello", "-n", "3", "--temp", "0")
    assert stats(r.stderr)["generated"] in (1, 2, 3)


def test_unknown_device_is_a_clear_error(tiny_qwen3):
    line = one_line_error(kazeia("run", "-m", tiny_qwen3, "-dev", "FOO", "-p", "hi", "-n", "1", check_rc=None))
    assert "FOO" in line and "CPU" in line


def test_no_prompt_is_a_clear_error(tiny_qwen3):
    line = one_line_error(kazeia("run", "-m", tiny_qwen3, "-n", "1", check_rc=None))
    assert "-p" in line


def test_bad_n_prompt_is_a_clear_error(tiny_qwen3):
    one_line_error(kazeia("run", "-m", tiny_qwen3, "--n-prompt", "0", "-n", "1", check_rc=None))


def test_make_model_bad_shapes_is_a_clear_error(tmp_path):
    out = tmp_path / "bad.gguf"
    line = one_line_error(kazeia("make-model", "--n-head", "3", "--n-head-kv", "2", "-o", str(out), check_rc=None))
    assert "n_head" in line
    assert not out.exists()
