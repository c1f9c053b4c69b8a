"""What `kazeia run` prints: the streamed text is flushed at the end (an incomplete UTF-8 sequence as U+FFFD,
as llama.cpp prints it), and the statistics line always starts on its own line.

Before, a generation ending inside a multi-byte character printed nothing of it (the stream decoder held it
back and was never flushed: `--n-prompt 32 -n 8` could print nothing), and the statistics line went to
stderr while stdout's newline was still in its buffer, so on a shared pipe it followed the text directly.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import kazeia.cli.run as run_cli
from kazeia.cli.main import main
from kazeia.engine.tokenizer import GGUFTokenizer, StreamDecoder
from kazeia.gguf.reader import load_gguf
from kazeia.gguf.synth_tokenizer import byte_alphabet


@pytest.fixture(scope="module")
def tok(tiny_qwen3) -> GGUFTokenizer:
    return GGUFTokenizer.from_gguf(load_gguf(tiny_qwen3))


def _byte_token(tok: GGUFTokenizer, b: int) -> int:
    return tok.vocab.index(byte_alphabet()[b])


def test_flush_gives_the_held_back_end(tok):
    e6, e6_97_a5 = _byte_token(tok, 0xE6), [_byte_token(tok, b) for b in "日".encode()]
    dec = StreamDecoder(tok)
    assert [dec.push(t) for t in tok.encode("ab", add_bos=False)] == ["a", "b"]
    assert dec.push(e6) == ""  # the first byte of a 3-byte character: held back
    assert dec.flush() == "\ufffd"  # ... and never completed: a replacement character, as llama.cpp prints
    dec = StreamDecoder(tok)
    assert "".join(dec.push(t) for t in e6_97_a5) == "日" and dec.flush() == ""


def _generate_recording(monkeypatch) -> list:
    """kazeia.cli.run's generate, recording each result (the tokens the command generated)."""
    seen = []
    real = run_cli.generate

    def recording(*a, **kw):
        res = real(*a, **kw)
        seen.append(res)
        return res

    monkeypatch.setattr(run_cli, "generate", recording)
    return seen


def test_a_generation_ending_mid_character_is_printed(tiny_qwen3, tok, capsys, monkeypatch):
    """`--n-prompt 32 -n 8`: every generated token reaches stdout, the unfinished character as U+FFFD."""
    seen = _generate_recording(monkeypatch)
    for seed in range(200):
        assert main(["run", "-m", tiny_qwen3, "--n-prompt", "32", "-n", "8", "-s", str(seed)]) == 0
        out, err = capsys.readouterr()
        text = tok.decode(seen[-1].tokens)
        assert len(seen[-1].tokens) == 8
        assert out == (text if text.endswith("\n") else text + "\n"), (seed, out, text)
        if tok.decode(seen[-1].tokens[-1:]) == "\ufffd" and text.endswith("\ufffd"):
            return  # this seed ended inside a character, and it was printed
    pytest.fail("no seed in 0..199 ended inside a multi-byte character")


@pytest.mark.parametrize("argv", [["--n-prompt", "32", "-n", "8"], ["-p", "hello", "-n", "3"]])
def test_the_statistics_line_starts_on_its_own_line(tiny_qwen3, argv):
    """stdout and stderr on one pipe, as a terminal or `2>&1` shows them."""
    r = subprocess.run([sys.executable, "-m", "kazeia", "run", "-m", tiny_qwen3, *argv], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, errors="replace")
    assert r.returncode == 0, r.stdout
    stats = [ln for ln in r.stdout.split("\n") if "[ prompt:" in ln]
    assert len(stats) == 1 and stats[0].startswith("[ prompt:"), r.stdout
    assert r.stdout.rstrip("\n").endswith("]")


def test_an_error_during_generation_starts_on_its_own_line(nan_weight_model):
    r = subprocess.run([sys.executable, "-m", "kazeia", "run", "-m", nan_weight_model, "-p", "hello", "-n", "3"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert r.returncode == 4, r.stdout
    assert r.stdout.startswith("hello\nerror: non-finite logits"), r.stdout
