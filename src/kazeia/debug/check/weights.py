"""What `kazeia check` reads from a GGUF header: the MUL_MAT weights, placed by their llama.cpp tensor names and
grouped into classes (one role, shape and type: `blk.*.ffn_down.weight` Q4_0 9728 x 2560), the rows M each class
is multiplied with (llama-cli's prompt: the ubatch, except the last layer's FFN and the lm_head, which see the one
row whose logits are kept), and the sizes the DSP maps (weights on the device, the KV cache).

Placement uses gguf-py's table of llama.cpp tensor names (gguf.constants.TENSOR_NAMES), so any architecture
llama.cpp writes is read: a 2-D `.weight` whose name is in the table is a MUL_MAT weight unless its role is one
llama.cpp reads another way (token embeddings by GET_ROWS, convolution kernels by SSM_CONV); 3-D expert stacks
are MUL_MAT_ID weights (listed, not planned); a name the table does not know is listed as not placed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kazeia.errors import KazeiaError
from kazeia.gguf.reader import GGUFFile

# roles llama.cpp reads without a MUL_MAT (GET_ROWS of embeddings, SSM_CONV / conv kernels, elementwise tables)
NOT_MATMUL = frozenset({"token_embd", "position_embd", "token_types", "per_layer_token_embd", "ssm_conv1d",
                        "shortconv.conv", "ssm_a", "ssm_d", "rope_freqs", "rope_factors_long", "rope_factors_short",
                        "ssm_dt", "time_mix_first", "conv1d"})
BLOCK = re.compile(r"^blk\.(\d+)\.(.+)\.weight$")
# architectures whose graph multiplies ssm_out by a [K, n_seq_tokens, n_seqs] src1 (llama.cpp src/models:
# mamba-base.cpp build_mamba_layer, jamba, plamo2, qwen35, qwen35moe, qwen3next; mamba2's layer reshapes to 2-D first)
SEQ_DIM_ARCHS = frozenset({"mamba", "jamba", "plamo2", "qwen35", "qwen35moe", "qwen3next"})
TOP = re.compile(r"^([^.]+(?:\.[^.]+)*)\.weight$")


def _known_roles() -> tuple[frozenset[str], frozenset[str]]:
    """(block roles, top-level roles) of llama.cpp's tensor names: 'blk.{bid}.attn_q' -> 'attn_q'."""
    from gguf.constants import TENSOR_NAMES

    block, top = set(), set()
    for fmt in TENSOR_NAMES.values():
        if fmt.startswith("blk.{bid}."):
            block.add(fmt[len("blk.{bid}."):])
        elif "{" not in fmt:
            top.add(fmt)
    return frozenset(block), frozenset(top)


@dataclass
class WeightClass:
    """MUL_MAT weights of one role, shape and type: K = row length (ne0), N = rows (ne1)."""

    role: str               # 'ffn_down', or a top-level name such as 'output'
    qtype: str              # ggml type name, lower case ('q4_0')
    k: int
    n: int
    tensors: list[str] = field(default_factory=list)
    m_max: int | None = None  # rows it is multiplied with at most (None: the ubatch); the lm_head gets 1
    tied: bool = False        # the lm_head is the token embeddings (no output.weight): llama.cpp duplicates them
    last: bool = False        # the last layer's FFN, after llama.cpp's inp_out_ids row selection
    seq_dim: bool = False     # its src1 is [K, T, n_seqs] (SEQ_DIM_ARCHS' ssm_out), not [K, n_tokens]

    @property
    def label(self) -> str:
        if self.tied:
            return f"token_embd.weight (tied lm_head) {self.qtype} {self.k}x{self.n}"
        if self.last:
            return f"{self.tensors[0]} (last layer) {self.qtype} {self.k}x{self.n}"
        where = f"blk.*.{self.role}" if self.tensors[0].startswith("blk.") else self.role
        return f"{where}.weight {self.qtype} {self.k}x{self.n}"


@dataclass
class ModelHeader:
    path: str
    arch: str
    n_layer: int
    classes: list[WeightClass]
    matmul_id: list[str]          # 3-D expert stacks (MUL_MAT_ID): listed, not planned
    not_placed: list[str]         # 2-D+ weights whose names llama.cpp's table does not know
    device_bytes: int             # every tensor but the token embeddings (on the CPU), plus a tied lm_head's copy
    kv_bytes_per_cell: int        # F16 K and V of every full-context attention layer, per context cell
    kv_swa_bytes_per_cell: int = 0  # ... of the sliding-window layers, per cell of their own cache
    n_swa: int = 0                # their window

    def kv_bytes(self, ctx: int, ubatch: int = 512) -> int:
        """F16 KV bytes at a context of ctx cells: the SWA layers' cache holds GGML_PAD(min(ctx, n_swa + ubatch),
        256) cells (llama_kv_cache_iswa)."""
        swa_cells = -(-min(ctx, self.n_swa + ubatch) // 256) * 256 if self.kv_swa_bytes_per_cell else 0
        return self.kv_bytes_per_cell * ctx + self.kv_swa_bytes_per_cell * swa_cells


def read_header(f: GGUFFile) -> ModelHeader:
    """The check's view of a GGUF header; one line naming what is missing when it is not a usable model."""
    arch = f.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise KazeiaError(f"{f.path}: not a usable model: no general.architecture")
    if not f.tensors:
        raise KazeiaError(f"{f.path}: not a usable model: it has no tensors")
    block_roles, top_roles = _known_roles()
    by_key: dict[tuple, WeightClass] = {}
    matmul_id, not_placed = [], []
    layers = {int(m.group(1)) for m in map(BLOCK.match, f.tensors) if m}
    last_layer = max(layers) if layers else None
    device = 0
    for name, t in f.tensors.items():
        if not name.startswith("token_embd"):
            device += t.nbytes
        dims = sum(1 for d in t.ne if d > 1)
        mb, mt = BLOCK.match(name), TOP.match(name)
        role = mb.group(2) if mb else (mt.group(1) if mt else None)
        if role is None or dims < 2 or role in NOT_MATMUL:
            continue
        if (mb and role not in block_roles) or (not mb and role not in top_roles):
            not_placed.append(name)
            continue
        if t.ne[2] > 1 or t.ne[3] > 1:
            matmul_id.append(name)
            continue
        # llama-cli computes the logits of the last token only: llama.cpp's graphs select those rows (inp_out_ids)
        # after the last layer's attention, so that layer's FFN and the lm_head see M = 1 during the prompt
        last = bool(mb) and int(mb.group(1)) == last_layer and role.startswith("ffn_")
        key = (role, t.type.name.lower(), t.ne[0], t.ne[1], last)
        c = by_key.get(key)
        if c is None:
            c = by_key[key] = WeightClass(role, t.type.name.lower(), t.ne[0], t.ne[1],
                                          m_max=1 if (not mb and role == "output") or last else None, last=last,
                                          seq_dim=role == "ssm_out" and arch in SEQ_DIM_ARCHS)
        c.tensors.append(name)
    emb = f.tensors.get("token_embd.weight")
    if "output.weight" not in f.tensors and emb is not None and emb.ne[1] > 1 and emb.ne[2] == emb.ne[3] == 1:
        # llama-model.cpp: no output.weight -> output = token_embd (TENSOR_DUPLICATED), in the output layer's
        # buffer: with every layer on the device the lm_head's MUL_MAT reads a device copy
        by_key[("output", "tied")] = WeightClass("output", emb.type.name.lower(), emb.ne[0], emb.ne[1],
                                                 ["token_embd.weight"], m_max=1, tied=True)
        device += emb.nbytes
    if not by_key:
        raise KazeiaError(f"{f.path}: not a usable model: no MUL_MAT weight found by llama.cpp's tensor names"
                          + (f" ({len(not_placed)} weights not placed, e.g. {not_placed[0]})" if not_placed else ""))
    n_layer = last_layer + 1 if last_layer is not None else 0
    return ModelHeader(f.path, arch, n_layer, list(by_key.values()), matmul_id, not_placed, device,
                       *_kv_bytes_per_cell(f, arch, n_layer))


def _kv_bytes_per_cell(f: GGUFFile, arch: str, n_layer: int) -> tuple[int, int, int]:
    """F16 K + V bytes per cell of the full-context layers and of the sliding-window layers, and the window: for an
    architecture kazeia runs, its own layers (a hybrid's recurrent layers keep no KV; Gemma 3's SWA layers have
    their own, smaller cache); else every layer, n_head_kv x (key_length + value_length) x 2 (0 when the header
    does not say)."""
    known = _arch_kv(f)
    if known is not None:
        return known
    return _header_kv(f, arch, n_layer), 0, 0


def _arch_kv(f: GGUFFile) -> tuple[int, int, int] | None:
    """The KV layout from the architecture's own hyperparameters, or None when kazeia cannot read them."""
    from kazeia.models.base import arch_module, model_args

    try:
        args = model_args(f)
        mod = arch_module(args.arch)
    except KazeiaError:
        return None
    layers = getattr(mod, "attention_layers", lambda a: list(range(a.n_layer)))(args)
    swa = set(getattr(mod, "swa_layers", lambda a: [])(args))
    per_layer = args.n_embd_kv * 2 * 2  # K and V, F16
    n_swa = sum(1 for il in layers if il in swa)
    return (len(layers) - n_swa) * per_layer, n_swa * per_layer, getattr(args, "n_swa", 0)


def _header_kv(f: GGUFFile, arch: str, n_layer: int) -> int:
    def num(key: str) -> int | None:
        v = f.get(f"{arch}.{key}")
        if isinstance(v, list):  # per-layer arrays: take the largest
            v = max((x for x in v if isinstance(x, int)), default=None)
        return int(v) if isinstance(v, int) and v > 0 else None

    heads, kv_heads, embd = num("attention.head_count"), num("attention.head_count_kv"), num("embedding_length")
    kv_heads = kv_heads or heads
    k_len = num("attention.key_length") or (embd // heads if embd and heads else None)
    v_len = num("attention.value_length") or k_len
    if not (kv_heads and k_len and v_len and n_layer):
        return 0
    return n_layer * kv_heads * (k_len + v_len) * 2
