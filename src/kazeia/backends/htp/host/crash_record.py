"""The cDSP crash record a device writes to logcat when the DSP user process dies, and its parser.

On a phone, a non-root user reads it with `adb logcat -s adsprpc`. Its lines, as quoted in public reports
(ggml-org/llama.cpp PR #17394, qualcomm/hexagon-mlir issue #69, haozixu/llama.cpp-npu issue #8), carry a prefix
(`CDSP0:[R]: ` or `adsprpc:dsp: CDSP:platform_qdi_driver.c:...: `), then: a banner "Process on cDSP CRASHED",
"Crash Details are furnished below", `Process "<pd> <binary>" crashed in thread "<t>" due to <reason>`, the
crashed shared object and its load address, the shell's load address, then `Fault PC`, `LR`, `SP`, `Bad VA`,
`FP`, `SSR`, `Error code` (hex) and a call trace of `[<PC>] symbol+0xOFF: (object)` lines.

The emulator's record follows that format. What it cannot know from a device it states as its own layout: the
HTP library's load address and symbol offsets, the callback thread's stack, and the virtual address VTCM is
mapped at (`VTCM_VA`; a real device prints where its VTCM is only in debug FARF logs, so `kazeia crashlog`
takes it as a parameter). Error codes: 0x2601 for a precise bus error and for a stack overflow (the code the
March 2026 HMX comment and the issue quote), 0x0 for an abort.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LIB = "./libggml-htp-v{arch}.so"  # the skel of the device's arch (archs.py)
LIB_LOAD = 0x20010000  # emulator's layout
SHELL = "fastrpc_shell_unsigned_3 load address : 100000  and size : 163EBC"
VTCM_VA = 0xD8000000  # emulator's layout: where VTCM is mapped in the DSP process
STACK_TOP = 0x00E40000  # emulator's layout: top of the callback thread's stack

# emulated symbol offsets inside LIB (the functions are upstream's names; the offsets are this emulator's)
SYMBOLS = {"htp_packet_callback": 0x1200, "proc_op_req": 0x1800, "op_matmul": 0x9400, "hmx_matmul_q_f32": 0xA200,
           "core_dot_chunk_fp16": 0xB600, "execute_op": 0x2400}
ERROR_CODES = {"bus-error": 0x2601, "stack-overflow": 0x2601, "abort": 0x0}
REASONS = {"bus-error": "due to precise exception occurrence", "stack-overflow": "due to precise exception occurrence",
           "abort": "for unknown reason"}
# the call chain each death kind dies in (innermost first)
TRACES = {"bus-error": ["core_dot_chunk_fp16", "hmx_matmul_q_f32", "op_matmul", "execute_op", "proc_op_req",
                        "htp_packet_callback"],
          "stack-overflow": ["op_matmul", "hmx_matmul_q_f32", "op_matmul", "hmx_matmul_q_f32", "op_matmul"],
          "abort": ["htp_packet_callback"]}
PREFIX = "CDSP0:[R]: "


def _pc(sym: str, off: int) -> int:
    return LIB_LOAD + SYMBOLS[sym] + off


def crash_record(kind: str, detail: dict | None = None, process: str = "llama-cli", arch: int = 79) -> list[str]:
    """The logcat lines of a cDSP crash of `kind` ("bus-error", "stack-overflow", "abort") in the skel of
    `arch`; `detail` may give `vtcm_offset` (the faulting VTCM byte: Bad VA = VTCM_VA + it) or `stack_used`
    (bytes of stack taken)."""
    detail = detail or {}
    lib = LIB.format(arch=arch)
    trace = TRACES.get(kind, ["htp_packet_callback"])
    offs = [0x1A4, 0x3C8, 0x88, 0x5C, 0x13C, 0x2F0]
    if "vtcm_offset" in detail:
        bad = VTCM_VA + int(detail["vtcm_offset"])
    elif kind == "stack-overflow":
        bad = STACK_TOP - int(detail.get("stack_used", 65536)) - 8
    else:
        bad = 0
    sp = STACK_TOP - int(detail.get("stack_used", 0x600))
    reason = REASONS.get(kind, "for unknown reason")
    lines = ["############################### Process on cDSP0 CRASHED!!!!!!! "
             "########################################",
             "--------------------- Crash Details are furnished below ------------------------------------",
             f'Process "/frpc/f05afd00 {process}" crashed in thread "htp-callback" {reason}',
             f'Crashed Shared Object "{lib}" load address : 0x{LIB_LOAD:08X} ', SHELL + " ",
             f"Fault PC   :    0x{_pc(trace[0], offs[0]):08X} ",
             f"LR         :    0x{_pc(trace[1 % len(trace)], offs[1 % len(offs)]):08X} ",
             f"SP         :    0x{sp:X} ", f"Bad VA     :    0x{bad:08X} ", f"FP         :    0x{sp + 8:X} ",
             f"SSR        :    0x{0x1970000 | (ERROR_CODES.get(kind, 0) & 0xFFF):X} ",
             f"Error code :    0x{ERROR_CODES.get(kind, 0):X} ", "Call trace : "]
    for i, sym in enumerate(trace):
        lines.append(f"[<{_pc(sym, offs[i % len(offs)]):08X}>] {sym}+0x{offs[i % len(offs)]:X}:     ({lib}) ")
    return [PREFIX + s for s in lines]


@dataclass
class ParsedCrash:
    process: str | None = None
    thread: str | None = None
    reason: str | None = None
    shared_object: str | None = None
    load_address: int | None = None
    fault_pc: int | None = None
    lr: int | None = None
    sp: int | None = None
    bad_va: int | None = None
    ssr: int | None = None
    error_code: int | None = None
    trace: list[tuple[int, str, int, str]] = field(default_factory=list)  # (pc, symbol, offset, object)

    def fault_location(self) -> str:
        """The fault PC as a symbolic location: the call trace's entry for it, else object+offset."""
        for pc, sym, off, obj in self.trace:
            if pc == self.fault_pc:
                return f"{sym}+0x{off:X} ({obj})"
        if self.fault_pc is not None and self.load_address is not None:
            return f"{self.shared_object or '?'}+0x{self.fault_pc - self.load_address:X}"
        return "unknown"


# Patterns over pasted user text: no nested or adjacent unbounded repeats (linear time on any line), and hex
# fields of at most 16 digits (a DSP address is 32 bits; a 5,000-digit "address" is not one).
_FIELD = re.compile(r"(Fault PC|LR|SP|Bad VA|FP|SSR|Error code)\s*:\s*0x([0-9A-Fa-f]{1,16})\b")
_PROC = re.compile(r'Process "([^"]*)" crashed in thread "([^"]*)" (.*)$')
_OBJ = re.compile(r'Crashed Shared Object "([^"]*)" load address : 0x([0-9A-Fa-f]{1,16})\b')
_TRACE = re.compile(r"\[<([0-9A-Fa-f]{1,16})>\]\s+([^+\s]+)\+0x([0-9A-Fa-f]{1,16}):\s*\(([^)]*)\)")
_KEYS = {"Fault PC": "fault_pc", "LR": "lr", "SP": "sp", "Bad VA": "bad_va", "FP": None, "SSR": "ssr",
         "Error code": "error_code"}


def parse_crash(text: str) -> ParsedCrash | None:
    """The crash record in pasted logcat text (any line prefix), or None when there is none."""
    if "CRASHED" not in text and "Bad VA" not in text:
        return None
    p = ParsedCrash()
    for line in text.splitlines():
        m = _PROC.search(line)
        if m:
            p.process, p.thread, p.reason = m.group(1), m.group(2), m.group(3).rstrip()
            continue
        m = _OBJ.search(line)
        if m:
            p.shared_object, p.load_address = m.group(1), int(m.group(2), 16)
            continue
        m = _TRACE.search(line)
        if m:
            p.trace.append((int(m.group(1), 16), m.group(2), int(m.group(3), 16), m.group(4)))
            continue
        m = _FIELD.search(line)
        if m and _KEYS.get(m.group(1)):
            setattr(p, _KEYS[m.group(1)], int(m.group(2), 16))
    return p if p.bad_va is not None or p.fault_pc is not None else None
