"""2026-10's lazy L2 bookkeeping (backends/htp/l2.py) against cases worked out by hand from htp/htp-tensor.c
(htp_tensor_flush_all, htp_tensor_dirty_all, merge_dirty_ranges, make_tensor_clean; thresholds of hex-utils.h:
4 KiB for the threaded flush, 4 MiB for a whole-cache flush) and main.c (flush-invalidate-all at batch start and
end; 64 ranges, htp-ctx.h)."""

from __future__ import annotations

from kazeia.backends.htp.l2 import MAX_DIRTY_RANGES, L2State

KiB, MiB = 1024, 1024 * 1024


def test_an_output_is_flushed_when_a_later_op_reads_it():
    l2 = L2State()
    l2.batch_start()
    l2.mark_dirty([(0x10000, 8 * KiB)])
    assert l2.dirty() == [(0x10000, 0x12000)]
    l2.flush_inputs([(0x40000, 100)])  # not dirty: nothing flushed
    assert l2.stats.ranges_flushed == 0
    l2.flush_inputs([(0x10000, 8 * KiB)])
    assert l2.dirty() == [] and l2.stats.bytes_flushed == 8 * KiB and l2.stats.threaded_flushes == 1
    l2.mark_dirty([(0x20000, 1 * KiB)])
    l2.flush_inputs([(0x20000, 1 * KiB)])  # under 4 KiB: the op's own thread flushes it
    assert l2.stats.threaded_flushes == 1 and l2.stats.ranges_flushed == 2


def test_touching_and_overlapping_outputs_merge():
    l2 = L2State()
    l2.mark_dirty([(0x1000, 0x1000), (0x2000, 0x1000)])  # [0x1000, 0x2000) touches [0x2000, 0x3000)
    assert l2.dirty() == [(0x1000, 0x3000)]
    l2.mark_dirty([(0x2800, 0x1000)])
    assert l2.dirty() == [(0x1000, 0x3800)]


def test_reading_part_of_a_range_cleans_only_what_was_read():
    l2 = L2State()
    l2.mark_dirty([(0x1000, 0x4000)])
    l2.flush_inputs([(0x1000, 0x1000)])  # the input starts the range: the range keeps its tail
    assert l2.dirty() == [(0x2000, 0x5000)]
    l2.flush_inputs([(0x4000, 0x1000)])  # the input ends it: the range keeps its head
    assert l2.dirty() == [(0x2000, 0x4000)]


def test_a_full_table_evicts_its_oldest_ranges():
    l2 = L2State()
    base = [(0x100000 * (i + 1), 256) for i in range(MAX_DIRTY_RANGES)]
    for span in base:
        l2.mark_dirty([span])
    assert len(l2.dirty()) == MAX_DIRTY_RANGES and l2.stats.ranges_flushed == 0
    l2.mark_dirty([(0x9000000, 256)])  # no free slot: slot 0's range is flushed and replaced
    assert l2.stats.ranges_flushed == 1 and l2.stats.bytes_flushed == 256
    assert (0x100000, 0x100100) not in l2.dirty() and (0x9000000, 0x9000100) in l2.dirty()


def test_past_4_mib_the_whole_cache_is_flushed():
    l2 = L2State()
    l2.mark_dirty([(0x100000, 3 * MiB), (0x1000000, 2 * MiB)])
    before = l2.stats.flush_all
    l2.flush_inputs([(0x100000, 3 * MiB), (0x1000000, 2 * MiB)])  # 5 MiB of dirty inputs
    assert l2.stats.flush_all == before + 1 and l2.dirty() == [] and l2.stats.bytes_flushed == 0


def test_every_batch_starts_and_ends_with_a_whole_cache_flush(tiny_qwen3_q4):
    from kazeia.backends.cpu import CpuBackend
    from kazeia.backends.htp import HtpBackend, HtpSettings
    from kazeia.engine.context import Context, Model
    from kazeia.engine.scheduler import Scheduler

    htp = HtpBackend(HtpSettings())
    ctx = Context(Model.load(tiny_qwen3_q4), Scheduler([htp, CpuBackend()]), n_ctx=64, n_ubatch=8)
    batches = []
    htp.add_batch_start_hook(lambda _be, b: batches.append(b.seq))
    ctx.decode(list(range(5, 11)))
    st = htp.dsp.l2.state.stats
    assert batches and st.flush_all >= 2 * len(batches)
    assert st.ranges_flushed > 0  # outputs read by later ops of the same batch were flushed before them
    robust = HtpBackend(HtpSettings(profile="robust"))
    assert robust.dsp.l2 is None  # May's code has no such table


def _merge_as_upstream(rs: list[list[int]]) -> None:
    """merge_dirty_ranges transcribed loop for loop (htp-tensor.c): the oracle of the sweep l2.py does."""
    for i in range(MAX_DIRTY_RANGES):
        r = rs[i]
        if not r[0]:
            continue
        j = 0
        while j < MAX_DIRTY_RANGES:
            s = rs[j]
            if i == j or not s[0] or r[1] < s[0] or s[1] < r[0]:
                j += 1
                continue
            r[0], r[1] = min(r[0], s[0]), max(r[1], s[1])
            s[0] = s[1] = 0
            j = 0


def test_the_merge_keeps_upstreams_slots():
    import random

    rng = random.Random(5)
    for _ in range(300):
        table = [[0, 0] for _ in range(MAX_DIRTY_RANGES)]
        for i in rng.sample(range(MAX_DIRTY_RANGES), rng.randint(0, MAX_DIRTY_RANGES)):
            a = rng.randrange(1, 4000) * 64
            table[i] = [a, a + rng.randrange(1, 40) * 64]
        want = [list(r) for r in table]
        _merge_as_upstream(want)
        l2 = L2State(ranges=[list(r) for r in table])
        l2._merge()
        assert l2.ranges == want


class _Upstream:
    """htp-tensor.c's table transcribed statement for statement over the 64 slots (the oracle of l2.py's faster
    bookkeeping): htp_tensor_dirty_all, htp_tensor_flush_all with make_tensor_clean, flush_all_dcache."""

    def __init__(self) -> None:
        self.r = [[0, 0] for _ in range(MAX_DIRTY_RANGES)]
        self.flushed = 0  # bytes of ranges flushed one by one
        self.all = 0

    def flush_all(self) -> None:
        self.all += 1
        self.r = [[0, 0] for _ in range(MAX_DIRTY_RANGES)]

    def dirty_all(self, tensors) -> None:
        pending = []
        for a, n in tensors:
            b, merged = a + n, False
            for r in self.r:
                if r[0] and r[0] <= b and a <= r[1]:
                    r[0], r[1] = min(a, r[0]), max(b, r[1])
                    merged = True
            if not merged:
                pending.append((a, b))
        _merge_as_upstream(self.r)
        if not pending:
            return
        active = [j for j in range(MAX_DIRTY_RANGES) if self.r[j][0]]
        empty = [j for j in range(MAX_DIRTY_RANGES) if not self.r[j][0]]
        if len(pending) <= len(empty):
            for j, (a, b) in zip(empty, pending):
                self.r[j] = [a, b]
            _merge_as_upstream(self.r)
            return
        n_evict = len(pending) - len(empty)
        total = sum(self.r[j][1] - self.r[j][0] for j in active[:n_evict])
        if total > 4 * MiB:
            self.flush_all()
            for j, (a, b) in enumerate(pending):
                self.r[j] = [a, b]
            _merge_as_upstream(self.r)
            return
        self.flushed += total
        for j, (a, b) in zip(active[:n_evict], pending):
            self.r[j] = [a, b]
        for j, (a, b) in zip(empty, pending[n_evict:]):
            self.r[j] = [a, b]
        _merge_as_upstream(self.r)

    def flush_inputs(self, tensors) -> None:
        dirty = [(a, a + n) for a, n in tensors if any(r[0] and r[0] < a + n and a < r[1] for r in self.r)]
        total = sum(b - a for a, b in dirty)
        if total == 0:
            return
        if total > 4 * MiB:
            return self.flush_all()
        self.flushed += total
        for a, b in dirty:
            for r in self.r:
                if r[0] and r[0] < b and a < r[1]:
                    if a <= r[0] and r[1] <= b:
                        r[0] = r[1] = 0
                    elif a <= r[0]:
                        r[0] = b
                    elif r[1] <= b:
                        r[1] = a


def test_random_op_sequences_keep_upstreams_table():
    import random

    rng = random.Random(11)
    for trial in range(40):
        want, got = _Upstream(), L2State()
        for _ in range(400):
            tensors = [(rng.randrange(1, 2000) * 256, rng.choice([64, 256, 4096, 65536, 3 * MiB]))
                       for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.5:
                want.dirty_all(tensors)
                got.mark_dirty(tensors)
            else:
                want.flush_inputs(tensors)
                got.flush_inputs(tensors)
            assert got.ranges == want.r, trial
        assert (got.stats.bytes_flushed, got.stats.flush_all) == (want.flushed, want.all)
