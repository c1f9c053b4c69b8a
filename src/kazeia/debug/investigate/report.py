"""The investigation report: one data structure, rendered as Markdown and as a self-contained HTML page.

Every number in it comes from the step that measured or computed it (the runs, the plan arithmetic), and
each hypothesis carries its evidence for and against, so a reader can check the verdict without rerunning.
"""

from __future__ import annotations

import base64
import html
import json
import os
from dataclasses import asdict, dataclass, field

from kazeia.limits import read_bytes
from kazeia.outputs import claim_folder, write_text


@dataclass
class Step:
    name: str
    seconds: float
    summary: str
    command: str = ""  # a kazeia command line that reproduces this step


@dataclass
class Hypothesis:
    name: str
    question: str
    status: str  # "ruled out" | "confirmed" | "cause" | "consequence" | "explains a symptom" | "inconclusive" |
    #              "not applicable"
    evidence_for: list[str] = field(default_factory=list)
    evidence_against: list[str] = field(default_factory=list)


@dataclass
class Investigation:
    title: str
    command: str
    outcome: str  # what the reproduction showed, in one line
    fault_found: bool
    steps: list[Step] = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # faulting op, last enqueued, range, plan numbers...
    hypotheses: list[Hypothesis] = field(default_factory=list)
    verdict: str = ""
    mechanism: str = ""
    gate: dict = field(default_factory=dict)  # description, flags, validated, evidence
    images: dict = field(default_factory=dict)  # title -> PNG path
    svgs: dict = field(default_factory=dict)  # title -> SVG text
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def _md_table(rows: list[list[str]], head: list[str]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def render_markdown(inv: Investigation, image_dir: str | None = None) -> str:
    lines = [f"# {inv.title}", "", f"Command: `{inv.command}`", "", f"**Outcome:** {inv.outcome}", ""]
    lines += ["## Verdict", "", inv.verdict or "(none)", ""]
    if inv.mechanism:
        lines += [f"**Mechanism:** {inv.mechanism}", ""]
    if inv.gate:
        g = inv.gate
        lines += ["## Recommended gate", "", g.get("description", ""), ""]
        if g.get("flags"):
            lines += [f"Try it: `{g['flags']}`", ""]
        if "validated" in g:
            lines += [f"Validated: **{'yes' if g['validated'] else 'no'}** — {g.get('evidence', '')}", ""]
    if inv.facts:
        lines += ["## Facts", "", _md_table([[k, _fmt(v)] for k, v in inv.facts.items()], ["fact", "value"]), ""]
    if inv.hypotheses:
        lines += ["## Hypotheses", ""]
        for h in inv.hypotheses:
            lines += [f"### {h.name}: {h.status}", "", f"*{h.question}*", ""]
            lines += [f"- for: {e}" for e in h.evidence_for] + [f"- against: {e}" for e in h.evidence_against]
            lines.append("")
    lines += ["## Steps", "", _md_table([[s.name, f"{s.seconds:.1f} s", s.summary, f"`{s.command}`" if s.command
                                          else ""] for s in inv.steps], ["step", "time", "result", "reproduce"]),
              ""]
    for title, path in inv.images.items():
        rel = os.path.relpath(path, image_dir) if image_dir else path
        lines += [f"### {title}", "", f"![{title}]({rel})", ""]
    for title in inv.svgs:
        lines += [f"### {title}", "", f"(see {_slug(title)}.svg)", ""]
    if inv.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in inv.notes] + [""]
    return "\n".join(lines)


def render_html(inv: Investigation) -> str:
    """One self-contained page: PNGs embedded as data URIs, SVGs inline."""
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(inv.title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}"
             "code{background:#f4f4f4;padding:1px 3px}.bad{color:#b00}.good{color:#070}"
             ".verdict{background:#fff6e0;border:1px solid #e0c080;padding:1em}</style></head><body>",
             f"<h1>{e(inv.title)}</h1><p>Command: <code>{e(inv.command)}</code></p>",
             f"<p><b>Outcome:</b> {e(inv.outcome)}</p>",
             f"<div class='verdict'><h2>Verdict</h2><p>{e(inv.verdict)}</p>"]
    if inv.mechanism:
        parts.append(f"<p><b>Mechanism:</b> {e(inv.mechanism)}</p>")
    parts.append("</div>")
    if inv.gate:
        g = inv.gate
        parts.append(f"<h2>Recommended gate</h2><p>{e(g.get('description', ''))}</p>")
        if g.get("flags"):
            parts.append(f"<p>Try it: <code>{e(g['flags'])}</code></p>")
        if "validated" in g:
            cls = "good" if g["validated"] else "bad"
            parts.append(f"<p class='{cls}'>Validated: {'yes' if g['validated'] else 'no'} — "
                         f"{e(str(g.get('evidence', '')))}</p>")
    if inv.facts:
        parts.append("<h2>Facts</h2><table>")
        parts += [f"<tr><th>{e(k)}</th><td>{e(_fmt(v))}</td></tr>" for k, v in inv.facts.items()]
        parts.append("</table>")
    if inv.hypotheses:
        parts.append("<h2>Hypotheses</h2><table><tr><th>hypothesis</th><th>status</th><th>evidence</th></tr>")
        for h in inv.hypotheses:
            ev = "".join(f"<li>for: {e(x)}</li>" for x in h.evidence_for)
            ev += "".join(f"<li>against: {e(x)}</li>" for x in h.evidence_against)
            cls = "good" if h.status in ("ruled out", "not applicable") else "bad"
            parts.append(f"<tr><td><b>{e(h.name)}</b><br><i>{e(h.question)}</i></td>"
                         f"<td class='{cls}'>{e(h.status)}</td><td><ul>{ev}</ul></td></tr>")
        parts.append("</table>")
    for title, path in inv.images.items():
        data = base64.b64encode(read_bytes(path, "report image", 64 << 20)).decode()
        parts.append(f"<h3>{e(title)}</h3><img alt='{e(title)}' style='max-width:100%' "
                     f"src='data:image/png;base64,{data}'>")
    for title, svg in inv.svgs.items():
        parts.append(f"<h3>{e(title)}</h3>{svg}")
    parts.append("<h2>Steps</h2><table><tr><th>step</th><th>time</th><th>result</th><th>reproduce</th></tr>")
    parts += [f"<tr><td>{e(s.name)}</td><td>{s.seconds:.1f}&nbsp;s</td><td>{e(s.summary)}</td>"
              f"<td><code>{e(s.command)}</code></td></tr>" for s in inv.steps]
    parts.append("</table>")
    if inv.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in inv.notes) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(inv: Investigation, out_dir: str) -> dict[str, str]:
    claim_folder(out_dir)
    paths = {"markdown": os.path.join(out_dir, "report.md"), "html": os.path.join(out_dir, "report.html"),
             "json": os.path.join(out_dir, "investigation.json")}
    for title, svg in inv.svgs.items():
        write_text(os.path.join(out_dir, f"{_slug(title)}.svg"), svg)
    write_text(paths["markdown"], render_markdown(inv, out_dir))
    write_text(paths["html"], render_html(inv))
    write_text(paths["json"], inv.to_json())
    return paths


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in s.lower()).strip("-")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_fmt(x) for x in v)
    return str(v)
