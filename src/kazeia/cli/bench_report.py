"""What `kazeia bench` measured and how it is printed: the test, model and result records, and the
llama-bench-like outputs (the markdown table, and json / jsonl / csv records with llama-bench's field names
plus each backend column's `<name>_avg_ts`, `<name>_stddev_ts`, `<name>_samples_ts`)."""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BenchTest:
    kind: str  # "pp" or "tg"
    n: int
    depth: int = 0  # tokens already in the KV cache when the test starts
    n_seq: int = 1  # -np: sequences side by side, n tokens each (llama-batched-bench's npl)

    @property
    def name(self) -> str:
        return f"{self.kind}{self.n}" + (f" x{self.n_seq} seq" if self.n_seq > 1 else "") \
            + (f" @ d{self.depth}" if self.depth else "")

    @property
    def tokens(self) -> int:
        """Tokens one repetition feeds: n per sequence (llama-batched-bench's pl*pp, pl*tg)."""
        return self.n * self.n_seq


@dataclass(frozen=True)
class ModelInfo:
    path: str
    type: str  # "llama 135M Q4_1"
    size: int  # bytes of tensor data
    params: int


@dataclass
class BenchResult:
    model: ModelInfo
    device: str
    backends: str
    threads: int
    n_ubatch: int
    flash_attn: bool
    type_k: str
    type_v: str
    test: BenchTest
    seconds: list[float] = field(default_factory=list)
    extra_seconds: dict[str, list[float]] = field(default_factory=dict)  # backend column -> seconds per rep

    @property
    def samples_ts(self) -> list[float]:
        return [self.test.tokens / s for s in self.seconds]

    def extra_ts(self, col: str) -> list[float]:
        return [self.test.tokens / s for s in self.extra_seconds.get(col, []) if s > 0]


def mean_sd(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


# ---------------------------------------------------------------------------------------------------
# output


def _extra_cols(results: list[BenchResult]) -> list[str]:
    cols: list[str] = []
    for r in results:
        cols += [c for c in r.extra_seconds if c not in cols and r.extra_ts(c)]
    return cols


def _ts(xs: list[float]) -> str:
    if not xs:
        return "-"
    m, sd = mean_sd(xs)
    return f"{m:.2f} ± {sd:.2f}"


def format_md(results: list[BenchResult], peak_rss: int) -> str:
    extra = _extra_cols(results)
    show_ub = any(r.n_ubatch != 512 for r in results)
    show_fa = any(not r.flash_attn for r in results)
    head = ["model", "size", "params", "backend", "threads"] + (["n_ubatch"] if show_ub else []) \
        + (["fa"] if show_fa else []) + ["test", "t/s"] + [f"{c} t/s" for c in extra]
    right = {"size", "params", "threads", "n_ubatch", "fa", "test", "t/s"} | {f"{c} t/s" for c in extra}
    rows = []
    for r in results:
        row = [r.model.type, f"{r.model.size / 2**20:.2f} MiB", f"{r.model.params / 1e6:.2f} M", r.device,
               str(r.threads)] + ([str(r.n_ubatch)] if show_ub else []) \
            + (["1" if r.flash_attn else "0"] if show_fa else []) + [r.test.name, _ts(r.samples_ts)] \
            + [_ts(r.extra_ts(c)) for c in extra]
        rows.append(row)
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    widths = [max(w, 20 if h.endswith("t/s") else 0) for w, h in zip(widths, head)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) if h in right else c.ljust(w)
                                 for c, w, h in zip(cells, widths, head)) + " |"

    sep = "| " + " | ".join(("-" * (w - 1) + ":") if h in right else "-" * w for w, h in zip(widths, head)) + " |"
    out = [line(head), sep] + [line(r) for r in rows]
    out.append("")
    out.append(f"peak memory (RSS): {peak_rss / 2**20:.1f} MiB")
    return "\n".join(out)


def record(r: BenchResult, peak_rss: int) -> dict:
    m, sd = mean_sd(r.samples_ts)
    rec = {
        "model_filename": r.model.path, "model_type": r.model.type, "model_size": r.model.size,
        "model_n_params": r.model.params, "backends": r.backends, "device": r.device, "n_threads": r.threads,
        "n_ubatch": r.n_ubatch, "flash_attn": r.flash_attn, "type_k": r.type_k, "type_v": r.type_v,
        "n_prompt": r.test.n if r.test.kind == "pp" else 0, "n_gen": r.test.n if r.test.kind == "tg" else 0,
        "n_depth": r.test.depth, "n_seq": r.test.n_seq,
        "test": r.test.name, "avg_ns": int(statistics.fmean(r.seconds) * 1e9) if r.seconds else 0,
        "stddev_ns": int(statistics.stdev(r.seconds) * 1e9) if len(r.seconds) > 1 else 0,
        "avg_ts": m, "stddev_ts": sd, "samples_ns": [int(s * 1e9) for s in r.seconds],
        "samples_ts": r.samples_ts, "peak_rss_bytes": peak_rss,
    }
    for c in r.extra_seconds:
        cm, csd = mean_sd(r.extra_ts(c))
        rec[f"{c}_avg_ts"], rec[f"{c}_stddev_ts"] = cm, csd
        rec[f"{c}_samples_ts"] = r.extra_ts(c)
    return rec


def format_records(results: list[BenchResult], peak_rss: int, fmt: str) -> str:
    recs = [record(r, peak_rss) for r in results]
    if fmt == "json":
        return json.dumps(recs, indent=2)
    if fmt == "jsonl":
        return "\n".join(json.dumps(r) for r in recs)
    keys: list[str] = []
    for r in recs:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for r in recs:
        w.writerow({k: (";".join(f"{x:g}" for x in v) if isinstance(v, list) else v) for k, v in r.items()})
    return buf.getvalue().rstrip("\n")
