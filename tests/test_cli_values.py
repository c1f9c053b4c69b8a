"""Every command-line value is checked when argparse reads it (kazeia/cli/validate.py), with llama.cpp's meanings.

- a generated matrix: every flag and positional of every subcommand (found by walking the parser, so a flag added
  later is covered too) given hostile values (NaN, infinities, negatives, 0, huge and 5000-digit numbers, bad
  regexes, a directory, a FIFO, a device, a missing path, non-ASCII text); the parser either accepts the value
  or exits 2 with one line naming the flag, never a traceback;
- where running is cheap (`run`/`trace` on a tiny model, `htp plan`, `make-model`, `oracle --list`, `bench`),
  every accepted hostile value is then run in process: it returns an exit status, never raises (slow);
- a hypothesis property over random text for the numeric flags;
- one test per case of issue 13 (`--temp nan`, `-s -1`, `--cpu-nodes '('`, `--gate 'weight=(,m=1-5'`,
  `--oplog-file DIR`, `--cpu-ops BOGUS`, `-n -5`, a FIFO as -m) and the llama.cpp meanings kept (-n -1/-2,
  -s -1 prints the seed, --temp < 0 is greedy, -t 0, -c 0, -ngl auto/all, --top-p 0 keeps one token).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kazeia import settings as kazeia_settings
from kazeia.cli import validate as V
from kazeia.cli.main import build_parser, main
from kazeia.engine.generate import Sampler, SamplingParams

HOSTILE_NUMBERS = ["nan", "NaN", "inf", "-inf", "1e309", "1e-320", "5e-324", "1e300", "2147483647", "-1", "-2",
                   "-3", "-5", "0", "-0", "1", "+3", "1.5", "0x10", "2147483648", "99999999999", "9" * 5000, "", " ",
                   "abc"]
HOSTILE_TEXT = ["(", "[", "*", "+", "a{99999999999}", "weight=(,m=1-5", "weight=x,m=5-1", "m=1-2", "5:3", "a:b",
                "-1:", "BOGUS", "mul_mat", "é" * 300, "\u202e", "x" * 5000]


@pytest.fixture(scope="module")
def hostile_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    fifo = d / "fifo"
    os.mkfifo(fifo)
    return [str(d), str(fifo), "/dev/zero", "/dev/null", str(d / "missing" / "file"), str(d / "nothing.gguf")]


def walk(p: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) for every parser under p."""
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from walk(sp, (*path, name))


def value_actions(p: argparse.ArgumentParser):
    """The actions that take a value (not flags, help, version or sub-parsers)."""
    for a in p._actions:
        if isinstance(a, (argparse._SubParsersAction, argparse._HelpAction, argparse._VersionAction)):
            continue
        if a.nargs == 0:
            continue
        yield a


def required_argv(p: argparse.ArgumentParser, skip: argparse.Action, tmp: str) -> list[str]:
    """Valid values for the required flags and positionals other than `skip`."""
    out: list[str] = []
    for a in value_actions(p):
        if a is skip:
            continue
        if a.option_strings and a.required:
            out += [a.option_strings[0], "4" if a.dest in ("m", "k", "n") else os.path.join(tmp, "out.gguf")]
        elif not a.option_strings:
            out.append(_a_file(tmp) if a.type is V.regular_file else tmp)
    return out


def _a_file(tmp: str) -> str:
    path = os.path.join(tmp, "a-file.txt")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write("text\n")
    return path


def argv_with(p, words, action, value, tmp) -> list[str]:
    if action.dest == "dump":  # REGEX DIR: the hostile value in its own place
        vals = ["x", value] if os.path.sep in value else [value, tmp]
    else:
        vals = [value] * (action.nargs if isinstance(action.nargs, int) else 1)
    rest = required_argv(p, action, tmp)
    flag = [action.option_strings[-1]] if action.option_strings else []
    return [*words, *rest, *flag, *vals]


def parse(argv: list[str], parser: argparse.ArgumentParser | None = None) -> tuple[argparse.Namespace | None, str]:
    """Parse like `kazeia` (with `parser`, or a new one): the namespace, or None and the error text (exit 2)."""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            return (parser or build_parser(argv[0])).parse_args(argv), ""
        except SystemExit as e:
            assert e.code == 2, (argv, e.code, err.getvalue())
    return None, err.getvalue()


def cases(paths: list[str]):
    for words, p in walk(build_parser()):
        for a in value_actions(p):
            for v in HOSTILE_NUMBERS + HOSTILE_TEXT + paths:
                yield words, p, a, v


@pytest.mark.slow  # ~4 s: every flag of every subcommand (CI runs it; the quick loop's budget is 2 min)
def test_every_flag_of_every_subcommand_refuses_hostile_values_in_one_line(hostile_paths, tmp_path):
    """The parser accepts a value or prints one line naming the flag and exits 2; it never raises."""
    n = refused = 0
    flags = set()
    parser = build_parser()
    for words, p, a, v in cases(hostile_paths):
        argv = argv_with(p, words, a, v, str(tmp_path))
        ns, err = parse(argv, parser)
        n += 1
        flags.add((words, a.dest))
        if ns is None:
            refused += 1
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert len(lines) == 1 and "Traceback" not in err, (argv, err)
            assert lines[0].startswith("kazeia") and ": error: " in lines[0], (argv, err)
            named = [*a.option_strings, a.metavar or a.dest]
            assert any(str(x) in lines[0] for x in named) or "unrecognized" in lines[0], (argv, err)
    assert len(flags) > 250 and refused > n // 3, (len(flags), n, refused)


PARSER = build_parser()
TYPED = [(w, p, a) for w, p in walk(PARSER) for a in value_actions(p) if a.type not in (None, str)]


@pytest.mark.slow  # ~1-2 s: CI runs it (the quick loop ran 107-120 s of its 120 s)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_numeric_flags_random_text(data, tmp_path):
    """Random text, numbers and floats written out for every typed flag: accepted or one line, never a traceback."""
    words, p, a = data.draw(st.sampled_from(TYPED))
    v = data.draw(st.one_of(st.text(max_size=30), st.integers().map(str), st.floats().map(repr),
                            st.from_regex(r"-?[0-9]{1,25}(\.[0-9]+)?(e-?[0-9]{1,4})?", fullmatch=True)))
    if v.startswith("-") and a.option_strings and not re.fullmatch(r"-[0-9.e]+", v):
        v = " " + v  # argparse reads '-x...' as a flag; a leading space keeps it a value
    ns, err = parse(argv_with(p, words, a, v, str(tmp_path)), PARSER)
    if ns is None:
        assert len([ln for ln in err.splitlines() if ln.strip()]) == 1 and "Traceback" not in err, err


# -- running what the parser accepted -------------------------------------------------------------------------

CHEAP = {("run",): ["-p", "hi", "-n", "1"], ("trace",): ["--n-prompt", "2", "--quiet"],
         ("htp", "plan"): [], ("make-model",): ["--layers", "1"], ("oracle",): ["--list", "--quick"],
         ("bench",): ["-p", "2", "-n", "1", "-r", "1"]}
SLOW_TO_RUN = {"n_predict", "n_gen", "n_prompt", "n_depth", "repetitions", "ctx_size"}  # accepted values that only
# make a cheap command long (a 2**31 token budget ends at the context, a huge -p at the model's context, ...)


RUNS_PER_FLAG = 5  # the first accepted values of each flag (the list starts with the extremes: nan, inf, -1, 0, ...)


def run_in_process(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, err.getvalue()


@pytest.mark.slow
def test_accepted_hostile_values_run_without_traceback(hostile_paths, tiny_qwen3_q4, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default output files (kazeia-trace.jsonl, ...) land here
    ran = 0
    per_flag: dict[tuple, int] = {}
    parser = build_parser()
    for words, p, a, v in cases(hostile_paths):
        if words not in CHEAP or a.dest in SLOW_TO_RUN or a.dest in ("model", "output") and words != ("make-model",):
            continue
        if per_flag.get((words, a.dest), 0) >= RUNS_PER_FLAG:
            continue
        argv = argv_with(p, words, a, v, str(tmp_path))
        if parse(argv, parser)[0] is None:
            continue
        per_flag[words, a.dest] = per_flag.get((words, a.dest), 0) + 1
        extra = CHEAP[words] + (["-m", tiny_qwen3_q4] if words in (("run",), ("trace",), ("bench",))
                                and a.dest != "model" else [])
        rc, err = run_in_process([*argv[:len(words)], *extra, *argv[len(words):]])
        ran += 1
        assert isinstance(rc, int) and "Traceback" not in err, (argv, rc, err)
        if rc not in (0, 130):
            assert len([ln for ln in err.splitlines() if ln.startswith(("error:", "kazeia"))]) >= 1, (argv, err)
    assert ran > 150 and len(per_flag) > 80, (ran, len(per_flag))


# -- the cases, one by one (subprocess: what a user sees) ----------------------------------------------


def kazeia(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kazeia", *args], capture_output=True, text=True, timeout=timeout)


def refused(r: subprocess.CompletedProcess, flag: str) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"argument {flag}" in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_temp_not_finite_is_refused(tiny_qwen3_q4, value):
    line = refused(kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "-n", "2", f"--temp={value}"), "--temp")
    assert "not a finite number" in line


@pytest.mark.slow  # ~1-2 s: CI runs it (the quick loop ran 107-120 s of its 120 s)
def test_seed_minus_one_is_random_and_printed(tiny_qwen3_q4):
    """llama.cpp: -s -1 (LLAMA_DEFAULT_SEED) draws a seed; it is printed, and rerunning with it repeats the run."""
    r = kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "-n", "6", "--temp", "1.5", "-s", "-1")
    assert r.returncode == 0, r.stderr
    seed = int(re.search(r"sampler seed: (\d+)", r.stderr).group(1))
    again = kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "-n", "6", "--temp", "1.5", "-s", str(seed))
    assert again.returncode == 0 and again.stdout == r.stdout
    assert V.seed("4294967295") == V.RANDOM_SEED and V.seed("4294967294") == 4294967294


@pytest.mark.parametrize("value", ["-2", "-5", "4294967296", "1.5"])
def test_seed_other_values_refused(value):
    with pytest.raises(argparse.ArgumentTypeError):
        V.seed(value)


def test_cpu_nodes_bad_regex(tiny_qwen3_q4):
    line = refused(kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "--cpu-nodes", "("), "--cpu-nodes")
    assert "not a valid regular expression" in line and "missing )" in line


@pytest.mark.slow  # ~1-2 s: CI runs it (the quick loop ran 107-120 s of its 120 s)
def test_gate_bad_regex_and_bad_m(tiny_qwen3_q4):
    line = refused(kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "--gate", "weight=(,m=1-5"), "--gate")
    assert "gate: '(' is not a valid regular expression" in line
    assert "LO <= HI" in refused(kazeia("run", "-p", "hi", "--gate", "weight=ffn,m=5-1"), "--gate")
    assert V.gate("weight=ffn_down,m=1-32") == "weight=ffn_down,m=1-32" and V.gate("vtcm-plan")


def test_oplog_file_directory(tiny_qwen3_q4, tmp_path):
    line = refused(kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "--oplog-file", str(tmp_path)), "--oplog-file")
    assert "is a directory" in line


def test_cpu_ops_unknown_name_lists_the_known_ones(tiny_qwen3_q4):
    line = refused(kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "--cpu-ops", "MUL_MAT,BOGUS"), "--cpu-ops")
    assert "unknown op BOGUS" in line and "MUL_MAT" in line and "SOFT_MAX" in line and "SILU" in line
    assert V.op_names("mul_mat, silu") == "MUL_MAT,SILU"


def test_cpu_ops_known_names_do_route(tiny_qwen3_q4):
    """A name the validator accepts is one the router matches: every MUL_MAT runs on the CPU under -dev HTP0."""
    from kazeia.cli.common import open_session

    args = build_parser("run").parse_args(["run", "-m", tiny_qwen3_q4, "-dev", "HTP0", "--cpu-ops", "mul_mat"])
    s = open_session(args)
    s.ctx.decode([1, 2, 3])
    mm = [pl for pl in s.scheduler.placements if pl.op == "MUL_MAT"]
    assert mm and all(pl.backend == "CPU" for pl in mm)


def test_n_predict_semantics(tiny_qwen3_q4):
    """-n -5 is refused (it ran to the context's end); -1 and -2 run until EOS or the context is full."""
    assert "-1 (infinity)" in refused(kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "-n", "-5"), "-n")
    for n in ("-1", "-2"):
        r = kazeia("run", "-m", tiny_qwen3_q4, "-p", "hi", "-n", n, "-c", "24", "--temp", "0")
        assert r.returncode == 0, r.stderr
        assert re.search(r"stop: (eos|context)", r.stderr), r.stderr


def test_fifo_model_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    line = refused(kazeia("run", "-m", str(fifo), "-p", "hi", timeout=60), "-m")
    assert "is a FIFO, not a regular file" in line


def test_prompt_file_from_a_pipe_still_works(tiny_qwen3_q4):
    """-f /dev/stdin (a pipe) is a stream to read, not refused like a FIFO model."""
    r = subprocess.run([sys.executable, "-m", "kazeia", "run", "-m", tiny_qwen3_q4, "-f", "/dev/stdin", "-n", "1"],
                       input="hello", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("hello"), r.stderr


def test_llama_cpp_meanings():
    assert V.temperature("-0.5") == 0.0  # llama.cpp: std::max(temp, 0): greedy
    assert V.threads("0") == 0 and V.threads("-4") == 0  # hardware concurrency
    assert V.ctx_size("0") == 0  # the model's training context
    assert V.gpu_layers("auto") is None and V.gpu_layers("all") is None and V.gpu_layers("-1") is None
    assert V.gpu_layers("0") == 0 and V.gpu_layers("99") == 99
    assert V.n_predict("-1") == -1 and V.n_predict("-2") == -2
    for parse, bad in [(V.ctx_size, "-1"), (V.threads, "513"), (V.gpu_layers, "-3"), (V.vtcm_bytes, "65535"),
                       (V.vtcm_bytes, str((1 << 30) + 1)), (V.probability, "1.01"), (V.probability, "-0.1"),
                       (V.seconds, "0"), (V.integer(0), "9" * 5000), (V.hex_mask, "0xZZ")]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)


def test_top_p_zero_keeps_the_most_likely_token_and_min_p():
    """llama.cpp: top-p 0 keeps one token (it disabled top-p here); min-p keeps tokens at least min_p times as
    likely as the best one, before the temperature."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    draws = {Sampler(SamplingParams(temp=1.0, top_k=0, top_p=0.0, seed=s)).sample(logits) for s in range(50)}
    assert draws == {0}
    draws = {Sampler(SamplingParams(temp=3.0, top_k=0, top_p=1.0, seed=s, min_p=0.5)).sample(logits)
             for s in range(200)}
    assert draws == {0, 1}  # 0.3 >= 0.5 * 0.5, 0.15 is not


def test_a_temperature_so_small_that_logits_overflow_is_greedy():
    """--temp 1e-320 is a valid finite temperature; logits / temp overflow to inf (NaN probabilities crashed)."""
    logits = np.array([1.0, 3.0, 2.0, -1.0])
    assert all(Sampler(SamplingParams(temp=t, top_k=0, top_p=1.0, seed=s)).sample(logits) == 1
               for t in (1e-320, 5e-324) for s in range(20))


@pytest.mark.slow  # ~1-2 s: CI runs it (the quick loop ran 107-120 s of its 120 s)
def test_make_model_refuses_a_model_too_big_for_memory_or_disk(tmp_path):
    r = kazeia("make-model", "-o", str(tmp_path / "big.gguf"), "--n-embd", str(1 << 20), "--n-ff", str(1 << 20))
    assert r.returncode == 2 and "GiB" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "big.gguf").exists()
    refused(kazeia("make-model", "-o", str(tmp_path), "--layers", "1"), "-o")
    refused(kazeia("make-model", "-o", str(tmp_path / "m.gguf"), "--rope-base", "nan"), "--rope-base")


def test_bench_prompt_larger_than_the_model_context_fails_before_drawing_it(tiny_qwen3_q4):
    r = kazeia("bench", "-m", tiny_qwen3_q4, "-p", "100000000", "-n", "0", "-r", "1")
    assert r.returncode == 2 and "the model's context is" in r.stderr, r.stderr


def test_env_default_is_validated_too(monkeypatch):
    """--cpu-node-range takes its default from KAZEIA_CPU_NODE_RANGE (bisect steps): a bad one is one line."""
    monkeypatch.setenv("KAZEIA_CPU_NODE_RANGE", "5:x")
    kazeia_settings.reload()  # (switches are read once per process)
    ns, err = parse(["run", "-p", "hi"])
    assert ns is None and "--cpu-node-range" in err and len(err.strip().splitlines()) == 1


def test_cpu_mask_is_bounded_as_llama_cpp_bounds_it():
    """--cpu-mask (issue 36): llama.cpp's parse_cpu_mask takes a lowercase 0x and at most 128 hex digits
    (GGML_MAX_N_THREADS = 512 bits); a mask of no CPU this machine has is refused rather than run unpinned."""
    cpus = sorted(os.sched_getaffinity(0))
    assert V.hex_mask("0x3") == "0x3" and V.hex_mask("f" * 128) == "f" * 128
    beyond = format(1 << (cpus[-1] + 1), "x")  # only the CPU after this machine's last
    for bad, why in [("0X3", "lowercase 0x"), ("f" * 129, "GGML_MAX_N_THREADS"), ("0x0", "none of this machine"),
                     (beyond, "none of this machine"), ("0x", "not a hex CPU mask")]:
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            V.hex_mask(bad)
