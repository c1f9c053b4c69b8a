"""The emulated Hexagon NPU (-dev HTP0): llama.cpp's ggml-hexagon backend in software, per upstream version
(profiles.py) and per arch (archs.py). This face is what the rest of kazeia (engine, debug, cli, bench) uses;
nothing outside htp/ imports past it (or past forensics.py, the
face of the internals the forensic tools read). Names load lazily: `from kazeia.backends.htp import HtpSettings` reads
settings.py only, not the whole device model.

The units, from the bottom up (each imports only those below it; tests/test_layering.py):
- profiles.py, build_layout.py (a build's HMX queue layout), archs.py (what each Hexagon arch sets per version),
  settings.py, fp16.py, msg.py (what host and DSP exchange: upstream htp-msg.h / htp-ops.h), l2.py (2026-10's
  dirty-range L2 table);
- kernels/: the native kernels of the numerics (one family per file: IR, front, portable twin);
- vtcm/: the VTCM arena, its areas, the MUL_MAT plan (May's on the DSP, October's on the host) and every other
  op's scratch layout;
- host/: the host side (op batches and their replay, the op queue and flush, supports_op, which under 2026-10
  asks the host's MUL_MAT plan, the x4x2 repack, the team's op log and dumps, the host/DSP timing, crash records);
- cost.py: modeled device time;
- device.py: the DSP process (VTCM, registers, the batch loop, death);
- hvx/, hmx/: each unit's numerics and its MUL_MAT path on the DSP;
- ops/: the DSP's op executor, MUL_MAT dispatch, flash attention, the other ops;
- backend.py: the Backend the scheduler sees.
"""

# ruff: noqa: F401  (the TYPE_CHECKING block re-exports every name of the face for readers; __all__ is built below)
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

_FACE = {
    "kazeia.backends.htp.backend": ("HtpBackend",),
    "kazeia.backends.htp.gates": ("VtcmPlanGate",),
    "kazeia.backends.htp.settings": ("HtpSettings", "DEFAULT_HVX_THREADS", "DEFAULT_VTCM", "MAX_HVX_THREADS"),
    "kazeia.backends.htp.profiles": ("FAULTS", "GENERATIONS", "LATEST_PROFILE", "PROFILES", "REPORTED",
                                     "Capabilities", "Fault", "Profile", "V73_HMX_QUANT_INF", "L2_LAZY_STALE",
                                     "HMX_BIAS_STALE", "HMX_QUEUE_NARROWING", "capabilities",
                                     "check_faults", "get_profile"),
    "kazeia.backends.htp.archs": ("KNOWN_ARCHS", "arch_profile", "describe_archs", "host_vmem_budget",
                                  "october_shm_bytes", "parse_arch", "session_refusal"),
    "kazeia.backends.htp.msg": ("STATUS_NAMES", "STATUS_OK"),
    "kazeia.backends.htp.host.support": ("K_QUANTS", "MAX_SRC1_ROWS", "MAX_WEIGHT_ROWS", "OCTOBER_QUANT_TYPES",
                                         "supports_op"),
    "kazeia.backends.htp.host.repack": ("RepackedWeight",),
    "kazeia.backends.htp.host.buffer_type": ("BUFFER_ALIGN", "alloc_size"),
    "kazeia.backends.htp.vtcm.matmul.record": ("MatmulPlan", "QTYPES"),
    "kazeia.backends.htp.vtcm.matmul.dispatch": ("matmul_node", "plan_for_node", "plan_matmul", "src_layout"),
    "kazeia.backends.htp.cost": ("DEFAULT", "PHONE_CPU", "CostModel", "graph_seconds", "hmx_matmul_seconds",
                                 "hvx_matmul_seconds", "op_seconds"),
    "kazeia.backends.htp.ops.matmul": ("WeightStore",),
    "kazeia.backends.htp.vtcm.hybrid_layouts": ("ssm_conv_scratch",),
    "kazeia.backends.htp.vtcm.src1_shortcut": ("src1_cache_effect",),
    "kazeia.backends.htp.build_layout": ("QUEUE_WORKERS", "build_skips", "describe_skips", "pin_build"),
}

if TYPE_CHECKING:  # what readers and IDEs see: the same names, imported eagerly (never at run time)
    from kazeia.backends.htp.archs import (
        KNOWN_ARCHS,
        arch_profile,
        describe_archs,
        host_vmem_budget,
        october_shm_bytes,
        parse_arch,
        session_refusal,
    )
    from kazeia.backends.htp.backend import HtpBackend
    from kazeia.backends.htp.build_layout import QUEUE_WORKERS, build_skips, describe_skips, pin_build
    from kazeia.backends.htp.cost import (
        DEFAULT,
        PHONE_CPU,
        CostModel,
        graph_seconds,
        hmx_matmul_seconds,
        hvx_matmul_seconds,
        op_seconds,
    )
    from kazeia.backends.htp.gates import VtcmPlanGate
    from kazeia.backends.htp.host.buffer_type import BUFFER_ALIGN, alloc_size
    from kazeia.backends.htp.host.repack import RepackedWeight
    from kazeia.backends.htp.host.support import (
        K_QUANTS,
        MAX_SRC1_ROWS,
        MAX_WEIGHT_ROWS,
        OCTOBER_QUANT_TYPES,
        supports_op,
    )
    from kazeia.backends.htp.msg import STATUS_NAMES, STATUS_OK
    from kazeia.backends.htp.ops.matmul import WeightStore
    from kazeia.backends.htp.profiles import (
        FAULTS,
        GENERATIONS,
        HMX_BIAS_STALE,
        HMX_QUEUE_NARROWING,
        L2_LAZY_STALE,
        LATEST_PROFILE,
        PROFILES,
        REPORTED,
        V73_HMX_QUANT_INF,
        Capabilities,
        Fault,
        Profile,
        capabilities,
        check_faults,
        get_profile,
    )
    from kazeia.backends.htp.settings import DEFAULT_HVX_THREADS, DEFAULT_VTCM, MAX_HVX_THREADS, HtpSettings
    from kazeia.backends.htp.vtcm.hybrid_layouts import ssm_conv_scratch
    from kazeia.backends.htp.vtcm.matmul.dispatch import matmul_node, plan_for_node, plan_matmul, src_layout
    from kazeia.backends.htp.vtcm.matmul.record import QTYPES, MatmulPlan
    from kazeia.backends.htp.vtcm.src1_shortcut import src1_cache_effect

def lazy_face(module: str, face: dict[str, tuple[str, ...]], namespace: dict) -> tuple[list[str], Callable, Callable]:
    """(__all__, __getattr__, __dir__) of a face module that loads each name's module on first use and keeps the
    value in `namespace` (the face's globals): importing the face costs nothing until a name is read."""
    where = {name: mod for mod, names in face.items() for name in names}

    def getattr_(name: str):
        mod = where.get(name)
        if mod is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(mod), name)
        namespace[name] = value
        return value

    names = sorted(where)
    return names, getattr_, lambda: names


__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
