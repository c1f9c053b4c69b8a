"""The `cpu` backend: float32; weight matmuls computed from the quantized bytes (qmatmul.py), the other ops by the
native kernels bound to nodes (bind.py, kernels/) or the float32 numpy kernels (f32_ops.py, backends/numpy_ops/).
`NumpyBackend` is what `cpu` and `ref` share."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

from kazeia.backends.base import Backend
from kazeia.backends.cpu import bind
from kazeia.backends.cpu.f32_ops import F32_KERNELS
from kazeia.backends.cpu.kernels import program
from kazeia.backends.cpu.packs import packed_copy
from kazeia.backends.cpu.qmatmul import WeightSet, dequantize_rows
from kazeia.backends.numpy_ops import KERNELS, NumpyOps, scatter_rows
from kazeia.errors import UnsupportedError
from kazeia.gguf.quants import Q8_0, BlockFormat, dequantize
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import SCALAR_DTYPES, BufferUsage, GGMLType, Tensor, TFlag, array, is_quantized, rows
from kazeia.identity import IdentityCache, binding
from kazeia.native.compile import available
from kazeia.native.threads import threads

if "NUMPY_MADVISE_HUGEPAGE" not in os.environ:
    # numpy asks for transparent huge pages on every array >= 4 MiB; the first touch of each 2 MiB page then
    # waits for the kernel to find (compact) and zero one: measured 20-50 ms for a 5-row store into a fresh
    # KV cache, 0.65 s of the default model's first token. A user's explicit NUMPY_MADVISE_HUGEPAGE wins.
    np._core.multiarray._set_madvise_hugepage(False)


class NumpyBackend(Backend, NumpyOps):
    """Shared plumbing of `cpu` and `ref`: loading sources, weight matrices, writing results."""

    ft = np.float32
    static_supports = True
    f32_kernels: dict = {}  # op -> (plain kernel it replaces, float32 kernel); used while KERNELS[op] is that one

    # --- Backend ---
    def supports(self, node: Tensor) -> bool:
        if node.op not in KERNELS:
            return False
        return all(s is None or _readable(s.type) for s in node.src) and _writable(node.type)

    def compute(self, node: Tensor) -> None:
        kern = KERNELS.get(node.op)
        f32 = self.f32_kernels.get(node.op)
        if f32 is not None and f32[0] is kern:  # (a patched KERNELS entry, e.g. by a test, wins)
            kern = f32[1]
        if kern is None:
            raise UnsupportedError(f"op {node.op} ({node.name}) is not implemented by {self.name}")
        if not self.hooks:
            return kern(self, node)
        info = self._info(node, self.path_name)  # one record for the op's start and completion
        self.emit_start(node, info)
        kern(self, node)
        self.emit_complete(node, info)

    path_name = "cpu"

    # --- NumpyOps ---
    def load(self, t: Tensor) -> np.ndarray:
        if t.type in SCALAR_DTYPES:
            return np.asarray(array(t), dtype=self.ft)  # no copy for float32 sources
        if t.type == GGMLType.BF16 or is_quantized(t.type):
            return dequantize(rows(t), t.type, self.ft)
        raise UnsupportedError(f"{t.name}: type {t.type.name} cannot be read by {self.name}")

    def load_rows(self, t: Tensor, sel: np.ndarray) -> np.ndarray:
        """Selected rows of a 2-D weight, dequantized (GET_ROWS on an embedding table)."""
        if t.type in SCALAR_DTYPES:
            return array(t)[0, 0, sel].astype(self.ft)
        return dequantize(rows(t)[0, 0, sel], t.type, self.ft)

    def store(self, t: Tensor, values: np.ndarray) -> None:
        if t.type == GGMLType.Q8_0:  # each row quantized as ggml-cpu's from_float does
            rows(t)[...] = Q8_0.quantize_rows(values.reshape(t.ne[::-1]))
            return
        out = array(t)
        out[...] = values.reshape(out.shape) if values.shape != out.shape else values

    def store_rows(self, t: Tensor, idx: np.ndarray, vals: np.ndarray) -> None:
        if t.type == GGMLType.Q8_0:  # a quantized KV cache (SET_ROWS): the rows quantized as `store` does
            scatter_rows(rows(t), idx, Q8_0.quantize_rows(vals))
            return
        scatter_rows(array(t), idx, vals)


def _readable(t: GGMLType) -> bool:
    return t in SCALAR_DTYPES or t == GGMLType.BF16 or t in BlockFormat.registry


def _writable(t: GGMLType) -> bool:
    return t in (GGMLType.F32, GGMLType.F16, GGMLType.Q8_0)  # (Q8_0: quantized by store / store_rows)


class CpuBackend(NumpyBackend):
    """float32; weight matmuls read the weights' own (memory-mapped) bytes through qmatmul, so no float copy of
    a weight is kept. Weight matmuls that share their input (Q/K/V, gate/up) write one product, each into its
    columns. Where the native kernels run, each node of a graph is bound once to its native call (bind.py) and a
    decode step is one ctypes call per op; the nodes they do not cover go through the numpy kernels."""

    name = "CPU"
    f32_kernels = F32_KERNELS
    ft = np.float32
    float_dtype = "float32"
    path_name = "cpu"
    fuse_matmuls = True

    def __init__(self) -> None:
        super().__init__()
        self._groups: IdentityCache[dict[Tensor, _Member]] = IdentityCache("cpu.matmul_groups", limit=16)
        self._fused: dict[Tensor, _Member] = {}  # the current graph's fused MUL_MATs -> their group
        self._pending: dict[tuple, list] = {}  # group -> [fused product of this graph run, members still to store]
        self._mirrors: IdentityCache[tuple[int, np.ndarray]] = IdentityCache("cpu.kv_mirrors", limit=None)
        self._sets: IdentityCache[WeightSet] = IdentityCache("cpu.weight_sets", bind=True)  # weights -> descriptors
        self._binds: IdentityCache[_GraphBind] = IdentityCache("cpu.graph_binds", limit=16, bind=True)
        self._graph_bind = _GraphBind(None)  # the current graph's
        self.run_id = 0  # counts graph runs: a fused group computes its product once per run

    @property
    def native_shared(self) -> dict:
        """What the bound calls of the current graph share (bind.py: rope tables, fused groups)."""
        return self._graph_bind.shared

    def begin_graph(self, graph: Graph) -> None:
        super().begin_graph(graph)
        self._pending.clear()
        self.run_id += 1
        placed = graph.placement
        self._graph_bind = self._binds.get(graph, lambda: _GraphBind(placed),
                                           lambda gb: placed is not None and gb.placement is placed)
        self._fused = self._groups.get(graph, lambda: _matmul_groups(graph)) if self.fuse_matmuls else {}

    def run_nodes(self, nodes: list[Tensor]) -> None:
        """With no hook attached, the nodes' bound calls one after the other, each run of native ones as one program
        (a list made once per graph placement and thread count; a node without a bound call goes through compute).
        A subclass that watches compute gets every node, and so does KAZEIA_NO_BIND=1 (node by node, each bound for
        its call)."""
        if self.hooks or type(self).compute is not CpuBackend.compute or not binding():
            return super().run_nodes(nodes)
        n = threads()
        calls = self._graph_bind.programs.get(nodes, lambda: self._program(nodes), lambda c: c[0] == n)
        for call in calls[1]:
            call()

    def _program(self, nodes: list[Tensor]) -> tuple[int, list]:
        """(thread count, the calls of `nodes`: runs of native ones merged into programs)."""
        calls = [self._call_of(n) for n in nodes]
        if available():
            calls = program.program(calls)  # runs of native calls: one call of run_program each
        return threads(), calls

    def _call_of(self, node: Tensor):
        e = self._entry(node)
        return e[1] if e[1] is not None else functools.partial(self.compute, node)

    def _entry(self, node: Tensor) -> tuple:
        """(node, bound call or None, hook details): kept for a node of the current graph; a node of no graph begun
        here (a replayed op, a row-split piece) is bound for this call only, with nothing shared, so it runs the
        same kernel as it did inside its graph."""
        bound = self._graph_bind.bound
        e = bound.get(node)
        if e is None:
            i, g = self.node_index.get(node), getattr(self, "_indexed", None)  # (set by Backend.begin_graph)
            member = i is not None and g is not None and i < len(g.nodes) and g.nodes[i] is node
            e = self._bind(node, member)
            if member and binding():
                bound[node] = e
        return e

    def _bind(self, node: Tensor, member: bool) -> tuple:
        if not available():
            return (node, None, None)
        shared = self.native_shared if member else {}
        if node.op == "MUL_MAT":
            got = bind.bind_matmul(self, node, self._fused.get(node) if member else None, shared)
            return (node, None, None) if got is None else (node, got[0], got[1])
        return (node, bind.bind(self, node, shared), {})

    def compute(self, node: Tensor) -> None:
        e = self._entry(node)
        if e[1] is not None:
            if not self.hooks:
                return e[1]()
            info = self._info(node, self.path_name, **e[2])
            self.emit_start(node, info)
            e[1]()
            self.emit_complete(node, info)
            return
        m = self._fused.get(node)
        if m is None:
            return super().compute(node)
        info = self._info(node, self.path_name, fused=len(m.weights)) if self.hooks else None
        if info is not None:
            self.emit_start(node, info)
        entry = self._pending.get(m.key)
        if entry is None:
            y = self.load(node.src[1])
            entry = self._pending[m.key] = [self._fused_product(m.weights, y.reshape(-1, y.shape[-1])),
                                            len(m.weights)]
        self.store(node, entry[0][:, m.c0:m.c1])
        entry[1] -= 1
        if entry[1] == 0:
            del self._pending[m.key]  # every member has its columns: free the product
        if info is not None:
            self.emit_complete(node, info)

    # --- float32 mirrors of F16 KV caches (the portable path: no native kernels): numpy's flash attention reads
    # them without converting every token ---
    # A mirror is made when this backend first writes rows into an F16 tensor outside the compute buffer (the
    # KV cache's SET_ROWS) and follows every later store_rows. It expires when the buffer's `version` changes
    # (KVCache.clear bumps it; any host code that writes such a buffer directly must bump it too) or when
    # another backend writes the tensor (foreign_write).
    def kv_mirror(self, t: Tensor) -> np.ndarray | None:
        """t (a view of an F16 KV cache) over the float32 mirror of its root, if a current one exists."""
        e = self._mirrors.peek(t.root)
        if e is None or e[0] != t.root.buffer.version:
            return None
        return _same_view(t, t.root, e[1])

    def foreign_write(self, root: Tensor) -> None:
        self._mirrors.pop(root)

    def store_rows(self, t: Tensor, idx: np.ndarray, vals: np.ndarray) -> None:
        super().store_rows(t, idx, vals)
        root = t.root
        if available():
            return  # the native flash attention reads F16 directly (numpy's converts the cells it uses)
        if root.type != GGMLType.F16 or root.buffer is None or root.buffer.usage == BufferUsage.COMPUTE:
            return
        e = self._mirrors.peek(root)
        if e is None or e[0] != root.buffer.version:
            self._mirrors.put(root, (root.buffer.version, _f32_mirror(array(root))))
            return  # made from the buffer, which already holds the new rows
        # the rows just written, as the F16 buffer holds them (the store rounded vals to fp16)
        scatter_rows(_same_view(t, root, e[1]), idx, vals.astype(np.float16).astype(np.float32))

    def weight_matrix(self, t: Tensor) -> np.ndarray:
        """The weight as float32 (N, K), dequantized now and not kept (for tools; matmuls never need it)."""
        return dequantize_rows(rows(t)[0, 0], t.type, t.ne[0])

    def weight_matmul(self, t: Tensor, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return self.weight_set((t,)).matmul(y, out)

    def _fused_product(self, ws: tuple[Tensor, ...], y: np.ndarray) -> np.ndarray:
        """y @ [W1; W2; ...]^T as one (M, sum N) array, each weight's product written into its columns."""
        return self.weight_set(ws).matmul(y)

    def weight_set(self, ws: tuple[Tensor, ...]) -> WeightSet:
        """The qmatmul.WeightSet of these weights (their GEMV descriptors: addresses of the mapped rows and of
        their packed copies, packs.py), kept by the weight tensors: weights are placed once, when the model is
        loaded, and never move."""
        return self._sets.get(ws, lambda: _weight_set(ws))


def _weight_set(ws: tuple[Tensor, ...]) -> WeightSet:
    s = WeightSet([(rows(w)[0, 0], w.type, w.ne[0]) for w in ws])
    if s.kind is not None:
        s.use_packed([_packed_copy(w, raw, s.kind) for w, (raw, _, _) in zip(ws, s.weights)])
    return s


def _packed_copy(w: Tensor, raw: np.ndarray, kind: str) -> np.ndarray | None:
    """The packed copy of a weight read from a mapped model file (packs.py), or None."""
    buf = w.buffer
    if buf is None or buf.source is None or buf.usage != BufferUsage.WEIGHTS:
        return None
    return packed_copy(raw, kind, buf.source, raw.ctypes.data - buf.data.ctypes.data)


class _GraphBind:
    """What the backend binds to one graph placed by the allocator (graph/alloc.py Placement): each node's bound
    native call, what those calls share (rope tables, fused products), and the programs of its node lists."""

    __slots__ = ("placement", "bound", "shared", "programs")

    def __init__(self, placement) -> None:
        self.placement = placement
        self.bound: dict[Tensor, tuple] = {}  # node -> (node, bound call or None, hook details)
        self.shared: dict[tuple, object] = {}
        self.programs: IdentityCache[tuple[int, list]] = IdentityCache("cpu.programs", limit=8, bind=True)


@dataclass(frozen=True)
class _Member:
    key: tuple  # identifies the fused weight matrix (names, addresses, types)
    weights: tuple[Tensor, ...]
    c0: int  # this node's columns in the fused product
    c1: int


def _f32_mirror(f16: np.ndarray) -> np.ndarray:
    """float32 copy of an F16 cache whose rows are mostly still zero (a fresh or cleared KV cache): zero pages
    (untouched, so they cost no memory) except the rows holding something, which are converted."""
    out = np.zeros(f16.shape, dtype=np.float32)
    flat = f16.reshape(-1, f16.shape[-1])
    # a row is used when any of its bytes is not zero: tested 8 bytes at a time when the row allows it
    # (the first store into a fresh cache scans all of it: 94 MB for the default model's -c 4096)
    word = np.uint64 if flat.shape[1] % 4 == 0 and flat.flags.c_contiguous else np.uint16
    used = (flat.view(word) != 0).any(axis=1)
    if used.any():
        idx = np.flatnonzero(used)
        out.reshape(-1, f16.shape[-1])[idx] = flat[idx]
    return out


def _same_view(t: Tensor, root: Tensor, full: np.ndarray) -> np.ndarray:
    """The view t takes of root's bytes, taken of `full` (root's values in another dtype) instead."""
    src_el, el = root.nb[0], full.itemsize
    start = (t.offset - root.offset) // src_el
    strides = tuple(nb // src_el * el for nb in t.nb[::-1])
    return np.lib.stride_tricks.as_strided(full.reshape(-1)[start:], shape=t.ne[::-1], strides=strides)


def _matmul_groups(graph: Graph) -> dict[Tensor, _Member]:
    """MUL_MAT nodes on 2-D weights grouped by their input tensor; groups of two or more are fused."""
    by_input: dict[Tensor, list[Tensor]] = {}
    for n in graph.nodes:
        if n.op == "MUL_MAT" and n.src[0].flags & TFlag.WEIGHT and n.src[0].ne[2] == n.src[0].ne[3] == 1:
            by_input.setdefault(n.src[1], []).append(n)
    out: dict[Tensor, _Member] = {}
    for nodes in by_input.values():
        if len(nodes) < 2:
            continue
        ws = tuple(n.src[0] for n in nodes)
        key = ("fused",) + tuple((w.weight_name or w.name, w.data_addr, w.type) for w in ws)
        c = 0
        for n, w in zip(nodes, ws):
            out[n] = _Member(key, ws, c, c + w.ne[1])
            c += w.ne[1]
    return out
