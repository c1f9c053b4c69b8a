"""kazeia compare --against LOG on a real llama-eval-callback log (tests/data/eval_callback_qwen3_tiny_f32_values.txt,
recorded with llama.cpp's own binary on the tiny F32 Qwen3, see tests/data/README.md): unmodified it compares
clean against kazeia's float64 reference of the same graph (tokens taken from the log); with one tensor's
printed values altered as a device fault would alter them (zeroed, scaled by one constant, one bad tile) the
first tensor departing is that one, with that signature; the tensors after it (computed by llama.cpp from the
true values) stay clean."""

from __future__ import annotations

import os
import re

import pytest

from kazeia.debug.evalcb import compare_log, parse_log, reference_nodes
from kazeia.engine.session import RunSpec

LOG = os.path.join(os.path.dirname(__file__), "data", "eval_callback_qwen3_tiny_f32_values.txt")
NUM = re.compile(r"-?\d+\.\d+")


@pytest.fixture(scope="module")
def reference(tiny_qwen3):
    log, tokens = parse_log(open(LOG).read())
    return log, reference_nodes(RunSpec(model=tiny_qwen3, tokens=tokens, device="REF"))


def _substitute(line: str, values: list[float]) -> str:
    it = iter(values)
    return NUM.sub(lambda m: f"{next(it):.4f}", line)


def altered(name: str, fn, sum_fn) -> str:
    """The log with the printed rows of the first tensor called `name` passed through fn(row_index, values)."""
    out, inside, row = [], False, 0
    for line in open(LOG).read().splitlines():
        if "common_debug_cb_eval:" in line:
            inside = line.split("common_debug_cb_eval:")[1].strip().startswith(f"{name} = ") and not row
        elif inside and line.strip().startswith("sum ="):
            line = f"    sum = {sum_fn(float(line.split('=')[1])):f}"
            inside, row = False, -1
        elif inside and NUM.search(line) and "[" in line:
            vals = [float(x) for x in NUM.findall(line)]
            new = fn(row, vals)
            line = _substitute(line, new)
            row += 1
        out.append(line)
    return "\n".join(out)


def test_log_parses_with_tokens_and_values():
    log, tokens = parse_log(open(LOG).read())
    assert tokens == [564, 531, 258, 369, 497, 484, 258, 371, 520, 494]
    assert len(log) == 76 and log[0].name == "embd" and log[-1].name == "result_output"
    q = next(t for t in log if t.name == "Qcur-0")
    assert q.ne == (256, 10, 1, 1) and len(q.values) == len(q.indices()) == 36 and q.sum is not None


def test_unmodified_log_compares_clean(reference):
    log, nodes = reference
    checks = compare_log(log, nodes)
    assert not [c for c in checks if c.status == "DEPARTS"]
    judged = [c for c in checks if c.status == "OK"]
    assert len(judged) >= 40 and {"Qcur-0", "ffn_out-1", "result_output", "node_25"} <= {c.name for c in judged}


@pytest.mark.parametrize("target", ["ffn_out-0", "attn_norm-1"])
def test_altered_tensor_is_named_with_its_signature(reference, target):
    _, nodes = reference
    cases = {
        "zeros": (lambda r, v: [0.0] * len(v), lambda s: 0.0),
        "scaled": (lambda r, v: [x * 0.25 for x in v], lambda s: s * 0.25),
        "tile": (lambda r, v: [x + 3.0 if i < 3 else x for i, x in enumerate(v)], lambda s: s + 3.0 * 32 * 10),
    }
    for kind, (fn, sfn) in cases.items():
        log, _ = parse_log(altered(target, fn, sfn))
        checks = compare_log(log, nodes)
        bad = [c for c in checks if c.status == "DEPARTS"]
        assert bad and bad[0].name == target, (kind, [(c.name, c.reason) for c in bad])
        assert len(bad) == 1, (kind, [c.name for c in bad])
        sig = bad[0].signature
        if kind == "zeros":
            assert sig.names()[0] == "zeros"
        elif kind == "scaled":
            s = sig.get("scaled")
            assert s is not None and abs(s.value - 0.25) < 2e-3
        else:
            reg = sig.get("region")
            assert reg is not None and reg.where["cols"] == [0, 1, 2] and reg.where["col_tiles"] == [0]
            assert "(0,0)" in reg.summary
