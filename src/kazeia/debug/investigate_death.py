"""Investigation steps for a device death (each returns (summary, reproduce command) and records findings)."""

from __future__ import annotations

from kazeia.debug.investigate import Context, logits_nmse, op_regex
from kazeia.debug.investigate_steps import cpu_nodes_spec, dump_op, out, sync_spec, validate_gate
from kazeia.debug.runner import run
from kazeia.errors import KazeiaError


def localise(cx: Context) -> tuple[str, str]:
    """OPBATCH=1, OPQUEUE=1: the failing batch holds exactly one op, so the host knows which op died."""
    spec = sync_spec(cx)
    r = run(spec)
    f = cx.findings
    if not r.death:
        f["sync_reproduces"] = False
        return "with one-op batches the run did NOT die (the fault needs batching: context-dependent)", spec.command()
    f["sync_reproduces"] = True
    ops = r.death.get("batch_ops") or []
    faulting = ops[0] if len(ops) == 1 else None
    f["faulting"] = faulting
    f["last_enqueued_sync"] = r.death["last_enqueued"]
    f["death"] = r.death
    facts = cx.facts.ops.get(faulting) if faulting else None
    f["faulting_facts"] = facts
    cx.inv.facts["faulting op (one-op batches)"] = faulting
    cx.inv.facts["last op enqueued when the host saw the error (one-op batches)"] = r.death["last_enqueued"]
    if facts and facts.m is not None:
        cx.inv.facts["faulting op"] = (f"{faulting}: {facts.op} {facts.weight} K={facts.k} N={facts.n} "
                                       f"M={facts.m} ({facts.wtype})")
    return (f"the failing batch held one op: {faulting}; the host was enqueueing {r.death['last_enqueued']} "
            f"when it read the error"), spec.command()


def misattribution(cx: Context) -> tuple[str, str]:
    """What the default configuration and the team's OPBATCH=1 setting would have pointed at."""
    f = cx.findings
    default_last = cx.first.death["last_enqueued"]
    team = cx.spec.with_(env={**cx.spec.env, "GGML_HEXAGON_OPBATCH": "1"})
    r = run(team)
    team_last = r.death["last_enqueued"] if r.death else None
    f["last_enqueued_default"], f["last_enqueued_team"] = default_last, team_last
    order = [p["node"] for p in r.placements] if r.placements else cx.facts.order
    faulting = f.get("faulting")
    dist = (order.index(team_last) - order.index(faulting)) if team_last in order and faulting in order else None
    f["team_distance"] = dist
    cx.inv.facts["last op enqueued at the error, defaults (OPBATCH=1024, OPQUEUE=16)"] = default_last
    cx.inv.facts["last op enqueued at the error, OPBATCH=1 (the team's setting)"] = team_last
    why = (f"{dist} ops after the faulting one: with up to OPQUEUE=16 one-op batches in flight, the host reads "
           f"the failed response only when the queue is full or at the next synchronization" if dist else "")
    return (f"defaults blame {default_last}; OPBATCH=1 blames {team_last} ({why}); neither is the faulting op"
            if team_last != faulting else f"OPBATCH=1 already points at {team_last}"), team.command()


def trace_summary(cx: Context) -> tuple[str, str]:
    """NaN-aware statistics of every op that completed before the fault, and of the faulting op's inputs."""
    facts = cx.facts
    done = [facts.ops[n] for n in facts.order if facts.ops[n].out_stats is not None or facts.ops[n].in_stats]
    # the KQ mask holds -inf by design: count it apart from the activations
    nonfinite = [(o.name, s.nonfinite) for o in done
                 for s in [o.out_stats, *(x for x, nm in zip(o.in_stats, o.srcs) if "mask" not in nm)]
                 if s and s.nonfinite]
    amax_in = max((s.amax for o in done for s in o.in_stats if s), default=0.0)
    amax_out = max((o.out_stats.amax for o in done if o.out_stats), default=0.0)
    fo = cx.findings.get("faulting_facts") or facts.fault
    fin = [s for s in (fo.in_stats if fo else []) if s]
    cx.findings.update(nonfinite_before=nonfinite, amax_inputs=amax_in, amax_outputs=amax_out,
                       fault_inputs=fin, ops_completed=sum(1 for o in done if o.out_stats))
    cx.inv.facts["non-finite values before the fault"] = len(nonfinite)
    cx.inv.facts["largest |x| in any op input / output before the fault"] = f"{amax_in:.4g} / {amax_out:.4g}"
    if fin:
        cx.inv.facts["faulting op input"] = "; ".join(s.short() for s in fin)
    _plot_amax(cx, done)
    return (f"{cx.findings['ops_completed']} ops completed before the fault; {len(nonfinite)} non-finite "
            f"tensors; max |input| {amax_in:.4g}, max |output| {amax_out:.4g} (fp16 max 65504)"), \
        cx.spec.command() + " --oplog"


def _axes(width: float, height: float):
    """(figure, axes) on an Agg canvas (kazeia.debug.plots), or None without matplotlib: these plots are optional."""
    from kazeia.debug.plots import new_figure

    try:
        fig = new_figure(width, height)
    except KazeiaError:
        return None
    return fig, fig.subplots()


def _save_image(cx: Context, fig, name: str, caption: str) -> None:
    fig.tight_layout()
    path = out(cx, name)
    fig.savefig(path, dpi=110)
    cx.inv.images[caption] = path


def _plot_amax(cx: Context, ops) -> None:
    drawn = _axes(9, 3.2)
    if drawn is None:
        return
    fig, ax = drawn
    xs = [o.index for o in ops if o.out_stats]
    ys = [max(o.out_stats.amax, 1e-12) for o in ops if o.out_stats]
    ax.semilogy(xs, ys, ".-", label="max |output| (finite values)")
    ax.axhline(65504, color="r", ls="--", label="fp16 max 65504")
    fo = cx.findings.get("faulting_facts")
    if fo:
        ax.axvline(fo.index, color="k", ls=":", label=f"fault: {fo.name}")
    ax.set_xlabel("node index")
    ax.set_ylabel("|x|")
    ax.legend(fontsize=8)
    _save_image(cx, fig, "amax.png", "Activation magnitude along the graph, up to the fault")


def dump(cx: Context) -> tuple[str, str]:
    from kazeia.debug.dump import compare_captures, find_pair

    name = cx.findings.get("faulting")
    if not name:
        return "no single faulting op to dump", ""
    d, dumps = dump_op(cx, name, "both")
    complete = next((x for x in dumps if x.capture == "complete"), None)
    enqueue = find_pair(dumps, complete) if complete else None
    cx.findings["dump_dir"] = d
    cx.findings["dump"] = complete
    summary = f"dumped {name} to {d}"
    if complete is not None and enqueue is not None:
        diff = compare_captures(enqueue, complete)
        cx.findings["capture_diff"] = diff
        summary += "; enqueue-time capture vs the consumed inputs: " + " ".join(diff.describe()[1:])
    return summary, cx.spec.command() + f" --dump '{op_regex(name)}' {d} --dump-at both"


def replay(cx: Context) -> tuple[str, str]:
    from kazeia.debug.replay import replay as do_replay

    dmp = cx.findings.get("dump")
    if dmp is None:
        return "nothing to replay", ""
    alone_ctx = do_replay(dmp, with_context=True)
    robust = do_replay(dmp, htp_profile="robust")
    cx.findings.update(replay=alone_ctx, replay_robust=robust)
    d = cx.findings["dump_dir"]
    return (f"same profile: {alone_ctx.verdict()} -> {alone_ctx.diagnosis()}; robust profile: "
            f"{robust.verdict()}"), f"kazeia replay {d} --with-context"


def routing(cx: Context) -> tuple[str, str]:
    """Move op classes off the device and see whether the death follows them."""
    f = cx.findings
    faulting = f.get("faulting")
    trials = {"HMX off (GGML_HEXAGON_USE_HMX=0)": cx.spec.with_(env={**cx.spec.env, "GGML_HEXAGON_USE_HMX": "0"}),
              "all MUL_MAT on the CPU": cx.spec.with_(cpu_ops="MUL_MAT"),
              "FLASH_ATTN_EXT on the CPU": cx.spec.with_(cpu_ops="FLASH_ATTN_EXT")}
    if faulting:
        trials[f"only {faulting} on the CPU"] = cpu_nodes_spec(cx, [faulting])
    team = f.get("last_enqueued_team")
    if team and team != faulting and cx.facts.ops.get(team) and cx.facts.ops[team].op == "MUL_MAT":
        trials[f"only {team} on the CPU (what the logs blamed)"] = cpu_nodes_spec(cx, [team])
    results = {}
    for label, spec in trials.items():
        r = run(spec)
        e = logits_nmse(r.logits, cx.reference_logits)
        results[label] = {"died": bool(r.death), "nmse": e, "command": spec.command()}
    f["routing"] = results
    parts = [f"{k}: {'dies' if v['died'] else 'completes'}" for k, v in results.items()]
    return "; ".join(parts), ""


def _faulting_matmul(cx: Context):
    """(facts of the faulting op, VTCM size, HTP profile of the run), or None if that op is not a MUL_MAT."""
    from kazeia.backends.htp.vtcm import DEFAULT_VTCM_SIZE

    fo = cx.findings.get("faulting_facts")
    if fo is None or fo.m is None:
        return None
    return fo, cx.spec.vtcm or DEFAULT_VTCM_SIZE, cx.spec.htp_profile or "robust"


def plan(cx: Context) -> tuple[str, str]:
    from kazeia.backends.htp.plan import plan_matmul
    from kazeia.cli.htp import plan_svg

    found = _faulting_matmul(cx)
    if found is None:
        return "the faulting op is not a MUL_MAT: no matmul plan", ""
    fo, vt, prof = found
    p = plan_matmul(fo.m, fo.k, fo.n, fo.wtype, vtcm_size=vt, profile=prof)
    pr = plan_matmul(fo.m, fo.k, fo.n, fo.wtype, vtcm_size=vt, profile="robust")
    cx.findings.update(plan=p, plan_robust=pr)
    cx.inv.facts["HMX plan of the faulting op"] = (f"{prof}: path {p.path}, mc={p.mc} nc={p.nc}, used {p.used} B of "
                                                   f"{p.vtcm} B, overflow {p.overflow} B, outcome {p.outcome}")
    cx.inv.facts["same op under robust"] = (f"path {pr.path}, mc={pr.mc} nc={pr.nc}, used {pr.used} B, "
                                            f"outcome {pr.outcome}")
    shown = p if p.path == "hmx" else (p.hmx_attempt or p)
    cx.inv.svgs[f"VTCM map of {fo.name} (M={fo.m}, {prof})"] = plan_svg(shown)
    log = [line for line in cx.first.dsp_log if "VTCM overflow" in line or "exception" in line]
    cx.findings["dsp_log"] = log
    if log:
        cx.inv.facts["DSP log (FARF; on a device only with root)"] = f"{len(log)} lines, e.g. {log[0]}"
    cmd = f"kazeia htp plan --m {fo.m} --k {fo.k} --n {fo.n} --type {fo.wtype} --htp-profile {prof} --vtcm {vt}"
    return (f"{prof}: used {p.used} B of {p.vtcm} B -> overflow {p.overflow} B ({p.status}, {p.outcome}); robust: "
            f"{pr.used} B, {pr.outcome}"), cmd


def threshold(cx: Context) -> tuple[str, str]:
    """Predict the failing M from the plan arithmetic, then confirm the boundaries with real runs."""
    from kazeia.backends.htp.plan import plan_matmul
    from kazeia.debug.bisect import OracleJudge, bisect_m

    found = _faulting_matmul(cx)
    if found is None:
        return "no matmul shape to scan", ""
    fo, vt, prof = found
    limit = min(1024, cx.spec.ubatch)
    plans = {m: plan_matmul(m, fo.k, fo.n, fo.wtype, vtcm_size=vt, profile=prof) for m in range(1, limit + 1)}
    bad = [m for m, p in plans.items() if p.outcome == "reenter"]
    ranges = _ranges(bad)
    cx.findings["predicted_ranges"] = ranges
    _plot_plan(cx, fo, vt)
    here = next(((lo, hi) for lo, hi in ranges if lo <= fo.m <= hi), None)
    if here is None:
        return f"plan arithmetic predicts failures for M in {ranges or 'none'}; the run's M={fo.m} is not in them", ""
    judge = OracleJudge(fail_regex=r"0x0000002e", isolate=False)
    spec = cx.spec.with_(n_prompt=fo.m, prompt=None, tokens=None)
    res = bisect_m(spec, judge, fail_m=fo.m, predicted=here, limit=limit)
    cx.findings["m_result"] = res
    if res.confirmed:
        cx.findings["failing_range"] = here
        cx.inv.facts["failing prompt lengths (M)"] = (f"{here[0]}..{here[1]} (predicted by the plan, boundaries "
                                                      f"confirmed)")
    return f"predicted {ranges}; runs: {res.message}", f"kazeia bisect m ... --n-prompt {fo.m}"


def _ranges(ms: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for m in ms:
        if out and out[-1][1] == m - 1:
            out[-1] = (out[-1][0], m)
        else:
            out.append((m, m))
    return out


def _plot_plan(cx: Context, fo, vt: int) -> None:
    from kazeia.backends.htp.plan import plan_matmul

    drawn = _axes(9, 3.4)
    if drawn is None:
        return
    fig, ax = drawn
    ms = list(range(1, 257))
    for prof, style in (("2026-05", "r.-"), ("robust", "g.--")):
        head = []
        for m in ms:
            p = plan_matmul(m, fo.k, fo.n, fo.wtype, vtcm_size=vt, profile=prof)
            head.append(vt - (p.hmx_attempt.used if p.hmx_attempt is not None else p.used))
        ax.plot(ms, head, style, ms=3, lw=0.8, label=f"VTCM headroom of the plan, {prof}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_yscale("symlog", linthresh=1024)
    rng = cx.findings.get("predicted_ranges") or []
    for lo, hi in rng:
        ax.axvspan(lo - 0.5, hi + 0.5, color="r", alpha=0.12, label=f"fails: M={lo}..{hi}")
    ax.set_xlabel("M (tokens in the micro-batch); M < 32 runs on HVX")
    ax.set_ylabel("VTCM - used (bytes, symlog)")
    ax.set_title(f"{fo.name}: K={fo.k} N={fo.n} {fo.wtype}, VTCM {vt} B")
    ax.legend(fontsize=8)
    _save_image(cx, fig, "plan_vs_m.png", "HMX VTCM plan size vs M for the faulting op")


def rows(cx: Context) -> tuple[str, str]:
    from kazeia.debug.bisect import ddmin_rows, dump_rows_replay

    dmp = cx.findings.get("dump")
    if dmp is None or dmp.op != "MUL_MAT":
        return "no matmul dump", ""
    values, replay_fn, config = dump_rows_replay(dmp)
    res = ddmin_rows(values, replay_fn, config=config)
    cx.findings["rows"] = res
    return res.message, f"kazeia bisect rows {cx.findings['dump_dir']}"


def gate(cx: Context) -> tuple[str, str]:
    """Propose the gate the evidence points at and validate it by rerunning the failing configuration."""
    f = cx.findings
    p = f.get("plan")
    if p is not None and p.path == "hmx" and not p.fits:
        g = "vtcm-plan"
        desc = ("Before enqueueing a MUL_MAT, compute its HMX VTCM plan on the host (the same arithmetic the DSP "
                "runs) and keep on the CPU every MUL_MAT whose plan would not fit; on a device the equivalent is "
                "routing ffn_down at these M to HVX/CPU, or choosing -ub so no micro-batch has M in the range.")
    elif f.get("faulting"):
        g = f"weight=^{f['faulting_facts'].weight}$,m=1-1024" if f.get("faulting_facts") and \
            f["faulting_facts"].weight else None
        desc = f"route {f['faulting']} to the CPU"
    else:
        return "no gate to propose", ""
    spec = cx.spec.with_(gates=[g]) if g else cpu_nodes_spec(cx, [f["faulting"]])
    ok = validate_gate(cx, spec, desc)
    return f"gate {g}: {'validated' if ok else 'NOT validated'}", spec.command()
