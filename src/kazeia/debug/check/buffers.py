"""The weights' HTP buffers at load time, from the header: what each weight takes in the HTP buffer type, how the
host packs them into buffers, and the size rules those buffers meet.

- Size of a weight: the HTP buffer type's (`backends/htp/host/buffer_type.alloc_size`, October's
  `ggml_backend_hexagon_buffer_type_get_alloc_size`: the repack types in their tiled rows, K and N rounded up to 32);
  May's code keeps ggml's sizes.
- Packing: llama.cpp allocates a buffer type's tensors in buffers of at most `get_max_size` (GGML_HEXAGON_MBUF,
  1 GiB), cutting at tensor boundaries in file order (ggml_backend_alloc_ctx_tensors_from_buft); a tensor larger
  than that cannot be allocated at all.
- llama.cpp #21071 (merged; the arch profiles' `mmap_max_bytes`, which the emulated DSP applies too): on v73 and
  older the DSP maps a buffer with HAP_mmap, which takes at most 2 GiB
  (htp/main.c: "mmap failed : size %llu exceeds 2GB limit for HAP_mmap", then abort()); with the default 1 GiB
  buffers no buffer comes near it: it applies when GGML_HEXAGON_MBUF is above 2048.
- After 2026-10, llama.cpp #29197 lowered the largest HTP buffer to 256 MiB: #29123's thread reports Qwen3.5-4B
  Q4_0 failing to load with "HTP0:0 buffer size 556236800 exceeds max_bufsize 268435456" (its Q6_K output.weight
  in the tiled layout). A later upstream change, not modelled as a profile yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazeia.backends.htp import BUFFER_ALIGN, alloc_size, arch_profile
from kazeia.gguf.reader import GGUFFile

MiB = 1 << 20
AFTER_OCTOBER_MAX = 256 * MiB     # max_bufsize after #29197 (#29123's thread)


@dataclass(frozen=True)
class Buffers:
    """The weights' HTP buffers under one buffer cap, from every device tensor's bytes in the buffer type."""

    cap: int                                   # the largest buffer (get_max_size)
    sizes: tuple[int, ...]                     # the buffers, in allocation order
    tensor_sizes: tuple[tuple[str, int], ...]  # (name, bytes) of every device tensor, in file order

    def over(self, limit: int) -> tuple[tuple[str, int], ...]:
        """The tensors larger than `limit` bytes."""
        return tuple((n, b) for n, b in self.tensor_sizes if b > limit)

    @property
    def too_large(self) -> tuple[tuple[str, int], ...]:
        """The tensors no buffer can hold: llama.cpp cannot allocate them."""
        return self.over(self.cap)

    @property
    def largest(self) -> tuple[str, int]:
        return max(self.tensor_sizes, key=lambda s: s[1], default=("-", 0))


def device_tensors(f: GGUFFile) -> list[tuple[str, object]]:
    """(name, tensor info) of the tensors a full offload puts on the HTP: every tensor but the token embeddings (the
    CPU's GET_ROWS), and a tied lm_head's copy of them (check/weights.py counts the same)."""
    out = [(n, t) for n, t in f.tensors.items() if not n.startswith("token_embd")]
    emb = f.tensors.get("token_embd.weight")
    if "output.weight" not in f.tensors and emb is not None and emb.ne[1] > 1:
        out.append(("output.weight (tied: token_embd.weight)", emb))
    return out


def weight_buffers(f: GGUFFile, generation: str, cap: int) -> Buffers:
    """The HTP buffers of the device's weights under `generation` with buffers of at most `cap` bytes."""
    sizes = [(n, alloc_size(t.type, tuple(t.ne), t.nbytes, generation)) for n, t in device_tensors(f)]
    bufs, cur = [], 0
    for _, b in sizes:
        b = -(-b // BUFFER_ALIGN) * BUFFER_ALIGN
        if b > cap:
            continue
        if cur and cur + b > cap:
            bufs.append(cur)
            cur = 0
        cur += b
    if cur:
        bufs.append(cur)
    return Buffers(cap, tuple(bufs), tuple(sizes))


def buffer_lines(f: GGUFFile, generations: tuple[str, ...], archs: tuple[int, ...], mbuf: int) -> list[str]:
    """The report's load-time lines: per version the buffers and the tensors too large for them, #21071's
    per-mapping rule on v73 and older, and the post-October cap."""
    out = []
    for gen in dict.fromkeys(generations):
        b = weight_buffers(f, gen, mbuf)
        big = max(b.sizes, default=0)
        out.append(f"  {gen}: {len(b.sizes)} weight buffer(s) of at most {mbuf / MiB:.0f} MiB (GGML_HEXAGON_MBUF), "
                   f"the largest {big / MiB:.1f} MiB; largest tensor {b.largest[0]} {b.largest[1] / MiB:.1f} MiB")
        for name, size in b.too_large:
            out.append(f"    cannot load: {name} takes {size} B, more than the largest buffer ({mbuf} B): llama.cpp "
                       f"cannot allocate it")
        limits = {a: arch_profile(a, gen).mmap_max_bytes for a in archs}  # the arch profiles' rule (#21071)
        old = [a for a, lim in limits.items() if lim is not None]
        if old:
            verdict = ("within it" if big <= min(limits[a] for a in old) else
                       "a buffer exceeds it: the DSP aborts when it maps it ('mmap failed : size ... exceeds 2GB "
                       "limit for HAP_mmap')")
            out.append(f"    {'/'.join(f'v{a}' for a in old)}: HAP_mmap maps at most 2 GiB a buffer (llama.cpp #21071, "
                       f"htp/main.c): largest buffer {big / MiB:.1f} MiB, {verdict}")
    over = weight_buffers(f, "2026-10", AFTER_OCTOBER_MAX).too_large
    if over:
        names = ", ".join(f"{n} ({s} B)" for n, s in over[:4]) + (f" +{len(over) - 4}" if len(over) > 4 else "")
        out.append(f"  after 2026-10: llama.cpp #29197 lowered the largest HTP buffer to 256 MiB (a later upstream "
                   f"change, not modelled as a profile yet): {names} exceed it, so the model does not load there "
                   f"('buffer size ... exceeds max_bufsize 268435456', #29123's thread)")
    return out
