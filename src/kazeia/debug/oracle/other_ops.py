"""The other ops the engine uses: smaller grids over the models' shapes, and their graph builders."""

from __future__ import annotations

import math
from collections.abc import Iterable

from kazeia.debug.oracle.cases import Case, GridOptions, OpDef, Value
from kazeia.debug.oracle.inputs import Leaves
from kazeia.graph import builder as gb
from kazeia.graph.tensor import Tensor

N_ROWS_OPS = (1, 7, 32, 33, 38, 64, 65, 512)


def _ns(o: GridOptions) -> tuple[int, ...]:
    return (1, 33) if o.quick else N_ROWS_OPS


def _rows_grid(op: str, o: GridOptions, widths: Iterable[int], **extra: Value) -> list[Case]:
    cases = []
    for w in widths:
        for n in _ns(o):
            cases.append(Case.make(op, type="f32", ne=(w, n, 1, 1), **extra, view="contig"))
        cases.append(Case.make(op, type="f32", ne=(w, 38, 1, 1), **extra, view="rows"))
    return cases


def _view_rows(lv: Leaves, c: Case, name: str, lo: float, hi: float, t: str = "f32") -> Tensor:
    """The case's operand: contiguous, or (view=rows) the first ne0 values of rows 64 elements wider."""
    ne = tuple(c["ne"])
    if c.get("view", "contig") == "rows":
        base = lv.input(t, (ne[0] + 64,) + ne[1:], name, lo, hi)
        return gb.view(base, ne, base.nb)
    return lv.input(t, ne, name, lo, hi)


def _rms_norm_grid(o: GridOptions) -> list[Case]:
    cases = _rows_grid("RMS_NORM", o, (2560, 576) if not o.quick else (2560,), eps=1e-6)
    for n in (1, 38):  # q/k norm over each 128-wide head
        cases.append(Case.make("RMS_NORM", type="f32", ne=(128, 32, n, 1), eps=1e-6, view="contig"))
    return cases


def _build_rms_norm(c: Case, lv: Leaves) -> Tensor:
    return gb.rms_norm(_view_rows(lv, c, "a", -10.0, 10.0), c["eps"])


def _binary_grid(op: str, o: GridOptions) -> list[Case]:
    cases = []
    for n in _ns(o):
        cases.append(Case.make(op, type="f32", ne_a=(2560, n, 1, 1), ne_b=(2560, 1, 1, 1), view="contig"))
        cases.append(Case.make(op, type="f32", ne_a=(2560, n, 1, 1), ne_b=(2560, n, 1, 1), view="contig"))
    cases.append(Case.make(op, type="f32", ne_a=(128, 32, 38, 1), ne_b=(128, 1, 1, 1), view="contig"))
    cases.append(Case.make(op, type="f32", ne_a=(16, 5, 3, 2), ne_b=(16, 1, 3, 2), view="contig"))
    cases.append(Case.make(op, type="f32", ne_a=(576, 38, 1, 1), ne_b=(576, 38, 1, 1), view="permuted"))
    return cases


def _build_binary(c: Case, lv: Leaves) -> Tensor:
    lo, hi = (0.9, 1.1) if c.op == "MUL" else (-1.0, 1.0)  # test-backend-ops: MUL/DIV away from zero
    ne_a, ne_b = tuple(c["ne_a"]), tuple(c["ne_b"])
    if c.get("view") == "permuted":
        a = lv.permuted("f32", ne_a, (1, 0, 2, 3), "a", lo, hi)
        b = lv.permuted("f32", ne_b, (1, 0, 2, 3), "b", lo, hi)
    else:
        a, b = lv.input("f32", ne_a, "a", lo, hi), lv.input("f32", ne_b, "b", lo, hi)
    return (gb.mul if c.op == "MUL" else gb.add)(a, b)


def _scale_grid(o: GridOptions) -> list[Case]:
    return [Case.make("SCALE", type="f32", ne=(2560, n, 1, 1), s=0.125, b=0.0, view="contig") for n in _ns(o)] + [
        Case.make("SCALE", type="f32", ne=(256, 38, 8, 1), s=0.37, b=-0.25, view="contig")]


def _build_scale(c: Case, lv: Leaves) -> Tensor:
    return gb.scale(lv.input("f32", tuple(c["ne"]), "a"), c["s"], c["b"])


def _unary_grid(op: str, o: GridOptions, widths: Iterable[int]) -> list[Case]:
    return [Case.make(op, type="f32", ne=(w, n, 1, 1), view="contig") for w in widths for n in _ns(o)]


def _build_swiglu(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    return gb.swiglu_split(lv.input("f32", ne, "gate", -150.0, 150.0), lv.input("f32", ne, "up", -150.0, 150.0))


def _build_silu(c: Case, lv: Leaves) -> Tensor:
    return gb.silu(lv.input("f32", tuple(c["ne"]), "a", -150.0, 150.0))


def _rope_grid(o: GridOptions) -> list[Case]:
    cases = []
    heads = ((128, 32, 2, 1e6), (128, 8, 2, 1e6), (64, 9, 0, 1e4))  # Qwen3-4B q, k (NEOX); SmolLM2 q (NORM)
    for d, h, mode, base in heads[:1] if o.quick else heads:
        for n in _ns(o):
            cases.append(Case.make("ROPE", type="f32", ne=(d, h, n, 1), n_dims=d, mode=mode, base=base,
                                   view="contig"))
    if not o.quick:
        cases.append(Case.make("ROPE", type="f32", ne=(128, 8, 38, 1), n_dims=128, mode=2, base=1e6, view="rows"))
    return cases


def _build_rope(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    if c.get("view") == "rows":  # heads of a wider fused projection
        base = lv.input("f32", (ne[0], ne[1] + 2, ne[2], ne[3]), "a")
        a = gb.view(base, ne, base.nb)
    else:
        a = lv.input("f32", ne, "a")
    pos = lv.input("i32", (ne[2],), "pos", init=("ids", 512, False))  # test-backend-ops: rand() % n_ctx
    return gb.rope_ext(a, pos, c["n_dims"], c["mode"], c["base"])


def _soft_max_grid(o: GridOptions) -> list[Case]:
    cases = []
    shapes = ((256, 38, 32), (256, 1, 32)) if o.quick else ((256, 38, 32), (256, 1, 32), (512, 64, 8),
                                                            (256, 65, 9), (32, 7, 4))
    masks = ("f16",) if o.quick else ("f16", "f32", "none")
    for n_kv, n, h in shapes:
        for mask in masks:
            cases.append(Case.make("SOFT_MAX", type="f32", ne=(n_kv, n, h, 1), mask=mask, scale=0.125,
                                   max_bias=0.0))
    if not o.quick:
        cases.append(Case.make("SOFT_MAX", type="f32", ne=(256, 38, 8, 1), mask="f16", scale=0.125, max_bias=8.0))
    return cases


def _build_soft_max(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    a = lv.input("f32", ne, "a")
    mask = None
    if c["mask"] != "none":
        mask = lv.input(c["mask"], (ne[0], ne[1]), "mask", init=("mask", ne[1]))
    return gb.soft_max_ext(a, mask, c["scale"], c["max_bias"])


def _fa_grid(o: GridOptions) -> list[Case]:
    cases = []
    heads = ((128, 8, 4),) if o.quick else ((128, 8, 4), (64, 3, 3))  # Qwen3-4B (32 q / 8 kv), SmolLM2 (9 / 3)
    for hs, nh, nr in heads:
        for kv in ((256,) if o.quick else (256, 512)):
            for n in ((1, 38) if o.quick else (1, 7, 32, 33, 38, 64, 65)):
                cases.append(Case.make("FLASH_ATTN_EXT", hs=hs, nh=nh, nr=nr, kv=kv, nb=n, mask=1,
                                       type_KV="f16"))
    if not o.quick:
        cases.append(Case.make("FLASH_ATTN_EXT", hs=128, nh=8, nr=4, kv=256, nb=38, mask=0, type_KV="f16"))
    return cases


def _build_fa(c: Case, lv: Leaves) -> Tensor:
    """The engine's layout: q a permuted [D, T, H] view, K/V permuted views of F16 caches, an F16 mask."""
    d, hkv, nr, n_kv, n = c["hs"], c["nh"], c["nr"], c["kv"], c["nb"]
    h = hkv * nr
    q = gb.permute(lv.input("f32", (d, h, n), "q"), 0, 2, 1, 3)
    caches = []
    for name in ("k", "v"):
        t = lv.input(c["type_KV"], (d * hkv, n_kv), f"cache_{name}", own_buffer=True)
        caches.append(gb.permute(gb.view_3d(t, d, hkv, n_kv, t.nb[0] * d, t.nb[1]), 0, 2, 1, 3))
    mask = lv.input("f16", (n_kv, n), "mask", init=("mask", n)) if c["mask"] else None
    return gb.flash_attn_ext(q, caches[0], caches[1], mask, 1.0 / math.sqrt(d))


def _get_rows_grid(o: GridOptions) -> list[Case]:
    types = [t for t in ("f32", "f16", "q4_0", "q8_0") if o.want(t)]
    return [Case.make("GET_ROWS", type=t, ne=(2560, 512, 1, 1), n_ids=n)
            for t in types for n in ((1, 33) if o.quick else (1, 7, 38, 64, 512))]


def _build_get_rows(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    table = lv.weight(c["type"], ne, "table")
    ids = lv.input("i32", (c["n_ids"],), "ids", init=("ids", ne[1], False))
    return gb.get_rows(table, ids)


def _set_rows_grid(o: GridOptions) -> list[Case]:
    cases = [Case.make("SET_ROWS", type="f16", ne=(1024, n, 1, 1), rows=512, view="contig") for n in _ns(o)]
    if not o.quick:
        cases += [Case.make("SET_ROWS", type="f32", ne=(1024, 38, 1, 1), rows=512, view="contig"),
                  Case.make("SET_ROWS", type="f16", ne=(1024, 38, 1, 1), rows=512, view="rows")]
    return cases


def _build_set_rows(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    dst = lv.input(c["type"], (ne[0], c["rows"]), "cache", own_buffer=True)
    src = _view_rows(lv, c, "src", -1.0, 1.0)
    ids = lv.input("i64", (ne[1],), "ids", init=("ids", c["rows"], True))
    return gb.set_rows(dst, src, ids)


def _cpy_grid(o: GridOptions) -> list[Case]:
    pairs = (("f32", "f16"),) if o.quick else (("f32", "f16"), ("f32", "f32"), ("f16", "f32"), ("f16", "f16"))
    cases = [Case.make("CPY", type_src=s, type_dst=d, ne=(1024, n, 1, 1), view="contig")
             for s, d in pairs for n in _ns(o)]
    if not o.quick:
        cases += [Case.make("CPY", type_src=s, type_dst=d, ne=(128, 38, 8, 1), view="permuted")
                  for s, d in pairs]
    return cases


def _build_cpy(c: Case, lv: Leaves) -> Tensor:
    ne = tuple(c["ne"])
    if c.get("view") == "permuted":
        src = lv.permuted(c["type_src"], ne, (0, 2, 1, 3), "src", -150.0, 150.0)
    else:
        src = lv.input(c["type_src"], ne, "src", -150.0, 150.0)
    dst = lv.input(c["type_dst"], ne, "dst", init=("zeros",), own_buffer=True)
    return gb.cpy(src, dst)


def _cont_grid(o: GridOptions) -> list[Case]:
    ts = ("f32",) if o.quick else ("f32", "f16")
    return [Case.make("CONT", type=t, ne=(128, n, 32, 1), per=(0, 2, 1, 3)) for t in ts for n in _ns(o)[:4]]


def _build_cont(c: Case, lv: Leaves) -> Tensor:
    return gb.cont(lv.permuted(c["type"], tuple(c["ne"]), tuple(c["per"]), "a"))


OP_DEFS = [
    OpDef("RMS_NORM", _rms_norm_grid, _build_rms_norm),
    OpDef("MUL", lambda o: _binary_grid("MUL", o), _build_binary),
    OpDef("ADD", lambda o: _binary_grid("ADD", o), _build_binary),
    OpDef("SCALE", _scale_grid, _build_scale),
    OpDef("ROPE", _rope_grid, _build_rope),
    OpDef("SOFT_MAX", _soft_max_grid, _build_soft_max),
    OpDef("FLASH_ATTN_EXT", _fa_grid, _build_fa),
    OpDef("SWIGLU", lambda o: _unary_grid("SWIGLU", o, (9728, 1536) if not o.quick else (1536,)), _build_swiglu,
          aliases=("GLU",)),
    OpDef("SILU", lambda o: _unary_grid("SILU", o, (9728,) if not o.quick else (1536,)), _build_silu,
          aliases=("UNARY",)),
    OpDef("GET_ROWS", _get_rows_grid, _build_get_rows),
    OpDef("SET_ROWS", _set_rows_grid, _build_set_rows),
    OpDef("CPY", _cpy_grid, _build_cpy),
    OpDef("CONT", _cont_grid, _build_cont),
]
