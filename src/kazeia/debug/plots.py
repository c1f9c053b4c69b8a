"""Plots of forensic reports (matplotlib, optional: `pip install 'kazeia[plots]'`).

Figures are drawn on matplotlib's object API with the Agg canvas, never through pyplot, so plotting from a
library call neither needs a display nor changes the caller's matplotlib backend.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kazeia.errors import KazeiaError

if TYPE_CHECKING:
    from kazeia.debug.compare.report import CompareReport
    from kazeia.debug.compare.rows import OpRow

NMSE_FLOOR = 1e-20  # where exact results (NMSE 0) are drawn on the log axis
NMSE_CEIL = 1e4  # where non-finite errors (NaN, inf, deaths) are drawn
_COLORS = {"cumulative": "tab:blue", "isolated": "tab:orange"}


def new_figure(width: float = 12.0, height: float = 5.0):
    """A matplotlib Figure attached to an Agg canvas (KazeiaError if matplotlib is missing)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise KazeiaError("plots need matplotlib: pip install 'kazeia[plots]' (or pip install matplotlib)") from None
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str) -> str:
    try:
        fig.savefig(path)
    except OSError as e:
        raise KazeiaError(f"cannot write the plot to {path}: {e}") from None
    return path


def _y(v: float | None) -> float:
    if v is None or not math.isfinite(v):
        return NMSE_CEIL
    return min(max(v, NMSE_FLOOR), NMSE_CEIL)


def _ticks(rows: list[OpRow]) -> tuple[list[int], list[str], str]:
    """Small graphs: every op by name. Large ones: the first op of every layer (at most ~16 labels)."""
    if len(rows) <= 64:
        return list(range(len(rows))), [r.name for r in rows], "op"
    xs, labels = _layer_ticks(rows)
    return xs, labels, "op (graph order; ticks: first op of each layer)"


def _layer_ticks(rows: list[OpRow]) -> tuple[list[int], list[str]]:
    firsts: list[tuple[int, str]] = []
    seen: set[tuple[int, int | None]] = set()
    for x, r in enumerate(rows):
        key = (r.ubatch, r.layer)
        if r.layer is not None and key not in seen:
            seen.add(key)
            firsts.append((x, f"L{r.layer}" if not r.ubatch else f"u{r.ubatch}L{r.layer}"))
    step = max(1, math.ceil(len(firsts) / 16))
    firsts = firsts[::step]
    return [x for x, _ in firsts], [s for _, s in firsts]


def plot_errors(report: CompareReport, path: str, title: str | None = None) -> str:
    """log10 NMSE of every op along the graph, one series per mode, the per-op thresholds (the one applied in
    isolated mode, a step line) and the whole-model threshold, failures in red and the first op out of
    tolerance marked. Returns `path`."""
    from kazeia.debug.judge import WHOLE_MODEL_NMSE

    fig = new_figure(14.0, 6.0)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_yscale("log")
    # one x position per (micro-batch, node index), shared by the modes (a death cuts a mode short)
    by_key: dict[tuple[int, int], OpRow] = {}
    for mode in report.modes:
        for r in report.rows.get(mode, []):
            by_key.setdefault((r.ubatch, r.index), r)
    keys = sorted(by_key)
    pos = {k: i for i, k in enumerate(keys)}
    ref_rows = [by_key[k] for k in keys]
    for mode in report.modes:
        rows = report.rows.get(mode, [])
        xs = [pos[(r.ubatch, r.index)] for r in rows]
        ys = [_y(r.nmse) for r in rows]
        if mode == "cumulative":
            ax.plot(xs, ys, "-", lw=1.2, color=_COLORS[mode], label=f"{mode} NMSE (each op fed its own inputs)")
        else:  # isolated errors are per op, not a trajectory: dots, with a faint line to follow the graph
            ax.plot(xs, ys, "-", lw=0.5, alpha=0.35, color=_COLORS.get(mode, "gray"))
            ax.plot(xs, ys, ".", ms=4, color=_COLORS.get(mode, "gray"), label=f"{mode} NMSE (REF inputs)")
        bad = [(x, r) for x, r in zip(xs, rows) if r.failed]
        if bad:
            ax.scatter([x for x, _ in bad], [_y(r.nmse) for _, r in bad], s=30, color="red", zorder=5,
                       marker="X" if mode == "isolated" else "o", label=f"{mode}: out of tolerance")
    if ref_rows:
        thr_rows = report.rows.get("isolated") or ref_rows
        xs = [pos[(r.ubatch, r.index)] for r in thr_rows]
        ax.step(xs, [_y(r.threshold) for r in thr_rows], where="mid", color="gray", lw=0.8, ls="--",
                label="per-op threshold (0 drawn at 1e-20)")
    ax.axhline(WHOLE_MODEL_NMSE, color="black", lw=0.8, ls=":",
               label=f"whole-model threshold {WHOLE_MODEL_NMSE:g}")
    first = report.first_failure
    if first is not None:
        x = pos[(first.ubatch, first.index)]
        ax.axvline(x, color="red", lw=1.0, alpha=0.6)
        ax.annotate(f"first out of tolerance ({first.mode}):\n#{first.index} {first.name} {first.op} {first.where}",
                    xy=(x, _y(first.nmse)), xytext=(8, -40), textcoords="offset points", fontsize=8, color="red",
                    bbox={"boxstyle": "round", "fc": "white", "ec": "red", "alpha": 0.85})
    ticks, labels, xlabel = _ticks(ref_rows)
    if ticks:
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, fontsize=6 if xlabel == "op" else 7, rotation=90 if xlabel == "op" else 0)
    ax.set_ylim(NMSE_FLOOR / 10, NMSE_CEIL * 10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("NMSE vs REF (0 at bottom, NaN/inf/death at top)")
    ax.set_title(title or f"{report.spec.device} vs REF, {report.n_tokens} tokens"
                 + (f", profile {report.spec.htp_profile}" if report.spec.htp_profile else "")
                 + (f", faults {','.join(report.spec.faults)}" if report.spec.faults else ""), fontsize=10)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return save_figure(fig, path)
