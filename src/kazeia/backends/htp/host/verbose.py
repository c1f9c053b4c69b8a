"""ggml-hexagon's VERBOSE op lines, as the host logs each op it queues (GGML_HEXAGON_VERBOSE): May's
'execute-op' line (htp_opformat's five fields) and October's (ggml_hexagon_dump_op_exec, logged by add_op, with the
op's kernel params)."""

from __future__ import annotations

from collections.abc import Callable

from kazeia.backends.htp.settings import HtpSettings
from kazeia.backends.htp.vtcm.matmul.dispatch import plan_for_node
from kazeia.graph.tensor import Tensor, type_name


def _op_fields(node: Tensor) -> list[str]:
    """The five fields of upstream's VERBOSE op line (both versions' htp_opformat): names, dims, types, strides and
    buffers, each "src x src -> dst"."""
    srcs = [s for s in node.src if s is not None]

    def dims(t: Tensor) -> str:
        return ":".join(str(x) for x in (t.ne[:2] if t.ne[2] == t.ne[3] == 1 else t.ne))

    def strides(t: Tensor) -> str:
        nb = t.nb[:2] if t.ne[2] == t.ne[3] == 1 else t.nb
        return ":".join(str(x) for x in nb) + ("" if t.is_contiguous() else "!")

    def join(f: Callable[[Tensor], str]) -> str:
        return (" x ".join(f(s) for s in srcs) + " -> " if srcs else "") + f(node)

    return [join(lambda t: t.name), join(dims), join(lambda t: type_name(t.type)), join(strides),
            join(lambda t: t.buffer.name)]


def op_desc_line(node: Tensor, session: str, flags: int = 0) -> str:
    """The upstream VERBOSE 'execute-op' line: names : dims : types : strides : buffers : flags."""
    return f"ggml-hex: {session} execute-op {node.desc()}: {' : '.join(_op_fields(node))} : flags 0x{flags:x}"


def op_desc_line_2026_10(node: Tensor, session: str, settings: HtpSettings, flags: int = 0) -> str:
    """2026-10's VERBOSE line (ggml_hexagon_dump_op_exec, logged by add_op): op|names|dims|types|strides|buffers|
    kernel params|flags. The kernel params are printed for MUL_MAT (its host plan: "hmx-tiled" / "hvx-tiled" and
    its VTCM bytes); the other ops' October params are not modelled, so that field is left empty for them."""
    kparams = ""
    if node.op == "MUL_MAT":
        p = plan_for_node(node, settings)
        kparams = f"{'hmx' if p.path == 'hmx' else 'hvx'}-tiled vtcm {p.used}"
    return f"ggml-hex: {session} execute-op {'|'.join([node.desc(), *_op_fields(node), kparams])}|flags 0x{flags:x}"
