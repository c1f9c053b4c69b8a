"""The DSP's L2 bookkeeping of October 2026 (llama.cpp 0c1e57098bba, `htp/htp-tensor.c`, `htp/main.c`): lazy,
dirty-range flushing, kept as a state the emulator updates exactly as the DSP does.

- At batch start the whole data cache is cleaned and invalidated and the table emptied (main.c: process_opbatch,
  QURT_MEM_CACHE_FLUSH_INVALIDATE_ALL); at batch end it is cleaned and invalidated again (the table is left).
- Before an op (main.c: prep_op_bufs -> htp_tensor_flush_all): each input overlapping a tracked dirty range is
  flushed (more than 4 MiB in all: a whole-cache flush instead; 4 KiB or more: spread over the worker threads) and
  its bytes cleared from the table.
- Then the op's outputs are recorded dirty (htp_tensor_dirty_all): merged into an overlapping range, else put in a
  free slot of the 64-entry table; with no free slot the oldest ranges are flushed to make room (again whole-cache
  past 4 MiB). Weights and fences are never tracked.

Memory in this emulator is coherent (numpy arrays), so the table changes no value: it is what a fault of L2
visibility (a stale line a consumer reads) needs to say which bytes were not written back, and what the counters
(flushes, bytes, whole-cache flushes) report. The DSP records its calls (`L2Recorder`) and the table is brought up
to date when read. Addresses are kazeia's (a buffer's base plus the tensor's offset).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_DIRTY_RANGES = 64  # HTP_MAX_DIRTY_RANGES (htp-ctx.h)
FLUSH_WQ_THRESHOLD = 4 * 1024  # HEX_L2_FLUSH_WQ_THRESHOLD (hex-utils.h): at or past it, the worker threads flush
FLUSH_ALL_THRESHOLD = 4 * 1024 * 1024  # HEX_L2_FLUSH_ALL_THRESHOLD: past it, the whole cache is flushed


@dataclass
class L2Stats:
    flush_all: int = 0  # whole-cache clean+invalidate (batch start and end, and past the 4 MiB threshold)
    ranges_flushed: int = 0
    bytes_flushed: int = 0
    threaded_flushes: int = 0  # range flushes spread over the worker threads (>= 4 KiB)


@dataclass
class L2State:
    """The 64-entry dirty-range table ([start, end) pairs; start 0 is a free slot) and its counters. `_live` holds
    the occupied slots' indexes, so that the scans upstream makes over all 64 slots visit only those (a decode
    keeps a handful live): the same slots, in the same order, with the same results."""

    ranges: list[list[int]] = field(default_factory=lambda: [[0, 0] for _ in range(MAX_DIRTY_RANGES)])
    stats: L2Stats = field(default_factory=L2Stats)
    n_threads: int = 6
    _live: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._live = [i for i, r in enumerate(self.ranges) if r[0]]

    def _set(self, i: int, a: int, b: int) -> None:
        r = self.ranges[i]
        was = bool(r[0])
        r[0], r[1] = a, b
        if a and not was:
            self._live.append(i)
            self._live.sort()
        elif was and not a:
            self._live.remove(i)

    def dirty(self) -> list[tuple[int, int]]:
        return [tuple(self.ranges[i]) for i in self._live]

    def _clear(self) -> None:
        for i in self._live:
            self.ranges[i][0] = self.ranges[i][1] = 0
        self._live = []

    def flush_all(self) -> None:
        self.stats.flush_all += 1
        self._clear()

    def batch_start(self) -> None:
        self.flush_all()

    def batch_end(self) -> None:
        self.stats.flush_all += 1  # (main.c cleans the cache; the table is emptied at the next start)

    def _flush(self, spans: list[tuple[int, int]]) -> None:
        total = sum(e - s for s, e in spans)
        self.stats.ranges_flushed += len(spans)
        self.stats.bytes_flushed += total
        if total >= FLUSH_WQ_THRESHOLD and self.n_threads > 1:
            self.stats.threaded_flushes += 1

    def _merge(self) -> None:
        """merge_dirty_ranges: ranges that overlap or touch, transitively, become one, kept in the lowest slot of
        their group (the slot upstream's double loop keeps: the first of the group it meets absorbs the others);
        the other slots are freed. Done as a sweep over the live ranges sorted by start: the same groups."""
        if len(self._live) < 2:
            return
        rs = self.ranges
        active = sorted((rs[i][0], rs[i][1], i) for i in self._live)
        group, hi = [active[0]], active[0][1]
        for item in active[1:]:
            if item[0] <= hi:
                group.append(item)
                hi = max(hi, item[1])
                continue
            self._fold(group)
            group, hi = [item], item[1]
        self._fold(group)

    def _fold(self, group: list[tuple[int, int, int]]) -> None:
        if len(group) == 1:
            return
        keep = min(g[2] for g in group)
        lo, hi = min(g[0] for g in group), max(g[1] for g in group)
        for _, _, i in group:
            if i != keep:
                self._set(i, 0, 0)
        self._set(keep, lo, hi)

    def flush_inputs(self, tensors: list[tuple[int, int]]) -> None:
        """htp_tensor_flush_all for an op's inputs, (address, size) of those not weights or fences."""
        if not self._live:
            return
        rs = self.ranges
        live = [rs[i] for i in self._live]
        dirty = [(a, a + n) for a, n in tensors if n > 0 and any(r[0] < a + n and a < r[1] for r in live)]
        if not dirty:
            return
        total = sum(e - s for s, e in dirty)
        if total > FLUSH_ALL_THRESHOLD:
            return self.flush_all()
        self._flush(dirty)
        for a, b in dirty:  # make_tensor_clean
            for i in list(self._live):
                r = rs[i]
                if r[0] < b and a < r[1]:
                    if a <= r[0] and r[1] <= b:
                        self._set(i, 0, 0)
                    elif a <= r[0]:
                        r[0] = b
                    elif r[1] <= b:
                        r[1] = a

    def mark_dirty(self, tensors: list[tuple[int, int]]) -> None:
        """htp_tensor_dirty_all for an op's outputs, (address, size) of those not weights or fences."""
        rs = self.ranges
        pending = []
        for a, n in tensors:
            b, merged = a + n, False
            for i in self._live:
                r = rs[i]
                if r[0] <= b and a <= r[1]:
                    r[0], r[1] = min(a, r[0]), max(b, r[1])
                    merged = True
            if not merged:
                pending.append((a, b))
        self._merge()
        if not pending:
            return
        live = set(self._live)
        empty = [i for i in range(MAX_DIRTY_RANGES) if i not in live]
        active = list(self._live)
        if len(pending) <= len(empty):
            for i, (a, b) in zip(empty, pending):
                self._set(i, a, b)
            return self._merge()
        n_evict = len(pending) - len(empty)
        evicted = [tuple(rs[i]) for i in active[:n_evict]]
        if sum(e - s for s, e in evicted) > FLUSH_ALL_THRESHOLD:
            self.flush_all()
            for i, (a, b) in enumerate(pending):
                self._set(i, a, b)
            return self._merge()
        self._flush(evicted)
        for i, (a, b) in zip(active[:n_evict], pending):
            self._set(i, a, b)
        for i, (a, b) in zip(empty, pending[n_evict:]):
            self._set(i, a, b)
        self._merge()


class L2Recorder:
    """The DSP's L2 calls, kept in order and applied to its `L2State` when someone reads it (`state`), or when many
    wait: the table is a function of the calls alone (nothing in it feeds back into what the ops compute), so the
    state read is the one the DSP would hold, at a fraction of the per-op cost on a decode's hundreds of ops."""

    LIMIT = 1 << 16  # calls kept before they are applied (bounded memory)

    def __init__(self, n_threads: int = 6) -> None:
        self._state = L2State(n_threads=n_threads)
        self._log: list[tuple] = []

    def batch_start(self) -> None:
        self._push(("start",))

    def batch_end(self) -> None:
        self._push(("end",))

    def op(self, inputs: list[tuple[int, int]], outputs: list[tuple[int, int]]) -> None:
        """prep_op_bufs: the op's dirty inputs flushed, then its outputs recorded dirty."""
        self._push(("op", inputs, outputs))

    def _push(self, call: tuple) -> None:
        self._log.append(call)
        if len(self._log) >= self.LIMIT:
            self._apply()

    def _apply(self) -> None:
        st = self._state
        for call in self._log:
            if call[0] == "op":
                st.flush_inputs(call[1])
                st.mark_dirty(call[2])
            elif call[0] == "start":
                st.batch_start()
            else:
                st.batch_end()
        self._log = []

    @property
    def state(self) -> L2State:
        self._apply()
        return self._state
