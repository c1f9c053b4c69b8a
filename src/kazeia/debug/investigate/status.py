"""The op-status branch (2026-10): an op returned a non-OK status on the DSP, the host kept it sticky and aborted at
its next synchronize (ggml-hexagon.cpp: flush_pending, ggml_backend_hexagon_synchronize). No process died: the
evidence is the status, the op that set it, where the host aborted, and, for a MUL_MAT, its host plan against the
VTCM the DSP had.

Steps: the facts of the status (from the reproduction and the plan scan); a workaround rerun (MUL_MAT off HMX with
GGML_HEXAGON_MM_SELECT=1 when the failing plan was HMX, else the op's class to the CPU), kept only when it completes.
"""

from __future__ import annotations

from kazeia.debug.investigate.table import Context, StepDef
from kazeia.debug.runner import run


def status_facts(cx: Context) -> tuple[str, str]:
    f, s = cx.findings, cx.settings
    det = f.first.error_detail or {}
    f.faulting = det.get("faulting")
    cx.fact("status", det.get("status"))
    cx.fact("op that set it", f.faulting)
    cx.fact("host aborted in", det.get("aborted_in"))
    plan = next((p.plan for p in f.matmul_plans or () if p.name == f.faulting and p.ubatch == 0), None)
    f.plan = plan
    if plan is not None and s is not None:
        cx.fact("host plan of the op", f"{plan.path} mc={plan.mc} nc={plan.nc}, {plan.used:,} B of the session's "
                                       f"{plan.vtcm:,} B")
        cx.fact("VTCM the DSP was granted", f"{s.dsp_vtcm_bytes:,} B")
    return (f"{f.faulting} set {det.get('status')}; the host aborted in {det.get('aborted_in')}",
            cx.spec.command())


def _candidates(cx: Context) -> list[tuple[str, object]]:
    """Workarounds to try, the least costly first: MUL_MAT off HMX, then every MUL_MAT on the CPU (a MUL_MAT
    status), or the op alone on the CPU."""
    f, spec = cx.findings, cx.spec
    out = []
    if f.plan is not None:
        if f.plan.path == "hmx":
            out.append(("MUL_MAT off HMX (GGML_HEXAGON_MM_SELECT=1: HVX, else the CPU)",
                        spec.with_(env={**spec.env, "GGML_HEXAGON_MM_SELECT": "1"})))
        out.append(("every MUL_MAT on the CPU (GGML_HEXAGON_MM_SELECT=0)",
                    spec.with_(env={**spec.env, "GGML_HEXAGON_MM_SELECT": "0"})))
    out.append((f"{f.faulting} on the CPU", spec.with_(cpu_nodes=f"^{f.faulting}$")))
    return out


def status_workaround(cx: Context) -> tuple[str, str]:
    tried = []
    for what, spec in _candidates(cx):
        r = run(spec)
        tried.append(f"{what}: {'completes' if r.ok else 'still fails'}")
        if r.ok:
            cx.inv.gate = {"description": what, "flags": spec.command(), "validated": True,
                           "evidence": "the rerun completes" + (f" (tried before: {'; '.join(tried[:-1])})"
                                                                 if len(tried) > 1 else "")}
            return "; ".join(tried), spec.command()
    cx.inv.gate = {"description": tried[-1].split(":")[0], "flags": spec.command(), "validated": False,
                   "evidence": "; ".join(tried)}
    return "; ".join(tried), spec.command()


STATUS = StepDef("the op status and its plan", status_facts, needs=("first",), gives=("faulting", "plan"))
STATUS_GATE = StepDef("a workaround, validated by a rerun", status_workaround, needs=("faulting",))


def status_verdict(cx: Context) -> None:
    f, s = cx.findings, cx.settings
    det = f.first.error_detail or {}
    op, status, where = f.faulting or "an unidentified op", det.get("status"), det.get("aborted_in")
    parts = [f"The op that set the status is {op}: it returned {status} on the DSP, the rest of its batch ran, and "
             f"the host, which kept the error sticky, aborted in {where} with upstream's text (no DSP death, no "
             f"0x2e)."]
    p = f.plan
    if p is not None and s is not None and p.used > s.dsp_vtcm_bytes:
        cx.inv.mechanism = (f"host/DSP VTCM disagreement: the host solved {op}'s {p.path.upper()} plan to "
                            f"{p.used:,} B against the session's {p.vtcm:,} B (htp_iface_hwinfo); the DSP was "
                            f"granted {s.dsp_vtcm_bytes:,} B (vtcm_alloc), so the kernel's own layout check failed "
                            f"before it computed anything")
        parts.append(f"Mechanism: {cx.inv.mechanism}. Derived from the code (matmul-ops.c: hmx_mm_2d_f32 and the HVX "
                     f"kernels check their layout against ctx->vtcm_size); no public report of it is known.")
    else:
        parts.append("Mechanism: not identified from this run's evidence (the op's plan fits what the DSP has).")
    g = cx.inv.gate
    if g:
        checked = "validated by a rerun" if g["validated"] else "NOT validated"
        parts.append(f"Workaround: {g['description']} ({checked}).")
    cx.inv.verdict = " ".join(parts)
