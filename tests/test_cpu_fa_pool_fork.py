"""The CPU's prefill flash attention hands half its KV heads to a helper thread (cpu/f32_ops._fa_pool). A forked
child (the oracle's workers, forensic tools' child runs) has no such thread: the pool must be made again there, or
the first prefill of the child waits forever (the oracle's CPU sweep hung on FLASH_ATTN_EXT nb=38 before this)."""

from __future__ import annotations

import multiprocessing as mp

from kazeia.backends.cpu import f32_ops


def _child(q) -> None:
    q.put(f32_ops._fa_pool().submit(lambda: 42).result(timeout=30))


def test_a_forked_child_gets_its_own_helper_thread():
    assert f32_ops._fa_pool().submit(lambda: 1).result(timeout=30) == 1  # the parent's pool exists and has run
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    p.join(60)
    alive = p.is_alive()
    if alive:
        p.kill()
    assert not alive and p.exitcode == 0
    assert q.get(timeout=5) == 42
