"""engine/gc_policy.py: while a session is open the objects that existed when it opened are frozen and young
collections are rarer; when the last session closes, everything is the collector's again (a closed session's
cycles are collected) and the thresholds are CPython's again."""

from __future__ import annotations

import subprocess
import sys

from kazeia.cli.common import open_session
from kazeia.cli.main import build_parser
from kazeia.engine import gc_policy

PROBE = r"""
import gc, weakref
from kazeia.engine import gc_policy

class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it

before = gc.get_threshold()
gc_policy.hold()
gc_policy.hold()
assert gc_policy.held() == 2 and gc.get_freeze_count() > 0
assert gc.get_threshold()[0] == max(gc_policy.YOUNG_THRESHOLD, before[0])
gc_policy.release()
assert gc.get_freeze_count() > 0  # one session is still open
gc_policy.release()
assert gc_policy.held() == 0 and gc.get_freeze_count() == 0 and gc.get_threshold() == before
gc_policy.release()  # a release without a hold changes nothing
assert gc_policy.held() == 0 and gc.get_threshold() == before

node = Node()
alive = weakref.ref(node)
gc_policy.hold()
del node
gc.collect()
assert alive() is not None  # frozen: the collector does not walk it
gc_policy.release()
gc.collect()
assert alive() is None  # the last release gave it back
print("ok")
"""


def test_holds_nest_freeze_and_the_last_release_gives_everything_back():
    """In a fresh interpreter: this one's state depends on the sessions earlier tests left open."""
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_a_session_holds_until_it_closes(tiny_qwen3_q4):
    held = gc_policy.held()
    s = open_session(build_parser("run").parse_args(["run", "-m", tiny_qwen3_q4, "-dev", "CPU"]))
    try:
        assert gc_policy.held() == held + 1
    finally:
        s.close()
    assert gc_policy.held() == held
