"""The entry point: replay one dumped op alone and, optionally, with its batch context, judged against float64
and against the recorded output, with the HTP settings of the recorded run (or overrides)."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import numpy as np

from kazeia.backends.devices import device_name
from kazeia.debug.dump import Dump, load_dump
from kazeia.debug.judge import judge, op_threshold
from kazeia.debug.replay.alone import reference_run, run_alone
from kazeia.debug.replay.results import Execution, ReplayResult
from kazeia.debug.replay.with_context import run_with_context
from kazeia.errors import DumpFileError, KazeiaError


def dump_threshold(dump: Dump) -> float:
    """The op's NMSE threshold (kazeia.debug.judge); a conversion when src0 is missing or of another type."""
    src0 = dump.sources[0] if dump.sources else None
    return op_threshold(dump.op, converts=src0 is None or src0.meta["type"] != dump.node["type"])


def htp_settings_for(dump: Dump, profile: str | None = None, vtcm: int | None = None,
                     faults: list[str] | None = None, env: dict[str, str] | None = None) -> Any:
    """The HTP settings of the recorded run (or of this environment for a CPU dump), with overrides."""
    from kazeia.backends.htp import HtpSettings, check_faults, get_profile

    rec = dump.htp_settings
    if rec is None:
        base = HtpSettings.from_env(profile=profile, vtcm_bytes=vtcm, faults=faults, overrides=env)
    else:
        base = _overridden(_recorded_settings(dump, rec), profile, vtcm, faults, env)
    get_profile(base.profile)
    check_faults(base.faults)
    return base


def _recorded_settings(dump: Dump, rec: dict) -> Any:
    """The HtpSettings the dump recorded (fields this kazeia does not know are dropped), without logging."""
    from kazeia.backends.htp import HtpSettings

    known = {f.name for f in dataclasses.fields(HtpSettings)}
    kw = {k: v for k, v in rec.items() if k in known}
    if kw.get("opfilter"):
        kw["opfilter"] = re.compile(kw["opfilter"], re.IGNORECASE)
    kw["faults"] = tuple(kw.get("faults") or ())
    kw["farf"] = False
    kw["verbose"] = 0
    kw["dump"] = None  # a replay writes no GGML_HEXAGON_DUMP captures (nor anywhere a dump file names)
    try:
        return HtpSettings(**kw)
    except TypeError as e:
        raise DumpFileError(f"{dump.path}: recorded HTP settings do not fit this kazeia ({e})") from None


def _overridden(base: Any, profile: str | None, vtcm: int | None, faults: list[str] | None,
                env: dict[str, str] | None) -> Any:
    """Recorded settings with the explicit overrides, and the GGML_HEXAGON_* switches `env` names."""
    from kazeia.backends.htp import HtpSettings

    if env:
        envd = HtpSettings.from_env(env=env)
        base = dataclasses.replace(base, **{k: getattr(envd, k) for k in ("opbatch", "opqueue", "nhvx", "use_hmx",
                                                                            "arch", "nhmx", "mm_select", "fa_select",
                                                                            "gdn_select", "opfusion")
                                            if any(n.endswith(k.upper()) for n in env)})
    if profile is not None:
        base = dataclasses.replace(base, profile=profile)
    if vtcm is not None:
        if vtcm < 64 * 1024 or vtcm > 1 << 30:
            raise KazeiaError(f"VTCM size {vtcm} B is out of range (64 KiB .. 1 GiB)")
        base = dataclasses.replace(base, vtcm_bytes=vtcm)
    if faults is not None:
        base = dataclasses.replace(base, faults=tuple(dict.fromkeys(faults)))
    return base


def _signature(out: np.ndarray, ref: np.ndarray, dump: Dump):
    """The error signature of a wrong output, with the output buffer's previous contents as a prior."""
    from kazeia.debug.signature import classify

    priors = {}
    before = dump.output_before.floats() if dump.output_before is not None else None
    if before is not None and before.size == np.asarray(out).size:
        priors["the output buffer (its previous contents)"] = before
    try:
        return classify(out, ref, priors=priors)
    except ValueError:  # shapes the classifier cannot pair (it says why): no signature
        return None


def replay(dump: Dump | str | os.PathLike, device: str | None = None, htp_profile: str | None = None,
           vtcm: int | None = None, faults: list[str] | None = None, env: dict[str, str] | None = None,
           with_context: bool = False, spec: Any = None, strict: bool = False) -> ReplayResult:
    """Rerun a dumped op on `device` (default: the device of the recorded run; CPU, HTP0 or REF), alone and
    optionally with its batch context, and judge it against float64 and against the recorded output.
    `spec` (a runner.RunSpec) may supply device, htp_profile, vtcm, faults and env instead.
    `faults=[]` clears the recorded fault injections; None keeps them. A weight MUL_MAT is allowed, on top of
    its threshold, the NMSE that ggml's own activation conversion commits on these inputs (as `kazeia compare`
    does: test-backend-ops compares with ggml's CPU, which converts them too); `strict=True` turns that off."""
    if not isinstance(dump, Dump):
        dump = load_dump(dump)
    if spec is not None:
        device = device or spec.device
        htp_profile = htp_profile or spec.htp_profile
        vtcm = vtcm or spec.vtcm
        faults = faults if faults is not None else (list(spec.faults) if spec.faults else None)
        env = env or (dict(spec.env) if spec.env else None)
    dev = device_name(device or dump.backend)
    settings = htp_settings_for(dump, htp_profile, vtcm, faults, env) if dev == "HTP0" else None
    if with_context and dev != "HTP0":
        raise KazeiaError("--with-context reruns the op's HTP batch: it needs -dev HTP0")
    thr = dump_threshold(dump)
    res = ReplayResult(dump.id, dump.name, dump.desc, dump.capture, thr, dev,
                       settings.profile if settings is not None else None,
                       alone=Execution("alone", dev), recorded_fault=dump.fault)
    if dump.capture == "enqueue" and not dump.manifest.get("synchronous"):
        res.notes.append("these inputs are an ENQUEUE-time capture: not what the op consumed on its device")

    ref, allowance = reference_run(dump)
    res.base_threshold = thr
    if allowance is not None:
        res.quant_allowance = allowance
        if not strict:
            thr = res.threshold = thr + allowance
    if ref.output is None:
        res.reference_error = ref.error or (ref.died or {}).get("message")
        res.notes.append(f"the float64 reference could not run: {res.reference_error}")
    recorded = dump.output.values if dump.output is not None and dump.capture == "complete" else None
    if recorded is not None and recorded.dtype.kind == "f":
        recorded = recorded.astype(np.float64)
    if recorded is not None and ref.output is not None:
        res.recorded_vs_ref = judge(recorded, ref.output, thr, name_a="recorded")
        if not res.recorded_vs_ref.ok:
            res.recorded_signature = _signature(recorded, ref.output, dump)

    def judged(ex: Execution) -> Execution:
        if ex.output is not None and ref.output is not None:
            ex.vs_ref = judge(ex.output, ref.output, thr, name_a=dev)
            if not ex.vs_ref.ok:
                ex.signature = _signature(ex.output, ref.output, dump)
        if ex.output is not None and recorded is not None:
            ex.vs_recorded = judge(ex.output, recorded, thr, name_a=dev, name_b="recorded")
        if ex.died is not None and dump.fault:
            ex.same_death_as_recorded = (ex.died.get("kind") == dump.fault.get("kind")
                                         and ex.died.get("cause") == dump.fault.get("cause"))
        return ex

    res.alone = judged(run_alone(dump, dev, settings))
    if with_context:
        if dump.capture != "complete":
            raise KazeiaError(f"{dump.id}: an enqueue-time capture has no batch context")
        res.context = judged(run_with_context(dump, settings))
    return res
