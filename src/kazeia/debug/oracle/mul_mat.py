"""MUL_MAT cases: the grids over test-backend-ops' blocks and the models' shapes, and the graph builder.

The grids follow the HTP's plan: every token count where the MUL_MAT plan (path, chunking, status, fallback)
changes under either profile, plus the tile edges and, for the layer of the original crash (Qwen3-4B
ffn_down, K=9728, N=2560), every token count of its 2026-05 overflow window.
"""

from __future__ import annotations

import functools

from kazeia.debug.oracle.cases import Case, GridOptions, OpDef, Value, dedup
from kazeia.debug.oracle.inputs import Leaves, ggml_type
from kazeia.errors import KazeiaError
from kazeia.graph import builder as gb
from kazeia.graph.tensor import Tensor, block_size, type_name

N_SMALL = (1, 2, 3, 4, 5, 7, 8, 9, 16)
N_TILES = tuple(sorted({n for t in range(32, 1025, 32) for n in (t - 1, t, t + 1) if n <= 1024}))
N_FOCUS = (1, 7, 16, 31, 32, 33, 38, 48, 63, 64, 65, 96, 97, 128, 129, 256, 257, 512, 513, 1024)
N_COARSE = (1, 31, 32, 33, 64, 65, 128)
N_MODEL_SMALL = (31, 32, 33, 38, 63, 64, 65, 127, 128, 129, 512, 1024)

# (m, k) = (weight rows / output features, inner dimension), with the layer they come from
QWEN3_4B = ((4096, 2560, "attn_q"), (1024, 2560, "attn_k/v"), (2560, 4096, "attn_output"),
            (9728, 2560, "ffn_gate/up"), (2560, 9728, "ffn_down"))
SMOLLM2_135M = ((576, 576, "attn_q/output"), (192, 576, "attn_k/v"), (1536, 576, "ffn_gate/up"),
                (576, 1536, "ffn_down"))
MM_TYPES = ("q4_0", "q4_1", "q8_0", "f16", "f32")


def mul_mat_case(type_a: str, m: int, n: int, k: int, type_b: str = "f32", bs: tuple[int, int] = (1, 1),
                 nr: tuple[int, int] = (1, 1), view: str = "contig", k_v: int | None = None,
                 per: tuple[int, ...] | None = None, init: str = "uniform") -> Case:
    """A MUL_MAT case: a [k, m] (weight) x b [k, n] -> [m, n]. view: contig, rows (b rows of k inside rows of
    k_v), transposed (b stored [n, k]) or permuted (both built with permuted dims `per`, batched by bs/nr).
    init=extreme: weight blocks with extreme but finite scales (not in the default grids)."""
    params: dict[str, Value] = dict(type_a=type_a, type_b=type_b, m=m, n=n, k=k, bs=tuple(bs), nr=tuple(nr),
                                    view=view)
    if view == "rows":
        params["k_v"] = int(k_v if k_v is not None else k + 64)
    elif view == "permuted":
        params["per"] = tuple(per or (0, 2, 1, 3))
    elif view not in ("contig", "transposed"):
        raise KazeiaError(f"unknown MUL_MAT view '{view}' (contig, rows, transposed, permuted)")
    if init != "uniform":
        params["init"] = init
    return Case.make("MUL_MAT", **params)


def case_for_node(node: Tensor) -> Case | None:
    """The oracle case replaying a graph node's MUL_MAT shape (2-D weight, F32/F16 activations), or None."""
    if node.op != "MUL_MAT":
        return None
    a, b = node.src[0], node.src[1]
    if a.ne[2] * a.ne[3] != 1 or b.ne[2] * b.ne[3] != 1:
        return None
    ta, tb = type_name(a.type), type_name(b.type)
    m, n, k = a.ne[1], b.ne[1], a.ne[0]
    if b.nb[0] > b.nb[1]:
        return mul_mat_case(ta, m, n, k, tb, view="transposed")
    row = b.nb[1] // b.nb[0]
    if b.ne[1] > 1 and row > k:
        return mul_mat_case(ta, m, n, k, tb, view="rows", k_v=row)
    return mul_mat_case(ta, m, n, k, tb)


def _settings(profile: str, vtcm: int | None):
    """The HTP the grid is planned for: default switches, this profile and VTCM size."""
    from kazeia.backends.htp import DEFAULT_VTCM, HtpSettings

    return HtpSettings(profile=profile, vtcm_bytes=vtcm or DEFAULT_VTCM)


@functools.lru_cache(maxsize=256)
def plan_points(m: int, k: int, qtype: str, vtcm: int | None = None) -> frozenset[int]:
    """Token counts n where the HTP MUL_MAT plan (path, chunking, status, fallback) changes, with the count just
    before, under both profiles; plus every n whose plan fails (2026-05 overflow) and its neighbours."""
    from kazeia.backends.htp import PROFILES, QTYPES, matmul_node, plan_for_node

    if qtype not in QTYPES:
        return frozenset()
    node = matmul_node(1, k, m, qtype)
    pts: set[int] = set()
    for prof in PROFILES:
        settings = _settings(prof, vtcm)
        prev = None
        for n in range(1, 1025):
            p = plan_for_node(node, settings, m=n)
            key = (p.path, p.mc, p.nc, p.status, p.hmx_attempt is not None)
            if prev is not None and key != prev:
                pts.update((n - 1, n))
            if p.status != "ok":
                pts.update((n - 1, n, n + 1))
            prev = key
    return frozenset(n for n in pts if 1 <= n <= 1024)


def _irregular(m: int, k: int, t: str, vtcm: int | None) -> set[int]:
    """Plan changes that are not at a 32-token tile edge (a new chunking chosen for cost reasons), and failures."""
    from kazeia.backends.htp import matmul_node, plan_for_node

    node, settings = matmul_node(1, k, m, t), _settings("2026-05", vtcm)
    failing = {n for n in plan_points(m, k, t, vtcm) if plan_for_node(node, settings, m=n).status != "ok"}
    edges = {n for n in plan_points(m, k, t, vtcm) if n % 32 not in (0, 1, 31)}
    return edges | {x for n in failing for x in (n - 1, n, n + 1) if 1 <= x <= 1024}


def _mm_quick(types: list[str], o: GridOptions) -> list[Case]:
    cases = []
    for t in types:
        for n in (1, 5):
            cases.append(mul_mat_case(t, 16, n, 256))
        for n in (1, 31, 32, 33, 64, 65):
            cases.append(mul_mat_case(t, 576, n, 1536))
    if o.want("q4_0"):
        cases += [mul_mat_case("q4_0", 2560, n, 9728) for n in (32, 33, 64, 65)]
        for n in (7, 38):
            cases += [mul_mat_case("q4_0", 576, n, 1536, view=v) for v in ("rows", "transposed")]
        cases += [mul_mat_case("q4_0", 576, n, 1536, type_b="f16") for n in (7, 33)]
    for t in [x for x in ("q4_0", "f16") if x in types]:
        cases += [mul_mat_case(t, 64, n, 320) for n in (1, 33)]
    if o.want("f16"):
        cases.append(mul_mat_case("f16", 64, 32, 128, bs=(4, 1), nr=(2, 1)))
        cases.append(mul_mat_case("f16", 16, 8, 256, bs=(2, 3), view="permuted", per=(0, 2, 1, 3)))
    return cases


def _mm_grid(o: GridOptions) -> list[Case]:
    types = [t for t in MM_TYPES if o.want(t)]
    if o.quick:
        return _mm_quick(types, o)
    cases: list[Case] = []
    add = cases.append
    # test-backend-ops' first block: every type, m=16, k=256, n=1..9, large k, and F16 activations
    for t in types:
        cases += [mul_mat_case(t, 16, n, 256) for n in range(1, 10)]
        cases += [mul_mat_case(t, 16, n, 1024) for n in (1, 8, 16)]
        cases += [mul_mat_case(t, 16, n, 256, type_b="f16") for n in (1, 16)]
    # SmolLM2-135M: every 32-tile neighbourhood on its HMX-eligible ffn_down (K=1536) in Q4_0; K=576 is not a
    # multiple of 256 (quantized: HVX only)
    for t in types:
        for m, k, _ in SMOLLM2_135M:
            full = t == "q4_0" and k % 256 == 0
            ns = set(N_SMALL) | set(N_TILES) if full else set(N_SMALL) | set(N_MODEL_SMALL)
            ns |= _irregular(m, k, t, o.vtcm) if t != "f32" else set()
            cases += [mul_mat_case(t, m, n, k) for n in sorted(ns)]
    # Qwen3-4B (the model of the original crash): Q4_0 at tile edges, plan changes and the ffn_down window
    # token by token; the other types at fewer sizes
    for t in types:
        for m, k, _ in QWEN3_4B:
            ns = set(N_FOCUS) if t == "q4_0" else set(N_COARSE)
            ns |= _irregular(m, k, t, o.vtcm) if t != "f32" else set()
            if t == "q4_0" and (m, k) == (2560, 9728):  # the layer of the original crash: every plan change, tile
                ns |= set(plan_points(m, k, t, o.vtcm))  # edges up to 320 tokens, its 2026-05 overflow window
                ns |= {n for n in N_TILES if n <= 320} | set(range(30, 71))  # token by token
            cases += [mul_mat_case(t, m, n, k) for n in sorted(ns)]
    # activations not contiguous: rows inside wider rows (k_v), stored transposed; F16 activations
    for t in types:
        for n in (1, 7, 31, 32, 33, 38, 64, 65, 100):
            add(mul_mat_case(t, 576, n, 1536, view="rows", k_v=1600))
            add(mul_mat_case(t, 576, n, 1536, view="transposed"))
        cases += [mul_mat_case(t, 576, n, 1536, type_b="f16") for n in (7, 33, 64)]
    if o.want("q4_0"):
        for m, k in ((2560, 9728), (2560, 4096)):
            for n in (7, 33, 38, 65):
                add(mul_mat_case("q4_0", m, n, k, view="rows", k_v=k + 64))
                add(mul_mat_case("q4_0", m, n, k, view="transposed"))
    # K not a multiple of 256 (quantized HMX needs it), nor of 64
    for t in types:
        for m, k in ((64, 320), (96, 800), (128, 4160)):
            cases += [mul_mat_case(t, m, n, k) for n in (1, 7, 31, 32, 33, 64, 65, 128)]
    # batched and permuted (test-backend-ops blocks 4 and 7; the attention kq product)
    for t in types:
        for per in ((0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)):
            cases += [mul_mat_case(t, 16, n, 256, bs=(2, 3), view="permuted", per=per) for n in (1, 8, 16)]
    for t in [x for x in ("f16", "f32") if x in types]:
        for m, n, k, bs, nr in ((64, 2, 128, (8, 1), (1, 1)), (83, 2, 128, (8, 1), (4, 1)),
                                (64, 45, 128, (8, 1), (4, 1)), (128, 45, 64, (8, 1), (4, 1))):
            add(mul_mat_case(t, m, n, k, bs=bs, nr=nr))
        for n in (1, 38, 64):  # Qwen3 kq: K cache [128, 256, 8 heads] x q [128, n, 32 heads]
            add(mul_mat_case(t, 256, n, 128, bs=(8, 1), nr=(4, 1), view="permuted", per=(0, 2, 1, 3)))
    return dedup(cases)


def _build_mul_mat(c: Case, lv: Leaves) -> Tensor:
    ta, tb = ggml_type(c["type_a"]), ggml_type(c["type_b"])
    m, n, k = c["m"], c["n"], c["k"]
    bs, nr = c.get("bs", (1, 1)), c.get("nr", (1, 1))
    view = c.get("view", "contig")
    ne_a = (k, m, bs[0], bs[1])
    ne_b = (k, n, bs[0] * nr[0], bs[1] * nr[1])
    if view == "permuted":
        per = c.get("per", (0, 2, 1, 3))
        # like test-backend-ops: a block-quantized a keeps its rows (only per[0] == 0 permutations touch it)
        a = lv.permuted(ta, ne_a, per, "a") if block_size(ta) == 1 or per[0] == 0 else lv.input(ta, ne_a, "a")
        return gb.mul_mat(a, lv.permuted(tb, ne_b, per, "b"))
    extreme = c.get("init", "uniform") == "extreme"
    a = lv.weight(ta, ne_a, "a", extreme) if bs == (1, 1) else lv.input(ta, ne_a, "a")
    if view == "contig":
        b = lv.input(tb, ne_b, "b")
    elif view == "rows":
        base = lv.input(tb, (c["k_v"],) + ne_b[1:], "b")
        b = gb.view(base, ne_b, base.nb)
    elif view == "transposed":
        if ne_b[2] * ne_b[3] != 1:
            raise KazeiaError(f"{c.name}: view=transposed is 2-D only")
        b = gb.transpose(lv.input(tb, (n, k), "b"))
    else:
        raise KazeiaError(f"{c.name}: unknown view '{view}'")
    return gb.mul_mat(a, b)


OP_DEFS = [OpDef("MUL_MAT", _mm_grid, _build_mul_mat)]
