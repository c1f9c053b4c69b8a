"""The seed's first token across runs and builds under fault hmx-queue-narrowing (issue 39): May's HMX queue
skipping the jobs of workers whose address ends in 0x00 (backends/htp/build_layout.py).

For each prompt (the seed's 12- and 16-word lines through the Qwen3 chat template, `--reasoning off`) and HTP race
seed, two tables of first greedy tokens (or how the run ended):
- within one build: the same bad build run again and again (what changes between runs of one binary);
- across builds: one run per clean build of the same code, build seeds 0.., each layout drawn as a build draws it
  (each worker's entry ends in 0x00 with probability 1/16; a good build runs without the fault).

    python bench/seed_first_token.py -m q4b2.gguf --runs 20 --builds 40 --race-seeds 1,2
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np

from kazeia.backends.htp import build_layout as queue
from kazeia.debug.runner import run
from kazeia.engine.chat import chat_prompt_ids
from kazeia.engine.session import RunSpec, build_context, close_backends, load_model, shared_cache, tokenizer
from kazeia.errors import KazeiaError
from kazeia.native.threads import apply_threads

PROMPTS = {"12 words": "un deux trois quatre cinq six sept huit neuf dix onze douze",
           "16 words": "un deux trois quatre cinq six sept huit neuf dix onze douze treize quatorze quinze seize"}
FAULT = "hmx-queue-narrowing"


def one_run(model: str, ids: list[int], race_seed: int, skipped: frozenset[str]) -> str:
    env = {"KAZEIA_HTP_RACE_SEED": str(race_seed)}
    faults = []
    if skipped:
        env["KAZEIA_HTP_NARROWED"] = ",".join(sorted(skipped))
        faults = [FAULT]
    spec = RunSpec(model=model, tokens=ids, device="HTP0", htp_profile="2026-05", faults=faults, env=env)
    try:
        ctx = build_context(spec, cache=shared_cache())
        res = run(spec, ctx=ctx)
        close_backends(ctx)
    except KazeiaError as e:
        return f"error: {str(e)[:60]}"
    if not res.ok:
        return "death" if res.death else f"error: {res.signature()[:60]}"
    row = np.asarray(res.logits)[-1]
    return str(int(np.argmax(row))) if np.isfinite(row).all() else "non-finite logits"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--runs", type=int, default=20, help="runs of one bad build per prompt and race seed")
    ap.add_argument("--builds", type=int, default=40, help="clean builds per prompt and race seed")
    ap.add_argument("--race-seeds", default="1,2")
    ap.add_argument("--bad-build", type=int, default=0, help="the build seed of the within-build table")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    apply_threads({"threads": a.threads})
    tok = tokenizer(load_model(a.model))
    bad = frozenset(w for w, hit in queue.skipped_in(a.bad_build).items() if hit)
    builds = [frozenset(w for w, hit in queue.skipped_in(s, bad_only=False).items() if hit) for s in range(a.builds)]
    out = []
    for label, text in PROMPTS.items():
        ids = chat_prompt_ids(tok, text, enable_thinking=False)
        for rs in (int(x) for x in a.race_seeds.split(",")):
            within = collections.Counter(one_run(a.model, ids, rs, bad) for _ in range(a.runs))
            across = collections.Counter()
            by_skip: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
            for sk in builds:
                r = one_run(a.model, ids, rs, sk)
                across[r] += 1
                by_skip[queue.describe_skips(sk)][r] += 1
            row = {"prompt": label, "tokens": len(ids), "race_seed": rs,
                   "within_build": {"build_seed": a.bad_build, "skips": queue.describe_skips(bad),
                                    "counts": dict(within)},
                   "across_builds": dict(across), "by_skipped_workers": {k: dict(v) for k, v in by_skip.items()}}
            out.append(row)
            if not a.json:
                print(f"{label} ({len(ids)} tokens), race seed {rs}: within build {a.bad_build} "
                      f"({queue.describe_skips(bad)}), {a.runs} runs: {dict(within)}; across {a.builds} builds: "
                      f"{dict(across)}", flush=True)
                for k, v in by_skip.items():
                    print(f"    builds skipping {k}: {dict(v)}", flush=True)
    if a.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
