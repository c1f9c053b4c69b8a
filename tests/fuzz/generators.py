"""One generator per input class: `gen(rng, n) -> list[Case]`, seeded, so `--seed` gives cases no test names.

Each starts from a real sample where one exists (tests/data/fuzz/corpus: an eval-callback log, op-stream lines,
a crash record, a gate policy) and mutates it the way a hostile or careless user would: blank, huge, negative or
non-numeric fields, very long lines, deep nesting, wrong types, binary bytes, truncation. {tiny} is the 2-layer
tiny qwen3 model; {dir} is the case's own folder.
"""

from __future__ import annotations

import os
import random
import stat
from collections.abc import Callable

from harness import Case

CORPUS = os.path.join(os.path.dirname(__file__), "..", "data", "fuzz")


def corpus(name: str) -> str:
    with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
        return f.read()


def _number(rng: random.Random) -> str:
    return rng.choice(["", " ", "0", "-1", "1", "7", "33", "4096", "65536", "2147483648", "9" * 30, "9" * 5000,
                       "1e9", "nan", "-0", "0x10", "1.5", "abc", "\u0663", "１２"])


def _junk(rng: random.Random) -> str:
    return rng.choice(["", "\x00", "\ufffd", "\udcff", "[" * 200, "{" * 200, "(" * 500 + "a", "a" * 70_000,
                       "=" * 1000, " = (f32) " * 200, "\t" * 50, "\u202e", "sum = ", "sum = 1e999", "x" * 8])


def _mutate_lines(rng: random.Random, lines: list[str], field_sub: Callable[[str], str]) -> list[str]:
    out = list(lines)
    for _ in range(rng.randint(1, 4)):
        if not out:
            break
        i = rng.randrange(len(out))
        kind = rng.randrange(6)
        if kind == 0:
            out[i] = field_sub(out[i])
        elif kind == 1:
            out[i] = out[i][: rng.randrange(len(out[i]) + 1)]
        elif kind == 2:
            out.insert(i, _junk(rng))
        elif kind == 3:
            out[i] = out[i] + _junk(rng)
        elif kind == 4:
            del out[i]
        else:
            out[i:i] = [out[i]] * rng.choice([2, 1000])
    return out


def _repeated(line: bytes, times: int) -> Callable[[str], None]:
    def write(path: str) -> None:
        with open(path, "wb") as f:
            f.write(line * times)
    return write


def _sub_numbers(rng: random.Random) -> Callable[[str], str]:
    import re

    def sub(line: str) -> str:
        nums = list(re.finditer(r"-?\d+(?:\.\d+)?", line))
        if not nums:
            return line + _number(rng)
        m = rng.choice(nums)
        return line[: m.start()] + _number(rng) + line[m.end():]
    return sub


def _text_file(lines: list[str], rng: random.Random) -> bytes:
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if rng.random() < 0.1:
        data += bytes(rng.randrange(256) for _ in range(64))
    return data


# --- device logs ------------------------------------------------------------------------------------------


def gen_evalcb(rng: random.Random, n: int) -> list[Case]:
    base = corpus("evalcb.txt").splitlines()
    cases = [Case("evalcb", "backtrack", ["compare", "-m", "{tiny}", "-p", "hi", "--against", "{dir}/log.txt"],
                  {"log.txt": ("embd = (f32) GET_ROWS(" + "a{1, " * 50_000 + ") = {1,").encode()}, bad=True),
             Case("evalcb", "ne-blank", ["compare", "-m", "{tiny}", "-p", "hi", "--against", "{dir}/log.txt"],
                  {"log.txt": b"embd = (f32) GET_ROWS(a{1}, b{2}) = {256, , 1, 1}\n"}, bad=True),
             Case("evalcb", "ne-digits", ["compare", "-m", "{tiny}", "-p", "hi", "--against", "{dir}/log.txt"],
                  {"log.txt": ("embd = (f32) GET_ROWS(a{1}, b{2}) = {" + "9" * 5000 + ", 1}\n").encode()},
                  bad=True)]
    for i in range(n - len(cases)):
        lines = _mutate_lines(rng, base, _sub_numbers(rng))
        cases.append(Case("evalcb", f"mutant-{i}",
                          ["compare", "-m", "{tiny}", "-p", "hi", "--against", "{dir}/log.txt"],
                          {"log.txt": _text_file(lines, rng)}))
    return cases


def gen_op_stream(rng: random.Random, n: int) -> list[Case]:
    types = ["q4_0", "q8_0", "f16", "f32", "q4_K", "iq4_nl", "bogus", "", "Q4_0"]
    ops = ["MUL_MAT", "FLASH_ATTN_EXT", "RMS_NORM", "MUL", "ADD", "ROPE", "SOFT_MAX", "X", "MUL_MAT ID"]
    dims = ["0", "1", "32", "33", "64", "4096", "9728", "65536", "1048576", "2147483648", "9" * 40, "", "-1"]

    def shape() -> str:
        return ",".join(rng.choice(dims) for _ in range(rng.choice([0, 1, 2, 3, 4, 5])))

    cases = []
    for i in range(n):
        lines = []
        for _ in range(rng.randint(1, 6)):
            op = rng.choice(ops)
            if rng.random() < 0.5:
                lines.append(f"KZOP {op} dst=[{shape()}] src0={rng.choice(types)}[{shape()}] "
                             f"src1={rng.choice(types)}[{shape()}]")
            else:
                lines.append(f"ggml-hex: execute-op {op}: a x b -> c : {shape().replace(',', ':')} x "
                             f"{shape().replace(',', ':')} -> {shape().replace(',', ':')} : {rng.choice(types)} x "
                             f"{rng.choice(types)} -> f32 : 1 : 2 : 3")
        content = _text_file(lines, rng)
        if rng.random() < 0.05:  # 200,000 lines: written when the case runs, not held by every case in memory
            content = _repeated((lines[0] + "\n").encode("utf-8", "surrogatepass"), 200_000)
        cases.append(Case("op-stream", f"lines-{i}", ["replay", "--op-stream", "{dir}/ops.txt"],
                          {"ops.txt": content}))
    return cases


def gen_crashlog(rng: random.Random, n: int) -> list[Case]:
    base = corpus("crash.txt").splitlines()
    cases = []
    for i in range(n):
        lines = _mutate_lines(rng, base, _sub_numbers(rng))
        argv = ["crashlog", "{dir}/crash.txt"]
        if rng.random() < 0.3:
            argv += ["-m", "{tiny}", "--n-prompt", rng.choice(["1", "38", "100", "100000000"])]
        cases.append(Case("crashlog", f"record-{i}", argv, {"crash.txt": _text_file(lines, rng)}))
    return cases


# --- gate policies ----------------------------------------------------------------------------------------


def _policy_values(rng: random.Random) -> str:
    return rng.choice(['"MUL_MAT"', "1", "1.5", "true", "[]", '["a", 1]', '"' + "(a+)+" * 20 + '"',
                       '"' + "x" * 100_000 + '"', "[" * 1000 + "]" * 1000, "{a = 1}", '"33-64"', '"-1--5"',
                       "99999999999999999999999", "-7", '"blk\\\\.0\\\\..*"', '"["', "nan", "inf"])


def gen_policy(rng: random.Random, n: int) -> list[Case]:
    base = corpus("policy.toml").splitlines()
    keys = ["op", "weight", "m", "node", "types", "reason", "cost", "version", "rules", "device", "profile"]
    cases = [Case("policy", "nest-1000", ["gate", "--explain", "{dir}/p.toml"],
                  {"p.toml": b"x = " + b"[" * 1000 + b"]" * 1000 + b"\n"}, bad=True)]
    for i in range(n - 1):
        lines = list(base)
        if rng.random() < 0.5:  # a rule of its own with one hostile value: a policy that may well be valid
            action = rng.choice(["cpu", "hvx", "hmx", "split", "split-op", "gpu"])
            lines += ["[[rule]]", f'name = "r{i}"', f'action = "{action}"',
                      f"{rng.choice(['op', 'type', 'k', 'n', 'm', 'node', 'why', 'modeled_s'])} = "
                      f"{_policy_values(rng)}"]
        else:
            for _ in range(rng.randint(1, 3)):
                lines.insert(rng.randrange(len(lines) + 1), f"{rng.choice(keys)} = {_policy_values(rng)}")
        lines = _mutate_lines(rng, lines, lambda s: s) if rng.random() < 0.3 else lines
        argv = (["gate", "--explain", "{dir}/p.toml"] if rng.random() < 0.5 else
                ["run", "-m", "{tiny}", "-p", "hi", "-n", "1", "-dev", "HTP0", "--gates", "{dir}/p.toml"])
        cases.append(Case("policy", f"policy-{i}", argv, {"p.toml": _text_file(lines, rng)}))
    return cases


# --- output paths and standard streams --------------------------------------------------------------------

READ_ONLY = "{dir}/ro"


def _read_only_dir(path: str) -> None:
    os.makedirs(path, exist_ok=True)
    os.chmod(path, stat.S_IRUSR | stat.S_IXUSR)


OUTPUT_TARGETS = ["/dev/full", READ_ONLY + "/out", "/proc/self/status", "/proc/version", "/sys/kernel/x",
                  "{dir}/missing/out", "{dir}", "", "/dev/null", "{dir}/ok.out"]


def gen_outputs(rng: random.Random, n: int) -> list[Case]:
    commands = [
        ["trace", "-m", "{tiny}", "-p", "hi", "-n", "1", "--quiet", "-o", "{target}"],
        ["run", "-m", "{tiny}", "-p", "hi", "-n", "1", "-dev", "HTP0", "--oplog-file", "{target}"],
        ["oracle", "--quick", "-o", "RMS_NORM", "--case", "RMS_NORM", "--csv", "{target}", "--no-progress"],
        ["oracle", "--quick", "-o", "RMS_NORM", "--case", "RMS_NORM", "--json", "{target}", "--no-progress"],
        ["make-model", "--preset", "tiny", "-o", "{target}"],
        ["compare", "-m", "{tiny}", "-p", "hi", "--json", "{target}"],
        ["gate", "-m", "{tiny}", "--auto", "-ub", "4", "-o", "{target}"],
        ["bench", "-m", "{tiny}", "-p", "8", "-n", "2", "-r", "1", "-o", "jsonl"],
        ["run", "-m", "{tiny}", "-p", "hi", "-n", "1", "--dump", "result_output", "{target}"],
        ["investigate", "-m", "{tiny}", "--n-prompt", "4", "-n", "1", "-o", "{target}", "--quiet"],
    ]
    cases = []
    for i in range(n):
        cmd = rng.choice(commands)
        target = rng.choice(OUTPUT_TARGETS)
        argv = [a.replace("{target}", target) for a in cmd]
        files = {"ro/.keep": b""} if target.startswith(READ_ONLY) else {}
        case = Case("outputs", f"{cmd[0]}-{i}", argv, files)
        if target.startswith(READ_ONLY):
            case.files = {"ro/.keep": b"", ".ro": lambda p: _read_only_dir(os.path.join(os.path.dirname(p), "ro"))}
        cases.append(case)
    return cases


def gen_streams(rng: random.Random, n: int) -> list[Case]:
    commands = [["run", "-m", "{tiny}", "-p", "hi", "-n", "8"], ["run", "-p", "Once upon a time", "-n", "4"],
                ["htp", "faults"], ["--help"], ["oracle", "--list"],
                ["bench", "-m", "{tiny}", "-p", "8", "-n", "2", "-r", "1"],
                ["trace", "-m", "{tiny}", "-p", "hi", "-n", "1"]]
    cases = []
    for i in range(n):
        mode = ["full", "closed", "broken"][i % 3]
        cases.append(Case("streams", f"{mode}-{i}", rng.choice(commands), stdout=mode))
    return cases


# --- environment ------------------------------------------------------------------------------------------

ENV_NAMES = ["KAZEIA_SIMD", "KAZEIA_CACHE_DIR", "KAZEIA_WEIGHT_CACHE_MB", "KAZEIA_GATE_CACHE",
             "KAZEIA_CPU_NODE_RANGE", "KAZEIA_NO_BIND", "KAZEIA_HTP_PROFILE", "KAZEIA_HTP_VTCM",
             "KAZEIA_HTP_FAULTS", "KAZEIA_HTP_RACE_SEED", "GGML_HEXAGON_OPBATCH", "GGML_HEXAGON_OPQUEUE",
             "GGML_HEXAGON_USE_HMX", "GGML_HEXAGON_NHVX", "GGML_HEXAGON_VERBOSE", "GGML_HEXAGON_OPMASK",
             "GGML_HEXAGON_OPFILTER", "GGML_HEXAGON_EXPERIMENTAL", "HOME", "TMPDIR", "OMP_NUM_THREADS",
             "OPENBLAS_NUM_THREADS"]
ENV_VALUES = ["", "0", "1", "2", "-1", "yes", "9" * 5000, "1e308", "nan", "{dir}/file", "{dir}/ro", "/proc",
              "/dev/null", "/nonexistent/x", "\u00e9", "a\tb", "1,2,,3", "hmx-bias-stale,nope", "2026-05", "x" * 5000]


def gen_env(rng: random.Random, n: int) -> list[Case]:
    commands = [["run", "-m", "{tiny}", "-p", "hi", "-n", "1"], ["run", "-m", "{tiny}", "-p", "hi", "-n", "1",
                                                                  "-dev", "HTP0"],
                ["htp", "faults"], ["gate", "-m", "{tiny}", "--explain"]]  # reads KAZEIA_GATE_CACHE's folder
    cases = []
    for i in range(n):
        env = {rng.choice(ENV_NAMES): rng.choice(ENV_VALUES) for _ in range(rng.randint(1, 2))}
        files = {"file": b"x", ".ro": lambda p: _read_only_dir(os.path.join(os.path.dirname(p), "ro"))}
        cases.append(Case("env", f"env-{i}", rng.choice(commands), files, env=env))
    return cases


# --- prompts ----------------------------------------------------------------------------------------------

BAD_TEXT = [b"\xff\xfe", b"caf\xe9", b"\xed\xa0\x80", b"\xc3", b"ok \x80 ok", b"\x00\x01", b"\xf4\x90\x80\x80",
            "\U0001f600".encode(), b"\xef\xbf\xbd"]


def gen_prompts(rng: random.Random, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        text = b"".join(rng.choice(BAD_TEXT) + b"x" for _ in range(rng.randint(1, 5)))
        as_arg = text.replace(b"\x00", b"").decode("utf-8", "surrogateescape")  # argv cannot carry a NUL
        how = i % 4
        if how == 0:
            case = Case("prompts", f"p-{i}", ["run", "-m", "{tiny}", "-p", as_arg, "-n", "1"], process=True)
        elif how == 1:
            case = Case("prompts", f"sys-{i}", ["run", "-m", "{tiny}", "-sys", as_arg, "-p", "hi", "-n", "1",
                                                "-st"], process=True)
        elif how == 2:
            case = Case("prompts", f"f-{i}", ["run", "-m", "{tiny}", "-f", "{dir}/p.txt", "-n", "1"],
                        {"p.txt": text})
        else:
            case = Case("prompts", f"chat-{i}", ["run", "-m", "{tiny}", "-cnv", "-n", "2"], stdin=text + b"\n")
        cases.append(case)
    return cases
