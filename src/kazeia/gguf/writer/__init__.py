"""Writing synthetic GGUF models (kazeia make-model) with gguf-py's GGUFWriter.

Weights are seeded random, scaled so activations stay in the range real models show: projections
~N(0, 1/fan_in), norm weights ~1, embeddings ~N(0, 1). Quantization goes through gguf-py (byte-exact with
llama.cpp's reference quantizers for Q4_0/Q4_1/Q8_0). A synthetic byte-level BPE tokenizer sized to the
vocabulary and a ChatML template make text prompts and chat work; the qwen3 presets embed the real Qwen3
tokenizer and chat template instead (hf_vocab.py), padded to the real embedding rows, as llama.cpp's converter
writes them.

The package: `config.py` (SynthConfig, the presets, validation), `layers.py` (each architecture's weights and keys),
`encode.py` (quantizers and tensor types), this face (the tokenizer and the file).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter

from kazeia.gguf.hf_vocab import qwen3_vocab
from kazeia.gguf.synth_tokenizer import CHATML_TEMPLATE, make_vocab
from kazeia.gguf.writer.config import (  # noqa: F401 - the face's names
    ARCHS,
    FILE_TYPES,
    K_QUANTS,
    PRESETS,
    QWEN3_VOCAB,
    TINY,
    TYPES,
    SynthConfig,
    T,
    preset,
    validate,
)
from kazeia.gguf.writer.encode import RowBlocks, encode_tensor, tensor_type  # noqa: F401
from kazeia.gguf.writer.layers import _weights, arch_keys, head_count_kv  # noqa: F401
from kazeia.outputs import OutputError, commit, discard, temporary_beside


def _tokenizer(cfg: SynthConfig):
    """The tokenizer keys' writer (w -> None); the real one is read before the file is opened, so a missing
    package is a one-line error that leaves no file behind."""
    if cfg.tokenizer == "qwen3":
        return qwen3_vocab(cfg.n_vocab).add_to
    return lambda w: _add_synthetic_tokenizer(w, cfg)


def _add_synthetic_tokenizer(w: GGUFWriter, cfg: SynthConfig) -> None:
    vocab = make_vocab(cfg.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre({"qwen2": "qwen2", "qwen3": "qwen2", "qwen35": "qwen35"}.get(cfg.arch, "smollm"))
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)


def write_model(cfg: SynthConfig, path: str | os.PathLike, tensors=None,
                extra_keys: Callable[[GGUFWriter], None] | None = None, header_only: bool = False,
                progress: Callable[[str], None] | None = None) -> dict:
    """Write the synthetic model; returns a summary (config, tensor count, bytes). `tensors`: (name, float32 array
    in numpy order, is_matrix) to write instead of the seeded random ones (e.g. a Hugging Face model's, mapped
    to GGUF names and layouts); matrices get cfg.wtype, the rest F32. `extra_keys(writer)` adds or overrides
    metadata after the standard keys (the fuzz tests write hostile files through it). `header_only`: the header,
    metadata and tensor table, no tensor data (what `kazeia check` reads; no values are drawn); `progress(line)`
    is told each layer as it is written."""
    validate(cfg)
    add_tokenizer = _tokenizer(cfg)
    path = os.fspath(path)
    qtype = TYPES[cfg.wtype]
    target = path if os.path.exists(path) and not os.path.isfile(path) else temporary_beside(path)
    try:
        n = _write(cfg, target, qtype, add_tokenizer, tensors, extra_keys, header_only, progress)
    except OSError as e:
        if target != path:
            discard(target)
        raise OutputError(f"{path}: cannot write: {e.strerror or e}") from None
    except BaseException:
        if target != path:
            discard(target)
        raise
    if target != path:
        commit(target, path)
    return {"path": path, "tensors": n, "bytes": os.path.getsize(path), "config": asdict(cfg)}


def _write(cfg: SynthConfig, path: str, qtype: T, add_tokenizer, tensors, extra_keys, header_only: bool = False,
           progress: Callable[[str], None] | None = None) -> int:
    """The GGUF itself, into `path` (write_model's temporary file); returns the tensor count."""
    w = GGUFWriter(path, cfg.arch)
    w.add_name(f"kazeia synthetic {cfg.arch}")
    w.add_block_count(cfg.n_layer)
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(head_count_kv(cfg))
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.n_rot or cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_vocab_size(cfg.n_vocab)
    w.add_file_type(FILE_TYPES[cfg.wtype])
    w.add_quantization_version(2)
    w.add_uint32("kazeia.synthetic.seed", cfg.seed)
    arch_keys(w, cfg)
    add_tokenizer(w)
    if extra_keys is not None:
        extra_keys(w)
    n, layer = 0, None
    for name, arr, is_matrix in (_weights(cfg, header_only) if tensors is None else tensors):
        t = tensor_type(cfg, name) if is_matrix else T.F32
        if header_only:
            rows = int(np.prod(arr.shape[:-1], dtype=np.int64))
            block, size = GGML_QUANT_SIZES[t]
            w.add_tensor_info(name, arr.shape, np.dtype(np.float32), rows * (arr.shape[-1] // block) * size,
                              raw_dtype=t)
        else:
            data, t = encode_tensor(arr, t) if is_matrix else (arr, T.F32)
            w.add_tensor(name, data, raw_dtype=t if t not in (T.F32, T.F16) else None)
        n += 1
        parts = name.split(".")
        if progress is not None and parts[0] == "blk" and parts[1] != layer:
            layer = parts[1]
            progress(f"layer {int(layer) + 1}/{cfg.n_layer}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    if header_only:
        w.write_ti_data_to_file()
    else:
        w.write_tensors_to_file()
    w.close()
    return n
