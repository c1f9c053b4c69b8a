"""kazeia check (issue 22, deliverable 3): a GGUF header against every version and arch.

Headers are written with gguf-py's GGUFWriter at real shapes and cut after the header (check reads nothing more).
Oracles: upstream's own October planner (tests/data/htp_2026_10_plans.json, computed by matmul-ops.h compiled
outside the repository), the seed's May numbers (docs/seed.md: ffn_down's 8,388,864-byte HMX layout at M 33..64),
the version's supports_op rules restated from the sources, and real runs of the emulator for every class."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

from cli_utils import kazeia_clean as _kazeia
from kazeia.backends.htp import plan_matmul
from kazeia.debug.check import check_model
from kazeia.debug.check.outcomes import Config, Planner
from kazeia.debug.check.weights import WeightClass
from kazeia.errors import KazeiaError


def write_header(path: str, arch: str, meta: dict, tensors: list[tuple[str, tuple[int, ...], Q]]) -> str:
    """A GGUF of `arch` whose tensors (name, ne (ggml order), type) are declared but whose data is absent."""
    w = GGUFWriter(path, arch)
    for k, v in meta.items():
        (w.add_uint32 if isinstance(v, int) else w.add_string)(f"{arch}.{k}" if "." not in k else k, v)
    for name, ne, qt in tensors:
        bs, ts = GGML_QUANT_SIZES[qt]
        nbytes = int(np.prod(ne)) // bs * ts
        byte_shape = (*reversed(ne[1:]), ne[0] // bs * ts)  # gguf-py takes quantized shapes in bytes per row
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def dense(n_layer: int, embd: int, ff: int, q: int, kv: int, vocab: int, qt: Q = Q.Q4_0, tied: bool = True,
          extra: tuple = ()) -> list:
    """llama.cpp's tensor names of a dense decoder (qwen3/llama/granite/gemma3 share them)."""
    t = [("token_embd.weight", (embd, vocab), qt), ("output_norm.weight", (embd,), Q.F32)]
    if not tied:
        t.append(("output.weight", (embd, vocab), Q.Q6_K if qt != Q.Q4_0 else Q.Q4_0))
    for i in range(n_layer):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", (embd,), Q.F32), (b + "attn_q.weight", (embd, q), qt),
              (b + "attn_k.weight", (embd, kv), qt), (b + "attn_v.weight", (embd, kv), qt),
              (b + "attn_output.weight", (q, embd), qt), (b + "ffn_norm.weight", (embd,), Q.F32),
              (b + "ffn_gate.weight", (embd, ff), qt), (b + "ffn_up.weight", (embd, ff), qt),
              (b + "ffn_down.weight", (ff, embd), qt)] + [(b + name, shape, typ) for name, shape, typ in extra]
    return t


@pytest.fixture(scope="module")
def qwen3_4b(tmp_path_factory) -> str:
    meta = {"block_count": 36, "embedding_length": 2560, "attention.head_count": 32, "attention.head_count_kv": 8,
            "attention.key_length": 128, "attention.value_length": 128}
    return write_header(str(tmp_path_factory.mktemp("h") / "qwen3-4b.gguf"), "qwen3", meta,
                        dense(36, 2560, 9728, 4096, 1024, 151936))


def _ranges(report, profile, arch, role):
    r = report.result(profile, arch)
    return [(rg.m_lo, rg.m_hi, rg.step.outcome, rg.used_max) for label, rs in r.ranges.items()
            if label.startswith(f"blk.*.{role}.") for rg in rs]


def test_the_seeds_qwen3_4b(qwen3_4b):
    """May crashes at M 33..64 in ffn_down with 8 MiB (the seed: an 8,388,864-byte layout), on every arch with
    HMX; v68/v69 have no HMX and run; 2026-10 fixes it, except that on v73 #26123's risk applies from M = 5;
    and 2026-10 opens no session below v73."""
    rep = check_model(qwen3_4b)
    assert os.path.getsize(qwen3_4b) < 1 << 20  # a header: nothing else to read
    for arch in (73, 75, 79, 81):
        down = _ranges(rep, "2026-05", arch, "ffn_down")
        assert [x for x in down if x[2] == "death"] == [(33, 64, "death", 8388864)]
        assert rep.result("2026-05", arch).verdict == "death"
        assert rep.result("robust", arch).verdict not in ("death", "risk", "dropped")
    for arch in (68, 69):
        assert {o for label, rs in rep.result("2026-05", arch).ranges.items() for o in (r.step.path for r in rs)
                } <= {"hvx", "cpu"}
        assert rep.result("2026-10", arch).verdict == "no-session"
    for arch in (75, 79):
        assert rep.result("2026-10", arch).verdict in ("hmx", "hvx", "cpu")
    v81 = _ranges(rep, "2026-10", 81, "ffn_down")  # #25876 (reported on v81): its HMX MUL_MATs carry the risk
    assert {o for _, _, o, _ in v81} == {"hvx", "risk"} and rep.result("2026-10", 81).verdict == "risk"
    risk = _ranges(rep, "2026-10", 73, "ffn_down")
    assert [(lo, hi, o) for lo, hi, o, _ in risk] == [(1, 4, "hvx"), (5, 512, "risk")]
    lm = rep.result("2026-05", 79).ranges["token_embd.weight (tied lm_head) q4_0 2560x151936"]
    assert [(r.m_lo, r.m_hi, r.step.outcome) for r in lm] == [(1, 1, "cpu")]  # May: > 16384 weight rows


def test_every_october_plan_of_upstreams_own_solver():
    """The 600 answers of October's matmul-ops.h (compiled outside the repository) through check's planner."""
    rows = json.load(open(os.path.join(os.path.dirname(__file__), "data", "htp_2026_10_plans.json"), encoding="utf-8"))
    planner = Planner()
    for r in (r for r in rows if r["src2"] == 0):
        c = Config("2026-10", 79, r["vtcm"], 4096, r["threads"])
        s = planner.step(c, WeightClass("x", r["type"], r["k"], r["n"], ["blk.0.x.weight"]), r["m"])
        want = r["upstream"]
        assert s.path == want[0], r
        if want[0] == "hmx":
            assert (s.mc, s.nc, s.used) == (want[1], want[2], want[4]), r
        elif want[0] == "hvx":
            assert s.used == want[3], r


@pytest.mark.parametrize("arch_name, meta, tensors", [
    ("gemma3", {"block_count": 26, "embedding_length": 1152, "attention.head_count": 4,
                "attention.head_count_kv": 1, "attention.key_length": 256, "attention.value_length": 256},
     dense(26, 1152, 6912, 1024, 256, 262144, extra=(("post_attention_norm.weight", (1152,), Q.F32),
                                                       ("post_ffw_norm.weight", (1152,), Q.F32),
                                                       ("attn_q_norm.weight", (256,), Q.F32)))),
    ("phi3", {"block_count": 32, "embedding_length": 3072, "attention.head_count": 24,
              "attention.head_count_kv": 8},
     [("token_embd.weight", (3072, 200064), Q.Q4_0), ("output.weight", (3072, 200064), Q.Q4_0)]
     + [t for i in range(32) for t in ((f"blk.{i}.attn_qkv.weight", (3072, 5120), Q.Q4_0),
                                       (f"blk.{i}.attn_output.weight", (3072, 3072), Q.Q4_0),
                                       (f"blk.{i}.ffn_up.weight", (3072, 16384), Q.Q4_0),
                                       (f"blk.{i}.ffn_down.weight", (8192, 3072), Q.Q4_0))]),
    ("granite", {"block_count": 40, "embedding_length": 4096, "attention.head_count": 32,
                 "attention.head_count_kv": 8}, dense(40, 4096, 12800, 4096, 1024, 49155, qt=Q.Q4_K, tied=False)),
])
def test_architectures_kazeia_does_not_run(tmp_path, arch_name, meta, tensors):
    """Every MUL_MAT weight placed by its llama.cpp name, and each class's ranges are the version's supports_op
    rule, then the plan, over every M, at VTCM sizes drawn here (no test names them)."""
    path = write_header(str(tmp_path / f"{arch_name}.gguf"), arch_name, meta, tensors)
    rng = random.Random(arch_name)
    vtcms = (rng.randrange(2 << 20, 16 << 20, 4096), rng.randrange(2 << 20, 16 << 20, 4096))
    rep = check_model(path, archs=(75,), vtcms=vtcms, ubatches=(96,))
    h = rep.header
    assert not h.not_placed and h.arch == arch_name
    n_mm = sum(1 for name, ne, _ in tensors if len([d for d in ne if d > 1]) == 2 and "norm" not in name
               and name != "token_embd.weight")
    assert sum(len(c.tensors) for c in rep.classes if not c.tied) == n_mm
    for r in rep.results:
        c = r.config
        for w in rep.classes:
            rs = r.ranges[w.label]
            assert rs[0].m_lo == 1 and rs[-1].m_hi == (1 if w.m_max == 1 else 96)
            for rg in rs:
                for m in {rg.m_lo, (rg.m_lo + rg.m_hi) // 2, rg.m_hi}:
                    may_cpu = c.generation != "2026-10" and (w.qtype not in ("q4_0", "q4_1", "q8_0", "iq4_nl",
                                                                            "mxfp4", "f16") or w.n > 16384)
                    if may_cpu:
                        assert rg.step.outcome == "cpu"
                        continue
                    p = plan_matmul(m, w.k, w.n, w.qtype, vtcm_size=c.vtcm, profile=c.profile, n_threads=6)
                    want = {"reenter": "death", "dropped": "dropped"}.get(p.outcome, p.path)
                    assert rg.step.outcome == want and rg.used_min <= p.used <= rg.used_max, (c.key(), w.label, m)
                    if m == rg.m_lo:
                        assert rg.step.used == p.used


def test_what_it_cannot_place_and_what_is_not_a_model(tmp_path):
    path = write_header(str(tmp_path / "foo.gguf"), "foo", {"block_count": 1},
                        [("blk.0.attn_q.weight", (256, 256), Q.Q4_0), ("blk.0.warp_drive.weight", (256, 512), Q.Q4_0),
                         ("blk.0.ffn_gate_exps.weight", (256, 512, 8), Q.Q4_0)])
    rep = check_model(path, archs=(79,))
    assert rep.header.not_placed == ["blk.0.warp_drive.weight"]
    assert rep.header.matmul_id == ["blk.0.ffn_gate_exps.weight"]
    assert [c.label for c in rep.classes] == ["blk.*.attn_q.weight q4_0 256x256"]
    empty = write_header(str(tmp_path / "empty.gguf"), "llama", {"block_count": 1}, [])
    norms = write_header(str(tmp_path / "norms.gguf"), "llama", {}, [("output_norm.weight", (64,), Q.F32)])
    for bad, words in ((empty, "no tensors"), (norms, "no MUL_MAT weight")):
        with pytest.raises(KazeiaError) as e:
            check_model(bad)
        assert words in str(e.value) and "\n" not in str(e.value)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(open(path, "rb").read()[:100])
    with pytest.raises(KazeiaError) as e:
        check_model(str(cut))
    assert "\n" not in str(e.value)


def test_the_cli_table_json_and_heat_map(qwen3_4b, tmp_path):
    r = _kazeia("check", "-m", qwen3_4b, "--htp-arch", "v73,v79", "--json", "--html", str(tmp_path / "h.html"))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    cfg = next(c for c in d["configs"] if c["profile"] == "2026-05" and c["arch"] == "v79")
    down = next(w for w in cfg["weights"] if w["name"] == "blk.7.ffn_down.weight")
    dead = next(x for x in down["ranges"] if x["m"] == [33, 64])
    assert dead["outcome"] == "death" and dead["vtcm_bytes"] == [8388864, 8388864]
    assert "class=axis" in (tmp_path / "h.html").read_text()  # the bars on their M axis
    bad = _kazeia("check", "-m", qwen3_4b, "--htp-arch", "v70")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_prediction_holds_against_real_runs(q4b2):
    """Every class's predicted path at M = 38 against the emulator's own run of that model (--oplog's KZOP lines):
    2026-10 and robust run every class as predicted (the last layer's FFN at M = 1); 2026-05 dies where check says
    it dies (blk.0.ffn_down, M 38)."""
    rep = check_model(q4b2, archs=(79,), ubatches=(38,))
    for profile in ("2026-10", "robust", "2026-05"):
        want = {}
        for w in rep.classes:
            rg = rep.result(profile, 79).ranges[w.label][-1]
            for name in w.tensors:
                want[name] = rg.step
        run = _kazeia("run", "-m", q4b2, "-dev", "HTP0", "--htp-profile", profile, "--n-prompt", "38", "-n", "1",
                      "--temp", "0", "--oplog")
        seen = {}
        for line in run.stderr.splitlines():
            if line.startswith("KZOP") and " MUL_MAT " in line and "(blk." in line:
                name = line.split("(")[1].split(")")[0]
                seen[name] = line.split()[4]
        for name, path in seen.items():
            step = want[name]
            assert path == ("CPU/cpu" if step.path == "cpu" else f"HTP0/{step.path}"), (profile, name, path, step)
        deaths = [n for n, s in want.items() if s.outcome == "death"]
        assert (run.returncode == 3) == bool(deaths), (profile, run.returncode, deaths)
        if deaths:
            assert deaths == ["blk.0.ffn_down.weight"] and "0x0000002e" in run.stderr
