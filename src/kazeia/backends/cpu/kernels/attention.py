"""The `cpu` backend's decode attention family: FLASH_ATTN_EXT for a few query rows as AVX2 IR, compiled by
native/compile.py and bound to nodes by cpu/bind.py (its front); above FA_MAX_T query rows, or without the native
kernels, cpu/f32_ops.py's numpy flash attention runs.

- flash_attn_<kv>_<mask>: FLASH_ATTN_EXT for a few query rows (decode): per query row and head, scores
  q*scale . k over the cells whose mask is not -inf (+ mask), max, p = exp(s - max), z = sum p, o = sum p v / z,
  all sums in cell order; a row that sees no cell gives zeros. GQA: head h reads KV head h / (H / Hkv).
"""

from __future__ import annotations

from llvmlite import ir

from kazeia.backends.cpu.kernels.ops import V8F16, V8I16, exp1, exp8, vec_loop
from kazeia.native.compile import Library
from kazeia.native.irkit import F16, F32, I16, I32, I64, V8F32, Kernel, f32, i64, ptr

# flash attention parameters, int64 each, in this order (element strides: floats for q/out, the KV type's elements
# for k/v, the mask type's for the mask)
FA_FIELDS = ("S", "H", "T", "D", "Dv", "Hkv", "n_kv", "q_t", "q_h", "q_s", "k_c", "k_h", "k_s", "v_c", "v_h", "v_s",
             "m_t", "m_s", "m_rows", "m_seqs", "o_h", "o_t", "o_s")
FA_KV = ("f16", "f32")
FA_MASK = ("f16", "f32")


def _load8(k: Kernel, kind: str, base: ir.Value, j: ir.Value) -> ir.Value:
    """8 consecutive elements of an f16 (I16 bits) or f32 array as <8 x float>."""
    if kind == "f16":
        return k.b.fpext(k.b.bitcast(k.load_vec(base, V8I16, j), V8F16), V8F32)
    return k.load_vec(base, V8F32, j)


def _load1(k: Kernel, kind: str, base: ir.Value, j: ir.Value) -> ir.Value:
    v = k.load(base, j)
    return k.b.fpext(k.b.bitcast(v, F16), F32) if kind == "f16" else v


def _elem(kind: str) -> ir.Type:
    return I16 if kind == "f16" else F32


def _flash_attn(module: ir.Module, kv: str, mk: str) -> str:
    """flash_attn_<kv>_<mask>(prm, q, k, v, mask, out, scale): see the module docstring; prm holds FA_FIELDS, scale
    is the bits of a float32."""
    name = f"flash_attn_{kv}_{mk}"
    k = Kernel(module, name, [("prm", ptr(I64)), ("q", ptr(F32)), ("k", ptr(_elem(kv))), ("v", ptr(_elem(kv))),
                              ("mask", ptr(_elem(mk))), ("out", ptr(F32)), ("scale_bits", I64)])
    b, a = k.b, k.a
    p = {f: k.load(a.prm, i) for i, f in enumerate(FA_FIELDS)}
    g = b.sdiv(p["H"], p["Hkv"])
    scale = b.bitcast(b.trunc(a.scale_bits, I32), F32)
    qs = b.alloca(F32, size=p["D"])        # the scaled query row
    sc = b.alloca(F32, size=p["n_kv"])     # its scores
    acc = b.alloca(F32, size=p["Dv"])      # sum of p v
    ninf = f32(float("-inf"))
    with k.loop(0, p["S"], name="s") as s, k.loop(0, p["T"], name="t") as t:
        pm = k.gep(a.mask, b.add(b.mul(b.srem(t, p["m_rows"]), p["m_t"]), b.mul(b.srem(s, p["m_seqs"]), p["m_s"])))
        nv_slot = k.var(I64, i64(0))  # cells past the last one this row sees add nothing: stop there
        with k.loop(0, p["n_kv"], name="last") as c:
            seen = b.fcmp_ordered("!=", _load1(k, mk, pm, c), ninf)
            b.store(b.select(seen, b.add(c, i64(1)), b.load(nv_slot)), nv_slot)
        nv = b.load(nv_slot)
        with k.loop(0, p["H"], name="h") as h:
            _fa_row(k, kv, mk, p, g, s, t, h, pm, nv, qs, sc, acc, scale)
    k.ret()
    return name


def _fa_row(k: Kernel, kv: str, mk: str, p: dict, g, s, t, h, pm, nv, qs, sc, acc, scale) -> None:
    """One query row of one head: scores of the cells < nv, softmax, sum of p v, into out."""
    b, a = k.b, k.a
    ninf = f32(float("-inf"))
    zero8 = ir.Constant(V8F32, [0.0] * 8)
    kh = b.sdiv(h, g)
    pq = k.gep(a.q, b.add(b.add(b.mul(s, p["q_s"]), b.mul(t, p["q_t"])), b.mul(h, p["q_h"])))
    pk = k.gep(a.k, b.add(b.mul(s, p["k_s"]), b.mul(kh, p["k_h"])))  # (k_s, v_s: 0 for one KV sequence)
    pv = k.gep(a.v, b.add(b.mul(s, p["v_s"]), b.mul(kh, p["v_h"])))
    po = k.gep(a.out, b.add(b.add(b.mul(s, p["o_s"]), b.mul(t, p["o_t"])), b.mul(h, p["o_h"])))
    scale8 = k.broadcast(scale, 8)
    vec_loop(k, p["D"], lambda j: k.store_vec(b.fmul(k.load_vec(pq, V8F32, j), scale8), qs, j),
              lambda j: k.store(b.fmul(k.load(pq, j), scale), qs, j))
    mx = k.var(F32, ninf)
    with k.loop(0, nv, name="c") as c:
        mv = _load1(k, mk, pm, c)
        k.store(ninf, sc, c)
        with k.if_(b.fcmp_ordered("!=", mv, ninf)):
            kc = k.gep(pk, b.mul(c, p["k_c"]))
            dot = k.var(V8F32, zero8)
            tail = k.var(F32, f32(0.0))
            vec_loop(k, p["D"],
                      lambda j: b.store(k.fma(k.load_vec(qs, V8F32, j), _load8(k, kv, kc, j), b.load(dot)), dot),
                      lambda j: b.store(k.fma(k.load(qs, j), _load1(k, kv, kc, j), b.load(tail)), tail))
            sv = b.fadd(b.fadd(k.hsum8(b.load(dot)), b.load(tail)), mv)
            k.store(sv, sc, c)
            m0 = b.load(mx)
            b.store(b.select(b.fcmp_ordered(">", sv, m0), sv, m0), mx)
    m = b.load(mx)
    vec_loop(k, p["Dv"], lambda j: k.store_vec(zero8, acc, j), lambda j: k.store(f32(0.0), acc, j))
    z = k.var(F32, f32(0.0))
    with k.if_(b.fcmp_ordered("!=", m, ninf)):
        m8 = k.broadcast(m, 8)
        # p = exp(s - max) in place, 8 cells at a time (a masked cell's -inf gives 0)
        vec_loop(k, nv, lambda j: k.store_vec(exp8(k, b.fsub(k.load_vec(sc, V8F32, j), m8)), sc, j),
                  lambda j: k.store(exp1(k, b.fsub(k.load(sc, j), m)), sc, j))
        with k.loop(0, nv, name="c2") as c:
            with k.if_(b.fcmp_ordered("!=", _load1(k, mk, pm, c), ninf)):  # masked cells are skipped, as ggml
                pe = k.load(sc, c)
                b.store(b.fadd(b.load(z), pe), z)
                vc = k.gep(pv, b.mul(c, p["v_c"]))
                pe8 = k.broadcast(pe, 8)
                vec_loop(k, p["Dv"],
                          lambda j: k.store_vec(k.fma(pe8, _load8(k, kv, vc, j), k.load_vec(acc, V8F32, j)), acc, j),
                          lambda j: k.store(k.fma(pe, _load1(k, kv, vc, j), k.load(acc, j)), acc, j))
    zz = b.load(z)
    zz = b.select(b.fcmp_ordered("==", zz, f32(0.0)), f32(1.0), zz)
    z8 = k.broadcast(zz, 8)
    vec_loop(k, p["Dv"], lambda j: k.store_vec(b.fdiv(k.load_vec(acc, V8F32, j), z8), po, j),
              lambda j: k.store(b.fdiv(k.load(acc, j), zz), po, j))


# --- a list of calls in one ------------------------------------------------------------------------------


LIB = Library(__name__, "kazeia_simd_attention")
FLASH_ATTN = {(kv, mk): LIB.kernel(f"flash_attn_{kv}_{mk}", _flash_attn, kv, mk) for kv in FA_KV for mk in FA_MASK}
