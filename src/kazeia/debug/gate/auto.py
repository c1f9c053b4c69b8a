"""`kazeia gate --auto`: validate the model's op classes on the device model, write the policy that routes only the
failing ones away, pick each alternative by modeled time, cache the result.

Per class (classes.py) the device's default path is run at the class's smallest and largest M in a child
process against REF; a failing class then has its alternatives validated the same way: `hvx` (the device with
HMX off for it) and `cpu` (the host backend), and `split` (cut the micro-batch so M avoids the class's range)
is valid when every piece size falls in classes that passed, and so is `split-op` (only that matmul cut along
M, graph/rowsplit.py) when the pieces pass for its own weight shape. Among the valid alternatives the one with the
best modeled prefill time of a micro-batch at the class's largest M wins: the HTP cost model for device time,
the stated phone-CPU model (cost.PhoneCpu) for the host. The policy is cached under the key (model file hash,
profile, VTCM size, fault set, kazeia version and a digest of the device model's source, plus the micro-batch
limit and the HMX/arch/NHVX switches that change plans).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import kazeia
from kazeia import __version__, settings
from kazeia.backends.htp import (
    PHONE_CPU,
    HtpSettings,
    graph_seconds,
    hmx_matmul_seconds,
    hvx_matmul_seconds,
    matmul_node,
    op_seconds,
)
from kazeia.debug.gate.classes import OpClass, conv_node, enumerate_classes
from kazeia.engine.context import Model
from kazeia.engine.policy import Policy, Rule
from kazeia.engine.session import load_model
from kazeia.errors import KazeiaError
from kazeia.graph.rowsplit import row_pieces, split_path
from kazeia.graph.tensor import GGMLType
from kazeia.limits import open_regular, read_json_object
from kazeia.models.shapes import shape_caches, ubatch_graph
from kazeia.native.threads import child_threads
from kazeia.outputs import ensure_folder, write_text

CHILD_TIMEOUT_S = 300.0


@dataclass
class AutoResult:
    policy: Policy
    cache_path: str
    cached: bool
    child_runs: int = 0
    cases: int = 0
    seconds: float = 0.0
    classes: int = 0
    failing: list[str] = field(default_factory=list)


def model_hash(path: str) -> str:
    """sha256 of the file, memoized beside the cache by (real path, size, mtime) so a second run reads nothing."""
    st = os.stat(path)
    memo = os.path.join(cache_dir(), "hashes.json")
    key = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}"
    try:
        known = read_json_object(memo, "gate cache memo", max_bytes=4 << 20)
    except KazeiaError:  # missing or damaged: hash again and write it anew
        known = {}
    if key in known:
        return known[key]
    h = hashlib.sha256()
    with open_regular(path, "model file") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    known[key] = h.hexdigest()
    ensure_folder(os.path.dirname(memo), "the gate cache (KAZEIA_GATE_CACHE)")
    write_text(memo, json.dumps(known))
    return known[key]


def cache_dir() -> str:
    """KAZEIA_GATE_CACHE (kazeia/settings.py), or ~/.cache/kazeia/gates."""
    return settings.get().gate_cache or os.path.join(os.path.expanduser("~"), ".cache", "kazeia", "gates")


@functools.lru_cache(maxsize=1)
def device_model_digest() -> str:
    """A digest of the device model's and graph builders' source: a policy validated by other code of the same
    kazeia version is not reused (the version alone let a stale policy survive a change to the emulator)."""
    root = Path(kazeia.__file__).parent
    h = hashlib.sha256()
    for sub in ("backends/htp", "graph", "models"):
        for f in sorted((root / sub).rglob("*.py")):  # the units' folders too (host/, vtcm/, ...)
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _switches(settings: HtpSettings) -> dict[str, str]:
    """The version's own switches a child must see (2026-05: USE_HMX; 2026-10: NHMX, the selects, OPFUSION and a
    VTCM grant; both: the VMEM budget and the weight buffer size), by their env names."""
    memory = {"GGML_HEXAGON_MBUF": str(settings.mbuf_mib)}  # (the VMEM budget a batch maps against)
    if settings.vmem_mib is not None:
        memory["GGML_HEXAGON_VMEM"] = str(settings.vmem_mib)
    if not settings.caps.env_selects:
        return {"GGML_HEXAGON_USE_HMX": str(int(settings.use_hmx)), **memory}
    env = {f"GGML_HEXAGON_{k.upper()}": str(getattr(settings, k))
           for k in ("nhmx", "mm_select", "fa_select", "gdn_select", "opfusion")}
    if settings.vtcm_grant is not None:
        env["KAZEIA_HTP_VTCM_GRANT"] = str(settings.vtcm_grant)
    return {**env, **memory}


def source_of(model_path: str, settings: HtpSettings, ubatch: int) -> dict:
    return {"model": os.path.basename(model_path), "model_sha256": model_hash(model_path),
            "profile": settings.profile, "vtcm": settings.vtcm_bytes, "faults": sorted(settings.faults),
            "kazeia": __version__, "code": device_model_digest(), "ubatch": ubatch, "arch": settings.arch,
            "nhvx": settings.nhvx, **_switches(settings)}


def cache_path_for(source: dict) -> str:
    key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:24]
    return os.path.join(cache_dir(), f"{key}.toml")


def auto_policy(model_path: str, settings: HtpSettings, ubatch: int = 512, jobs: int = 2,
                progress: Callable[[int, int, str], None] | None = None, use_cache: bool = True) -> AutoResult:
    """The cached policy for this (model, settings), or a new one validated now."""
    t0 = time.perf_counter()
    source = source_of(model_path, settings, ubatch)
    path = cache_path_for(source)
    if use_cache and os.path.exists(path):
        pol = Policy.load(path)
        return AutoResult(pol, path, True, seconds=time.perf_counter() - t0, classes=-1)
    model = load_model(model_path)  # the process's loaded model (investigate, bisect, gate share one mmap)
    classes, _ = enumerate_classes(model, settings, ubatch)
    res = AutoResult(Policy(source=source, path=path), path, False, classes=len(classes))
    verdicts = _validate(model_path, classes, settings, {c.key: [None] for c in classes}, jobs, progress, res)
    failing = [c for c in classes if not all(v["ok"] for v in verdicts[c.key])]
    passing_ms: dict = {}  # M values whose classes passed: per weight shape, and for every shape ("any")
    for c in classes:
        passing_ms.setdefault((c.wtype, c.k, c.n), set()).update(c.ms if c not in failing else ())
    shapes = {(c.wtype, c.k, c.n) for c in classes if c.op == "MUL_MAT"}
    passing_ms["any"] = set.intersection(*(passing_ms[s] for s in shapes)) if shapes else set()
    if failing:
        alts = _validate(model_path, failing, settings, {
            c.key: ["hvx", "cpu"] if c.path == "hmx" and c.op == "MUL_MAT" else ["cpu"] for c in failing},
            jobs, progress, res)
        for c in failing:
            res.failing.append(c.key)
            rule = _rule_for if c.op == "MUL_MAT" else _op_rule_for
            res.policy.rules.append(rule(model, settings, c, verdicts[c.key], alts[c.key], passing_ms))
    ensure_folder(os.path.dirname(path), "the gate cache (KAZEIA_GATE_CACHE)")
    res.policy.save(path)
    res.seconds = time.perf_counter() - t0
    return res


def _validate(model_path: str, classes: list[OpClass], settings: HtpSettings, paths: dict[str, list],
              jobs: int, progress, res: AutoResult) -> dict[str, list[dict]]:
    """Every class's cases, one child per weight shape (the model is loaded once per child)."""
    groups: dict[tuple, list[OpClass]] = {}
    for c in classes:
        groups.setdefault((c.op, c.wtype, c.k, c.n), []).append(c)
    todo = []
    for cs in groups.values():
        cases = sorted({(m, p or "default") for c in cs for p in paths[c.key] for m in c.representatives()})
        todo.append((cs, cases))
    out: dict[str, list[dict]] = {}
    done, total = 0, len(todo)

    def one(item):
        cs, cases = item
        return cs, {(d["m"], d["path"]): d for d in _run_child(model_path, cs[0].weights[0], cases, settings,
                                                                 child_threads(share=jobs), cs[0].op)}

    if progress:
        progress(0, total, "starting")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for cs, got in pool.map(one, todo):
            for c in cs:
                out[c.key] = [got[(m, p or "default")] for p in paths[c.key] for m in c.representatives()]
            done += 1
            res.child_runs += 1
            res.cases += len(got)
            if progress:
                progress(done, total, f"{cs[0].op} {cs[0].wtype} K={cs[0].k} N={cs[0].n}: {len(got)} cases")
    return out


def _run_child(model_path: str, weight: str, cases: list[tuple[int, str]], settings: HtpSettings,
               threads: int | None = None, op: str = "MUL_MAT") -> list[dict]:
    env = {"GGML_HEXAGON_NHVX": str(settings.nhvx), "GGML_HEXAGON_ARCH": str(settings.arch), **_switches(settings)}
    job = {"model": model_path, "op": op, "weight": weight, "cases": [[m, p] for m, p in cases],
           "settings": {"profile": settings.profile, "vtcm": settings.vtcm_bytes, "faults": list(settings.faults),
                        "env": env}, "threads": threads}
    with tempfile.TemporaryDirectory(prefix="kazeia-gate-") as tmp:
        jp = os.path.join(tmp, "job.json")
        with open(jp, "w") as f:
            json.dump(job, f)
        try:
            proc = subprocess.run([sys.executable, "-m", "kazeia.debug.gate.child", jp], capture_output=True,
                                  text=True, timeout=CHILD_TIMEOUT_S)
            stdout, why = proc.stdout, f"child exited with status {proc.returncode}"
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            why = f"child timed out after {CHILD_TIMEOUT_S:.0f} s (hang)"
    got: dict[tuple, dict] = {}
    running = None
    for line in stdout.splitlines():
        d = json.loads(line)
        if "start" in d:
            running = tuple(d["start"])
        elif "m" in d:
            got[(d["m"], d["path"])] = d
            running = None
    out = []
    for m, p in cases:
        d = got.get((m, p))
        if d is None:  # the child died or hung in (or before) this case
            tail = "" if running == (m, p) else " (not reached)"
            d = {"m": m, "path": p, "ok": False, "evidence": why + tail}
        out.append(d)
    return out


def _graph_s(model: Model, settings: HtpSettings, t: int, route: dict[str, str] | None = None) -> float:
    g = ubatch_graph(model.args, model.weights, shape_caches(model.args, t + 256), t, 256)
    for n in g.nodes:
        if route and n.op == "MUL_MAT" and n.src[0].weight_name in route:
            n.route_path = route[n.src[0].weight_name]
    return graph_seconds(g.nodes, settings)[0]


def _rule_for(model: Model, settings: HtpSettings, c: OpClass, default: list[dict], alts: list[dict],
              passing_ms: set[int]) -> Rule:
    m_hi = c.ms[-1]
    wtype = GGMLType[c.wtype.upper()]
    ok = {p: all(v["ok"] for v in alts if v["path"] == p) for p in ("hvx", "cpu")}
    options: dict[str, float] = {}
    for p in ("hvx", "cpu"):
        if ok.get(p) and any(v["path"] == p for v in alts):
            options[p] = _graph_s(model, settings, m_hi, {w: p for w in c.weights})
    lo = c.ms[0]
    if lo >= 2 and len(c.ranges()) == 1:  # the pieces' M must be validated classes of this shape
        pieces = row_pieces(m_hi, lo, m_hi)
        if all(p in passing_ms.get((c.wtype, c.k, c.n), ()) for p in pieces):
            options["split-op"] = _graph_s(model, settings, m_hi, {w: split_path(lo, m_hi) for w in c.weights})
        if all(p in passing_ms.get("any", ()) for p in pieces):
            options["split"] = sum(_graph_s(model, settings, p) for p in pieces)
    ev = [f"M={v['m']} {v['path']}: {'ok' if v['ok'] else 'FAILED'}: {v['evidence']}" for v in default + alts]
    if not options:
        return Rule(f"{c.rule_name}-cpu", "cpu", "MUL_MAT", c.wtype, (c.k, c.k), (c.n, c.n), (lo, m_hi),
                    why=f"{c.describe()} fails and no alternative validated; the host is the last resort",
                    evidence=ev)
    best = min(options, key=options.get)
    # the cost model prices a failing HMX plan as the HVX it would need: put the HMX time back for "all-HMX"
    all_hmx = _graph_s(model, settings, m_hi) + c.nodes_per_ubatch * (
        hmx_matmul_seconds(m_hi, c.k, c.n, wtype, c.plan[3] or 32) - hvx_matmul_seconds(m_hi, c.k, c.n, wtype))
    ev.append("modeled prefill of a micro-batch of " + f"{m_hi} tokens: " + ", ".join(
        f"{p} {m_hi / s:.1f} tok/s" for p, s in sorted(options.items(), key=lambda kv: kv[1]))
        + f"; all-HMX (had it not failed) {m_hi / all_hmx:.1f} tok/s")
    if best == "split-op":
        per_node = sum(hmx_or_hvx_seconds(settings, p, c.k, c.n, wtype) for p in row_pieces(m_hi, lo, m_hi))
    else:
        per_node = {"hvx": hvx_matmul_seconds(m_hi, c.k, c.n, wtype),
                    "cpu": PHONE_CPU.matmul_seconds(m_hi, c.k, c.n, wtype)}.get(best)
    return Rule(f"{c.rule_name}-{best}", best, "MUL_MAT", c.wtype, (c.k, c.k), (c.n, c.n), (lo, m_hi),
                why=f"{c.describe()}: the default path fails ({_first_failure(default)}); {best} is the fastest "
                    f"alternative that validates",
                evidence=ev, modeled_s=per_node)


def _op_rule_for(model: Model, settings: HtpSettings, c: OpClass, default: list[dict], alts: list[dict],
                 passing_ms: dict) -> Rule:
    """A failing non-matmul class (a short conv's kernel): its nodes at those M go to the host, the one alternative
    (validated or not: the host is the last resort either way)."""
    ev = [f"M={v['m']} {v['path']}: {'ok' if v['ok'] else 'FAILED'}: {v['evidence']}" for v in default + alts]
    lo, hi = c.ms[0], c.ms[-1]
    cpu_ok = all(v["ok"] for v in alts)
    modeled = PHONE_CPU.op_seconds(conv_node(model.weights[c.weights[0]], hi))
    return Rule(f"{c.rule_name}-cpu", "cpu", c.op, m=(lo, hi),
                why=f"{c.describe()}: the default path fails ({_first_failure(default)}); the host "
                    + ("validates" if cpu_ok else "is the last resort (it did not validate either)"),
                evidence=ev, modeled_s=modeled)


def hmx_or_hvx_seconds(settings: HtpSettings, m: int, k: int, n: int, wtype: GGMLType) -> float:
    """Modeled seconds of one MUL_MAT piece of m rows on the path its own plan takes."""
    return op_seconds(matmul_node(m, k, n, wtype), settings).seconds


def _first_failure(verdicts: list[dict]) -> str:
    v = next((v for v in verdicts if not v["ok"]), None)
    return f"M={v['m']}: {v['evidence']}" if v else "?"


def explain(policy: Policy) -> str:
    """Every rule, why it exists (its failing cases with their evidence) and its modeled cost."""
    lines = [f"policy {policy.path}: {len(policy.rules)} rule(s)"]
    src = policy.source
    if src:
        lines.append(f"  for {src.get('model')} (sha256 {str(src.get('model_sha256', ''))[:12]}), profile "
                     f"{src.get('profile')}, VTCM {src.get('vtcm')} B, faults {src.get('faults') or 'none'}, "
                     f"kazeia {src.get('kazeia')}, M 1..{src.get('ubatch')}")
    if not policy.rules:
        lines.append("  no rule: every op class validated on its default path")
    for r in policy.rules:
        match = " ".join(f"{k}={_fmt(getattr(r, k))}" for k in ("op", "type", "k", "n", "m", "node")
                         if getattr(r, k) is not None)
        lines.append(f"rule {r.name}: {match} -> {r.action}")
        if r.why:
            lines.append(f"  why: {r.why}")
        for e in r.evidence:
            lines.append(f"  - {e}")
        if r.modeled_s is not None:
            lines.append(f"  modeled: {r.modeled_s * 1e6:.1f} us per node under this rule")
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, tuple):
        return str(v[0]) if v[0] == v[1] else f"{v[0]}..{v[1]}"
    return str(v)
