"""kazeia's Q4_K / Q6_K writer (gguf/kquantize.py) and make-model's q4_k, q6_k and q4_k_m types: the blocks mean what
ggml's layout says (read back by gguf-py's dequantizer, an independent reader, and kazeia's), the scale packing is
the inverse of get_scale_min_k4, and q4_k_m gives tensors the types of llama.cpp's Q4_K_M rule."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from kazeia.errors import KazeiaError
from kazeia.gguf.kquantize import quantize_q4_k, quantize_q6_k
from kazeia.gguf.quants import _q4k_scales_mins, dequantize
from kazeia.gguf.reader import load_gguf
from kazeia.gguf.writer import preset, tensor_type, write_model


@pytest.mark.parametrize("fn, qtype, rel", [(quantize_q4_k, T.Q4_K, 0.12), (quantize_q6_k, T.Q6_K, 0.03)])
def test_blocks_read_back_as_the_values(fn, qtype, rel):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((7, 768)) * rng.uniform(0.01, 3, (7, 1))).astype(np.float32)
    raw = fn(x)
    y = gq.dequantize(raw, qtype)
    assert np.array_equal(y.view(np.uint32), dequantize(raw, qtype).view(np.uint32))
    assert np.sqrt(((y - x) ** 2).mean(axis=1) / (x ** 2).mean(axis=1)).max() < rel
    assert not np.any(gq.dequantize(fn(np.zeros((2, 256), np.float32)), qtype))


def test_scale_packing_is_get_scale_min_k4_inverted():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((64, 256)) * rng.uniform(0.01, 3, (64, 1))).astype(np.float32)
    raw = quantize_q4_k(x).reshape(-1, 144)
    sc, mn = _q4k_scales_mins(raw[:, 4:16])
    assert sc.max() == 63 and mn.max() <= 63  # the largest scale of each block is d's 63
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q4_k(np.zeros((1, 128), np.float32))


def test_q4_k_m_follows_llama_cpps_rule(tmp_path):
    cfg = preset("tiny", wtype="q4_k_m", n_layer=16, tied=False)
    more = [i for i in range(16) if tensor_type(cfg, f"blk.{i}.ffn_down.weight") == T.Q6_K]
    assert more == [0, 1, 4, 7, 10, 13, 14, 15]  # i < 2 or i >= 14 or (i - 2) % 3 == 2
    assert tensor_type(cfg, "output.weight") == T.Q6_K and tensor_type(cfg, "blk.3.attn_q.weight") == T.Q4_K
    path = tmp_path / "k.gguf"
    write_model(preset("tiny", wtype="q4_k_m", n_layer=4), path)
    g = load_gguf(path)
    types = {n: t.type for n, t in g.tensors.items()}
    assert types["blk.2.attn_v.weight"] == T.Q6_K and types["blk.1.ffn_down.weight"] == T.Q4_K
    assert types["token_embd.weight"] == T.Q4_K and g.get("general.file_type") == 15
    with pytest.raises(KazeiaError, match="multiple of 256"):
        write_model(preset("tiny", wtype="q4_k", n_embd=288), tmp_path / "bad.gguf")
