"""Gate policies (issue 11): the TOML format, rule matching, routing through the scheduler, split rules."""

from __future__ import annotations

import numpy as np
import pytest

from kazeia.backends.htp.vtcm.matmul.dispatch import matmul_node
from kazeia.cli.common import open_session
from kazeia.cli.main import build_parser
from kazeia.engine.policy import Policy, Rule, split_sizes
from kazeia.errors import KazeiaError

POLICY = """format = 1
[[rule]]
name = "down-hvx"
op = "MUL_MAT"
type = "Q4_0"
k = 9728
n = [2000, 3000]
m = [33, 64]
node = "^ffn_out-"
action = "hvx"
why = "test"
evidence = ["a", "b"]
modeled_s = 0.5
"""


def write(tmp_path, text: str, name: str = "p.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def session(*argv: str):
    args = build_parser("run").parse_args(["run", *argv])
    return open_session(args)


def test_policy_round_trips(tmp_path):
    pol = Policy.load(write(tmp_path, POLICY))
    again = Policy.from_dict(__import__("tomllib").loads(pol.to_toml()))
    assert [vars(r) | {"_re": None} for r in again.rules] == [vars(r) | {"_re": None} for r in pol.rules]
    r = pol.rules[0]
    assert (r.k, r.n, r.m, r.action, r.evidence, r.modeled_s) == ((9728, 9728), (2000, 3000), (33, 64), "hvx",
                                                                    ["a", "b"], 0.5)


@pytest.mark.parametrize("text, msg", [
    ("[[rule]]\nname='a'\naction='cpu'\n", "format = 1"),
    ("format = 1\nbogus = 2\n", "unknown key"),
    ("format = 1\n[[rule]]\nname='a'\naction='gpu'\n", "not one of"),
    ("format = 1\n[[rule]]\nname='a'\naction='cpu'\nm=[5, 2]\n", "empty"),
    ("format = 1\n[[rule]]\nname='a'\naction='cpu'\nk='x'\n", r"integer or \[lo, hi\]"),
    ("format = 1\n[[rule]]\nname='a'\naction='cpu'\nnode='('\n", "node regex"),
    ("format = 1\n[[rule]]\nname='a'\naction='split'\n", "split needs"),
    ("format = 1\n[[rule]]\nname='a'\naction='cpu'\n[[rule]]\nname='a'\naction='hvx'\n", "duplicate"),
    ("format = 1\n[[rule]]\nname='a'\naction='cpu'\nexec='rm -rf /'\n", "unknown key"),
    ("not toml [", "not a TOML"),
])
def test_bad_policies_are_one_line_errors(tmp_path, text, msg):
    with pytest.raises(KazeiaError, match=msg):
        Policy.load(write(tmp_path, text))


def test_rule_matches_every_field():
    r = Rule("x", "cpu", op="MUL_MAT", type="q4_0", k=(9728, 9728), n=(2560, 2560), m=(33, 64))
    node = matmul_node(38, 9728, 2560, "q4_0")
    assert r.matches(node)
    assert not r.matches(node, m=32) and not r.matches(node, m=65)
    assert not r.matches(matmul_node(38, 4096, 2560, "q4_0"))
    assert not r.matches(matmul_node(38, 9728, 2560, "q8_0"))
    assert not Rule("y", "cpu", node="^ffn").matches(node)  # the node is named 'matmul'
    assert Rule("y", "cpu", node="^mat").matches(node)


def test_split_sizes_avoid_the_range():
    pol = Policy([Rule("s", "split", op="MUL_MAT", m=(33, 64))])

    def nodes_for(t):
        return [matmul_node(t, 256, 64)]

    for n in range(1, 200):
        sizes = split_sizes(n, nodes_for, pol)
        assert sum(sizes) == n and not any(33 <= s <= 64 for s in sizes)
        if not 33 <= n <= 64:
            assert sizes == [n]
    assert split_sizes(38, nodes_for, pol) == [32, 6]


def _greedy(s, ids, n=3):
    logits = s.ctx.decode(ids)
    out = [np.array(logits[-1])]
    toks = []
    for _ in range(n):
        toks.append(int(np.argmax(out[-1])))
        out.append(np.array(s.ctx.decode([toks[-1]])[-1]))
    return toks, np.stack(out)


def test_cpu_rule_runs_what_cpu_ops_runs(tiny_qwen3_q4, tmp_path):
    """A policy sending every MUL_MAT to the CPU gives bitwise the logits of --cpu-ops MUL_MAT, and says which rule
    routed each node."""
    pol = write(tmp_path, 'format = 1\n[[rule]]\nname = "mm-cpu"\nop = "MUL_MAT"\naction = "cpu"\n')
    ids = list(range(5, 45))
    a = session("-m", tiny_qwen3_q4, "-dev", "HTP0", "--gates", pol)
    b = session("-m", tiny_qwen3_q4, "-dev", "HTP0", "--cpu-ops", "MUL_MAT")
    ta, la = _greedy(a, ids)
    tb, lb = _greedy(b, ids)
    assert ta == tb and np.array_equal(la, lb)
    mm = [p for p in a.scheduler.placements if p.op == "MUL_MAT"]
    assert mm and all(p.backend == "CPU" and p.reason.startswith("rule mm-cpu") for p in mm)


def test_hvx_rules_run_what_use_hmx_0_runs(tiny_qwen3_q4, tmp_path, monkeypatch):
    """HMX off per node by rules (matmuls and flash attention) equals HMX off for the whole device, bitwise, on a
    prompt long enough for HMX; the rule leaves the node on the device."""
    pol = write(tmp_path, 'format = 1\n[[rule]]\nname = "mm"\nop = "MUL_MAT"\naction = "hvx"\n'
                          '[[rule]]\nname = "fa"\nop = "FLASH_ATTN_EXT"\naction = "hvx"\n')
    ids = list(range(5, 45))
    a = session("-m", tiny_qwen3_q4, "-dev", "HTP0", "--gates", pol)
    c = session("-m", tiny_qwen3_q4, "-dev", "HTP0")
    monkeypatch.setenv("GGML_HEXAGON_NHMX", "0")  # 2026-10's switch (USE_HMX=0 under 2026-05)
    b = session("-m", tiny_qwen3_q4, "-dev", "HTP0")
    ta, la = _greedy(a, ids)
    tb, lb = _greedy(b, ids)
    _, lc = _greedy(c, ids)
    assert ta == tb and np.array_equal(la, lb)
    assert not np.array_equal(la, lc)  # HMX was really in use without the rules
    mm = [p for p in a.scheduler.placements if p.op == "MUL_MAT" and p.backend == "HTP0"]
    assert mm and all(p.reason.startswith("rule mm") for p in mm)


def test_split_rule_runs_what_a_smaller_ubatch_runs(tiny_qwen3_q4, tmp_path):
    """A split rule cutting M 33..64 runs a 38-token prompt as 32 + 6: bitwise the run with -ub 32."""
    pol = write(tmp_path, 'format = 1\n[[rule]]\nname = "cut"\nop = "MUL_MAT"\nm = [33, 64]\naction = "split"\n')
    ids = list(range(5, 43))
    a = session("-m", tiny_qwen3_q4, "-dev", "HTP0", "--gates", pol)
    seen = []
    a.ctx.on_ubatch = lambda i, n: seen.append(n)
    b = session("-m", tiny_qwen3_q4, "-dev", "HTP0", "-ub", "32")
    ta, la = _greedy(a, ids)
    tb, lb = _greedy(b, ids)
    assert seen[:2] == [32, 6]
    assert ta == tb and np.array_equal(la, lb)


def test_row_pieces():
    from kazeia.graph.rowsplit import row_pieces

    for m in range(1, 300):
        for lo, hi in ((33, 64), (2, 5), (1, 64), (65, 96)):
            p = row_pieces(m, lo, hi)
            assert sum(p) == m and all(x > 0 for x in p)
            if lo >= 2:
                assert not any(lo <= x <= hi for x in p)
