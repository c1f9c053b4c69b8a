"""kazeia make-model: write a synthetic GGUF (seeded random weights, real shapes, working tokenizer)."""

from __future__ import annotations

import argparse
import json

from kazeia.cli.common import add_common
from kazeia.gguf.writer import PRESETS, TYPES, preset, write_model


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("make-model", help="write a synthetic GGUF model with seeded random weights")
    p.add_argument("--arch", choices=["qwen3", "llama"], default=None)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--layers", type=int, default=None, help="number of blocks (preset: tiny 2, qwen3-4b 36)")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size")
    p.add_argument("--type", dest="wtype", choices=sorted(TYPES), default=None, help="matrix weight type (q4_0)")
    p.add_argument("--n-embd", type=int, default=None)
    p.add_argument("--n-ff", type=int, default=None)
    p.add_argument("--n-head", type=int, default=None)
    p.add_argument("--n-head-kv", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--ctx", type=int, default=None, help="training context length written to the file")
    p.add_argument("--rope-base", type=float, default=None)
    p.add_argument("--untied", action="store_true", help="write a separate output.weight")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("-o", "--output", required=True, help="output GGUF path")
    add_common(p)
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    cfg = preset(args.preset, arch=args.arch, n_layer=args.layers, n_vocab=args.vocab, wtype=args.wtype,
                 n_embd=args.n_embd, n_ff=args.n_ff, n_head=args.n_head, n_head_kv=args.n_head_kv,
                 head_dim=args.head_dim, n_ctx=args.ctx, rope_base=args.rope_base, seed=args.seed,
                 tied=False if args.untied else None)
    summary = write_model(cfg, args.output)
    print(json.dumps({"path": summary["path"], "bytes": summary["bytes"], "tensors": summary["tensors"],
                      **{k: v for k, v in summary["config"].items()}}))
    return 0
