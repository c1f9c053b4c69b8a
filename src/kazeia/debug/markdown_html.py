"""The markdown kazeia's reports write (headings, pipe tables, paragraphs, 4-space indented blocks, `code`) as one
self-contained HTML page: the tables a browser shows as tables, not the text inside a <pre>."""

from __future__ import annotations

import html
import re

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;line-height:1.4}"
         "table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
         "vertical-align:top;text-align:left}th{background:#f4f4f4}code,pre{background:#f4f4f4}"
         "code{padding:1px 3px}pre{padding:0.5em;white-space:pre-wrap}")


def _inline(text: str) -> str:
    """Escaped text with `code` spans."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(f"<code>{html.escape(p[1:-1])}</code>" if p.startswith("`") and p.endswith("`") and len(p) > 1
                   else html.escape(p) for p in parts)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def page(title: str, markdown: str) -> str:
    """The page of `markdown` titled `title`."""
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{STYLE}</style></head><body>"]
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 6)
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                if not re.fullmatch(r"\|[\s:\-|]+\|?", lines[i].strip()):  # (the header's separator row)
                    rows.append(_cells(lines[i]))
                i += 1
            head, body = rows[0], rows[1:]
            out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body]
            out.append("</table>")
            continue
        elif line.startswith("    "):
            block = []
            while i < len(lines) and lines[i].startswith("    "):
                block.append(lines[i][4:])
                i += 1
            out.append(f"<pre>{html.escape(chr(10).join(block))}</pre>")
            continue
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    out.append("</body></html>\n")
    return "\n".join(out)
