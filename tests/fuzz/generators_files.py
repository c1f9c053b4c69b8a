"""Generators for the inputs that are files kazeia builds from: sizes (context, prompts, counts), chat templates
and metadata inside a GGUF, tensor shapes, dumps and oracle replays. Hostile GGUFs are written by kazeia's own
writer from the tiny config with `extra_keys` overriding metadata (the file is otherwise a valid model)."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable

import numpy as np
from harness import Case

from kazeia.gguf.writer import RowBlocks, SynthConfig, write_model

TINY = SynthConfig(n_layer=1, n_vocab=512, n_ctx=256, wtype="f32")


def _override(key: str, put: Callable) -> Callable:
    def extra(w) -> None:
        for kv in w.kv_data:
            kv.pop(key, None)
        put(w)
    return extra


def gguf_with(extra: Callable | None = None, cfg: SynthConfig = TINY, tensors=None) -> Callable[[str], None]:
    return lambda path: write_model(cfg, path, tensors=tensors, extra_keys=extra)


def _template(text: str) -> Callable[[str], None]:
    return gguf_with(_override("tokenizer.chat_template", lambda w: w.add_chat_template(text)))


HOSTILE_TEMPLATES = [
    "{% set l = [1] %}{% for i in range(40) %}{% set l = l + l %}{% endfor %}{{ l }}",
    "{% set ns = namespace(x=[1]) %}{% for i in range(64) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|length }}",
    "{% set ns = namespace(x='ab') %}{% for i in range(64) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ 1 }}",
    "{% set l = [1,2,3] %}{% for i in range(30) %}{% set l = [l, l] %}{% endfor %}{{ l|tojson }}",
    "{% set l = [1,2,3] %}{% for i in range(30) %}{% set l = [l, l] %}{% endfor %}{{ l[1:] }}",
    "{% set l = ['x'*1000] %}{% for i in range(30) %}{% set l = l + l %}{% endfor %}{{ l|join(',') }}",
    "{{ ('\t' * 100000)|expandtabs(100000) }}",
    "{{ ('a ' * 100000)|wordwrap(1) }}",
    "{{ (['ab'] * 100000)|join('x' * 100000) }}",
    "{{ messages|tojson(indent=100000) }}",
    "{% macro r(n) %}{{ r(n+1) }}{% endmacro %}{{ r(0) }}",
    "{% for m in messages %}{{ m.content * 1000000 }}{% endfor %}",
    "{{ '%999999999d' % 1 }}",
    "{{ 'x'|center(2**40) }}",
    "{{ range(10**9)|list }}",
    "{{ messages.__class__.__mro__ }}",
    "{{ lipsum(10**6) }}",
    "{{ ''.join(['a'] * 10**7) }}",
    "{% set d = {} %}{% for i in range(10**6) %}{% set _ = d.update({i: i}) %}{% endfor %}",
    "{{ (messages[0].content ~ '') * 10**6 }}",
    "{{ raise_exception('no') }}",
    "{% for x in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{{ 9**9**9 }}",
    "{{ x.y.z }}",
    "{% if %}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l|tojson }}",
    "{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l[1:] }}",
    "{% set ns = namespace(l=['a']) %}{% for i in range(30) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}"
    "{{ ns.l|join(',') }}",
    "{% set ns = namespace(d={}) %}{% for i in range(30) %}{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}"
    "{{ ns.d }}",
    "{% set ns = namespace(l=1) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
    "{{ ('\\t' * 60000).expandtabs(60000) }}",
]


def gen_templates(rng: random.Random, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        if i < len(HOSTILE_TEMPLATES):
            text = HOSTILE_TEMPLATES[i]
        else:
            parts = rng.sample(HOSTILE_TEMPLATES, 2)
            text = parts[0] + rng.choice(["", "{{ messages[0].content }}", "x" * rng.choice([1, 1000])]) + parts[1]
        argv = ["run", "-m", "{dir}/t.gguf", "-p", "hi", "-n", "1", "-cnv"] if rng.random() < 0.5 else \
            ["run", "-m", "{dir}/t.gguf", "-sys", "be brief", "-p", "hi", "-n", "1", "-st"]
        cases.append(Case("templates", f"tmpl-{i}", argv, {"t.gguf": _template(text)}, stdin=b"hi\n"))
    return cases


def big_array(key: str, one: list, n: int, elem_bytes: int) -> Callable[[str], None]:
    """The tiny model with metadata array `key` grown from one element to `n` zero elements (an int32 0 or an
    empty string: `elem_bytes` each) by splicing the file, which is far faster than packing n values: the
    array's count is rewritten and the grown part left as a hole (n - 1 elements x elem_bytes is a multiple
    of the 32-byte alignment, so the tensor data stays aligned)."""
    import struct

    from gguf import GGUFReader

    def write(path: str) -> None:
        small = path + ".small"
        write_model(TINY, small, extra_keys=lambda w: w.add_array(key, one))
        field = GGUFReader(small).fields[key]
        count_at = field.offset + 8 + len(key.encode()) + 4 + 4
        end = count_at + 8 + elem_bytes
        with open(small, "rb") as f:
            data = f.read()
        grow = (n - 1) * elem_bytes
        with open(path, "wb") as f:
            f.write(data[:count_at] + struct.pack("<Q", n) + data[count_at + 8:end])
            f.seek(end + grow)
            f.write(data[end:])
        os.unlink(small)
    return write


def gen_sizes(rng: random.Random, n: int) -> list[Case]:
    big_ctx = gguf_with(_override("qwen3.context_length", lambda w: w.add_context_length(4 << 20)))
    fixed = [
        Case("sizes", "ctx0-4M", ["run", "-m", "{dir}/big.gguf", "-c", "0", "-p", "hi", "-n", "1"],
             {"big.gguf": big_ctx}),
        Case("sizes", "n-prompt-1e8", ["run", "-m", "{tiny}", "--n-prompt", "100000000", "-n", "1"], bad=True),
        Case("sizes", "trace-n-max", ["trace", "-m", "{tiny}", "-p", "hi", "-n", "2147483647", "--quiet"]),
        Case("sizes", "determinism-N", ["determinism", "-m", "{tiny}", "-p", "hi", "-N", "10000", "-n", "1"]),
        Case("sizes", "prompt-50MB", ["run", "-m", "{tiny}", "-f", "{dir}/p.txt", "-n", "1"],
             {"p.txt": lambda p: open(p, "wb").write(b"hello world " * (50 << 20 // 12))}),
        Case("sizes", "meta-64M-ints", ["run", "-m", "{dir}/m.gguf", "-p", "hi", "-n", "1"],
             {"m.gguf": big_array("kazeia.fuzz.big", [0], (64 << 20) + 1, 4)}),
        Case("sizes", "meta-30M-strings", ["run", "-m", "{dir}/m.gguf", "-p", "hi", "-n", "1"],
             {"m.gguf": big_array("kazeia.fuzz.strs", [""], (30 << 20) + 1, 8)}),
    ]
    cases = list(fixed)
    flags = [("-c", ["0", "1", "2", "3", "17", "100000", "2147483647", "99999999999"]),
             ("-n", ["0", "-1", "-2", "1", "1000000", "2147483647"]),
             ("-ub", ["1", "2", "7", "100000", "2147483647"]),
             ("--n-prompt", ["0", "1", "255", "256", "257", "100000"])]
    while len(cases) < n:
        argv = ["run", "-m", "{tiny}", "-p", "hi"]
        for flag, values in rng.sample(flags, rng.randint(1, 3)):
            if flag == "--n-prompt":
                argv.remove("-p"), argv.remove("hi")
            argv += [flag, rng.choice(values)]
        if "-n" not in argv:
            argv += ["-n", "1"]
        cases.append(Case("sizes", f"flags-{len(cases)}", argv))
    return cases


def _manifest(rng: random.Random) -> bytes:
    ne = [rng.choice([1, 256, 1 << 20, 1 << 30, -1, 0]) for _ in range(4)]
    return json.dumps({"format": "kazeia-op-dump", "version": 1, "id": "0001-x", "capture": "complete",
                       "node": {"name": "x", "op": rng.choice(["MUL_MAT", "ADD", "NONE"]), "type": "f32",
                                "ne": ne, "nb": [4, 4 * abs(ne[0]), 0, 0], "params": {}},
                       "inputs": [{"name": "a", "type": rng.choice(["f32", "q4_0", "zz"]), "ne": ne,
                                   "blob": "0" * 64}], "output": {"blob": "1" * 64}}).encode()


def gen_dumps(rng: random.Random, n: int) -> list[Case]:
    def sparse(path: str) -> None:
        with open(path, "wb") as f:
            f.truncate(3 << 30)

    cases = [Case("dumps", "replay-dev-zero", ["oracle", "--replay", "/dev/zero", "--replay-shape", "4096,4096"]),
             Case("dumps", "replay-sparse", ["oracle", "--replay", "{dir}/s.bin", "--replay-shape", "4096,4096"],
                  {"s.bin": sparse})]
    while len(cases) < n:
        files = {"d/index.json": json.dumps({"format": "kazeia-dump-index", "version": 1,
                                             "dumps": ["0001-x"]}).encode(),
                 "d/0001-x/manifest.json": _manifest(rng) if rng.random() < 0.8 else os.urandom(64),
                 "d/blobs/" + "0" * 64 + ".npy": os.urandom(rng.choice([0, 16, 4096]))}
        cases.append(Case("dumps", f"dump-{len(cases)}", ["replay", "{dir}/d"] + rng.choice([[], ["--json"]]),
                          files))
    return cases


def _reshaped(cfg: SynthConfig, target: str, split: int) -> Callable[[str], None]:
    """The tiny model with `target` written one dimension higher: its outermost numpy axis split in `split`
    (split 1: a trailing ggml dimension of 1, which llama.cpp's check_tensor_dims accepts; 2: a real 3-D tensor
    of the same size, which it refuses)."""
    def write(path: str) -> None:
        from kazeia.gguf.writer import _weights

        ts = []
        for name, arr, is_matrix in _weights(cfg):
            if name == target:
                if isinstance(arr, RowBlocks):  # a matrix drawn block by block: all its rows at once here
                    arr = np.concatenate([arr.make(min(arr.block, arr.rows - r))
                                          for r in range(0, arr.rows, arr.block)])
                arr, is_matrix = arr.reshape((split, arr.shape[0] // split, *arr.shape[1:])), False
            ts.append((name, arr, is_matrix))
        write_model(cfg, path, tensors=ts)
    return write


def gen_gguf(rng: random.Random, n: int) -> list[Case]:
    names = ["blk.0.attn_q.weight", "blk.0.ffn_down.weight", "token_embd.weight", "blk.0.attn_norm.weight",
             "output_norm.weight", "blk.0.attn_k_norm.weight"]
    cases = []
    for i in range(n):
        split = rng.choice([1, 2])
        cases.append(Case("gguf", f"dims-{split}-{i}", ["run", "-m", "{dir}/w.gguf", "-p", "hi", "-n", "1"],
                          {"w.gguf": _reshaped(TINY, rng.choice(names), split)}, bad=split == 2))
    return cases


# --- issue 36: results weighed before they are built; special files as every input; compressed expansions ---

_SIZES = [0, 1, 7, 1000, 60_000, 10**6, 3 * 10**7, 3 * 10**8]


def _source(rng: random.Random) -> str:
    n = rng.choice(_SIZES)
    return rng.choice([f"range({n})", f"('ab' * {n})", "[1]", "messages", f"range({n})|map('string')",
                       f"range({n})|select", f"([[0]] * {min(n, 10**6)})"])


def _filter_chain(rng: random.Random) -> str:
    k, m = rng.choice(_SIZES), rng.choice([0, 1, 100, 60_000])
    return rng.choice([f"join('y' * {m})", f"batch({k}, 0)|list|length", f"slice({k})|list|length",
                       f"slice({k}, 'f')|list|length", "list|length", "sum(start=[])|length", "unique|list|length",
                       "sort|first", "reverse|list|length", "map('string')|join", "first", "max",
                       f"batch({k})|map('length')|sum", "groupby('x')|list|length"])


def gen_template_results(rng: random.Random, n: int) -> list[Case]:
    """Templates whose filters and methods would build a sequence or a string from inputs of any size: each
    must be refused (or rendered) from sizes known before anything large is built."""
    cases = []
    for i in range(n):
        src = _source(rng)
        if rng.random() < 0.2:
            text = f"{{{{ ('y' * {rng.choice([0, 1, 60000])}).join({src}) }}}}"
        else:
            text = "{{ " + src + "|" + "|".join(_filter_chain(rng) for _ in range(rng.randint(1, 2))) + " }}"
        cases.append(Case("template-results", f"tres-{i}",
                          ["run", "-m", "{dir}/t.gguf", "-sys", "s", "-p", "hi", "-n", "1", "-st"],
                          {"t.gguf": _template(text)}))
    return cases


def _special(kind: str) -> Callable[[str], None]:
    def make(path: str) -> None:
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            os.makedirs(path, exist_ok=True)
        elif kind == "socket":
            import socket

            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.bind(path)
            finally:
                s.close()
        else:  # a symbolic link to a device
            os.symlink({"devzero": "/dev/zero", "devnull": "/dev/null", "tty": "/dev/tty"}[kind], path)
    return make


# (argv with {X} where the special file goes, extra files the command needs beside it)
_SPECIAL_INPUTS = [
    (["run", "-m", "{X}", "-p", "hi", "-n", "1"], {}),
    (["run", "-m", "{tiny}", "-f", "{X}", "-n", "1"], {}),
    (["run", "-m", "{tiny}", "-p", "hi", "-n", "1", "--gates", "{X}"], {}),
    (["oracle", "--replay", "{X}"], {}),
    (["oracle", "--replay", "{dir}/a.bin", "--seed", "1"], {"a.bin": np.arange(64, dtype=np.float32).tobytes()}),
    (["crashlog", "{X}"], {}),
    (["replay", "{X}"], {}),
    (["replay", "{dir}/d"], {"d/0001-x/manifest.json": b"{}"}),
    (["replay", "--op-stream", "{X}", "-m", "{tiny}"], {}),
    (["compare", "-m", "{tiny}", "-p", "hi", "--against", "{X}"], {}),
    (["check", "-m", "{X}"], {}),
]


def gen_special_files(rng: random.Random, n: int) -> list[Case]:
    """Every file input given a FIFO (no writer), a socket, a directory or a device: one line each, never a
    read that blocks or never ends."""
    cases = []
    kinds = ["fifo", "dir", "socket", "devzero", "devnull"]
    for i in range(n):
        argv, extra = _SPECIAL_INPUTS[i % len(_SPECIAL_INPUTS)]
        kind = kinds[(i // len(_SPECIAL_INPUTS)) % len(kinds)] if i < len(_SPECIAL_INPUTS) * len(kinds) \
            else rng.choice(kinds)
        files = dict(extra)
        if "{dir}/a.bin" in argv:  # the description beside the replayed activation is the special file
            files["a.txt"] = _special(kind)
        elif "{dir}/d" in argv:  # the dump's index
            files["d/index.json"] = _special(kind)
        else:
            files["X"] = _special(kind)
        argv = [a.replace("{X}", "{dir}/X") for a in argv]
        cases.append(Case("special-files", f"special-{kind}-{i}", argv, files, bad=True))
    return cases


def _base_dump() -> str:
    """A real dump of one op (ffn_out-0 of the tiny Qwen3), made once per fuzz run by kazeia itself."""
    import subprocess
    import sys
    import tempfile

    base = tempfile.mkdtemp(prefix="kazeia-fuzz-dump-")
    model = os.path.join(base, "m.gguf")
    write_model(TINY, model)
    subprocess.run([sys.executable, "-m", "kazeia", "run", "-m", model, "-p", "hi", "-n", "1", "--dump-no-context",
                    "--dump", "ffn_out-0", os.path.join(base, "dump")], check=True, capture_output=True)
    return os.path.join(base, "dump")


def _npz_bomb(base: str, n_elems: int, role: str) -> Callable[[str], None]:
    """The base dump with one blob of its op (its output or a source) replaced by a compressed blob of `n_elems`
    zeros, under the manifest's own (small) shape: a zip that expands far past what the manifest names. The
    manifest stays consistent (its digest recomputed): only the blob lies."""
    def write(d: str) -> None:
        import glob
        import pathlib
        import shutil

        from kazeia.debug.dump.blobs import BlobStore
        from kazeia.debug.dump.format import manifest_digest

        shutil.copytree(base, d)
        path = glob.glob(os.path.join(d, "*", "manifest.json"))[0]
        with open(path) as f:
            m = json.load(f)
        target = m["output"] if role == "output" or not m.get("sources") else m["sources"][0]
        ref = BlobStore(pathlib.Path(d)).put(np.zeros(n_elems, dtype=np.float32), compress=True)
        target["values"] = dict(ref, shape=target["values"]["shape"], bytes=target["values"]["bytes"])
        m["digest"] = manifest_digest(m)
        with open(path, "w") as f:
            json.dump(m, f)
    return write


def gen_expansion(rng: random.Random, n: int) -> list[Case]:
    """Compressed dump blobs sized against their manifests (and the machine) before they are expanded: a small
    zip of zeros that expands past the array its manifest names, for replay and replay --json."""
    base = _base_dump()
    cases = []
    for i in range(n):
        n_elems = rng.choice([1000, 10**6, 4 * 10**6, 3 * 10**7])
        role = rng.choice(["output", "source"])
        cases.append(Case("expansion", f"npz-{role}-{n_elems}-{i}", ["replay", "{dir}/d"]
                          + rng.choice([[], ["--json"]]), {"d": _npz_bomb(base, n_elems, role)}, bad=True))
    return cases
