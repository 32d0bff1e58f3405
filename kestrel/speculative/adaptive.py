"""k = "auto": each round's k chosen from the measured unit costs and a running estimate of the
acceptance profile, k = 0 (a plain step: no draft, no verify) included.

    run_spec(model, prompt, 64, k="auto", policy="checkpoint", drafter="mtp", k_max=4, unit_costs=u)

Why. A round of k drafts pays the draft chain, a verify of k rows and the undo; it advances
max(n_ok, 1) tokens. When the drafts are good that beats a step a token; when they are not, or
when the shape is launch-bound so that a verify of k rows costs several steps, every fixed k
loses to plain decoding. The cost model (cost.predict) prices a round for any k and any per-depth
acceptance profile; this chooser feeds it the profile the run has seen so far and takes the k
with the lowest predicted ms per token, 0 when a plain step (greedy: step + argmax) is cheaper.

The estimate. One rate per judged depth j (the pairing's: the trained pairing's d_1 is free, so its
first judged draft is d_2), starting at PRIOR (counted as one observation): the plain mean of the
first few rounds that reached that depth, then an exponential moving average (weight WEIGHT per
observation): recent rounds count most, so the estimate follows acceptance that changes within a
run, and a run whose first drafts all miss stops drafting after a round or two, not four.

The costs, as measured. Unit costs price the device's work; a round also pays the host's (the
Python of the round, the reads), which on a launch-bound shape is a large part of it. So the
chooser keeps moving averages of each measured time over what the cost model predicted for it:
one for plain steps, one for drafted rounds, and one for the rounds of each k (the model can
misprice one k against another: on a CPU it made k = 3 look cheaper than it was). A k's
prediction is scaled by its own average once a round of it has been measured, else by the
drafted rounds' one.

Exploring. A k's own scale exists only once a round of it has been timed, so a k next to the one
the run settles on would be priced with the other k's scale for ever, and the model can misprice
one k against the next by more than their difference (on a 2-core CPU the tiny model's k = 3
rounds ran 1.09x their prediction and its k = 2 rounds 1.03x, which made k = 3 look best while
k = 2 was 5 % faster). So once the best k has been timed, a drafted round takes, once, a
neighbouring k that has never been timed when it is predicted within EXPLORE of the best and
faster than a plain step. Likewise hysteresis keeps the last k only while it still beats a plain
step (at the 27B costs with nothing accepted, its fourth round had kept k = 3, predicted slower
than a plain step, where k = 2 was still predicted faster).

Whether to try at all. On a launch-bound shape a round's measured time strays from what the unit
costs predict by more than a round's gain: the tiny model's rounds on an H200 ran 0.95-1.14x their
prediction in one run (results/bench_spec.json), and the same configuration (checkpoint, mtp, k = 3)
measured 0.42 and 0.73 ms a token in runs two days apart (that file and results/bench_adaptive.md).
Where even perfect drafts would cost more than PAY_MARGIN of a plain step a token (the tiny model on
an H200: 0.90 by that file's unit costs), that error alone can make every round a loss, and the
rounds it takes to find out cost an H100 run 8 % against greedy
(results/bench_adaptive_h100_before_pay_margin.md, one probe round). So such a run never drafts
(results/bench_adaptive_h100.md: 1.02x, level with greedy timed on its own engine). Shapes where speculation does pay are far from the
margin (by the same unit costs: 0.8B 0.64, 4B 0.52, 9B 0.47, 27B 0.39; the tiny model on a 2-core
CPU about 0.4).

Probing. A plain step observes nothing, so once k = 0 wins the estimate would never change.
A run that can pay opens with a drafted round even where the prior favours a plain step (it did
on a 2-core CPU with some unit-cost measurements, and those runs spent their first four to eight
rounds on plain steps before the first probe).
While it wins, every probe_gap plain steps one round is drafted at the best k > 0 (its outcome
updates the estimate); a probe after which a plain step still wins doubles the gap (up to
PROBE_GAP_MAX), any other drafted round resets it. PROBE_GAP_MAX bounds how long good drafts that
return go unseen: at 64, an H100 run of 192 tokens whose drafts turned good again for the last
48 barely drafted there (0.95 of the best fixed k, results/bench_adaptive_t192_h100.md); priced
on the 27B costs (autosim), 32 beats every fixed k there and costs nothing measurable when
nothing is accepted (0.993 against 0.992 of greedy). A round that accepts all its drafts counts as a
hit one depth further too, so the estimate can climb to a k it has not tried (or not tried for
CLIMB_AFTER drafted rounds: a depth judged recently keeps the rate its own rounds measured, else
every all-accepted round of a smaller k would pull it up). With perfect drafts (every rate 1) a round that
still cannot beat a step (at the measured scales) is never tried again: where speculation cannot
pay at all (the tiny model on a GPU), the run becomes plain greedy decoding.

Its own time. choose() and observe_time() run between rounds; their time is added to the round's
bookkeeping, so a run's measured time includes its decisions (about 0.03 ms a round in Python on a
2-core CPU: each k is priced from a table of round costs made once).

Bits. The chooser only decides which verify runs and how many rows; every token is still the main
model's argmax, so the stream is the greedy stream (the policies' construction guarantee).
"""
from __future__ import annotations

from dataclasses import dataclass

from .cost import round_cost
from .errors import SpecArgumentError
from .pairing import Pairing
from .policy import Policy
from .schedule import advance, nok_distribution_unchecked
from .units import UnitCosts

WEIGHT = 0.2            # an observation's weight in the per-depth moving average
HYSTERESIS = 0.03       # a round keeps the last k chosen as best unless another is predicted this much faster
                        # (and only while it beats a plain step)
PRIOR = 0.5             # the rate assumed for a depth before any round reached it
PROBE_GAP = 4           # plain steps before the first probe round
PROBE_GAP_MAX = 32      # the longest run of plain steps between probes: how late returning good drafts are seen
CLIMB_AFTER = 8         # drafted rounds after a depth was last judged before all-accepted rounds climb to it
EXPLORE = 0.10          # a k next to the best one, never timed, is tried once if predicted within this much
PAY_MARGIN = 0.8        # drafting is tried only if perfect drafts cost at most this share of a step a token
OPEN_WITH_PROBE = True  # a run that can pay drafts its first round even where the prior favours a plain step


@dataclass
class Choice:
    """One decision: the k taken, why, and the predicted ms per token of each k (0: a plain step)."""
    k: int
    reason: str                 # "best" | "probe" | "explore" | "cannot pay"
    predicted: dict             # k -> predicted ms per token
    alphas: tuple               # the estimate it was made with


class KChooser:
    """Each round's k for one run: choose() before the round, observe() with its n_ok (drafted
    rounds), observe_plain() (plain steps), observe_time() with its measured ms. trace holds one
    Choice a round."""

    def __init__(self, units: UnitCosts, policy, pairing, k_max: int, *, weight: float = WEIGHT,
                 prior: float = PRIOR, probe_gap: int = PROBE_GAP, probe_gap_max: int = PROBE_GAP_MAX,
                 time_scaled: bool = True):
        """time_scaled=False: decide from the unit costs alone, never from what rounds measure
        (studies of the cost model, and tests whose decisions must not depend on the machine)."""
        if not isinstance(units, UnitCosts):
            raise SpecArgumentError(f"k='auto' prices rounds with UnitCosts (measure_unit_costs), got "
                                    f"{type(units).__name__}")
        self.units, self.policy, self.pairing = units, Policy.parse(policy), Pairing.parse(pairing)
        missing = [k for k in range(1, k_max + 1) if k not in units.covered_ks(range(1, k_max + 1))]
        if missing:
            raise SpecArgumentError(f"k='auto' with k_max={k_max} needs unit costs measured up to k={k_max}; "
                                    f"these lack k = {missing}")
        self.k_max, self.weight, self.probe_gap0, self.probe_gap_max = k_max, weight, probe_gap, probe_gap_max
        self.time_scaled = time_scaled
        # a round that judges no draft (the trained pairing's k = 1: only the free d_1) is a step
        # taken through the verify: never cheaper than a plain one, so never a choice
        self.ks = [k for k in range(1, k_max + 1) if self.pairing.judged_depths(k) >= 1]
        if not self.ks:
            raise SpecArgumentError(f"k='auto' with k_max={k_max}: no k judges a draft under the "
                                    f"{self.pairing.value} pairing (k_max >= {self.pairing.min_nok + 1})")
        self._round_ms = {}                          # k -> [(a round's predicted ms, its advance)] by n_ok
        self.alphas = [prior] * self.pairing.judged_depths(k_max)
        self.seen = [1] * len(self.alphas)          # observations behind each rate (the prior counts as one)
        self.judged_at = [None] * len(self.alphas)  # the round that last judged each depth itself
        self.rounds = 0
        self.step_ms = units.greedy_ms_per_token
        self.best_case = min(self._ms(k, (1.0,) * len(self.alphas)) for k in self.ks)
        self.scale = {"round": 1.0, "plain": 1.0}  # measured / predicted, moving averages
        self.kscale = {}                             # k -> measured / predicted of rounds of that k
        self.measured = {"round": 0, "plain": 0}   # rounds behind each
        # with every draft accepted, some k beats a step by more than the unit costs' own error
        self.can_pay = self.best_case < PAY_MARGIN * self.step_ms
        self.gap, self.plain_run = probe_gap, 0
        self.trace: list = []                        # one Choice a round
        self._pred = None                            # predicted() until the estimate changes

    def _ms(self, k: int, alphas) -> float:
        """cost.predict(units, policy, pairing, k, profile=alphas).ms_per_token, from a table of
        each (k, n_ok) round's cost made once: this runs every round (predict's checks cost more
        than a tenth of a millisecond a round in Python)."""
        table = self._round_ms.get(k)
        if table is None:
            first = self.pairing.min_nok               # rounds below it never happen: weight 0
            table = self._round_ms[k] = [
                (sum(round_cost(self.units, self.policy, self.pairing, k, n).values()) if n >= first else 0.0,
                 advance(n)) for n in range(k + 1)]
        dist = nok_distribution_unchecked(alphas, k, self.pairing)
        ms = sum(w * c for w, (c, _) in zip(dist, table) if w > 0)
        return ms / sum(w * a for w, (_, a) in zip(dist, table) if w > 0)

    def predicted(self) -> dict:
        """k -> predicted ms per token under the current estimate (0: a plain step)."""
        if self._pred is None:
            r = self.scale["round"]
            self._pred = {0: self.step_ms * self.scale["plain"],
                          **{k: self._ms(k, self.alphas) * self.kscale.get(k, r) for k in self.ks}}
        return self._pred

    def choose(self, left: int) -> int:
        """The next round's k (at most `left`, the tokens still to emit)."""
        pred = self.predicted()
        ks = [k for k in self.ks if k <= left]
        if not self.can_pay or not ks:
            k, why = 0, "cannot pay" if not self.can_pay else "best"
        else:
            k = min([0] + ks, key=lambda j: pred[j])
            why = "best"
            last = next((c.k for c in reversed(self.trace)
                         if c.k > 0 and c.reason == "best"), None)
            if (k > 0 and last in ks and pred[k] > pred[last] * (1.0 - HYSTERESIS)
                    and pred[last] < pred[0]):
                k = last            # estimate noise would flip between near-equal k
            opening = OPEN_WITH_PROBE and self.rounds == 0    # no drafted round seen yet
            if k == 0 and (self.plain_run >= self.gap or opening):
                k, why = min(ks, key=lambda j: pred[j]), "probe"
            elif k > 0 and self.time_scaled and k in self.kscale:
                near = [j for j in (k - 1, k + 1) if j in ks and j not in self.kscale
                        and pred[j] <= pred[k] * (1.0 + EXPLORE) and pred[j] < pred[0]]
                if near:
                    k, why = min(near, key=lambda j: pred[j]), "explore"
        # pred is shared with the next choices until the estimate changes
        self.trace.append(Choice(k, why, pred, tuple(self.alphas)))
        return k

    def observe(self, k: int, n_ok: int):
        """A drafted round of k that accepted n_ok: update each depth it judged. A round that
        accepted every draft also counts as a hit one depth further (acceptance at one depth goes
        with acceptance at the next) when that depth has not been judged for CLIMB_AFTER rounds,
        so the estimate can climb to a k it has not tried lately."""
        choice = self.trace[-1] if self.trace else None
        first, judged = self.pairing.min_nok, self.pairing.judged_depths(k)
        for j in range(judged):
            if first + j > n_ok:            # not reached: an earlier draft missed
                break
            self._update(j, 1.0 if first + j < n_ok else 0.0)
            self.judged_at[j] = self.rounds
        last = self.judged_at[judged] if judged < len(self.alphas) else None
        if n_ok == k and judged < len(self.alphas) and (last is None or self.rounds - last > CLIMB_AFTER):
            self._update(judged, 1.0)
        self.rounds += 1
        self._pred = None
        pred = self.predicted()
        if choice is not None and choice.reason == "probe" and min(pred, key=pred.get) == 0:
            self.gap = min(2 * self.gap, self.probe_gap_max)      # a plain step still wins: wait longer
        else:
            self.gap = self.probe_gap0
        self.plain_run = 0

    def _update(self, j: int, hit: float):
        """Depth j's rate moves toward hit: the plain mean while it rests on fewer than
        1/WEIGHT observations (the first rounds of a run are not outweighed by the prior), then the
        moving average."""
        self.seen[j] += 1
        self.alphas[j] += max(self.weight, 1.0 / self.seen[j]) * (hit - self.alphas[j])

    def observe_time(self, k: int, n_ok: int, ms: float):
        """The measured ms of the round just observed (k = 0: a plain step): the scale of its kind
        moves toward measured / predicted (its first measurement sets it); once both kinds are
        measured and even perfect drafts cannot beat a step at their scales, no round is drafted
        again (the run finishes with plain greedy steps)."""
        if not self.time_scaled:
            return
        pred = (self.step_ms if k == 0 else
                sum(round_cost(self.units, self.policy, self.pairing, k, max(n_ok, self.pairing.min_nok)).values()))
        kind = "plain" if k == 0 else "round"
        if pred > 0 and ms > 0:
            first = self.measured[kind] == 0
            self.scale[kind] += (1.0 if first else self.weight) * (ms / pred - self.scale[kind])
            self.measured[kind] += 1
            if k:                       # each k's own scale: the cost model can misprice one k against another
                ks = self.kscale.get(k)
                self.kscale[k] = ms / pred if ks is None else ks + self.weight * (ms / pred - ks)
        self._pred = None
        both = min(self.measured.values()) >= 1      # one scale alone says nothing about the other
        if self.can_pay and both and self.best_case * self.scale["round"] >= self.step_ms * self.scale["plain"]:
            self.can_pay = False

    def observe_plain(self):
        self.plain_run += 1
