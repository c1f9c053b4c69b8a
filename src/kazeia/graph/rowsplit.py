"""A MUL_MAT split along M (src1's rows) so that every piece's M avoids a range: the `split-op` routing action
(engine/policy.py). Rows of a matmul are independent, so the pieces write their rows of the node's own storage
and compute the same rows; each piece gets its own plan on the device (HMX for a whole 32-row piece, HVX for a
short tail)."""

from __future__ import annotations

from dataclasses import replace

from kazeia.graph.tensor import Tensor

PREFIX = "split:"


def split_path(lo: int, hi: int) -> str:
    """The route_path a split-op rule puts on a node: pieces of at most lo - 1 rows while the rest is in lo..hi."""
    return f"{PREFIX}{lo}-{hi}"


def parse_split(path: str | None) -> tuple[int, int] | None:
    if not path or not path.startswith(PREFIX):
        return None
    lo, hi = path[len(PREFIX):].split("-")
    return int(lo), int(hi)


def row_pieces(m: int, lo: int, hi: int) -> list[int]:
    """Row counts summing to m, none in lo..hi (lo >= 2): pieces of lo - 1 while the rest falls in the range."""
    if lo < 2:
        return [m]  # nothing below the range to cut to
    out, rest = [], m
    while lo <= rest <= hi:
        out.append(lo - 1)
        rest -= lo - 1
    return out + [rest] if rest else out


def _rows(t: Tensor, r0: int, n: int, name: str) -> Tensor:
    """Rows r0..r0+n of a 2-D tensor (ne[2] = ne[3] = 1), sharing its storage."""
    root = t.root
    v = replace(t, ne=(t.ne[0], n, 1, 1), name=name, op="VIEW" if t.op != "MUL_MAT" else t.op,
                view_src=root, view_offs=t.view_offs + r0 * t.nb[1], offset=t.offset + r0 * t.nb[1],
                route_path=None, route_rule=None)
    return v


def split_nodes(node: Tensor) -> list[Tensor]:
    """The pieces of a MUL_MAT whose route_path is a split (one piece when nothing needs cutting)."""
    rng = parse_split(node.route_path)
    w, x = node.src[0], node.src[1]
    if rng is None or node.op != "MUL_MAT" or x.ne[2] * x.ne[3] != 1 or w.ne[2] * w.ne[3] != 1:
        return [node]
    pieces = row_pieces(x.ne[1], *rng)
    if len(pieces) == 1:
        return [node]
    out, r0 = [], 0
    for n in pieces:
        xs = _rows(x, r0, n, f"{x.name}[{r0}:{r0 + n}]")
        out.append(replace(_rows(node, r0, n, f"{node.name}[{r0}:{r0 + n}]"), src=(w, xs), op="MUL_MAT"))
        r0 += n
    return out
