"""`kazeia check`'s outputs: the text table (verdict matrix, then each failing configuration's classes and M
ranges, its safest settings, modeled speed and VMEM), the JSON (every configuration, every weight by its GGUF
name with its M ranges) and the HTML heat map (weights x M, coloured by outcome)."""

from __future__ import annotations

import html
import math

from kazeia.debug.check import FAILING, CheckReport, ConfigResult, safest_settings
from kazeia.debug.check.outcomes import SEVERITY, Range

MiB = 1 << 20
COLOURS = {"hmx": "#2e7d32", "hvx": "#81c784", "cpu": "#ffd54f", "risk": "#fb8c00", "dropped": "#8e24aa",
           "death": "#c62828", "no-session": "#424242"}


def _role(label: str) -> str:
    """'blk.*.ffn_down.weight q4_0 ...' -> 'ffn_down'; the tied lm_head -> 'lm_head'."""
    if "(tied lm_head)" in label:
        return "lm_head"
    return label.split()[0].replace("blk.*.", "").replace(".weight", "")


def _short(r: ConfigResult) -> str:
    """One cell of the verdict matrix."""
    if r.verdict == "no-session":
        return "no session (GenieX #1170)"
    fails = r.failing()
    cpu = sorted({_role(label) + (f" ({rg.step.report})" if rg.step.report else "")
                  for label, rs in r.ranges.items() for rg in rs if rg.step.outcome == "cpu"})
    on_cpu = f"; CPU: {', '.join(cpu[:3])}{f' +{len(cpu) - 3}' if len(cpu) > 3 else ''}" if cpu else ""
    if not fails and not r.ops:
        return "runs" + on_cpu
    by_outcome: dict[str, list[str]] = {}
    reports: dict[str, str] = {}
    for label, rg in fails:
        by_outcome.setdefault(rg.step.outcome, []).append(f"{_role(label)} M {_m(rg)}")
        if rg.step.report:
            reports.setdefault(rg.step.outcome, rg.step.report)
    for o in r.ops:
        by_outcome.setdefault(o.outcome, []).append(f"{o.op} M {o.m()}" if o.outcome == "wrong" else o.op)
        if o.report:
            reports.setdefault(o.outcome, o.report)
    word = {"death": "crash", "dropped": "garbage", "risk": "risk", "wrong": "wrong numbers",
            "depends": "depends on the run (stale src1 shortcut: run upgrade)"}
    parts = []
    for outcome, items in sorted(by_outcome.items(), key=lambda kv: SEVERITY[kv[0]]):
        more = f" +{len(items) - 2}" if len(items) > 2 else ""
        report = reports.get(outcome)
        parts.append(f"{word[outcome]}{f' ({report})' if report else ''}: {', '.join(items[:2])}{more}")
    return "; ".join(parts) + on_cpu


def _m(rg: Range) -> str:
    return str(rg.m_lo) if rg.m_lo == rg.m_hi else f"{rg.m_lo}..{rg.m_hi}"


def text(report: CheckReport) -> str:
    h = report.header
    out = [f"kazeia check: {h.path}",
           f"  {h.arch}, {h.n_layer} layers, {len(report.classes)} MUL_MAT weight classes "
           f"({sum(len(c.tensors) for c in report.classes)} tensors), {h.device_bytes / MiB:.1f} MiB on the device, "
           f"KV {h.kv_bytes(report.ctx) / MiB:.1f} MiB at -c {report.ctx}"]
    if h.matmul_id:
        out.append(f"  MUL_MAT_ID expert weights, not planned: {len(h.matmul_id)} (e.g. {h.matmul_id[0]})")
    if h.not_placed:
        out.append(f"  not placed (names llama.cpp's table does not know): {', '.join(h.not_placed[:8])}"
                   + (f" +{len(h.not_placed) - 8}" if len(h.not_placed) > 8 else ""))
    groups: dict[tuple, dict[str, dict[int, ConfigResult]]] = {}
    for r in report.results:
        c = r.config
        groups.setdefault((c.vtcm, c.ubatch, c.n_seq), {}).setdefault(c.profile, {})[c.arch] = r
    for (vtcm, ub, n_seq), by_profile in groups.items():
        profiles = list(by_profile)
        archs = sorted({a for d in by_profile.values() for a in d})
        seqs = f" -np {n_seq}," if n_seq > 1 else ""
        out += ["", f"verdicts at -ub {ub},{seqs} VTCM {vtcm} B:", "",
                "| arch | " + " | ".join(profiles) + " |", "| --- |" + " --- |" * len(profiles)]
        for a in archs:
            out.append(f"| v{a} | " + " | ".join(_short(by_profile[p][a]) if a in by_profile[p] else "-"
                                                 for p in profiles) + " |")
    shown: set[str] = set()
    for r in report.results:
        if r.verdict not in FAILING or r.verdict == "no-session":
            continue
        body = _detail(r)
        if body in shown:  # another arch with the same outcome table: say so once
            continue
        shown.add(body)
        same = [f"v{x.config.arch}" for x in report.results if x.verdict == r.verdict and _detail(x) == body
                and x.config.profile == r.config.profile and x.config.ubatch == r.config.ubatch
                and x.config.n_seq == r.config.n_seq]
        seqs = f", -np {r.config.n_seq}" if r.config.n_seq > 1 else ""
        out += ["", f"## {r.config.profile} on {', '.join(same)}, VTCM {r.config.vtcm} B, -ub {r.config.ubatch}{seqs}: "
                    f"{r.verdict}", body]
        archs = tuple(int(a[1:]) for a in same)
        out += ["safest fast settings:"] + [f"  {s}" for s in safest_settings(r, report, archs)]
    out += ["", "modeled speed (the emulator's cost model, the one upgrade and bench print; the phone CPU's for the "
                "ops that go to the CPU; -np N: the MUL_MATs alone):"]
    first = (report.results[0].config.vtcm, report.results[0].config.ubatch)
    for r in report.results:
        c = r.config
        if (c.vtcm, c.ubatch) != first:
            continue
        seqs = f" np {c.n_seq}" if c.n_seq > 1 else ""
        out.append(f"  {c.profile:8s} v{c.arch}{seqs}: " + ("no session" if r.prefill_tps is None else
                   f"prefill {r.prefill_tps:.1f} t/s ({r.n_prompt}-token prompt, -ub {c.ubatch}), decode "
                   f"{r.decode_tps:.1f} t/s" + ("" if r.rates_of == "graph" else
                                               f" (MUL_MATs alone: {r.rates_of})")))
    out += ["", "VMEM (the DSP address space the host budgets for mappings; kazeia counts weights and F16 KV, not the "
                "compute buffer):"]
    seen = set()
    for r in report.results:
        v, c = r.vmem, r.config
        key = (c.generation, v["budget"])
        if key in seen:
            continue
        seen.add(key)
        archs = [f"v{x.config.arch}" for x in report.results
                 if x.config.generation == c.generation and x.vmem["budget"] == v["budget"]]
        out.append(f"  {c.generation} {'/'.join(dict.fromkeys(archs))}: budget {v['budget'] / MiB:.0f} MiB, weights "
                   f"{v['weights'] / MiB:.0f} + KV {v['kv'] / MiB:.0f} MiB: "
                   + ("fits" if v["fits"] else "does not fit at once: batches flush and the DSP drops and remakes "
                      "mappings (on v73, #26123's address-space hypothesis: kazeia's, unverified; GenieX #1155: \"a "
                      "single NPU (HTP) can use only ~3.5GB\", and two HTPs, GGML_HEXAGON_DEVICES=2 with --device "
                      "HTP0,HTP1, ran Gemma-4-E4B there)"))
    if report.buffers:
        out += ["", "Buffers (load time: the weights in the HTP buffer type, packed as llama.cpp allocates them):",
                *report.buffers]
    if report.queue:
        out += ["", *report.queue]
    return "\n".join(out)


def _detail(r: ConfigResult) -> str:
    lines = ["| weight class | M | path | outcome | VTCM bytes | why |", "| --- | --- | --- | --- | ---: | --- |"]
    lines += [f"| {o.op} (not a weight's MUL_MAT) | {o.m()} | - | {o.outcome}{f' ({o.report})' if o.report else ''} "
              f"| - | {o.reason} |" for o in r.ops]
    for label, rs in r.ranges.items():
        for rg in rs:
            s = rg.step
            used = "-" if not rg.used_max else (str(rg.used_max) if rg.used_min == rg.used_max
                                                 else f"{rg.used_min}..{rg.used_max}")
            lines.append(f"| {label} | {_m(rg)} | {s.path} | {s.outcome}{f' ({s.report})' if s.report else ''} | "
                         f"{used} | {s.reason.replace('|', '/')} |")  # the whole reason: a viewer wraps it
    return "\n".join(lines)


def to_dict(report: CheckReport) -> dict:
    h = report.header
    configs = []
    for r in report.results:
        c = r.config
        weights = []
        for w in report.classes:
            rs = [rg.to_dict() for rg in r.ranges[w.label]]
            weights += [{"name": name, "class": w.label, "type": w.qtype, "k": w.k, "n": w.n, "ranges": rs}
                        for name in w.tensors]
        configs.append({"profile": c.profile, "arch": f"v{c.arch}", "vtcm": c.vtcm, "ubatch": c.ubatch,
                        "n_seq": c.n_seq, "verdict": r.verdict, "summary": _short(r),
                        "ops": [{"op": o.op, "m": [o.m_lo, o.m_hi], "outcome": o.outcome, "why": o.reason,
                                 "report": o.report} for o in r.ops], "prefill_tps": r.prefill_tps,
                        "decode_tps": r.decode_tps, "vmem": r.vmem, "safest": safest_settings(r, report),
                        "weights": weights})
    return {"model": h.path, "arch": h.arch, "n_layer": h.n_layer, "ctx": report.ctx, "matmul_id": h.matmul_id,
            "not_placed": h.not_placed, "buffers": report.buffers, "hmx_queue": report.queue, "configs": configs}


def heatmap_html(report: CheckReport) -> str:
    """One chart per configuration: a bar per weight class on one M axis shared by every bar (log2: M 1..4 and
    33..64 stay visible beside 512), each M range coloured by its outcome, its reason on hover."""
    e = html.escape
    parts = ["<!doctype html><meta charset=utf-8><title>kazeia check</title><style>body{font:13px sans-serif}"
             ".row{display:flex;align-items:center;height:16px}.l{width:360px;flex:none;white-space:nowrap;"
             "overflow:hidden;text-overflow:ellipsis;padding-right:8px}.bar{position:relative;width:900px;height:14px;"
             "background:#eee}.seg{position:absolute;top:0;height:14px}.axis{position:relative;width:900px;height:18px;"
             "border-top:1px solid #444}.tick{position:absolute;top:2px;font-size:11px;transform:translateX(-50%)}"
             "</style>", f"<h1>kazeia check: {e(report.header.path)}</h1><p>"]
    parts += [f"<span style='background:{col};padding:0 8px'>&nbsp;</span> {k} " for k, col in COLOURS.items()]
    parts.append("</p>")
    for r in report.results:
        c = r.config
        m_max = max((rg.m_hi for rs in r.ranges.values() for rg in rs), default=1)
        span = math.log2(m_max + 1)
        x = lambda m, s=span: 100.0 * math.log2(m) / s  # noqa: E731 - the left edge of M, in % of the bar
        parts.append(f"<h2>{e(c.key())}: {e(_short(r))}</h2>")
        for label, rs in r.ranges.items():
            segs = "".join(f"<div class=seg title='{e(label)}: M {_m(rg)}: {e(rg.step.outcome)}: {e(rg.step.reason)}' "
                           f"style='left:{x(rg.m_lo):.3f}%;width:{x(rg.m_hi + 1) - x(rg.m_lo):.3f}%;"
                           f"background:{COLOURS[rg.step.outcome]}'></div>" for rg in rs)
            parts.append(f"<div class=row><div class=l title='{e(label)}'>{e(label)}</div><div class=bar>{segs}</div>"
                         f"</div>")
        ticks = sorted({1 << i for i in range(int(math.log2(m_max)) + 1)} | {m_max})
        marks = "".join(f"<span class=tick style='left:{x(m):.3f}%'>{m}</span>" for m in ticks)
        parts.append(f"<div class=row><div class=l>M (tokens in a micro-batch)</div><div class=axis>{marks}</div>"
                     f"</div>")
    return "".join(parts)
