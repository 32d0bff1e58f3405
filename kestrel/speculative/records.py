"""What a speculative run records: each round (RoundRecord), the run itself (SpecResult), and the
one typed summary every consumer reads (RunSummary: the CLI, the benchmarks, widgets, plots,
results files through to_dict / from_dict)."""
from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields

from .errors import SpecArgumentError
from .pairing import Pairing
from .policy import Policy
from .schedule import format_hist
from .stats import PHASES, CondHit, NokCounts, conditional_hits, histogram


@dataclass
class RoundRecord:
    i: int                  # round index
    p: int                  # anchor: main consumed through p
    k: int                  # drafts this round (k, fewer in a shrunk tail round; 0: a plain step, k = "auto")
    drafts: list
    n_ok: int
    emitted: list           # tokens emitted this round
    self_token: int | None  # argmax of verify row n_ok-1 (never emitted, unless emit_self)
    mtp_cursor: int         # MTP cursor at the round start
    ms: dict                # phase -> milliseconds
    requested: int | None = None   # n_ok the replay drafter asked for

    @property
    def total_ms(self) -> float:
        return float(sum(self.ms.values()))


@dataclass
class RunSummary(NokCounts):
    """One run, or several aggregated (e.g. the six starts), in numbers. Times are ms per emitted
    token: phase_ms_per_token covers the rounds, ms_per_token the rounds plus the strict tail.
    greedy_ms_per_token: plain greedy decoding of the same tokens, timed in the same run.
    predicted_*: the cost model priced for these rounds (benchmarks fill them)."""
    policy: Policy
    pairing: Pairing
    drafter: str                      # the drafter's description, e.g. 'mtp' or 'replay[hist(...)]'
    k: int
    T: int                            # tokens emitted
    hist: dict                        # n_ok -> rounds
    cond_hits: list                   # [CondHit], j = 1..k
    ms_per_token: float
    phase_ms_per_token: dict
    greedy_ms_per_token: float | None = None
    bit_exact: bool | None = None
    first_diff: int | None = None
    model: str = ""
    device: str = ""
    runs: int = 1
    prompt_tokens: int | None = None
    tail_tokens: int = 0
    tail_reason: str = ""
    schedule: str | None = None       # a short name for what the replay drafter replayed
    variants: dict = field(default_factory=dict)    # the deliberately wrong switches that were on
    speedup_per_run: list | None = None
    predicted_ms_per_token: float | None = None
    predicted_speedup: float | None = None
    predicted_phase_ms_per_token: dict | None = None
    plain_steps: int = 0              # rounds that drafted nothing (k = "auto" chose a plain step)
    k_chosen: dict | None = None      # k = "auto": k -> rounds that took it (0: plain steps)

    @property
    def speedup(self) -> float | None:
        if self.greedy_ms_per_token is None or not self.ms_per_token:
            return None
        return self.greedy_ms_per_token / self.ms_per_token

    @property
    def spec_ms(self) -> float:
        return self.ms_per_token * self.T

    @property
    def greedy_ms(self) -> float | None:
        return None if self.greedy_ms_per_token is None else self.greedy_ms_per_token * self.T

    @property
    def tail_ms_per_token(self) -> float:
        """ms per token of the strict tail (plain steps after the last round)."""
        if not self.tail_tokens:
            return 0.0
        return max(self.ms_per_token - sum(self.phase_ms_per_token.values()), 0.0)

    def log_lines(self) -> list:
        return log_lines(self)

    # ---- results files -----------------------------------------------------------------------
    DERIVED = ("speedup", "rounds", "accepted", "advance_per_round", "mean_per_round", "zero_rounds",
               "first_draft_hit")

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["policy"], d["pairing"] = self.policy.name, self.pairing.value
        d["hist"] = {int(n): int(c) for n, c in self.hist.items()}
        d["cond_hits"] = [asdict(c) for c in self.cond_hits]
        for name in self.DERIVED:                     # for readers of the file; from_dict recomputes them
            d[name] = getattr(self, name)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunSummary":
        """The inverse of to_dict. Keys it does not know (a benchmark's additions, e.g. its log
        lines) and the derived values are ignored; a missing field names itself."""
        names = {f.name for f in fields(cls)}
        kw = {n: d[n] for n in names if n in d}
        missing = [f.name for f in fields(cls)
                   if f.name not in d and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise SpecArgumentError(f"a run summary needs {missing}; got keys {sorted(d)}")
        kw["policy"], kw["pairing"] = Policy.parse(d["policy"]), Pairing.parse(d["pairing"])
        kw["hist"] = {int(n): int(c) for n, c in d["hist"].items()}
        kw["cond_hits"] = [CondHit(**c) for c in d["cond_hits"]]
        unknown = set(d["phase_ms_per_token"]) - set(PHASES)
        if unknown:
            raise SpecArgumentError(f"unknown phase(s) {sorted(unknown)} in a run summary; phases: {PHASES}")
        return cls(**kw)


@dataclass
class SpecResult:
    """One speculative run: its rounds, its stream, and the reference it is checked against."""
    model: str
    device: str
    policy: Policy
    drafter: str
    pairing: Pairing
    k: int
    T: int
    batch: str
    tail_mode: str
    prompt: list
    stream: list
    reference: list | None
    rounds: list
    tail_tokens: int = 0
    tail_ms: float = 0.0
    tail_reason: str = ""
    prefill_ms: float = 0.0
    mtp_fill_ms: float = 0.0
    greedy_ms: float | None = None         # greedy decode of the same T tokens, same run
    variants: dict = field(default_factory=dict)
    auto_k_max: int | None = None          # k = "auto": the most drafts a round could take
    choices: list | None = None            # k = "auto": adaptive.Choice per round

    @property
    def bit_exact(self) -> bool | None:
        return None if self.reference is None else list(self.stream) == list(self.reference)

    @property
    def first_diff(self) -> int | None:
        if self.reference is None:
            return None
        for i, (a, b) in enumerate(zip(self.stream, self.reference)):
            if a != b:
                return i
        return None if len(self.stream) == len(self.reference) else min(len(self.stream), len(self.reference))

    @property
    def drafted(self) -> list:
        """The rounds that drafted (every round but the plain steps k = "auto" chose)."""
        return [r for r in self.rounds if r.k > 0]

    @property
    def noks(self) -> list:
        return [r.n_ok for r in self.drafted]

    def k_chosen(self) -> dict | None:
        """k = "auto": k -> rounds that took it (0: plain steps); None for a fixed k."""
        if self.k != "auto":
            return None
        out = {}
        for r in self.rounds:
            out[r.k] = out.get(r.k, 0) + 1
        return dict(sorted(out.items()))

    @property
    def spec_ms(self) -> float:
        return float(sum(r.total_ms for r in self.rounds) + self.tail_ms)

    def phase_ms(self) -> dict:
        return phase_totals(self.rounds)

    def summary(self) -> RunSummary:
        return RunSummary(
            policy=self.policy, pairing=self.pairing, drafter=self.drafter, k=self.k_max, T=self.T,
            hist=histogram(self.noks, self.k_max), cond_hits=conditional_hits(self.noks, [r.k for r in self.drafted]),
            ms_per_token=self.spec_ms / self.T, phase_ms_per_token={ph: v / self.T for ph, v in self.phase_ms().items()},
            greedy_ms_per_token=None if self.greedy_ms is None else self.greedy_ms / self.T,
            bit_exact=self.bit_exact, first_diff=self.first_diff, model=self.model, device=self.device,
            prompt_tokens=len(self.prompt), tail_tokens=self.tail_tokens, tail_reason=self.tail_reason,
            variants=dict(self.variants), plain_steps=len(self.rounds) - len(self.drafted),
            k_chosen=self.k_chosen())

    @property
    def k_max(self) -> int:
        """The most drafts a round could take: k, or k_max under k = "auto"."""
        return self.auto_k_max if self.k == "auto" else self.k

    def log_lines(self) -> list:
        return log_lines(self.summary())

    def to_dict(self, rounds: bool = True) -> dict:
        d = {"summary": self.summary().to_dict(), "prompt": list(self.prompt), "stream": list(self.stream),
             "reference": None if self.reference is None else list(self.reference)}
        if rounds:
            d["rounds"] = [asdict(r) for r in self.rounds]
        return d


def phase_totals(rounds) -> dict:
    """ms per phase summed over RoundRecords (every phase present, 0 where unused)."""
    out = {ph: 0.0 for ph in PHASES}
    for r in rounds:
        for ph, v in r.ms.items():
            out[ph] += v
    return out


def aggregate(results: list) -> RunSummary:
    """One summary over several runs of one configuration (e.g. the six starts): histograms,
    counts, tokens and times add."""
    results = list(results)
    if not results:
        raise SpecArgumentError("aggregate: no results")
    r0 = results[0]
    mixed = [r for r in results if (r.policy, r.pairing) != (r0.policy, r0.pairing)]
    if mixed:
        raise SpecArgumentError(f"aggregate: runs of one policy and pairing only ({r0.policy}/{r0.pairing} and "
                                f"{mixed[0].policy}/{mixed[0].pairing})")
    noks = [n for r in results for n in r.noks]
    ks = [x.k for r in results for x in r.drafted]
    k = max(r.k_max for r in results)
    T = sum(r.T for r in results)
    phases = phase_totals([x for r in results for x in r.rounds])
    greedy = None if any(r.greedy_ms is None for r in results) else sum(r.greedy_ms for r in results)
    exact = [r.bit_exact for r in results]
    tails = sum(1 for r in results if r.tail_tokens)
    return RunSummary(
        policy=r0.policy, pairing=r0.pairing, drafter=r0.drafter, k=k, T=T, hist=histogram(noks, k),
        cond_hits=conditional_hits(noks, ks), ms_per_token=sum(r.spec_ms for r in results) / T,
        phase_ms_per_token={ph: v / T for ph, v in phases.items()},
        greedy_ms_per_token=None if greedy is None else greedy / T,
        bit_exact=None if None in exact else all(exact),
        first_diff=next((r.first_diff for r in results if r.bit_exact is False), None),
        model=r0.model, device=r0.device, runs=len(results), tail_tokens=sum(r.tail_tokens for r in results),
        tail_reason=(f"fewer than k={k} left at the end of {tails} run(s): the strict batch needs M == mmax, "
                     f"so the article's driver stops speculating") if tails else "",
        speedup_per_run=[r.summary().speedup for r in results],
        plain_steps=sum(len(r.rounds) - len(r.drafted) for r in results), k_chosen=_k_chosen(results))


def _k_chosen(results) -> dict | None:
    """k -> rounds over runs with k = "auto" (None when none of them chose)."""
    chosen = [r.k_chosen() for r in results]
    if all(c is None for c in chosen):
        return None
    out = {}
    for c in chosen:
        for k, n in (c or {}).items():
            out[k] = out.get(k, 0) + n
    return dict(sorted(out.items()))


def _f(x, nd=3):
    return "n/a" if x is None else f"{x:.{nd}f}"


def cond_line(cond) -> str:
    parts = [f"{c.label} {c.hit}/{c.of}={_f(c.rate)}" if c.of is not None else f"{c.label} {_f(c.rate)}"
             for c in cond]
    return "[spec] " + "; ".join(parts)


def log_lines(s: RunSummary) -> list:
    """The article's [spec] log lines for a summary."""
    lines = []
    if s.greedy_ms is not None:
        lines.append(f"[spec] A (greedy, MTP off) {s.T} tokens: {s.greedy_ms:.1f} ms "
                     f"({s.greedy_ms_per_token:.3f} ms/token)")
    sp = f" => speedup {s.speedup:.3f}x" if s.speedup is not None else ""
    k = f"auto (<= {s.k})" if s.k_chosen is not None else s.k
    lines.append(f"[spec] B (spec, k={k}, policy={s.policy}, drafter={s.drafter}) "
                 f"{s.T} tokens: {s.spec_ms:.1f} ms ({s.ms_per_token:.3f} ms/token){sp}")
    lines.append(f"[spec] rounds={s.rounds} accepted={s.accepted} mean/round={s.mean_per_round:.3f} "
                 f"=> advance/round={s.advance_per_round:.3f} (n_ok=0 rounds={s.zero_rounds})")
    lines.append(f"[spec] n_ok histogram: {format_hist(s.hist)}")
    if s.cond_hits:
        lines.append(cond_line(s.cond_hits))
    if s.k_chosen is not None:
        lines.append(f"[spec] k chosen per round (k=auto): {' '.join(f'k={k}:{c}' for k, c in s.k_chosen.items())} "
                     f"({s.plain_steps} plain step(s), no draft)")
    if s.tail_tokens:
        lines.append(f"[spec] tail: {s.tail_tokens} token(s) by plain M=1 steps ({s.tail_reason})")
    if s.bit_exact is not None:
        if s.bit_exact:
            lines.append("[spec] token stream memcmp=0 => PASS (byte-identical to greedy)")
        else:
            lines.append(f"[spec] token stream memcmp!=0 => FAIL (first difference at token {s.first_diff})")
    return lines
