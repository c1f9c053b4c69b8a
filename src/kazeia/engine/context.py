"""A loaded model and an inference context: KV cache, micro-batches, graph building and running.

`Model.load(path)` reads the GGUF (memory-mapped), picks the architecture file and checks the weights.
`Context.decode(tokens)` splits tokens into micro-batches of at most n_ubatch, builds (or reuses) the graph
for each, lets the graph allocator place intermediates, writes the inputs, runs the scheduler and returns
the logits of the requested rows. `Context.decode_seqs(seqs)` feeds several sequences in lockstep (llama.cpp's
`-np N` with a unified KV cache, `-kvu`), cut into micro-batches as llama.cpp's split_equal cuts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np

from kazeia.engine.kv import KVCache, SwaCache
from kazeia.engine.recurrent import RecurrentCache
from kazeia.engine.scheduler import Scheduler
from kazeia.errors import ContextOverflowError, KazeiaError
from kazeia.gguf.reader import GGUFFile, load_gguf
from kazeia.graph.alloc import GraphAllocator
from kazeia.graph.builder import Graph
from kazeia.graph.tensor import Buffer, GGMLType, Tensor, array
from kazeia.identity import IdentityCache
from kazeia.models.base import ModelArgs, arch_module, model_args, require_weights, weight_tensors
from kazeia.models.transformer import GraphOptions, Inputs, make_inputs, position_streams

FA_KV_PAD = 256  # llama.cpp pads the attended KV length to 256 cells with flash attention
MAX_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ


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


@dataclass
class _BuiltGraph:
    graph: Graph
    inputs: Inputs
    logits: Tensor


class Context:
    def __init__(self, model: Model, scheduler: Scheduler, n_ctx: int = 4096, n_ubatch: int = 512,
                 flash_attn: bool = True, type_k: GGMLType = GGMLType.F16, type_v: GGMLType = GGMLType.F16,
                 n_seq: int = 1, kq_mask_cast: bool = False) -> None:
        """`n_seq`: the sequences `decode_seqs` runs side by side (llama.cpp's n_seq_max, -np), in one unified KV
        cache of n_ctx cells and one recurrent-state cell each. `kq_mask_cast`: the May 2026 graph (an F32 mask and
        its F16 cast, models/transformer.py) instead of llama.cpp's since #23764."""
        if n_ctx <= 0 or n_ubatch <= 0:
            raise KazeiaError("context size and micro-batch size must be positive")
        if not 1 <= n_seq <= MAX_SEQ:
            raise KazeiaError(f"the number of sequences must be in [1, {MAX_SEQ}] (llama.cpp's LLAMA_MAX_SEQ)")
        if n_seq > n_ubatch:
            raise KazeiaError(f"-np {n_seq} sequences do not fit in a micro-batch of {n_ubatch} tokens (raise -ub)")
        self.n_seq = n_seq
        self.seq_n_past = 0  # decode_seqs: tokens of each sequence so far (they advance together)
        self.model = model
        self.args = model.args
        self.scheduler = scheduler
        self.n_ctx = n_ctx
        self.n_ubatch = n_ubatch
        self.opts = GraphOptions(flash_attn=flash_attn, kq_mask_cast=kq_mask_cast, n_ctx_seq=n_ctx)  # one stream
        kv_layers = getattr(model.arch, "attention_layers", None)  # a hybrid keeps KV for its attention layers only
        swa = getattr(model.arch, "swa_layers", lambda a: [])(model.args)  # sliding-window layers: their own cache
        layers = kv_layers(model.args) if kv_layers else list(range(model.args.n_layer))
        if swa and n_seq > 1:
            raise KazeiaError(f"-np {n_seq}: several sequences with a sliding-window model are not modelled")
        self.kv = KVCache(model.args, n_ctx, type_k, type_v, [il for il in layers if il not in swa])
        self.kv_swa = SwaCache(model.args, n_ctx, model.args.n_swa, n_ubatch, swa, type_k, type_v) if swa else None
        self.rs = RecurrentCache.for_model(model.args, model.arch, n_seq)  # conv/SSM states per sequence, or None
        self.allocator = GraphAllocator()
        # graphs by (tokens, KV cells, outputs, sequences): a decode builds each shape once and replays it every token
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
        self.allocator.reserve(self._build(n, self.kv.size, n, n_kv_swa=self.kv_swa.size if self.kv_swa else 0).graph)

    @property
    def n_past(self) -> int:
        return self.kv.n_past

    def reset(self) -> None:
        self.kv.clear()
        if self.kv_swa is not None:
            self.kv_swa.clear()
        self.seq_n_past = 0
        if self.rs is not None:
            self.rs.clear()

    def rewind(self, n: int) -> int:
        """Keep the first n tokens of the cache (later cells are masked out, then overwritten); returns how many
        were kept. A recurrent state cannot go back: short of n_past itself, the context starts over (0)."""
        if (self.rs is not None and n != self.n_past) or (
                self.kv_swa is not None and not self.kv_swa.keeps(n, self.n_past)):
            self.reset()
            return 0
        self.kv.n_past = n
        return n

    def _n_kv(self, n_end: int) -> int:
        pad = FA_KV_PAD if self.opts.flash_attn else 32
        return min(self.kv.size, (n_end + pad - 1) // pad * pad)

    def _graph_for(self, n_tokens: int, n_kv: int, n_out: int, n_seqs: int = 1, n_kv_swa: int = 0) -> _BuiltGraph:
        bg = self._build(n_tokens, n_kv, n_out, n_seqs, n_kv_swa)
        self.allocator.allocate(bg.graph)
        return bg

    def _layer_caches(self) -> list:
        """Per layer what its graph reads and writes: its KV cache (the SWA cache for a sliding-window layer) or
        its recurrent state."""
        kv = self.kv.layers
        if self.kv_swa is not None:
            kv = [s if s is not None else b for s, b in zip(self.kv_swa.layers, kv)]
        return self.rs.layer_caches(kv) if self.rs is not None else kv

    def _build(self, n_tokens: int, n_kv: int, n_out: int, n_seqs: int = 1, n_kv_swa: int = 0) -> _BuiltGraph:
        """The graph of a micro-batch of n_tokens = n_seqs x (tokens per sequence) seeing n_kv cells of the KV
        cache (and n_kv_swa of the SWA cache); only a recurrent layer's shapes depend on n_seqs."""
        def make() -> _BuiltGraph:
            arch_inputs = getattr(self.model.arch, "make_inputs", None)
            inp = (arch_inputs(n_tokens, n_kv, n_out, self.opts.flash_attn, self.opts.kq_mask_cast, n_seqs=n_seqs,
                               rs_fresh=fresh)
                   if arch_inputs is not None else
                   make_inputs(n_tokens, n_kv, n_out, self.opts.flash_attn, self.opts.kq_mask_cast, self.args.n_embd,
                               n_kv_swa))
            graph, logits = self.model.arch.build(self.args, self.model.weights, inp, self._layer_caches(), n_kv,
                                                  self.opts)
            return _BuiltGraph(graph, inp, logits)
        fresh = self.rs is not None and self.rs.fresh  # build_rs zeroes a fresh cell: its view has a size then
        return self._graphs.get((n_tokens, n_kv, n_out, n_seqs, n_kv_swa, fresh), make)

    def _n_kv_swa(self, n_end: int) -> int:
        return self.kv_swa.n_kv(n_end) if self.kv_swa is not None else 0

    def decode(self, tokens: list[int] | np.ndarray, all_logits: bool = False) -> np.ndarray:
        """Feed tokens at the next positions; returns logits [n_out, n_vocab] of the last micro-batch
        (its last row only unless all_logits)."""
        if self.n_seq > 1:
            raise KazeiaError(f"this context runs {self.n_seq} sequences side by side: feed them with decode_seqs")
        tokens = self._checked(tokens)
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

    def _checked(self, tokens, n_seqs: int = 1) -> np.ndarray:
        """tokens as int64, refused when empty, out of the vocabulary or beyond the context."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise KazeiaError("nothing to decode: empty token list")
        if self.n_past + n_seqs * tokens.size > self.n_ctx:
            what = f"{tokens.size} tokens" + (f" x {n_seqs} sequences" if n_seqs > 1 else "")
            raise ContextOverflowError(
                f"{what} do not fit in the context: {self.n_past} used of {self.n_ctx} "
                f"(raise -c, up to the model's {self.args.n_ctx_train})")
        if tokens.min() < 0 or tokens.max() >= self.args.n_vocab:
            raise KazeiaError(f"token id out of range [0, {self.args.n_vocab})")
        return tokens

    def decode_seqs(self, seqs: list) -> np.ndarray:
        """Continue every sequence of the context by the same number of tokens (seqs[s] continues sequence s), as
        llama-batched-bench does: micro-batches as llama.cpp's split_equal cuts them (all sequences, at most
        n_ubatch // n_seq tokens each, sequence after sequence), cells of one unified KV cache in order, a mask
        that lets a token see only its own sequence's cells. Returns the logits of each sequence's last token
        [n_seq, n_vocab]. A context of one sequence decodes it with `decode`."""
        if len(seqs) != self.n_seq:
            raise KazeiaError(f"decode_seqs: {len(seqs)} sequences given, the context runs {self.n_seq}")
        if self.n_seq == 1:  # one sequence: decode's micro-batches (and the policy's split rules)
            return self.decode(seqs[0])
        arrays = [np.asarray(t, dtype=np.int64).reshape(-1) for t in seqs]
        if len({a.size for a in arrays}) != 1:
            raise KazeiaError("decode_seqs: the sequences advance together, so they need the same number of tokens")
        for a in arrays:
            self._checked(a, self.n_seq)
        n, per = arrays[0].size, self.n_ubatch // self.n_seq
        logits = None
        for i, start in enumerate(range(0, n, per)):
            chunk = np.stack([a[start:start + per] for a in arrays])  # (n_seq, t)
            logits = self._decode_seqs_ubatch(chunk)
            if self.on_ubatch:
                self.on_ubatch(i, chunk.size)
        return logits

    def _decode_seqs_ubatch(self, chunk: np.ndarray) -> np.ndarray:
        S, t = chunk.shape
        c0, p0 = self.kv.n_past, self.seq_n_past
        n_kv = self._n_kv(c0 + S * t)
        bg = self._graph_for(S * t, n_kv, S, S)
        seq = np.repeat(np.arange(S), t)  # token i of the micro-batch: sequence seq[i], position pos[i]
        pos = p0 + np.tile(np.arange(t), S)
        cells = np.arange(c0, c0 + S * t, dtype=np.int64)
        self.kv.cell_seq[cells], self.kv.cell_pos[cells] = seq, pos
        owner, at = self.kv.cell_seq[:n_kv], self.kv.cell_pos[:n_kv]
        visible = (owner[None, :] == seq[:, None]) & (at[None, :] <= pos[:, None])  # its own sequence's past
        out_rows = np.arange(S) * t + t - 1  # each sequence's last token
        self._run(bg, lambda: self._write_inputs(bg.inputs, chunk.reshape(-1), pos, cells, visible, out_rows),
                  f"micro-batch of {S} sequences x {t} tokens at position {p0}")
        self.kv.n_past, self.seq_n_past = c0 + S * t, p0 + t
        return np.array(array(bg.logits)[0, 0], dtype=np.float32)

    def _split(self, n: int) -> tuple[list[int], list[int]]:
        """(offsets, sizes) of the pieces the policy's split rules cut a micro-batch of n tokens into."""
        from kazeia.engine.policy import split_sizes

        def nodes_for(t: int) -> list[Tensor]:
            n_end = self.n_past + t
            return [x for x in self._build(t, self._n_kv(n_end), 1, n_kv_swa=self._n_kv_swa(n_end)).graph.nodes
                    if x.is_computed]

        sizes = split_sizes(n, nodes_for, self.policy)
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        return offsets, sizes

    def _decode_ubatch(self, tokens: np.ndarray, all_logits: bool, compute_logits: bool = True) -> np.ndarray:
        T = tokens.size
        p0 = self.n_past
        n_kv = self._n_kv(p0 + T)
        n_out = T if all_logits else 1
        n_kv_swa = self._n_kv_swa(p0 + T)
        bg = self._graph_for(T, n_kv, n_out, n_kv_swa=n_kv_swa)
        pos = np.arange(p0, p0 + T)  # one sequence: cell i holds position i
        visible = np.arange(n_kv)[None, :] <= pos[:, None]  # causal: a token sees itself and the past

        def write() -> None:
            self._write_inputs(bg.inputs, tokens, pos, pos.astype(np.int64), visible, out_rows)
            if self.kv_swa is not None:  # the sliding-window layers' cells and mask
                cells = self.kv_swa.store(pos)
                self._write_kv_inputs(bg.inputs.swa, cells, self.kv_swa.visible(pos, n_kv_swa))
        out_rows = np.arange(T) if all_logits else np.array([T - 1])
        self._run(bg, write, f"micro-batch of {T} tokens at position {p0}")
        self.kv.n_past = p0 + T
        out = array(bg.logits)[0, 0]  # (n_out, n_vocab)
        return np.array(out, dtype=np.float32)

    def _run(self, bg: _BuiltGraph, write_inputs, what: str) -> None:
        """Write the inputs and run the graph; with a recovery, a re-run after a device death starts from the same
        inputs and recurrent state. Afterwards every recurrent cell holds a state."""
        self._compute(bg, write_inputs, what)
        if self.rs is not None:
            self.rs.fresh = False

    def _compute(self, bg: _BuiltGraph, write_inputs, what: str) -> None:
        write_inputs()
        self.last_graph = bg.graph
        if self.recovery is None:
            self.scheduler.compute(bg.graph)
            self.scheduler.read_output(bg.logits)  # llama_decode reads the logits: an asynchronous device finishes
            return
        state = self.rs.buffer.data.copy() if self.rs is not None else None

        def prepare() -> None:
            if state is not None:
                self.rs.buffer.data[:] = state
                self.rs.buffer.version += 1
            write_inputs()

        self.recovery.compute(bg.graph, bg.logits, prepare, what)

    def _write_inputs(self, inp: Inputs, tokens: np.ndarray, pos: np.ndarray, cells: np.ndarray, visible: np.ndarray,
                      out_rows: np.ndarray) -> None:
        """A micro-batch's inputs: token i at position pos[i] goes to KV cell cells[i] and attends the cells
        visible[i] (the mask: 0 there, -inf elsewhere); the logits of rows out_rows are kept."""
        T = tokens.size
        array(inp.tokens)[...] = tokens.astype(np.int32)
        array(inp.pos)[...] = position_streams(pos, inp.pos.ne[0] // T).astype(np.int32)
        if self.rs is not None:
            self.rs.write_inputs(inp)
        self._write_kv_inputs(inp, cells, visible)
        array(inp.out_ids)[...] = out_rows.astype(np.int32)

    @staticmethod
    def _write_kv_inputs(inp: Inputs, cells: np.ndarray, visible: np.ndarray) -> None:
        """One KV cache's inputs: the cells the new K and V go to and the mask (0 where visible, -inf elsewhere)."""
        array(inp.kv_idx)[...] = cells
        if inp.v_idx is not None:
            array(inp.v_idx)[...] = cells
        m = array(inp.mask)[0, 0]  # (T, n_kv)
        m[...] = np.where(visible, 0.0, -np.inf).astype(m.dtype)
