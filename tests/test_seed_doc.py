"""docs/seed.md cannot rot: every command block marked `<!-- check -->` runs, and its output must hold what the
document says it does.

A checked block is a ```console block right after a `<!-- check -->` line. In it, a line starting with `$ ` is a
command (shell syntax, run with bash in one working directory for the whole document, where `q4b2.gguf` is the
seed's model: `kazeia make-model --preset qwen3-4b --layers 2`, the real Qwen3 tokenizer; `kazeia` is this
checkout's). The lines after a command are what its output (stdout and stderr together) must show: consecutive
lines must appear as consecutive output lines, in order; a line `...` allows any output in between; `{*}` in a
line matches any text; `(exit status N)` checks the command's exit status; blank lines count on neither side.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # the doc's commands: some twenty runs of the 2-layer 4B-shaped model

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "seed.md")
CHECK = "<!-- check -->"


def checked_blocks(text: str) -> list[list[tuple[str, list[str]]]]:
    """Each checked block: [(command, expected lines)]."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == CHECK:
            assert lines[i + 1].startswith("```console"), f"line {i + 2}: a check marker needs a console block"
            j = i + 2
            body = []
            while not lines[j].startswith("```"):
                body.append(lines[j])
                j += 1
            blocks.append(_commands(body))
            i = j
        i += 1
    return blocks


def _commands(body: list[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    k = 0
    while k < len(body):
        line = body[k]
        assert line.startswith("$ "), f"a checked block starts with a command, not {line!r}"
        cmd = line[2:]
        while cmd.endswith("\\"):  # a continued line: bash reads backslash-newline as a space
            k += 1
            cmd = cmd + "\n" + body[k]
        k += 1
        expect = []
        while k < len(body) and not body[k].startswith("$ "):
            expect.append(body[k])
            k += 1
        out.append((cmd, expect))
    return out


def _pattern(line: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(p) for p in line.split("{*}")))


def check_output(output: str, rc: int, expect: list[str]) -> str | None:
    """None if the output holds the expectation, else what is missing."""
    got = [ln.rstrip() for ln in output.splitlines() if ln.strip()]  # blank lines are layout, not output
    runs: list[list[str]] = [[]]
    for line in expect:
        m = re.fullmatch(r"\(exit status (\d+)\)", line.strip())
        if m:
            if rc != int(m.group(1)):
                return f"exit status {rc}, expected {m.group(1)}"
        elif line.strip() == "...":
            runs.append([])
        elif line.strip():
            runs[-1].append(line.rstrip())
    pos = 0
    for run in (r for r in runs if r):
        pats = [_pattern(x) for x in run]
        for start in range(pos, len(got) - len(run) + 1):
            if all(p.fullmatch(got[start + i]) for i, p in enumerate(pats)):
                pos = start + len(run)
                break
        else:
            return f"not found (in order, consecutively) after output line {pos}: {run}"
    return None


def test_check_output_rules():
    out = "a\nb x\n\nc\nd\n"
    assert check_output(out, 0, ["a", "b {*}", "...", "d", "(exit status 0)"]) is None
    assert check_output(out, 0, ["b x", "c"]) is None  # the blank line between them is not output
    assert check_output(out, 0, ["a", "c"]) is not None  # not consecutive
    assert check_output(out, 0, ["d", "...", "a"]) is not None  # not in order
    assert check_output(out, 1, ["a", "(exit status 0)"]) is not None


@pytest.fixture(scope="module")
def workdir(q4b2_real, tmp_path_factory):
    d = tmp_path_factory.mktemp("seed_doc")
    os.symlink(q4b2_real, d / "q4b2.gguf")
    return d


def run_blocks(blocks, cwd, env: dict) -> list[str]:
    """Run every checked command in `cwd` with bash; what each one's output lacks (empty: all hold)."""
    env = dict(env)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    failures = []
    for block in blocks:
        for cmd, expect in block:
            # one pipe for stdout and stderr: the lines in the order a terminal shows them
            r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=900)
            problem = check_output(r.stdout, r.returncode, expect)
            if problem:
                failures.append(f"$ {cmd}\n  {problem}\n  output tail: {r.stdout.splitlines()[-6:]}")
    return failures


def test_every_checked_command_shows_what_the_document_says(workdir):
    blocks = checked_blocks(open(DOC, encoding="utf-8").read())
    assert len(blocks) >= 10
    failures = run_blocks(blocks, workdir, dict(os.environ))
    assert not failures, "\n".join(failures)
