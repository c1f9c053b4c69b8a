"""A MUL_MAT plan for people: the text `kazeia htp plan` prints and an SVG of the VTCM map (the report layer of
`kazeia.backends.htp.plan`; the investigation report embeds the SVG). Every number is the plan's."""

from __future__ import annotations

from xml.sax.saxutils import escape

from kazeia.backends.htp import MatmulPlan
from kazeia.backends.htp.forensics import BANK_BYTES, DeepLoad


def _hex(v: int) -> str:
    return f"0x{v:06x}"


def _consequence(plan: MatmulPlan) -> str:
    if plan.outcome == "reenter":
        return "HMX returns -1 and op_matmul re-enters itself forever (DSP stack overflow or hang)"
    if plan.outcome == "dropped":
        return "op returns VTCM_TOO_SMALL, the batch drops it: dst keeps stale contents"
    return ""


def plan_text(plan: MatmulPlan, crossings: list[DeepLoad] | None = None) -> str:
    """The human-readable plan (what `kazeia htp plan` prints)."""
    lines = [f"MUL_MAT   m={plan.m} k={plan.k} n={plan.n} {plan.qtype}   profile {plan.profile}",
             f"path      {plan.path}   ({plan.reason})"]
    if plan.hmx_attempt is not None:
        h = plan.hmx_attempt
        tried = f"mc={h.mc} nc={h.nc} used {h.used:,} B, " if h.mc is not None else ""
        lines.append(f"hmx try   {tried}{h.status} ({h.reason})")
    if plan.path == "hmx" and "act_threads" in plan.info:  # 2026-10: the host solver's answer
        i = plan.info
        lines.append(f"chunks    mc={plan.mc} nc={plan.nc}   act threads {i['act_threads']}, "
                     f"{'pipelined' if i['pipeline'] else 'not pipelined'}; group A {i['group_a']:,} B, "
                     f"then group B {i['group_b']:,} B over group C {i['group_c']:,} B (they overlap)")
    elif plan.path == "hmx" and plan.mc is not None:
        lines.append(f"chunks    mc={plan.mc} nc={plan.nc}   ({plan.info.get('m_chunks')} M x "
                     f"{plan.info.get('n_chunks')} N chunks; search estimate {plan.estimate:,} B)")
    elif plan.path == "hvx" and "n_prefetch" in plan.info:
        i = plan.info
        rows = f"M chunks of {i['m_chunk']}" if i["m_chunk"] else "all rows at once"
        lines.append(f"threads   {plan.n_threads}   ({i['kernel']}, prefetch depth {i['n_prefetch']}, {rows})")
    elif plan.path == "hvx":
        lines.append(f"threads   {plan.n_threads}   ({plan.info.get('kernel')}, src1 row {plan.info.get('src1_row')} B,"
                     f" src0 ring row {plan.row_stride} B)")
    if plan.areas:
        lines.append(f"  {'area':<12}{'offset':>10}{'size':>12}{'end':>10}")
        for a in plan.areas:
            mark = "  <- past VTCM" if a.end > plan.vtcm else ""
            lines.append(f"  {a.name:<12}{_hex(a.offset):>10}{a.size:>12,}{_hex(a.end):>10}{mark}")
    lines.append(f"used      {plan.used:,} B")
    lines.append(f"vtcm      {plan.vtcm:,} B")
    cons = _consequence(plan)
    if plan.overflow:
        lines.append(f"overflow  {plan.overflow:,} B" + (f"   -> {cons}" if cons else ""))
    else:
        lines.append("overflow  none")
        if plan.status != "ok":
            lines.append(f"status    {plan.status}   -> {cons}")
    for c in crossings or []:
        lines.append(f"bank      {c.kind} run in {c.area} crosses a 4 MiB boundary: "
                     f"{c.offset:#x}-{c.end - 1:#x} (tile {c.tile}, k0 {c.k0})")
    return "\n".join(lines)



_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac")
_W, _MARGIN, _BAR_Y, _BAR_H, _ROW_H = 960, 20, 56, 64, 18


def _lanes(areas) -> list[int]:
    """A lane per area: the first whose areas it does not overlap. 2026-10's layouts overlap on purpose (the fp32
    activation staging reuses the weight/output group's bytes): they are drawn one above the other."""
    placed: list[list] = []
    lanes = []
    for a in areas:
        lane = next((i for i, row in enumerate(placed)
                     if all(a.end <= b.offset or b.end <= a.offset for b in row)), len(placed))
        if lane == len(placed):
            placed.append([])
        placed[lane].append(a)
        lanes.append(lane)
    return lanes


def plan_svg(plan: MatmulPlan) -> str:
    """A self-contained SVG of the VTCM map: areas to scale and labelled, the part past VTCM in red, the 4 MiB
    bank boundaries dashed, and a table of every area underneath."""
    extent = max(plan.vtcm, plan.used, 1)
    scale = (_W - 2 * _MARGIN) / extent

    def x(off: int) -> float:
        return _MARGIN + off * scale

    height = _BAR_Y + _BAR_H + 40 + _ROW_H * (len(plan.areas) + 2)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
           f'viewBox="0 0 {_W} {height}" font-family="monospace" font-size="11">',
           f'<rect width="{_W}" height="{height}" fill="white"/>']
    title = (f"MUL_MAT m={plan.m} k={plan.k} n={plan.n} {plan.qtype}: {plan.path}, profile {plan.profile}, "
             f"used {plan.used:,} of {plan.vtcm:,} B")
    if plan.mc is not None:
        title += f", mc={plan.mc} nc={plan.nc}"
    out.append(f'<text x="{_MARGIN}" y="18" font-size="13">{escape(title)}</text>')
    out.append(f'<rect x="{x(0):.2f}" y="{_BAR_Y}" width="{plan.vtcm * scale:.2f}" height="{_BAR_H}" '
               f'fill="#f4f4f4" stroke="black"/>')
    lanes = _lanes(plan.areas)
    lane_h = _BAR_H / (max(lanes) + 1 if lanes else 1)
    for i, (a, lane) in enumerate(zip(plan.areas, lanes)):
        color = _PALETTE[i % len(_PALETTE)]
        w = max(a.size * scale, 0.5)
        y0 = _BAR_Y + lane * lane_h
        note = " (overlaps the areas above it: the same bytes, used at another time)" if lane else ""
        out.append(f'<rect x="{x(a.offset):.2f}" y="{y0:.2f}" width="{w:.2f}" height="{lane_h:.2f}" fill="{color}" '
                   f'stroke="white" stroke-width="0.5"><title>{escape(a.name)} {a.offset:#x} +{a.size:,} B'
                   f'{note}</title></rect>')
        if w > 7 * len(a.name) + 4:
            out.append(f'<text x="{x(a.offset) + w / 2:.2f}" y="{y0 + lane_h / 2 + 4:.2f}" text-anchor="middle" '
                       f'fill="white">{escape(a.name)}</text>')
    if plan.overflow:
        w = max(plan.overflow * scale, 3.0)  # a 256 B overflow would be invisible to scale
        out.append(f'<rect id="overflow" x="{x(plan.vtcm):.2f}" y="{_BAR_Y - 6}" width="{w:.2f}" '
                   f'height="{_BAR_H + 12}" fill="red"><title>overflow {plan.overflow:,} B past VTCM</title></rect>')
        out.append(f'<text x="{x(plan.vtcm) - 4:.2f}" y="{_BAR_Y - 10}" text-anchor="end" fill="red">'
                   f'overflow {plan.overflow:,} B</text>')
    for b in range(BANK_BYTES, extent, BANK_BYTES):
        if b == plan.vtcm:
            continue  # the VTCM end marker is drawn below
        out.append(f'<line class="bank" x1="{x(b):.2f}" y1="{_BAR_Y - 16}" x2="{x(b):.2f}" y2="{_BAR_Y + _BAR_H + 8}"'
                   f' stroke="black" stroke-dasharray="4,3"/>')
        out.append(f'<text x="{x(b) + 3:.2f}" y="{_BAR_Y - 20}">{b // (1024 * 1024)} MiB</text>')
    out.append(f'<line x1="{x(plan.vtcm):.2f}" y1="{_BAR_Y - 4}" x2="{x(plan.vtcm):.2f}" '
               f'y2="{_BAR_Y + _BAR_H + 16}" stroke="black" stroke-width="2"/>')
    out.append(f'<text x="{x(plan.vtcm):.2f}" y="{_BAR_Y + _BAR_H + 28}" text-anchor="end">'
               f'VTCM end {plan.vtcm:,} B</text>')
    y = _BAR_Y + _BAR_H + 52
    head = f"{'area':<12}{'offset':>10}{'size':>12}{'end':>10}".replace(" ", "&#160;")
    out.append(f'<text x="{_MARGIN + 16}" y="{y}" font-weight="bold">{head}</text>')
    for i, a in enumerate(plan.areas):
        y += _ROW_H
        out.append(f'<rect x="{_MARGIN}" y="{y - 10}" width="10" height="10" fill="{_PALETTE[i % len(_PALETTE)]}"/>')
        row = f"{a.name:<12}{_hex(a.offset):>10}{a.size:>12,}{_hex(a.end):>10}"
        fill = ' fill="red"' if a.end > plan.vtcm else ""
        out.append(f'<text x="{_MARGIN + 16}" y="{y}"{fill}>{escape(row).replace(" ", "&#160;")}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
