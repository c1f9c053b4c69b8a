"""Hardening, round two (issue 20): each input boundary and each way a write can fail, on the issue's own examples.
The fuzz run (tests/fuzz, test_fuzz.py) covers the same classes with generated values."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

import pytest

from kazeia.cli.main import INTERNAL_ERROR, OUTPUT_ERROR, main
from kazeia.debug.evalcb import parse_log
from kazeia.debug.op_stream import parse_stream
from kazeia.engine.policy import Policy
from kazeia.errors import KazeiaError
from kazeia.gguf.reader import LAZY_MIN, LazyArray, load_gguf
from kazeia.gguf.writer import SynthConfig, write_model
from kazeia.limits import check_nesting, decode_text, parse_dims, parse_int, safe_regex
from kazeia.outputs import LOCK_NAME, OutputError, atomic_write, claim_folder


def kazeia(*argv: str, stdout=subprocess.PIPE, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kazeia", *argv], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, **kw)


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


# --- the last resort and standard output ------------------------------------------------------------------


def test_an_escaped_exception_is_one_line_and_status_70(monkeypatch, capsys):
    import kazeia.cli.main as cli

    def boom(args):
        raise ValueError("something kazeia did not expect")

    def parser(command=None):
        p = cli.Parser(prog="kazeia")
        p.add_argument("-v", "--verbose", action="store_true")
        p.set_defaults(func=boom)
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    assert main([]) == INTERNAL_ERROR
    assert one_line(capsys.readouterr().err) == ("kazeia: internal error: ValueError: something kazeia did not "
                                                 "expect (rerun with -v for the traceback)")
    assert main(["-v"]) == INTERNAL_ERROR
    assert "Traceback (most recent call last)" in capsys.readouterr().err


@pytest.mark.slow  # three interpreters and an oracle listing (~5 s)
def test_a_full_or_closed_stdout_is_one_line_and_a_broken_pipe_is_quiet():
    with open("/dev/full", "w") as full:
        r = kazeia("htp", "faults", stdout=full)
    assert r.returncode == OUTPUT_ERROR and "No space left on device" in one_line(r.stderr)
    r = subprocess.run(f"{sys.executable} -m kazeia htp faults >&-", shell=True, capture_output=True, text=True)
    assert r.returncode == OUTPUT_ERROR and "standard output is closed" in one_line(r.stderr)
    p = subprocess.Popen([sys.executable, "-m", "kazeia", "oracle", "--list"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    assert p.wait() == 141 and p.stderr.read() == b""


# --- writes -----------------------------------------------------------------------------------------------


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(str(target)) as f:
        f.write("half of the new one")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["out.json"]
    with pytest.raises(OutputError, match="No space left on device"), atomic_write("/dev/full") as f:
        f.write("x" * (1 << 16))
    with pytest.raises(OutputError, match="/proc/version: cannot write"):
        with atomic_write("/proc/version") as f:
            f.write("x")


@pytest.mark.parametrize("argv", [["make-model", "--preset", "tiny", "-o", "/dev/full"],
                                  ["make-model", "--preset", "tiny", "-o", "/proc/self/status"],
                                  ["oracle", "--quick", "-o", "RMS_NORM", "--case", "RMS_NORM", "--no-progress",
                                   "--csv", "/dev/full"]])
def test_output_paths_that_cannot_be_written_are_one_line(argv):
    r = kazeia(*argv)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert one_line(r.stderr).startswith("error: ")


@pytest.mark.slow  # two kazeia runs and a lock holder (~1.5 s)
def test_an_output_folder_has_one_writer(tmp_path, tiny_qwen3_q4):
    """A folder another process is dumping into is refused in one line, not shared (both runs exited 0 and
    one's dumps overwrote the other's)."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from kazeia.outputs import claim_folder; "
                               f"claim_folder({str(folder)!r}); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "-n", "1", "--dump", "result_output", str(folder))
        assert r.returncode != 0 and "being written by another kazeia process" in one_line(r.stderr)
    finally:
        holder.kill()
        holder.wait()
    r = kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "-n", "1", "--dump", "result_output", str(folder))
    assert r.returncode == 0, r.stderr  # the lock ended with its process


def test_claim_folder_refuses_a_held_lock(tmp_path):
    d = tmp_path / "x"
    d.mkdir()
    fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(OutputError, match="being written by another kazeia process"):
            claim_folder(str(d))
    finally:
        os.close(fd)


def test_a_gate_cache_naming_a_file_is_one_line(tmp_path, tiny_qwen3_q4):
    f = tmp_path / "afile"
    f.write_text("x")
    r = kazeia("gate", "-m", tiny_qwen3_q4, "--auto", "-ub", "2", env={**os.environ, "KAZEIA_GATE_CACHE": str(f)})
    assert r.returncode != 0 and "exists and is not a folder" in one_line(r.stderr)


# --- readers ----------------------------------------------------------------------------------------------


def test_numbers_and_shapes_have_limits():
    with pytest.raises(KazeiaError, match="has 5000 digits"):
        parse_int("9" * 5000, "log:3", "extent")
    with pytest.raises(KazeiaError, match="is not an integer"):
        parse_int(" ", "log:3", "extent")
    with pytest.raises(KazeiaError, match="outside 1..2147483648"):
        parse_dims(["0", "4"], "log:3", "shape")
    with pytest.raises(KazeiaError, match="5 dimensions"):
        parse_dims(["1"] * 5, "log:3", "shape")
    with pytest.raises(KazeiaError, match="elements"):
        parse_dims(["2147483648", "2147483648"], "log:3", "shape")


def test_the_issues_eval_callback_lines_are_refused_with_their_line():
    head = "embd = (f32) GET_ROWS(a{1}, b{2}) = {"
    with pytest.raises(KazeiaError, match=r"^log.txt:2: output shape extent '' is not an integer"):
        parse_log(f"x\n{head}256, , 1, 1}}\n", "log.txt")
    with pytest.raises(KazeiaError, match="log.txt:1: output shape extent has 5000 digits"):
        parse_log(head + "9" * 5000 + ", 1}\n", "log.txt")
    shaped = "embd = (f32) GET_ROWS(" + "a{1, " * 12_000 + ") = {1,"  # the old pattern backtracked on this
    assert parse_log(shaped, "log.txt") == ([], None)
    with pytest.raises(KazeiaError, match="log.txt:1: a line of 1048577 characters"):
        parse_log("x" * (1 << 20) + "y", "log.txt")


@pytest.mark.parametrize("line, error", [
    ("KZOP MUL_MAT dst=[0,4] src0=q4_0[4096,4096] src1=f32[4096,4]", "ops.txt:1: dst shape extent 0 is outside"),
    ("KZOP MUL_MAT dst=[4096,4] src0=q4_0[4096,99999999999999999999999] src1=f32[4096,4]", "has 23 digits"),
    ("KZOP ADD dst=[1,2,3,4,5] src0=f32[1] src1=f32[1]", "dst shape has 5 dimensions"),
    ("KZOP ADD dst=[65536,65536] src0=f32[1] src1=f32[1]", r"elements \(at most"),
])
def test_op_stream_shapes_are_refused_with_their_line(line, error):
    with pytest.raises(KazeiaError, match=error):
        parse_stream(line, "ops.txt")


@pytest.mark.parametrize("line, why", [
    ("KZOP MUL_MAT dst=[4096,4] src0=q4_0[4010,4096] src1=f32[4010,4]", "not a multiple of the q4_0 block"),
    ("KZOP MUL_MAT dst=[4096,4] src0=bogus[4096,4096] src1=f32[4096,4]", "is not one the oracle builds"),
    ("KZOP MUL_MAT dst=[4096,4] src0=q4_0[4096,4096] src1=f32[2048,4]", "is not a MUL_MAT shape"),
    ("KZOP ADD dst=[4096] src0=f32[4096] src1=f32[3]", "does not broadcast"),
])
def test_op_stream_ops_that_cannot_be_rebuilt_say_why(line, why):
    (op,) = parse_stream(line, "ops.txt")
    assert op.case is None and why in op.why_not


def test_regexes_that_could_backtrack_for_ever_are_refused():
    for bad in ["(a+)+", "(x|xy)*", ".*.*.*.*x", "x" * 300]:
        with pytest.raises(KazeiaError):
            safe_regex(bad, "--cpu-nodes")
    for good in ["^ffn_out-", r"blk\.0\..*", "ffn_(up|gate)", r"^(?!ffn).*-\d+$"]:
        assert safe_regex(good, "--cpu-nodes").pattern == good


@pytest.mark.parametrize("text, error", [
    ("format = 1\nx = " + "[" * 1000 + "]" * 1000, "nested more than 8 deep"),
    ("format = true\n", "'format = 1' is required"),
    ("format = 1.0\n", "'format = 1' is required"),
    ("format = 1\nrule = 5\n", "'rule' must be a list"),
    ("format = 1\n[[rule]]\nname='a'\naction='cpu'\nm = 1.5\n", "'m' must be an integer"),
    ("format = 1\n[[rule]]\nname='a'\naction='cpu'\nm = [true, 4]\n", "'m' must be an integer"),
    ("format = 1\n[[rule]]\nname='a'\naction='cpu'\nnode = '" + "(a+)+" + "'\n", "repeats a repetition"),
])
def test_gate_policies_are_typed_and_bounded(tmp_path, text, error):
    p = tmp_path / "p.toml"
    p.write_text(text)
    with pytest.raises(KazeiaError, match=error) as e:
        Policy.load(str(p))
    assert "\n" not in str(e.value)


def test_nesting_is_counted_outside_strings_only():
    check_nesting('a = "[[[[[[[[[[[[["\n# [[[[[[[[[[[[\nb = [[1]]\n', "p", 8)
    with pytest.raises(KazeiaError, match="p:3: brackets nested more than 2 deep"):
        check_nesting('a = "["\n\nb = [[[1]]]\n', "p", 2)


def test_big_metadata_arrays_stay_in_the_map(tmp_path):
    path = tmp_path / "m.gguf"
    write_model(SynthConfig(n_layer=1, n_vocab=512, wtype="f32"), path,
                extra_keys=lambda w: w.add_array("kazeia.test.big", list(range(LAZY_MIN + 1))))
    f = load_gguf(path)
    assert isinstance(f.metadata["kazeia.test.big"], LazyArray)
    assert f.get("kazeia.test.big")[-1] == LAZY_MIN


# --- text and sizes ---------------------------------------------------------------------------------------


def test_invalid_utf8_is_decoded_as_llama_cli_does():
    assert decode_text(b"caf\xe9") == ("caf\ufffd", 1)
    assert decode_text(b"\xe2\x82A") == ("\ufffd\ufffdA", 2)  # one U+FFFD per byte, not per sequence
    assert decode_text("\udcff\udcfex") == ("\ufffd\ufffdx", 2)  # argv's surrogateescape bytes
    assert decode_text(b"\xef\xbf\xbd ok") == ("\ufffd ok", 0)  # a real U+FFFD is not a replacement


def test_a_prompt_file_with_invalid_utf8_runs_with_a_warning(tmp_path, tiny_qwen3_q4):
    p = tmp_path / "p.txt"
    p.write_bytes(b"hello \xff\xfe world")
    r = kazeia("run", "-m", tiny_qwen3_q4, "-f", str(p), "-n", "1")
    assert r.returncode == 0
    assert "is not valid UTF-8: 2 byte(s) replaced by U+FFFD" in r.stderr


@pytest.mark.parametrize("argv, error", [
    (["run", "--n-prompt", "100000000", "-n", "1"], "--n-prompt 100000000 does not fit in the context"),
    (["trace", "-p", "hi", "-n", "2147483647", "--quiet"], "-n 2147483647 cannot finish"),
    (["determinism", "-p", "hi", "-N", "10000"], "10000"),
])
def test_work_that_cannot_finish_is_refused_up_front(tiny_qwen3_q4, tmp_path, argv, error):
    r = kazeia(argv[0], "-m", tiny_qwen3_q4, *argv[1:], cwd=tmp_path)
    assert r.returncode != 0 and error in one_line(r.stderr)


def test_a_prompt_larger_than_the_context_can_hold_is_refused_before_tokenizing(tmp_path, tiny_qwen3_q4):
    p = tmp_path / "p.txt"
    p.write_bytes(b"hello world " * 200_000)
    r = kazeia("run", "-m", tiny_qwen3_q4, "-f", str(p), "-c", "64", "-n", "1")  # 256 cells: llama.cpp's padding
    assert r.returncode != 0 and "cannot fit in the context of 256 tokens" in one_line(r.stderr)


def test_internal_error_status_is_distinct():
    assert INTERNAL_ERROR == 70 and OUTPUT_ERROR == 74


def test_long_work_says_so(capsys):
    import time

    from kazeia.engine.progress import ticking

    n = {"ops": 0}
    with ticking("trace", lambda: f"{n['ops']} ops traced", after=0.0, every=0.05):
        for _ in range(10):
            n["ops"] += 1
            time.sleep(0.03)
    lines = capsys.readouterr().err.splitlines()
    assert lines and all(ln.startswith("kazeia: trace: ") and "ops traced" in ln for ln in lines)
    with ticking("quick", after=60.0):
        pass
    assert capsys.readouterr().err == ""  # work that ends sooner says nothing


@pytest.mark.parametrize("content, error", [
    (b"[1, 2]", "a JSON object was expected"),
    (b"{" * 100 + b"}" * 100, "nested more than 64 deep"),
    (b"\xff\xfe{}", "not a readable bisect state file"),
    (b"{\"version\": ", "not a readable bisect state file"),
])
def test_files_kazeia_wrote_earlier_are_read_as_untrusted(tmp_path, content, error):
    """A bisect --state file, a cache memo or a dump index a user edited or damaged is one line, never a
    traceback (a JSON list made the state reader fail with AttributeError)."""
    from kazeia.limits import read_json_object

    p = tmp_path / "state.json"
    p.write_bytes(content)
    with pytest.raises(KazeiaError, match=error):
        read_json_object(str(p), "bisect state file")
