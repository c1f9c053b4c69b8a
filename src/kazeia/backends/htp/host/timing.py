"""Host/DSP asynchrony: when, in modeled time, the host does each step and the DSP finishes each batch.

On a device the DSP works through the queued batches while the host goes on enqueueing; what a host-side read
(OPLOG, DUMP, an enqueue-time dump) sees of an op's inputs depends on which batches have finished by then. This
model decides that, and nothing else: batches always run in order and compute the same bytes whenever they run,
so no op output depends on it.

Host: every step costs its modeled time (below), times a log-normal jitter, plus now and then a stall of a few
milliseconds (the host thread losing its core to another process or a cluster migration: a phone is not a quiet
machine). DSP: a batch starts when it has been written and the previous batch is done, and takes the dspqueue
round trip plus the cost model's time of each op (cost.py), times a small log-normal jitter (clock and DDR
contention). All figures are ASSUMED, not measured on a device; they are of the orders a phone shows, and they
make the race the original team met a race here too: with OPLOG on, the host spends about as long per op
(reading src1 for its statistics) as the DSP takes, so whether an op's producer has finished when the host
reads varies from run to run.

KAZEIA_HTP_RACE_SEED pins the jitter (the run is then reproducible); without it every run draws its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HostCosts:
    enqueue_s: float = 6e-6  # translate one op, de-duplicate its descriptors (enqueue_op)
    write_s: float = 15e-6  # close a batch and dspqueue_write it
    read_s: float = 8e-6  # one dspqueue_read that returns at once
    queue_latency_s: float = 25e-6  # the DSP sees a written batch this much later (signal, cache maintenance)
    log_line_s: float = 250e-6  # one fprintf(stderr) line, to a terminal over adb (the team ran llama-cli so)
    stats_bytes_per_s: float = 1.0e9  # the team's amax loop over src1, one core
    dump_s: float = 300e-6  # open, write, close a dump file pair
    dump_bytes_per_s: float = 0.4e9  # to flash
    jitter_sigma: float = 0.25  # log-normal spread of every host step
    stall_p: float = 0.05  # chance a host step is interrupted
    stall_mean_s: float = 2.5e-3  # how long such an interruption lasts (exponential; a scheduler tick is ~4 ms)
    dsp_jitter_sigma: float = 0.05


DEFAULT_HOST = HostCosts()


class Timing:
    """Modeled host clock and DSP finish times, from a seeded generator."""

    def __init__(self, seed: int | None, costs: HostCosts = DEFAULT_HOST) -> None:
        self.costs = costs
        self.rng = np.random.default_rng(None if seed is None else [int(seed), 0x71AE])
        self.now = 0.0  # host time
        self.dsp_free = 0.0  # when the DSP finishes the last batch submitted so far
        self.finish: dict[int, float] = {}  # batch seq -> modeled finish time

    def host(self, seconds: float) -> None:
        """The host spends `seconds` (jittered, maybe interrupted)."""
        c = self.costs
        t = seconds * float(self.rng.lognormal(0.0, c.jitter_sigma))
        if self.rng.random() < c.stall_p:
            t += float(self.rng.exponential(c.stall_mean_s))
        self.now += t

    def submit(self, seq: int, dsp_seconds: float) -> float:
        """A batch written now that the DSP needs `dsp_seconds` for; returns its finish time."""
        start = max(self.now + self.costs.queue_latency_s, self.dsp_free)
        self.dsp_free = start + dsp_seconds * float(self.rng.lognormal(0.0, self.costs.dsp_jitter_sigma))
        self.finish[seq] = self.dsp_free
        return self.dsp_free

    def done_by_now(self, seq: int) -> bool:
        return self.finish.get(seq, float("inf")) <= self.now

    def wait_for(self, seq: int) -> None:
        """The host blocks in dspqueue_read until batch `seq` is done."""
        self.now = max(self.now, self.finish.get(seq, self.now))
        self.host(self.costs.read_s)
        self.finish.pop(seq, None)
