"""The CUDA backend's plan cache: which plans it keeps, and what a plan costs before it is cheap.

A plan (plan.py) is lowered at its first use and runs eagerly; its second use captures it as a
CUDA graph; every use after that replays the graph. The backend keeps PLAN_CACHE plans per
model, least recently used evicted first, keyed on (program, rows, GDN mode, the engine state's
buffers, the kernel switches): every engine has plans of its own. Plans wider than
GRAPH_MAX_ROWS (a prompt) are lowered each time and never cached.

Pure Python, without CuPy, so that a benchmark's plan traffic can be replayed on any machine
(tests/test_sweep.py replays the speculative benchmark's and checks that its timed runs lower
and capture nothing).
"""
from __future__ import annotations

import collections

GRAPH_MAX_ROWS = 8       # plans up to this many rows are cached and graphed (verify widths)

# A plan holds a few MB of activation buffers (27B, M = 4: 5 MB) and one graph; re-lowering an
# evicted plan costs an eager run and then a capture (tens of ms at 27B), and a benchmark that
# cycles engines must never pay that inside a timed run. 48 did not hold the speculative
# benchmark's engines (four policies x two batch modes x k = 2..4, the unit-cost and greedy
# engines): its timed runs re-lowered plans (2026-12-02).
PLAN_CACHE = 256

# The batched engine's passes (lower_batch) are kept apart: a pass over 64 sequences' rows holds
# hundreds of MB of activations at 27B (the logits alone: 256 rows x 248320 x 4 bytes). A plan
# is made for a batch's room (its slots and widest call, segments.bounds) and serves every mix
# of rows within it; only the pass's total rows varies, over segments.totals: at most 20 totals
# for 64 slots of 5 rows, so one batch's main, MTP and fold plans (41) fit with room to spare
# (tests/test_batch.py). With 8 plans keyed on every sequence's rows, the H100 run of
# 2026-12-05 re-lowered passes every round.
BATCH_PLAN_CACHE = 64


class PlanCache(collections.OrderedDict):
    """key -> plan, least recently used first."""

    def __init__(self, size: int = PLAN_CACHE):
        super().__init__()
        self.size = size

    def get_or_make(self, key, make) -> tuple:
        """(the plan of key, whether it was made now): made by make() on a miss, evicting the
        least recently used past `size`."""
        plan = self.get(key)
        if plan is not None:
            self.move_to_end(key)
            return plan, False
        plan = self[key] = make()
        while len(self) > self.size:
            self.popitem(last=False)
        return plan, True
