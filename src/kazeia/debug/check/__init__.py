"""`kazeia check`: from a GGUF header alone, what each MUL_MAT weight meets on the HTP under every version, arch,
VTCM size and ubatch asked for, before the model reaches a phone.

    report = check_model("q4b.gguf", ubatches=(512,))
    report.result("2026-05", 79).verdict    # 'death': ffn_down's HMX layout overflows 8 MiB at M 33..64

Nothing past the header is read (a file cut after its header is enough): the weights are placed by their llama.cpp
names (weights.py) and planned with the arithmetic the emulator itself runs (outcomes.py); report.py renders it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kazeia.backends.htp import (
    DEFAULT,
    KNOWN_ARCHS,
    LATEST_PROFILE,
    PHONE_CPU,
    HtpSettings,
    arch_profile,
    get_profile,
    hmx_matmul_seconds,
    host_vmem_budget,
    hvx_matmul_seconds,
)
from kazeia.backends.htp import PROFILES as HTP_PROFILES
from kazeia.debug.check.buffers import buffer_lines
from kazeia.debug.check.op_risks import OpRisk, op_risks
from kazeia.debug.check.outcomes import SEVERITY, Config, Planner, Range
from kazeia.debug.check.queue import queue_exposure
from kazeia.debug.check.weights import ModelHeader, WeightClass, read_header
from kazeia.debug.modeled import ScenarioCost
from kazeia.errors import KazeiaError
from kazeia.gguf.reader import load_gguf
from kazeia.graph.tensor import GGMLType, row_size

PROFILES = tuple(HTP_PROFILES)  # every upstream version kazeia models (htp/profiles.py), in its order
FAILING = ("no-session", "death", "dropped", "wrong", "risk", "depends")
MiB = 1 << 20
@dataclass
class ConfigResult:
    config: Config
    ranges: dict[str, list[Range]]           # class label -> its M ranges
    verdict: str                             # the worst outcome over every class and M
    prefill_tps: float | None                # modeled (debug/modeled.ScenarioCost; None: no session)
    decode_tps: float | None
    n_prompt: int = 0                        # the prompt the rates are for
    rates_of: str = "graph"                  # "graph": the scenario's whole graph; else why the MUL_MATs alone
    ops: list[OpRisk] = field(default_factory=list)  # the other ops' predicted risks (op_risks.py)
    vmem: dict = field(default_factory=dict)

    def failing(self) -> list[tuple[str, Range]]:
        return [(label, r) for label, rs in self.ranges.items() for r in rs if r.step.outcome in FAILING]


@dataclass
class CheckReport:
    header: ModelHeader
    ctx: int
    results: list[ConfigResult]
    classes: list[WeightClass]
    buffers: list[str] = field(default_factory=list)  # the weights' HTP buffers at load time (buffers.py)
    queue: list[str] = field(default_factory=list)  # the HMX job queue's per-build exposure (queue.py)

    def result(self, profile: str, arch: int, vtcm: int | None = None, ubatch: int | None = None) -> ConfigResult:
        for r in self.results:
            c = r.config
            if (c.profile, c.arch) == (profile, arch) and vtcm in (None, c.vtcm) and ubatch in (None, c.ubatch):
                return r
        raise KeyError((profile, arch, vtcm, ubatch))


def check_model(path: str, profiles: tuple[str, ...] = PROFILES, archs: tuple[int, ...] = KNOWN_ARCHS,
                vtcms: tuple[int | None, ...] = (None,), ubatches: tuple[int, ...] = (512,), ctx: int = 4096,
                threads: int = 6, n_seqs: tuple[int, ...] = (1,), n_prompt: int | None = None) -> CheckReport:
    """The matrix profiles x archs x VTCM sizes (None: the arch's own) x ubatches (x sequences per micro-batch) for
    the model at `path`; the modeled rates are those of an `n_prompt`-token prompt (default: one whole micro-batch)
    and one decode token after it, by the one scenario cost (debug/modeled.py) `upgrade` and `bench` print."""
    f = load_gguf(path, header_only=True)
    header = read_header(f)
    planner = Planner()
    costs: dict[int, ScenarioCost | str] = {}
    results = []
    for profile in profiles:
        for arch in archs:
            for vtcm in vtcms:
                for ub in ubatches:
                    for n_seq in n_seqs:
                        if ub < 1 or not 1 <= n_seq <= ub:
                            raise KazeiaError(f"-ub {ub} and -np {n_seq}: need 1 <= -np <= -ub")
                        gen = get_profile(profile).generation
                        c = Config(profile, arch, vtcm or arch_profile(arch, gen).vtcm_bytes, ub, threads, n_seq)
                        cost = "-np N micro-batches are not built" if n_seq > 1 else costs.get(ub)
                        if cost is None:
                            cost = costs[ub] = _scenario(f, n_prompt or ub, ub)
                        res = _result(c, header, planner, ctx, cost)
                        if res.verdict != "no-session":
                            res.ops = op_risks(f.tensors, profile, c.vtcm, ub, arch_profile(arch, gen).hmx)
                            res.verdict = min([res.verdict, *(o.outcome for o in res.ops)],
                                              key=SEVERITY.__getitem__)
                        results.append(res)
    mbuf = HtpSettings.from_env(profile=profiles[0]).mbuf_mib * MiB
    gens = tuple(get_profile(p).generation for p in profiles)
    return CheckReport(header, ctx, results, header.classes, buffer_lines(f, gens, archs, mbuf),
                       queue_exposure(f.tensors, profiles, max(ubatches)))


def _scenario(f, n_prompt: int, ub: int) -> ScenarioCost | str:
    """The scenario's cost graphs, or why they cannot be built from this header (an architecture kazeia does not
    run, a header without its hyperparameters): check then prices the MUL_MATs alone."""
    try:
        return ScenarioCost(f, n_prompt, ub)
    except KazeiaError as e:
        return f"the graph cannot be built ({e})"


def _result(c: Config, header: ModelHeader, planner: Planner, ctx: int, cost: ScenarioCost | str) -> ConfigResult:
    ranges = {w.label: planner.ranges(c, w) for w in header.classes}
    worst = min((r.step.outcome for rs in ranges.values() for r in rs), key=SEVERITY.__getitem__)
    if worst == "no-session":
        return ConfigResult(c, ranges, worst, None, None, vmem=_vmem(c, header, ctx))
    if isinstance(cost, ScenarioCost):
        settings = HtpSettings.from_env(profile=c.profile, vtcm_bytes=c.vtcm,
                                        overrides={"GGML_HEXAGON_ARCH": f"v{c.arch}"})
        prefill, decode = cost.rates(settings)
        return ConfigResult(c, ranges, worst, prefill, decode, n_prompt=cost.n_prompt, vmem=_vmem(c, header, ctx))
    m = c.ubatch // c.n_seq * c.n_seq  # several sequences a micro-batch: the MUL_MATs alone (below)
    return ConfigResult(c, ranges, worst, _tps(c, header, planner, m), _tps(c, header, planner, c.n_seq),
                        n_prompt=m, rates_of=cost, vmem=_vmem(c, header, ctx))


def _tps(c: Config, header: ModelHeader, planner: Planner, m: int) -> float:
    """Modeled tokens/s of the MUL_MATs alone at M = m (the lm_head at one row per sequence), for `-np N` micro-batches
    that the scenario cost does not build: the cost model of the emulator's modeled column for the DSP paths, the
    phone CPU's for what goes to the CPU."""
    seconds = 0.0
    for w in header.classes:
        rows = c.rows(w, m)
        s = planner.step(c, w, rows)
        t = GGMLType[w.qtype.upper()]
        if s.path == "hmx":
            one = hmx_matmul_seconds(rows, w.k, w.n, t, s.mc or 32, DEFAULT)
        elif s.path == "hvx":
            one = hvx_matmul_seconds(rows, w.k, w.n, t, DEFAULT)
        else:
            one = PHONE_CPU.matmul_seconds(rows, w.k, w.n, t)
            if s.report == "llama.cpp #26094":  # refused at run time, its weight in the REPACK buffer: copied out
                one += PHONE_CPU.weight_copy_seconds(w.n * row_size(t, w.k))  # every compute (cost.py)
        seconds += one * len(w.tensors)
    return m / seconds if seconds > 0 else 0.0


def _vmem(c: Config, header: ModelHeader, ctx: int) -> dict:
    """The DSP address space the host budgets (opt_vmem, minus October's op queue) against what the model maps."""
    budget = host_vmem_budget(arch_profile(c.arch, c.generation).vmem_bytes, c.generation)
    kv = header.kv_bytes(ctx, c.ubatch)
    return {"budget": budget, "weights": header.device_bytes, "kv": kv, "fits": header.device_bytes + kv <= budget}


def gate_regex(label: str) -> str:
    """The --gate weight regex of a class label ('blk.*.ffn_down.weight q4_0 9728x2560')."""
    name = label.split()[0]
    return re.escape(name).replace(r"blk\.\*\.", r"blk\.\d+\.")


def safest_settings(r: ConfigResult, report: CheckReport, archs: tuple[int, ...] = ()) -> list[str]:
    """What to run instead, from this run's arithmetic: the ubatch under the first failing M, a gate per failing
    range (those weights at those M on the CPU), the env switch that avoids the unit, or the upgrade (on `archs`,
    the archs that share this outcome table; default r's own)."""
    fails = [(label, rg) for label, rg in r.failing() if rg.step.outcome != "no-session"]
    c = r.config
    if r.verdict == "no-session":
        return [f"no session on v{c.arch} under {c.profile}: --htp-profile 2026-05 (HVX only) or -dev CPU"]
    if not fails and not r.ops:
        return []
    out = []
    lo = min([rg.m_lo for _, rg in fails] + [o.m_lo for o in r.ops if o.outcome == "wrong"], default=1)
    if lo > 1:
        out.append(f"-ub {lo - 1} (no ubatch reaches M {lo})")
    if fails:
        gates = [f"--gate 'weight={gate_regex(label)},m={rg.m_lo}-{rg.m_hi}'" for label, rg in fails]
        out.append(" ".join(gates) + " (those weights at those M on the CPU)")
    for o in r.ops:
        out.append(f"{o.gate} ({o.op} on the CPU" + (": its wrong numbers)" if o.outcome == "wrong" else
                                                     ": no stale shortcut after it; validate with kazeia upgrade)"))
    outcomes = {rg.step.outcome for _, rg in fails}
    if "death" in outcomes:
        out.append("GGML_HEXAGON_USE_HMX=0 (every MUL_MAT on HVX)")
    if "risk" in outcomes:
        out.append("GGML_HEXAGON_NHMX=0 or GGML_HEXAGON_MM_SELECT=1 (the workarounds of #26123)")
    if c.profile != LATEST_PROFILE:
        ups = {}
        for a in archs or (c.arch,):
            try:
                ups[a] = report.result(LATEST_PROFILE, a, c.vtcm, c.ubatch).verdict
            except KeyError:
                continue
        fixed = [f"v{a}" for a, v in ups.items() if v not in FAILING]
        if fixed:
            left = [f"v{a}: {v}" for a, v in ups.items() if v in FAILING]
            out.append(f"upgrade: {LATEST_PROFILE} runs every class on {', '.join(fixed)}"
                       + (f" (not on {', '.join(left)})" if left else ""))
    return out
