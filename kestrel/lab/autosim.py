"""k = "auto"'s decisions, priced instead of run: the chooser (kestrel/speculative/adaptive.py)
against a forced acceptance schedule, every round priced by the cost model from unit costs, its
"measured" time the price x a per-k bias x log-normal noise. No model runs, so many seeds take
seconds, and with no noise the outcome depends on the decisions alone, never on a machine's
timing: the tests hold the chooser to it at the 27B shape's costs (tests/test_adaptive.py), and
dev/adaptive_sim.py compares variants of the chooser with it before they are measured for real.

    ms, ks = priced_run(units, spec.Schedule(profile=spec.E16_PROFILE, pairing="trained"), 64, "auto")
"""
from __future__ import annotations

import numpy as np

from kestrel import speculative as spec
from kestrel.speculative.adaptive import KChooser
from kestrel.speculative.cost import round_cost
from .sweep import ALPHA_3P39


def priced_run(units, schedule, T: int, k, *, k_max: int = 4, policy="checkpoint", bias=None,
               sigma: float = 0.0, rng=None, chooser: KChooser | None = None) -> tuple:
    """One run of T tokens at a fixed k (an int; its last short round shrinks, a single token is a
    plain step) or k = "auto" (up to k_max) -> (ms per token, the k of each round, 0: a plain
    step). bias: k -> factor on its rounds' prices (0: plain steps); sigma: log-normal noise.
    chooser: the KChooser that decides a k = "auto" run (default: a new one), so that a caller can
    read its trace (every decision with its reason and predictions) afterwards."""
    bias = bias or {}
    rng = rng if rng is not None else np.random.default_rng(0)
    pairing = schedule.pairing
    ch = (chooser or KChooser(units, policy, pairing, k_max)) if k == "auto" else None
    schedule.bind(k_max)                        # a fixed k takes min(n_ok, k) of what it asks
    out, ms, ks = 0, 0.0, []
    while out < T:
        left = T - out
        if ch is not None:
            kr = ch.choose(left) if ch.can_pay else 0
        else:
            kr = min(k, left)
        if kr and pairing.judged_depths(kr) < 1:       # nothing to judge: a plain step
            kr = 0
        if kr == 0:
            n, price = 0, units.greedy_ms_per_token
            if ch is not None:
                ch.observe_plain()
        else:
            n = schedule.next(kr, at=out)
            price = sum(round_cost(units, policy, pairing, kr, n).values())
            if ch is not None:
                ch.observe(kr, n)
        t = price * bias.get(kr, 1.0) * (float(np.exp(rng.normal(0.0, sigma))) if sigma else 1.0)
        if ch is not None and ch.can_pay:
            ch.observe_time(kr, n, t)
        ms += t
        out += max(n, 1)
        ks.append(kr)
    return ms / T, ks


def compare(units, make_schedule, T: int = 64, ks=(2, 3, 4), seeds: int = 20, **kw) -> dict:
    """Each fixed k and "auto" over `seeds` schedules (make_schedule(seed)) -> mode -> mean ms
    per token, and "trace": auto's k by round for the first seed."""
    res, trace = {}, None
    for mode in [*ks, "auto"]:
        vals = []
        for seed in range(seeds):
            ms, kk = priced_run(units, make_schedule(seed), T, mode, k_max=max(ks),
                                rng=np.random.default_rng(1000 + seed), **kw)
            vals.append(ms)
            if mode == "auto" and trace is None:
                trace = kk
        res[mode] = float(np.mean(vals))
    res["trace"] = trace
    return res


def switch(T: int) -> list:
    """n_ok by token: every draft accepted (4 of 4) for the first quarter, only the free d_1 for
    the next half, all again for the last quarter (scripts/bench_adaptive.py's switching case)."""
    q = T // 4
    return [4] * q + [1] * (T - 2 * q) + [4] * q


def cases(T: int = 64) -> list:
    """(name, make_schedule(seed)) of the 27B study: E16, flat 3.39 tokens a round, nothing
    accepted, the switch."""
    def seq(s, **kw):
        return lambda seed: spec.Schedule(seq=s, pairing="trained", **kw)
    return [("E16 profile", lambda seed: spec.Schedule(profile=spec.E16_PROFILE, pairing="trained", seed=seed)),
            ("3.39 tokens/round", lambda seed: spec.Schedule(profile=(ALPHA_3P39,) * 3, pairing="trained", seed=seed)),
            ("nothing accepted", seq([1])),
            ("good, useless, good", seq(switch(T), by="token"))]
