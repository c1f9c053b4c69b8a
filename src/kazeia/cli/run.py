"""kazeia run: generate text like llama-cli (completion by default, chat with -cnv)."""

from __future__ import annotations

import argparse
import sys

from kazeia.cli import validate as V
from kazeia.cli.common import (
    add_common,
    add_device_args,
    add_model_args,
    open_session,
    prompt_text,
    prompt_tokens,
    user_text,
)
from kazeia.engine.chat import ChatSession
from kazeia.engine.generate import GenerationResult, Sampler, SamplingParams, generate
from kazeia.engine.tokenizer import StreamDecoder
from kazeia.errors import KazeiaError

EPILOG = """\
exit status: 0 done; 2 a bad input or flag (one line); 3 the device died (the host's line, e.g. dspqueue_read
  failed: 0x0000002e, and the op it was running); 4 non-finite logits (names the first op whose output went
  non-finite; --stop-on-nonfinite stops there); 74 an output that cannot be written; 130 interrupted.
run time: the embedded default model answers in seconds; a 36-layer 4B Q4_0 decodes ~8-10 tokens/s on 2 cores
  (CPU and HTP0 alike).

examples:
  kazeia run -p 'The capital of France is' -n 16
  kazeia run -m qwen3-4b-q4_0.gguf -dev HTP0 --htp-profile 2026-05 --n-prompt 38 -n 0
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("run", help="generate text from a prompt, or chat (-cnv)",
                       description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_device_args(p)
    g = p.add_argument_group("generation")
    g.add_argument("-n", "--n-predict", "--predict", type=V.n_predict, default=64,
                   help="tokens to generate (default 64; -1 = infinity, -2 = until the context is filled; both "
                        "stop at EOS)")
    g.add_argument("--temp", "--temperature", type=V.temperature, default=0.8,
                   help="temperature (default 0.8; 0 or less = greedy)")
    g.add_argument("--top-k", type=V.integer(None), default=40, help="top-k sampling (default 40, 0 = disabled)")
    g.add_argument("--top-p", type=V.probability, default=0.95, help="top-p sampling (default 0.95, 1 = disabled)")
    g.add_argument("--min-p", type=V.probability, default=0.0,
                   help="min-p sampling (default 0 = disabled; llama-cli's default is 0.05)")
    g.add_argument("-s", "--seed", type=V.seed, default=0,
                   help="sampling seed (default 0; -1 = a random seed, printed)")
    g.add_argument("-cnv", "--conversation", action="store_true", help="interactive chat with the chat template")
    g.add_argument("-no-cnv", "--no-conversation", dest="conversation", action="store_false",
                   help="completion, no chat template (the default here)")
    g.add_argument("-st", "--single-turn", action="store_true", help="chat: answer -p once, then exit")
    g.add_argument("-sys", "--system-prompt", default=None, help="chat: system message")
    g.add_argument("--reasoning", choices=["on", "off"], default=None, help="Qwen3 thinking on/off (chat)")
    g.add_argument("--no-display-prompt", action="store_true", help="do not echo the prompt")
    g.add_argument("--stop-after", default=None, metavar="NODE",
                   help="forensics: run each graph only through the node NODE (e.g. l_out-0; --oplog names), print "
                        "its output's statistics and whether the device died; no logits, so -n 0")
    g.add_argument("--no-warmup", action="store_true", help="accepted for llama-cli command lines: there is no "
                                                            "warm-up run here to skip")
    add_common(p)
    p.set_defaults(func=main)
    return p


def _stats(res: GenerationResult) -> str:
    return (f"[ prompt: {res.prompt_tokens} tokens, {res.prompt_tps:.1f} tokens/s | "
            f"generation: {len(res.tokens)} tokens, {res.gen_tps:.1f} tokens/s | stop: {res.stop} ]")


def _stream(s, out) -> tuple[StreamDecoder, callable]:
    dec = StreamDecoder(s.tok)

    def on_token(tid: int) -> None:
        out.write(dec.push(tid))
        out.flush()

    return dec, on_token


def _end_text(dec: StreamDecoder, out=None) -> None:
    """What the decoder still holds (an incomplete character as U+FFFD), then a newline unless the text ends
    with one: the statistics line (or an error) always starts on its own line."""
    out = out or sys.stdout
    tail = dec.flush()
    out.write(tail if (tail or dec.emitted).endswith("\n") else tail + "\n")
    out.flush()


def _seed(args: argparse.Namespace) -> int:
    """-s, or the seed drawn for -s -1, printed as llama.cpp prints it (so the run can be repeated)."""
    seed, drawn = V.resolve_seed(args.seed)
    if drawn:
        print(f"sampler seed: {seed} (-s -1: drawn at random; repeat this run with -s {seed})", file=sys.stderr)
    return seed


def main(args: argparse.Namespace) -> int:
    s = open_session(args)
    sampler = Sampler(SamplingParams(args.temp, args.top_k, args.top_p, _seed(args), args.min_p))
    if args.conversation or args.single_turn:
        return _chat(args, s, sampler)
    ids = prompt_tokens(args, s)
    if args.n_predict > 0 and len(ids) <= s.ctx.n_ctx < len(ids) + args.n_predict - 1:
        print(f"warning: -n {args.n_predict} cannot finish in the context of {s.ctx.n_ctx} tokens after "
              f"{len(ids)} prompt tokens: generation stops when the context is full, as llama-cli's does",
              file=sys.stderr)
    if getattr(args, "stop_after", None):
        return _prefix_run(args, s, ids)
    if not args.no_display_prompt and args.n_prompt is None:
        sys.stdout.write(s.tok.decode(ids))
        sys.stdout.flush()
    dec, on_token = _stream(s, sys.stdout)
    try:
        res = generate(s.ctx, ids, args.n_predict, sampler, s.tok.is_eog, on_token)
    finally:
        _end_text(dec)
    print(_stats(res), file=sys.stderr)
    return 130 if res.stop == "interrupted" else 0


def _prefix_run(args: argparse.Namespace, s, ids: list[int]) -> int:
    """--stop-after: the prompt through one node (engine/prefix.py); a device death ends it as any run."""
    from kazeia.debug.stats import values_stats
    from kazeia.engine.prefix import check_prefix_run

    check_prefix_run(args.stop_after, args.n_predict)  # (-cnv took the chat path before this)
    s.ctx.decode(ids)
    print(f"stopped after {args.stop_after} ({len(ids)} prompt tokens): {values_stats(s.scheduler.output).short()}",
          file=sys.stderr)
    return 0


def _chat(args: argparse.Namespace, s, sampler: Sampler) -> int:
    thinking = None if args.reasoning is None else args.reasoning == "on"
    chat = ChatSession(s.ctx, s.tok, user_text(args.system_prompt, "-sys"), thinking)
    first = prompt_text(args)
    while True:
        if first is not None:
            user, first = first, None
        else:
            if args.single_turn:
                return 0
            try:
                user = _read_turn()
            except (EOFError, KeyboardInterrupt):
                print()
                return 0
        if not user.strip():
            continue
        fed = chat.prompt_tokens_for(user)
        dec, on_token = _stream(s, sys.stdout)
        try:
            res = generate(s.ctx, fed, args.n_predict, sampler, s.tok.is_eog, on_token)
        finally:
            _end_text(dec)
        print(_stats(res), file=sys.stderr)
        reply = res.tokens[:-1] if res.stop == "eos" else res.tokens
        chat.add_reply(fed, reply, s.tok.decode(reply, skip_special=True))
        if res.stop == "interrupted" or args.single_turn:
            return 130 if res.stop == "interrupted" else 0


MAX_TURN_BYTES = 1 << 20  # one chat turn read from stdin


def _read_turn() -> str:
    """One user turn: input() on a terminal (line editing), else one line of stdin's bytes, bounded and decoded
    as llama-cli decodes it."""
    if sys.stdin is None:
        raise EOFError
    if sys.stdin.isatty():
        return user_text(input("> "), "the chat input")
    print("> ", end="", flush=True)
    raw = sys.stdin.buffer.readline(MAX_TURN_BYTES + 1)
    if not raw:
        raise EOFError
    if len(raw) > MAX_TURN_BYTES and not raw.endswith(b"\n"):
        raise KazeiaError(f"a chat turn longer than {MAX_TURN_BYTES} bytes on stdin (the turn limit)")
    return user_text(raw.rstrip(b"\r\n"), "the chat input")
