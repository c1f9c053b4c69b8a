"""Building graphs the ggml way: op constructors that compute result shapes, and a DFS-ordered graph.

Each constructor mirrors the ggml function of the same name (ggml_mul_mat, ggml_rope_ext, ...): same
operand order, same result shape, same op name. `Graph.expand(t)` adds t and everything it depends on in
depth-first order (src[0] before src[1]), as ggml_build_forward_expand does, so our node order, and thus
the order ops reach a backend, matches llama.cpp's.
"""

from __future__ import annotations

from kazeia.graph.tensor import GGMLType, Tensor, TFlag, contiguous_strides, make_tensor

F32 = GGMLType.F32


def _ne4(ne) -> tuple[int, int, int, int]:
    ne = tuple(int(x) for x in ne)
    return ne + (1,) * (4 - len(ne))  # type: ignore[return-value]


def _result(op: str, t: GGMLType, ne, srcs, name: str = "", **params) -> Tensor:
    return make_tensor(t, _ne4(ne), name=name, op=op, src=tuple(srcs), params=params)


def _view_of(a: Tensor, op: str, ne, nb, offs: int, name: str) -> Tensor:
    root = a.root
    return Tensor(type=a.type, ne=_ne4(ne), nb=tuple(nb), name=name, op=op, src=(a,),
                  view_src=root, view_offs=a.view_offs + offs, layer=a.layer)


def can_repeat(a: Tensor, b: Tensor) -> bool:
    """ggml_can_repeat(b, a): b broadcasts to a's shape."""
    return all(a.ne[i] % b.ne[i] == 0 for i in range(4))


# ---------------------------------------------------------------------------------------------
# views


def view(a: Tensor, ne, nb, offset: int = 0, name: str = "") -> Tensor:
    """ggml_view_Nd: ne and nb of the same length (nb[0] included); missing dims are 1."""
    ne4 = _ne4(ne)
    nb4 = list(nb)
    while len(nb4) < 4:
        nb4.append(nb4[-1] * ne4[len(nb4) - 1])
    return _view_of(a, "VIEW", ne4, nb4, offset, name or f"{ggml_name(a)} (view)")


def view_2d(a: Tensor, ne0: int, ne1: int, nb1: int, offset: int = 0, name: str = "") -> Tensor:
    return view(a, (ne0, ne1), (a.nb[0], nb1), offset, name)


def view_3d(a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int = 0, name: str = "") -> Tensor:
    return view(a, (ne0, ne1, ne2), (a.nb[0], nb1, nb2), offset, name)


def view_4d(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int, offset: int = 0,
            name: str = "") -> Tensor:
    return view(a, (ne0, ne1, ne2, ne3), (a.nb[0], nb1, nb2, nb3), offset, name)


def reshape(a: Tensor, *ne: int, name: str = "") -> Tensor:
    ne4 = _ne4(ne)
    if ne4[0] * ne4[1] * ne4[2] * ne4[3] != a.nelements:
        raise ValueError(f"reshape of {a.name} {a.ne} to {ne4}: element count differs")
    if not a.is_contiguous():
        raise ValueError(f"reshape of non-contiguous tensor {a.name}")
    return _view_of(a, "RESHAPE", ne4, contiguous_strides(a.type, ne4), 0, name or f"{ggml_name(a)} (reshaped)")


def permute(a: Tensor, ax0: int, ax1: int, ax2: int, ax3: int, name: str = "") -> Tensor:
    """ggml_permute: source dim i goes to position axis_i."""
    axes = (ax0, ax1, ax2, ax3)
    if sorted(axes) != [0, 1, 2, 3]:
        raise ValueError(f"bad permutation {axes}")
    ne = [0] * 4
    nb = [0] * 4
    for i, ax in enumerate(axes):
        ne[ax] = a.ne[i]
        nb[ax] = a.nb[i]
    return _view_of(a, "PERMUTE", ne, nb, 0, name or f"{ggml_name(a)} (permuted)")


def transpose(a: Tensor, name: str = "") -> Tensor:
    """ggml_transpose: dims 0 and 1 swapped, op TRANSPOSE (a view, like PERMUTE)."""
    t = permute(a, 1, 0, 2, 3, name=name or f"{ggml_name(a)} (transposed)")
    t.op = "TRANSPOSE"
    return t


# ---------------------------------------------------------------------------------------------
# compute ops


def cont(a: Tensor, name: str = "") -> Tensor:
    return _result("CONT", a.type, a.ne, (a,), name or f"{ggml_name(a)} (cont)")


def cpy(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """Copy a into b (converting type); the result is a view of b, named as ggml_cpy names it: `<b> (copy of <a>)`,
    or `<a> (copy)` when b has no name."""
    if a.nelements != b.nelements:
        raise ValueError("cpy: element counts differ")
    default = f"{ggml_name(b)} (copy of {ggml_name(a)})" if b.name else f"{ggml_name(a)} (copy)"
    r = _view_of(b, "CPY", b.ne, b.nb, 0, name or default)
    r.op, r.src = "CPY", (a, b)
    return r


def cast(a: Tensor, t: GGMLType, name: str = "") -> Tensor:
    """ggml_cast: a CPY into a new tensor of type t, named `<a> (copy)`; like ggml, its src[1] is itself."""
    r = _result("CPY", t, a.ne, (a,), name or f"{ggml_name(a)} (copy)")
    r.src = (a, r)
    return r


def get_rows(a: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """Rows of a (any type) picked by I32 ids -> F32 [a.ne0, n_ids, ids.ne1, ids.ne2]."""
    return _result("GET_ROWS", F32, (a.ne[0], ids.ne[0], ids.ne[1], ids.ne[2]), (a, ids), name)


def set_rows(dst: Tensor, src: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """Write rows of src into dst at I64 ids (converting to dst's type); the result is a view of dst."""
    r = _view_of(dst, "SET_ROWS", dst.ne, dst.nb, 0, name or f"{ggml_name(dst)} (view)")
    r.src = (src, ids, dst)
    return r


def rms_norm(a: Tensor, eps: float, name: str = "") -> Tensor:
    return _result("RMS_NORM", F32, a.ne, (a,), name, eps=float(eps))


def _binary(op: str, a: Tensor, b: Tensor, name: str) -> Tensor:
    if not can_repeat(a, b):
        raise ValueError(f"{op}: {b.name}{b.ne} does not broadcast to {a.name}{a.ne}")
    return _result(op, F32, a.ne, (a, b), name)


def add(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary("ADD", a, b, name)


def mul(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    return _binary("MUL", a, b, name)


def scale(a: Tensor, s: float, bias: float = 0.0, name: str = "") -> Tensor:
    return _result("SCALE", F32, a.ne, (a,), name, scale=float(s), bias=float(bias))


def scale_inplace(a: Tensor, s: float, name: str = "") -> Tensor:
    """ggml_scale_inplace: a SCALE whose result is a view of a (`<a> (view)`), written over a."""
    r = _view_of(a, "SCALE", a.ne, a.nb, 0, name or f"{ggml_name(a)} (view)")
    r.params = dict(scale=float(s), bias=0.0)
    return r


def mul_mat(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """ggml_mul_mat: a [K, N, ...] (weights), b [K, M, ...] -> [N, M, b.ne2, b.ne3]."""
    if a.ne[0] != b.ne[0]:
        raise ValueError(f"mul_mat {a.name} x {b.name}: K differs ({a.ne[0]} vs {b.ne[0]})")
    if b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise ValueError(f"mul_mat {a.name} x {b.name}: cannot broadcast batch dims")
    return _result("MUL_MAT", F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), (a, b), name)


ROPE_NORM = 0
ROPE_NEOX = 2


def rope_ext(a: Tensor, pos: Tensor, n_dims: int, mode: int, freq_base: float, freq_scale: float = 1.0,
             n_ctx_orig: int = 0, ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
             beta_slow: float = 1.0, name: str = "", freq_factors: Tensor | None = None) -> Tensor:
    """Rotary embedding over [head_dim, n_head, n_tokens]; pos is I32 [n_tokens]. `freq_factors` (F32 [n_dims/2],
    ggml's src[2], Phi-3's LongRoPE factors): pair i turns by theta_i / freq_factors[i]."""
    if mode not in (ROPE_NORM, ROPE_NEOX):
        raise ValueError(f"rope mode {mode} is not supported")
    if freq_factors is not None and freq_factors.ne[0] < n_dims // 2:
        raise ValueError(f"rope: {freq_factors.name} has {freq_factors.ne[0]} factors, want {n_dims // 2}")
    srcs = (a, pos) if freq_factors is None else (a, pos, freq_factors)
    return _result("ROPE", F32, a.ne, srcs, name, n_dims=int(n_dims), mode=int(mode),
                   freq_base=float(freq_base), freq_scale=float(freq_scale), n_ctx_orig=int(n_ctx_orig),
                   ext_factor=float(ext_factor), attn_factor=float(attn_factor), beta_fast=float(beta_fast),
                   beta_slow=float(beta_slow))


def soft_max_ext(a: Tensor, mask: Tensor | None, scale_: float, max_bias: float = 0.0, name: str = "") -> Tensor:
    return _result("SOFT_MAX", F32, a.ne, (a, mask) if mask is not None else (a,), name,
                   scale=float(scale_), max_bias=float(max_bias))


def flash_attn_ext(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale_: float, max_bias: float = 0.0,
                   softcap: float = 0.0, name: str = "") -> Tensor:
    """q [D, T, H], k [D, n_kv, H_kv], v [Dv, n_kv, H_kv], mask [n_kv, T] -> [Dv, H, T] (permuted)."""
    if q.ne[2] % k.ne[2]:
        raise ValueError("flash_attn_ext: query heads must be a multiple of kv heads")
    srcs = (q, k, v, mask) if mask is not None else (q, k, v)
    return _result("FLASH_ATTN_EXT", F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), srcs, name,
                   scale=float(scale_), max_bias=float(max_bias), softcap=float(softcap), prec="f32")


def swiglu_split(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """GLU op, SWIGLU variant, split form: silu(a) * b."""
    if a.ne != b.ne:
        raise ValueError("swiglu_split: operand shapes differ")
    return _result("GLU", F32, a.ne, (a, b), name, glu_op="SWIGLU", swapped=0)


def swiglu(a: Tensor, name: str = "") -> Tensor:
    """ggml_swiglu: the GLU op on one source, silu(first half of each row) * second half -> [ne0/2, ...]."""
    if a.ne[0] % 2:
        raise ValueError(f"swiglu: {a.name} has an odd row length {a.ne[0]}")
    return _result("GLU", F32, (a.ne[0] // 2, *a.ne[1:]), (a,), name, glu_op="SWIGLU", swapped=0)


def geglu_split(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """GLU op, GEGLU variant, split form: gelu(a) * b, ggml's tanh-approximated GELU."""
    if a.ne != b.ne:
        raise ValueError("geglu_split: operand shapes differ")
    return _result("GLU", F32, a.ne, (a, b), name, glu_op="GEGLU", swapped=0)


def silu(a: Tensor, name: str = "") -> Tensor:
    return _result("UNARY", F32, a.ne, (a,), name, unary_op="SILU")


def tanh(a: Tensor, name: str = "") -> Tensor:
    return _result("UNARY", F32, a.ne, (a,), name, unary_op="TANH")


def sigmoid(a: Tensor, name: str = "") -> Tensor:
    return _result("UNARY", F32, a.ne, (a,), name, unary_op="SIGMOID")


def softplus(a: Tensor, name: str = "") -> Tensor:
    """log(1 + exp(x)), and x itself above 20 (ggml_compute_softplus_f32)."""
    return _result("UNARY", F32, a.ne, (a,), name, unary_op="SOFTPLUS")


# ---------------------------------------------------------------------------------------------
# the ops of the hybrid (gated delta net) layers and multi-section rope

ROPE_MROPE = 8
ROPE_IMROPE = 40  # MROPE | 32: sections interleaved (Qwen3-VL, Qwen3.5)
ROPE_VISION = 24


def rope_multi(a: Tensor, pos: Tensor, n_dims: int, sections: tuple[int, int, int, int], mode: int,
               freq_base: float, freq_scale: float = 1.0, n_ctx_orig: int = 0, ext_factor: float = 0.0,
               attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0, name: str = "") -> Tensor:
    """ggml_rope_multi: rope over [head_dim, n_head, n_tokens] with 4 position streams, pos I32 [4 * n_tokens]
    (t, h, w, e); `sections` pairs of dims per stream. Op ROPE, like ggml."""
    if mode not in (ROPE_MROPE, ROPE_IMROPE):
        raise ValueError(f"rope_multi mode {mode} is not supported")
    if pos.ne[0] != 4 * a.ne[2]:
        raise ValueError(f"rope_multi: {pos.name} has {pos.ne[0]} positions, want 4 x {a.ne[2]}")
    return _result("ROPE", F32, a.ne, (a, pos), name, n_dims=int(n_dims), mode=int(mode),
                   sections=[int(x) for x in sections], freq_base=float(freq_base), freq_scale=float(freq_scale),
                   n_ctx_orig=int(n_ctx_orig), ext_factor=float(ext_factor), attn_factor=float(attn_factor),
                   beta_fast=float(beta_fast), beta_slow=float(beta_slow))


def cont_nd(a: Tensor, *ne: int, name: str = "") -> Tensor:
    """ggml_cont_2d/3d/4d: a CONT whose result has the new shape (same element count)."""
    ne4 = _ne4(ne)
    if ne4[0] * ne4[1] * ne4[2] * ne4[3] != a.nelements:
        raise ValueError(f"cont of {a.name} {a.ne} to {ne4}: element count differs")
    return _result("CONT", a.type, ne4, (a,), name or f"{ggml_name(a)} (cont)")


def concat(a: Tensor, b: Tensor, dim: int, name: str = "") -> Tensor:
    """ggml_concat: a then b along `dim`; every other dim equal. Result type is a's."""
    if a.type != b.type or any(a.ne[i] != b.ne[i] for i in range(4) if i != dim):
        raise ValueError(f"concat {a.name}{a.ne} and {b.name}{b.ne} along {dim}: shapes or types differ")
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    return _result("CONCAT", a.type, ne, (a, b), name, dim=int(dim))


def l2_norm(a: Tensor, eps: float, name: str = "") -> Tensor:
    """x / max(||x||, eps) per row."""
    return _result("L2_NORM", F32, a.ne, (a,), name, eps=float(eps))


def ssm_conv(sx: Tensor, c: Tensor, name: str = "") -> Tensor:
    """ggml_ssm_conv: sx [d_conv - 1 + n_t, d_inner, n_s] (conv state then the new columns, per channel), c
    [d_conv, d_inner] -> [d_inner, n_t, n_s]: out[s, t, i] = sum_j sx[s, i, t + j] * c[i, j]."""
    d_conv, d_inner = c.ne[0], c.ne[1]
    n_t = sx.ne[0] - d_conv + 1
    if sx.ne[1] != d_inner or n_t < 0 or sx.ne[3] != 1 or c.ne[2] != 1 or c.ne[3] != 1:
        raise ValueError(f"ssm_conv: {sx.name}{sx.ne} does not fit kernel {c.name}{c.ne}")
    return _result("SSM_CONV", F32, (d_inner, n_t, sx.ne[2]), (sx, c), name)


def gated_delta_net(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                    name: str = "", snapshots: int = 1) -> Tensor:
    """ggml_gated_delta_net: q, k [S, H_k, T, n_seqs], v [S, H, T, n_seqs], g [1 | S, H, T, n_seqs], beta
    [1, H, T, n_seqs] -> [S*H, T*n_seqs + K*S*n_seqs]: the outputs of every token, then K state snapshots (the
    final state when K = 1). q/k heads broadcast tiled (head h reads q head h % H_k), q is scaled by 1/sqrt(S)
    inside. The state comes in either upstream form: today's ggml (0c1e57098bba) takes the initial state
    [S, S, H, n_seqs] and K as an op param (`snapshots`); ggml bb4dc86a took [S*S*H, K, n_seqs], K its ne[1]."""
    S, H, T, n_seqs = v.ne
    today = state.ne == (S, S, H, n_seqs)
    K = snapshots if today else state.ne[1]
    ok = (q.ne[0] == k.ne[0] == S and q.ne[2] == k.ne[2] == T and H % q.ne[1] == 0 and H % k.ne[1] == 0
          and n_seqs % q.ne[3] == 0 and n_seqs % k.ne[3] == 0 and g.ne[0] in (1, S) and g.ne[1:] == (H, T, n_seqs)
          and beta.ne == (1, H, T, n_seqs) and (today or state.ne == (S * S * H, K, n_seqs, 1)) and K >= 1)
    if not ok:
        raise ValueError(f"gated_delta_net: inconsistent shapes q{q.ne} k{k.ne} v{v.ne} g{g.ne} beta{beta.ne} "
                         f"state{state.ne}")
    params = {"K": int(K)} if today else {}
    return _result("GATED_DELTA_NET", F32, (S * H, T * n_seqs + K * S * n_seqs), (q, k, v, g, beta, state), name,
                   **params)


def gdn_snapshots(node: Tensor) -> int:
    """K, the state snapshots a GATED_DELTA_NET node writes: today's op param, or the May form's state ne[1]."""
    return node.params.get("K", node.src[5].ne[1])


def gdn_state_slots(node: Tensor) -> int:
    """States per sequence its state source holds: 1 in today's form, K in the May form."""
    return 1 if "K" in node.params else node.src[5].ne[1]


# ---------------------------------------------------------------------------------------------


DUP_MARK = "#"  # `norm-0#2`: the third node llama.cpp names norm-0


def ggml_name(t: Tensor) -> str:
    """The name llama.cpp gives the tensor (without the `#k` that makes repeated names unique here)."""
    head, mark, k = t.name.rpartition(DUP_MARK)
    return head if mark and k.isdigit() else t.name


class Graph:
    """Nodes in execution order (DFS from each expanded output, sources first) plus the leaves.

    Names, as ggml_visit_parents gives them: an unnamed node becomes `node_<index>`, an unnamed leaf
    `leaf_<index>`. A name already used in this graph (llama.cpp repeats `norm-0`, `Qcur-0`, ...) gets `#k`, k = 1,
    2, ... in graph order, so every node has a name of its own; `ggml_name` strips it again."""

    def __init__(self) -> None:
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._seen: set[int] = set()
        self._names: dict[str, int] = {}
        self.placement = None  # graph/alloc.py Placement: where the allocator last placed every tensor (None: not)

    def expand(self, t: Tensor) -> Tensor:
        self.placement = None
        self._visit(t)
        return t

    def _visit(self, t: Tensor) -> None:
        # iterative DFS (models have thousands of chained nodes): post-order, src[0] first
        stack: list[tuple[Tensor, int]] = [(t, 0)]
        while stack:
            cur, i = stack.pop()
            if i == 0:
                if id(cur) in self._seen:
                    continue
                self._seen.add(id(cur))
            srcs = [s for s in cur.src if s is not None]
            while i < len(srcs) and id(srcs[i]) in self._seen:
                i += 1
            if i < len(srcs):
                stack.append((cur, i + 1))
                stack.append((srcs[i], 0))
                continue
            into = self.leafs if cur.op == "NONE" else self.nodes
            self._name(cur, "leaf" if into is self.leafs else "node", len(into))
            into.append(cur)

    def _name(self, t: Tensor, kind: str, index: int) -> None:
        if not t.name:
            t.name = f"{kind}_{index}"
        k = self._names.get(t.name, 0)
        self._names[t.name] = k + 1
        if k:
            t.name = f"{t.name}{DUP_MARK}{k}"

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> Tensor:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def outputs(self) -> list[Tensor]:
        return [n for n in self.nodes if n.flags & TFlag.OUTPUT]
