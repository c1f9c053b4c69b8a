"""Issue 11's figures: the gated run of a Qwen3-4B-shaped model under 2026-05, against robust and the cpu backend.

    python bench/bench_gates.py -m MODEL.gguf [--tokens 38] [-ub 512] [--profile 2026-05] [--vtcm B] [--no-run]

1. `gate --auto` for the model (child-process validation; a second call reads the cache and does no work, both
   timed and printed);
2. MODELED prefill tokens/s of the prefill graph (cost.py, not a measurement): all-HMX on `robust`, gated on the
   profile (the policy's rules applied to the graph), and the alternatives the policy did not pick;
3. unless --no-run: the gated run on HTP0 (completes?), the NMSE of its last logits against the cpu backend, and
   the recovery run (no gates, --recover) with its tokens against the gated run's.
Uses KAZEIA_GATE_CACHE (default ~/.cache/kazeia/gates).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kazeia.backends.htp import HtpSettings, graph_seconds
from kazeia.cli.common import open_session
from kazeia.cli.main import build_parser
from kazeia.debug.gate.auto import auto_policy
from kazeia.debug.judge import nmse
from kazeia.engine.context import Model
from kazeia.engine.policy import PolicyGate
from kazeia.models.shapes import shape_caches, ubatch_graph


def modeled_tps(model: Model, settings: HtpSettings, t: int, gate=None) -> float:
    g = ubatch_graph(model.args, model.weights, shape_caches(model.args, t + 256), t, 256)
    for n in g.nodes:
        n.route_path = n.route_rule = None
        r = gate(n) if gate is not None else None
        if r is not None:
            n.route_path = r.path
    return t / graph_seconds(g.nodes, settings)[0]


def session(*argv: str):
    return open_session(build_parser("run").parse_args(["run", *argv]))


def greedy(s, ids, n):
    logits = np.array(s.ctx.decode(ids)[-1])
    toks = [int(np.argmax(logits))]
    for _ in range(n - 1):
        toks.append(int(np.argmax(s.ctx.decode([toks[-1]])[-1])))
    return logits, toks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokens", type=int, default=38)
    ap.add_argument("-ub", type=int, default=512)
    ap.add_argument("--profile", default="2026-05")
    ap.add_argument("--vtcm", type=int, default=None)
    ap.add_argument("-n", type=int, default=4, help="tokens to generate in the runs")
    ap.add_argument("--no-run", action="store_true")
    a = ap.parse_args()
    settings = HtpSettings.from_env(profile=a.profile, vtcm_bytes=a.vtcm)
    t0 = time.perf_counter()
    res = auto_policy(a.model, settings, a.ub)
    print(f"gate --auto: {res.classes} classes, {res.child_runs} child runs, {res.cases} cases, "
          f"{len(res.policy.rules)} rule(s), {time.perf_counter() - t0:.1f} s (cached: {res.cached})")
    t0 = time.perf_counter()
    again = auto_policy(a.model, settings, a.ub)
    print(f"gate --auto again: cached {again.cached}, {again.child_runs} child runs, {again.cases} cases, "
          f"{time.perf_counter() - t0:.2f} s")
    for r in res.policy.rules:
        print(f"  rule {r.name}: {r.action} ({r.evidence[-1] if r.evidence else ''})")
    model = Model.load(a.model)
    robust = modeled_tps(model, HtpSettings.from_env(profile="robust", vtcm_bytes=a.vtcm), a.tokens)
    gated = modeled_tps(model, settings, a.tokens, PolicyGate(res.policy))
    print(f"modeled prefill of {a.tokens} tokens (cost model): robust {robust:.1f} tok/s, {a.profile} gated "
          f"{gated:.1f} tok/s = {100 * gated / robust:.1f} % of robust")
    for alt in ("hvx", "cpu", "split-op"):
        pol = type(res.policy)([type(r)(r.name, alt, r.op, r.type, r.k, r.n, r.m) for r in res.policy.rules])
        print(f"  every rule as {alt}: {modeled_tps(model, settings, a.tokens, PolicyGate(pol)):.1f} tok/s")
    if a.no_run:
        return
    ids = list(range(1000, 1000 + a.tokens))
    common = ("-m", a.model, "-ub", str(a.ub), "-dev", "HTP0", "--htp-profile", a.profile)
    if a.vtcm:
        common += ("--vtcm", str(a.vtcm))
    t0 = time.perf_counter()
    lg, toks = greedy(session(*common, "--gates", "auto"), ids, a.n)
    print(f"gated run: completed, tokens {toks} ({time.perf_counter() - t0:.0f} s)")
    cpu, _ = greedy(session("-m", a.model, "-ub", str(a.ub), "-dev", "CPU"), ids, 1)
    print(f"logits NMSE gated HTP0 vs cpu: {nmse(lg, cpu):.3g} (acceptance <= 5e-4)")
    t0 = time.perf_counter()
    s = session(*common, "--recover")
    _, rt = greedy(s, ids, a.n)
    rec = s.ctx.recovery
    print(f"recovery run: {rec.deaths} deaths, {rec.recoveries} recovered micro-batch(es), rules "
          f"{[r.name + ':' + r.action for r in rec.rules_added]}, tokens {rt} ({'==' if rt == toks else '!='} "
          f"gated) ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
