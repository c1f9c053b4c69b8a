"""A loaded model and an inference context: KV cache, micro-batches, graph building and running.

`Model.load(path)` reads the GGUF (memory-mapped), picks the architecture file and checks the weights.
`Context.decode(tokens)` splits tokens into micro-batches of at most n_ubatch, builds (or reuses) the graph
for each, lets the graph allocator place intermediates, writes the inputs, runs the scheduler and returns
the logits of the requested rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

from kazeia.engine.recurrent import RecurrentCache
from kazeia.engine.scheduler import Scheduler
from kazeia.errors import ContextOverflowError, KazeiaError
from kazeia.gguf.reader import GGUFFile, load_gguf
from kazeia.graph.alloc import GraphAllocator
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Buffer, BufferUsage, GGMLType, Tensor, array, make_tensor
from kazeia.identity import IdentityCache
from kazeia.memory import check_fits
from kazeia.models.base import ModelArgs, arch_module, model_args, require_weights, weight_tensors
from kazeia.models.transformer import GraphOptions, Inputs, LayerCache, make_inputs, position_streams

FA_KV_PAD = 256  # llama.cpp pads the attended KV length to 256 cells with flash attention


@dataclass
class Model:
    file: GGUFFile
    args: ModelArgs
    arch: ModuleType
    weights: dict[str, Tensor]
    weight_buffer: Buffer

    @classmethod
    def load(cls, path: str) -> Model:
        f = load_gguf(path)
        arch = arch_module(f.architecture, f.path)
        args = model_args(f)
        buf, weights = weight_tensors(f)
        require_weights(f, weights, arch.required_weights(args))
        return cls(f, args, arch, weights, buf)

    @property
    def path(self) -> str:
        return self.file.path


class KVCache:
    """Per-layer K and V caches [n_embd_kv, size]; cell i holds position i (one sequence)."""

    def __init__(self, args: ModelArgs, size: int, type_k: GGMLType = GGMLType.F16,
                 type_v: GGMLType = GGMLType.F16, layers: list[int] | None = None) -> None:
        """`layers`: the layers with attention (default all; a hybrid's other layers have None here)."""
        self.size = size
        self.layers: list[LayerCache | None] = [None] * args.n_layer
        tensors = []
        for il in range(args.n_layer) if layers is None else layers:
            k = make_tensor(type_k, (args.n_embd_kv, size), name=f"cache_k_l{il}")
            v = make_tensor(type_v, (args.n_embd_kv, size), name=f"cache_v_l{il}")
            tensors += [k, v]
            self.layers[il] = LayerCache(k, v)
        total = sum((t.nbytes + Buffer.ALIGN - 1) // Buffer.ALIGN * Buffer.ALIGN for t in tensors)
        check_fits(f"the KV cache for a context of {size} tokens ({len(tensors) // 2} layers, K and V "
                   f"{type_k.name}/{type_v.name})", total, "; lower -c")
        self.buffer = Buffer.zeros("kv_cache", total, BufferUsage.ANY)
        off = 0
        for t in tensors:
            t.buffer, t.offset = self.buffer, off
            off += (t.nbytes + Buffer.ALIGN - 1) // Buffer.ALIGN * Buffer.ALIGN
        self.n_past = 0

    def clear(self) -> None:
        self.buffer.data[:] = 0
        self.buffer.version += 1
        self.n_past = 0


@dataclass
class _BuiltGraph:
    graph: Graph
    inputs: Inputs
    logits: Tensor


class Context:
    def __init__(self, model: Model, scheduler: Scheduler, n_ctx: int = 4096, n_ubatch: int = 512,
                 flash_attn: bool = True, type_k: GGMLType = GGMLType.F16, type_v: GGMLType = GGMLType.F16) -> None:
        if n_ctx <= 0 or n_ubatch <= 0:
            raise KazeiaError("context size and micro-batch size must be positive")
        self.model = model
        self.args = model.args
        self.scheduler = scheduler
        self.n_ctx = n_ctx
        self.n_ubatch = n_ubatch
        self.opts = GraphOptions(flash_attn=flash_attn)
        kv_layers = getattr(model.arch, "attention_layers", None)  # a hybrid keeps KV for its attention layers only
        self.kv = KVCache(model.args, n_ctx, type_k, type_v, kv_layers(model.args) if kv_layers else None)
        self.rs = RecurrentCache.for_model(model.args, model.arch)  # conv/SSM states of recurrent layers, or None
        self.allocator = GraphAllocator()
        # graphs by (tokens, KV cells, outputs): a decode builds each shape once and replays it every token
        self._graphs: IdentityCache[_BuiltGraph] = IdentityCache("context.graphs", limit=9, bind=True, by_value=True)
        self.last_graph: Graph | None = None
        self.on_ubatch = None  # optional callback(ubatch_index, n_tokens) for progress
        self.recovery = None  # engine/recovery.py: Recovery, to survive device deaths (None: a death ends the run)
        self.policy = None  # engine/policy.py: Policy whose split rules cut micro-batches (its routing is a gate)
        self.reserve()

    def reserve(self) -> None:
        """llama_context's graph_reserve: plan the compute buffer for the worst-case micro-batch (n_ubatch tokens,
        every KV cell, every token an output); smaller graphs then run at that plan's addresses."""
        n = min(self.n_ctx, self.n_ubatch)
        self.allocator.reserve(self._build(n, self.kv.size, n).graph)

    @property
    def n_past(self) -> int:
        return self.kv.n_past

    def reset(self) -> None:
        self.kv.clear()
        if self.rs is not None:
            self.rs.clear()

    def rewind(self, n: int) -> int:
        """Keep the first n tokens of the cache (later cells are masked out, then overwritten); returns how many
        were kept. A recurrent state cannot go back: short of n_past itself, the context starts over (0)."""
        if self.rs is not None and n != self.n_past:
            self.reset()
            return 0
        self.kv.n_past = n
        return n

    def _n_kv(self, n_end: int) -> int:
        pad = FA_KV_PAD if self.opts.flash_attn else 32
        return min(self.kv.size, (n_end + pad - 1) // pad * pad)

    def _graph_for(self, n_tokens: int, n_kv: int, n_out: int) -> _BuiltGraph:
        bg = self._build(n_tokens, n_kv, n_out)
        self.allocator.allocate(bg.graph)
        return bg

    def _build(self, n_tokens: int, n_kv: int, n_out: int) -> _BuiltGraph:
        def make() -> _BuiltGraph:
            arch_inputs = getattr(self.model.arch, "make_inputs", None)
            inp = (arch_inputs(n_tokens, n_kv, n_out, self.opts.flash_attn) if arch_inputs is not None else
                   make_inputs(n_tokens, n_kv, n_out, self.opts.flash_attn, self.opts.kq_mask_cast, self.args.n_embd))
            caches = self.rs.layer_caches(self.kv.layers) if self.rs is not None else self.kv.layers
            graph, logits = self.model.arch.build(self.args, self.model.weights, inp, caches, n_kv, self.opts)
            return _BuiltGraph(graph, inp, logits)
        return self._graphs.get((n_tokens, n_kv, n_out), make)

    def decode(self, tokens: list[int] | np.ndarray, all_logits: bool = False) -> np.ndarray:
        """Feed tokens at the next positions; returns logits [n_out, n_vocab] of the last micro-batch
        (its last row only unless all_logits)."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise KazeiaError("nothing to decode: empty token list")
        if self.n_past + tokens.size > self.n_ctx:
            raise ContextOverflowError(
                f"{tokens.size} tokens do not fit in the context: {self.n_past} used of {self.n_ctx} "
                f"(raise -c, up to the model's {self.args.n_ctx_train})")
        if tokens.min() < 0 or tokens.max() >= self.args.n_vocab:
            raise KazeiaError(f"token id out of range [0, {self.args.n_vocab})")
        logits = None
        pieces = [tokens[s:s + self.n_ubatch] for s in range(0, tokens.size, self.n_ubatch)]
        if self.policy is not None:  # split rules: sizes whose graphs hold no node in a range to avoid
            pieces = [c[o:o + n] for c in pieces for o, n in zip(*self._split(c.size))]
        for i, chunk in enumerate(pieces):
            last = i == len(pieces) - 1
            logits = self._decode_ubatch(chunk, all_logits and last, compute_logits=last)
            if self.on_ubatch:
                self.on_ubatch(i, chunk.size)
        return logits

    def _split(self, n: int) -> tuple[list[int], list[int]]:
        """(offsets, sizes) of the pieces the policy's split rules cut a micro-batch of n tokens into."""
        from kazeia.engine.policy import split_sizes

        def nodes_for(t: int) -> list[Tensor]:
            return [x for x in self._build(t, self._n_kv(self.n_past + t), 1).graph.nodes if x.is_computed]

        sizes = split_sizes(n, nodes_for, self.policy)
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        return offsets, sizes

    def _decode_ubatch(self, tokens: np.ndarray, all_logits: bool, compute_logits: bool = True) -> np.ndarray:
        T = tokens.size
        p0 = self.n_past
        n_kv = self._n_kv(p0 + T)
        n_out = T if all_logits else 1
        bg = self._graph_for(T, n_kv, n_out)
        self._write_inputs(bg.inputs, tokens, p0, n_kv, all_logits)
        self.last_graph = bg.graph
        if self.recovery is None:
            self.scheduler.compute(bg.graph)
            self.scheduler.read_output(bg.logits)  # llama_decode reads the logits: an asynchronous device finishes
        else:  # a re-run after a device death starts from the same inputs and recurrent state
            state = self.rs.buffer.data.copy() if self.rs is not None else None

            def prepare() -> None:
                if state is not None:
                    self.rs.buffer.data[:] = state
                    self.rs.buffer.version += 1
                self._write_inputs(bg.inputs, tokens, p0, n_kv, all_logits)

            self.recovery.compute(bg.graph, bg.logits, prepare, f"micro-batch of {T} tokens at position {p0}")
        self.kv.n_past = p0 + T
        out = array(bg.logits)[0, 0]  # (n_out, n_vocab)
        return np.array(out, dtype=np.float32)

    def _write_inputs(self, inp: Inputs, tokens: np.ndarray, p0: int, n_kv: int, all_logits: bool) -> None:
        T = tokens.size
        pos = np.arange(p0, p0 + T)
        array(inp.tokens)[...] = tokens.astype(np.int32)
        array(inp.pos)[...] = position_streams(pos, inp.pos.ne[0] // T).astype(np.int32)
        if self.rs is not None:
            self.rs.write_inputs(inp)
        array(inp.kv_idx)[...] = pos.astype(np.int64)
        if inp.v_idx is not None:
            array(inp.v_idx)[...] = pos.astype(np.int64)
        cells = np.arange(n_kv)
        visible = cells[None, :] <= pos[:, None]  # causal: a token sees itself and the past
        m = array(inp.mask)[0, 0]  # (T, n_kv)
        m[...] = np.where(visible, 0.0, -np.inf).astype(m.dtype)
        array(inp.out_ids)[...] = (np.arange(T) if all_logits else np.array([T - 1])).astype(np.int32)
