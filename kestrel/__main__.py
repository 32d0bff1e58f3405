"""Command line: python -m kestrel <command> ...

  spec    speculative decoding over the starts, with the article's log lines per start and overall
          python -m kestrel spec --k 3 --T 64 --starts all --drafter mtp --policy checkpoint \\
                                 --model tiny --device auto --json out.json
  accept  teacher-forced MTP acceptance on the greedy streams (the article's E16)
          python -m kestrel accept --depth 4 --T 64 --starts all --pairing both --model tiny
  costs   measure unit costs and predict ms/token and speedup for a histogram or profile
          python -m kestrel costs --k 3 --hist "0:24 1:6 2:11 3:4" --model tiny

Every user error (an argument, an empty flag value, the model, the device, an output path)
prints one line `kestrel: error: ...` to stderr and exits 2 before anything runs; a run whose
stream is not bit-exact exits 1; an output that cannot be written after the run (a full disk)
is one such line too, exit 2. A closed pipe (`python -m kestrel spec | head -1`) ends the
command quietly with status 141, as a Unix tool killed by SIGPIPE does. Text the terminal
cannot encode (a path of undecodable bytes) is printed with backslash escapes.
"""
from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path

from .errors import DeviceError, KestrelError
import kestrel
from kestrel.speculative import default_starts, DRAFTERS, FEEDS, PAIRINGS, POLICIES, TAILS
from kestrel import speculative as spec


class UsageError(Exception):
    """A user error found before the run: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):             # one line instead of argparse's usage + message
        command = self.prog.replace("python -m kestrel", "").strip()
        raise UsageError(f"{command}: {message}" if command else message)


def _count(lo: int):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {lo}, got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an int >= {lo}, got {v}")
        return v
    return parse


def _k_or_auto(s: str):
    if s == "auto":
        return s
    return _count(1)(s)


def _load(args):
    model = args.model
    if model != "tiny" and model not in kestrel.PRESETS and not Path(model).is_dir():
        raise UsageError(f"--model {model!r}: not 'tiny', a preset ({', '.join(kestrel.PRESETS)}) "
                         f"or a checkpoint directory")
    try:
        return kestrel.load(model, device=args.device, dtype=args.dtype, seed=args.weights_seed)
    except DeviceError as e:
        raise UsageError(f"--device {args.device}: {e}") from None
    except (KestrelError, OSError) as e:
        raise UsageError(f"--model {model!r}: {e}") from None


def _starts(model, which: str):
    allst = default_starts(model)
    if which == "all":
        return list(enumerate(allst))
    try:
        idx = [int(x) for x in which.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--starts takes 'all' or comma-separated indices 0..{len(allst) - 1}, got {which!r}") from None
    bad = [i for i in idx if not 0 <= i < len(allst)]
    if bad or not idx:
        raise UsageError(f"--starts: indices must be in 0..{len(allst) - 1}, got {which!r}")
    return [(i, allst[i]) for i in idx]


def _check_output(path: str | None):
    """A --json path must be writable before the run starts (the run may take long): an existing
    regular file, or a new name in a writable directory; never a directory, a device (/dev/full
    accepts the open and fails the write) or a FIFO (the write would wait for a reader)."""
    if path is None:
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    try:
        limit = os.pathconf(parent if parent.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    long = [c for c in p.parts if len(os.fsencode(c)) > limit]
    if long:
        raise UsageError(f"--json {path!r:.80}: the name {long[0]!r:.40} is longer than the file system's "
                         f"{limit} bytes")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UsageError(f"--json {path!r:.80}: {e.strerror}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UsageError(f"--json {path!r:.80} is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if (
            stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) else "not a regular file"
        raise UsageError(f"--json {path!r:.80} is {kind}; give a regular file's name")
    if not parent.is_dir():
        raise UsageError(f"--json {path!r:.80}: the directory {str(parent)!r:.80} does not exist")
    if not os.access(parent, os.W_OK) or (st is not None and not os.access(p, os.W_OK)):
        raise UsageError(f"--json {path!r:.80} is not writable")


def _write_output(path: str, data: dict):
    """Write the --json file; a failure after the run (a full disk) is one line, exit 2."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=1))
    except OSError as e:
        raise UsageError(f"--json {path!r:.80}: cannot write: {e.strerror or e}") from None


def _say(text: str, stream=None):
    """print(), with what the stream's encoding lacks written as backslash escapes."""
    stream = sys.stdout if stream is None else stream
    enc = getattr(stream, "encoding", None) or "utf-8"
    stream.write(text.encode(enc, "backslashreplace").decode(enc) + "\n")


def _common(p):
    p.add_argument("--model", default="tiny", help="'tiny', a preset name (random weights), or a checkpoint directory")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="projection weights")
    p.add_argument("--weights-seed", type=_count(0), default=0, help="seed of random preset weights")
    p.add_argument("--T", type=_count(1), default=64, help="tokens to generate per start")
    p.add_argument("--starts", default="all", help="'all' or indices, e.g. 0,2,5")
    p.add_argument("--json", default=None, help="write the full results here")


def _label(lab: str) -> str:
    return repr(lab) if len(lab) <= 40 else repr(lab[:37] + "...")


def _checked(fn, what: str):
    """Run a check of kestrel's; its named error becomes a usage error."""
    try:
        return fn()
    except KestrelError as e:
        raise UsageError(f"{what}{e}") from None


# ---- spec --------------------------------------------------------------------------------------
def check_spec(args):
    """-> (model, starts, run_spec keyword arguments), every start's arguments checked."""
    _check_output(args.json)
    if args.drafter != "replay" and (args.hist is not None or args.profile is not None):
        raise UsageError("--hist/--profile drive the replay drafter: add --drafter replay")
    if args.drafter != "mtp" and args.feed != "correct":
        raise UsageError("--feed changes the mtp drafter's inputs: add --drafter mtp")
    model = _load(args)
    starts = _starts(model, args.starts)
    schedule = None
    if args.drafter == "replay":
        if sum(x is not None for x in (args.hist, args.profile)) != 1:
            raise UsageError("--drafter replay needs one of --hist '0:24 1:6 2:11 3:4' or --profile '0.714,0.364,...'")
        src = dict(hist=args.hist) if args.hist is not None else dict(profile=_checked(lambda: spec.parse_profile(args.profile),
                                                                            "--profile: "))
        schedule = _checked(lambda: spec.Schedule(**src, pairing=args.pairing, seed=args.seed),
                            "--hist: " if args.hist is not None else "--profile: ")
    kw = dict(policy=args.policy, drafter=args.drafter, schedule=schedule, tail=args.tail,
              mistakes=spec.Mistakes(feed=args.feed))
    auto = dict(k_max=args.k_max) if args.k == "auto" else {}
    for i, (lab, toks) in starts:
        _checked(lambda: spec.validate_run(model, toks, args.T, args.k, **kw, **auto), f"start {i}: ")
    if auto:                # one measurement of the unit costs serves every start
        auto["unit_costs"] = spec.measure_unit_costs(model, k_max=args.k_max)
    return model, starts, {**kw, **auto}


def cmd_spec(args) -> int:
    model, starts, kw = check_spec(args)
    results = []
    _say(f"[spec] model={model.cfg.name} ({model.source}) device={getattr(model.be, 'device_name', model.be.name)} "
          f"policy={args.policy} drafter={args.drafter} k={args.k} T={args.T}")
    for i, (lab, toks) in starts:
        ref = None if not args.no_greedy else spec.reference_stream(model, toks, args.T)
        r = spec.run_spec(model, toks, args.T, args.k, greedy=not args.no_greedy, reference=ref, **kw)
        results.append((i, lab, r))
        _say(f"== start {i}: {_label(lab)} (P={len(toks)})")
        for line in r.log_lines():
            _say(line)
        if model.tokenizer is not None:
            _say(f"[spec] text: {model.tokenizer.decode(r.stream)!r}")
    s = spec.aggregate([r for _, _, r in results])
    _say(f"== overall: {len(results)} start(s)")
    for line in s.log_lines():
        _say(line)
    if args.json:
        out = {"command": " ".join(["python -m kestrel"] + args.argv), "summary": s.to_dict(),
               "starts": [{"index": i, "label": lab, **r.to_dict()} for i, lab, r in results]}
        _write_output(args.json, out)
        _say(f"[spec] wrote {args.json}")
    return 0 if s.bit_exact in (True, None) else 1


# ---- accept ------------------------------------------------------------------------------------
def cmd_accept(args) -> int:
    _check_output(args.json)
    model = _load(args)
    starts = _starts(model, args.starts)
    pairings = tuple(spec.Pairing) if args.pairing == "both" else (spec.Pairing.parse(args.pairing),)
    for i, (lab, toks) in starts:
        _checked(lambda: spec.check_length(args.T, model, len(toks)), f"start {i}: ")
    _checked(lambda: spec.check_depth(args.depth, args.T), "--depth: ")
    out = {}
    for pairing in pairings:
        accs = []
        for i, (lab, toks) in starts:
            a = spec.teacher_forced(model, toks, T=args.T, depth=args.depth, pairing=pairing)
            accs.append(a)
            _say(f"start {i} {_label(lab)}: {a.line()}")
        tot = spec.combine(accs)
        _say(f"overall: {tot.line()}")
        adv = tot.to_dict()["advance"]
        _say("[accept] expected advance/round by k: " + ", ".join(f"k={k}: {v:.3f}" for k, v in adv.items()))
        out[pairing.value] = {"overall": tot.to_dict(), "starts": [a.to_dict() for a in accs]}
    if args.json:
        _write_output(args.json, out)
        _say(f"[accept] wrote {args.json}")
    return 0


# ---- costs -------------------------------------------------------------------------------------
def cmd_costs(args) -> int:
    _check_output(args.json)
    if args.hist is not None and args.profile is not None:
        raise UsageError("give one of --hist and --profile")
    if args.hist is not None:
        src = dict(hist=_checked(lambda: spec.parse_hist(args.hist), "--hist: "))
        _checked(lambda: spec.check_hist(src["hist"], args.k, spec.Pairing.ARTICLE), "--hist: ")
    else:
        profile = ",".join(map(str, spec.E16_PROFILE)) if args.profile is None else args.profile
        src = dict(profile=_checked(lambda: spec.parse_profile(profile),
                                    "--profile: "))
        _checked(lambda: spec.check_profile(src["profile"], args.k, spec.Pairing.TRAINED), "--profile: ")
    model = _load(args)
    _checked(lambda: spec.check_measurement(model, args.k, args.ctx, args.reps, 1), "")
    u = spec.measure_unit_costs(model, k_max=args.k, ctx=args.ctx, reps=args.reps)
    _say(f"[costs] {model.cfg.name} on {u.meta['device']}, context {args.ctx} (median of {args.reps}), ms:")
    _say(f"  step(M=1) {u.step:.3f}  draft(a draft token: MTP M=1 + argmax, in a chain) {u.draft:.3f}  mark {u.mark:.3f}  "
          f"rollback {u.rollback:.3f}  select {u.select:.3f}  argmax {u.argmax:.3f}")
    for m in sorted(u.step_m):
        _say(f"  M={m}: step_m {u.step_m[m]:.3f}  verify_checkpointed {u.ckpt[m]:.3f}  mtp_fill {u.mtp[m]:.3f}")
    preds = []
    for pol in spec.POLICIES.values():
        for pairing in spec.Pairing:
            try:
                pr = spec.predict(u, pol, pairing, args.k, **src)
            except spec.ScheduleError as e:       # e.g. a histogram with n_ok = 0 under the trained pairing
                _say(f"  {pol.name:12s} pairing={pairing.value}: n/a ({e})")
                continue
            preds.append(pr.to_dict())
            _say(f"  {pol.name:12s} pairing={pairing.value}: {pr.ms_per_token:.3f} ms/token, advance/round "
                  f"{pr.advance_per_round:.3f}, predicted speedup {pr.speedup:.3f}x")
    if args.json:
        _write_output(args.json, {"units": u.to_dict(), "predictions": preds})
    return 0


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m kestrel", description="kestrel: speculative decoding with an MTP "
                 "draft head on hybrid GDN + attention models")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    p = sub.add_parser("spec", help="speculative decoding with the article's log lines")
    _common(p)
    p.add_argument("--k", type=_k_or_auto, default=3, help="drafts per round, or 'auto': each round's k chosen "
                   "(0..--k-max, 0 a plain step) from unit costs measured first and the acceptance seen so far")
    p.add_argument("--k-max", type=_count(1), default=4, help="with --k auto: the most drafts a round takes")
    p.add_argument("--policy", default="checkpoint", choices=tuple(POLICIES))
    p.add_argument("--drafter", default="mtp", choices=DRAFTERS)
    p.add_argument("--hist", default=None, help="replay drafter: n_ok histogram, e.g. '0:24 1:6 2:11 3:4'")
    p.add_argument("--profile", default=None, help="replay drafter: per-depth acceptance, e.g. '0.714,0.364,0.5,0.75'")
    p.add_argument("--pairing", default="article", choices=PAIRINGS, help="replay drafter: MTP pairing")
    p.add_argument("--seed", type=_count(0), default=0, help="replay drafter: schedule seed")
    p.add_argument("--tail", default=None, choices=TAILS,
                   help="fewer than k tokens left: plain M=1 steps (strict default) or a short batch (flex default)")
    p.add_argument("--feed", default="correct", choices=FEEDS,
                   help="mtp drafter inputs (wrong ones on purpose: bit-exact, acceptance collapses)")
    p.add_argument("--no-greedy", action="store_true", help="skip the timed greedy baseline")
    p.set_defaults(fn=cmd_spec)
    p = sub.add_parser("accept", help="teacher-forced MTP acceptance (E16)")
    _common(p)
    p.add_argument("--depth", type=_count(1), default=4)
    p.add_argument("--pairing", default="both", choices=PAIRINGS + ("both",))
    p.set_defaults(fn=cmd_accept)
    p = sub.add_parser("costs", help="unit costs and cost-model predictions")
    _common(p)
    p.add_argument("--k", type=_count(1), default=3)
    p.add_argument("--ctx", type=_count(1), default=64)
    p.add_argument("--reps", type=_count(1), default=5)
    p.add_argument("--hist", default=None)
    p.add_argument("--profile", default=None)
    p.set_defaults(fn=cmd_costs)
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser().parse_args(argv)
        _no_empty_values(args)
        args.argv = argv
        rc = args.fn(args)
        sys.stdout.flush()                 # a closed pipe shows here, not in the interpreter's exit
        return rc
    except UsageError as e:
        _error(str(e))
        return 2
    except KestrelError as e:              # found during a run: still the user's input, still one line
        _error(f"{type(e).__name__}: {e}")
        return 1
    except BrokenPipeError:                # the reader left (| head): stop quietly, as SIGPIPE would
        _quiet_stdout()
        return 141


def _no_empty_values(args):
    """An empty value is a mistake, never "the default": refused by its own flag's name."""
    for dest, v in vars(args).items():
        if isinstance(v, str) and not v.strip():
            raise UsageError(f"--{dest.replace('_', '-')}: empty value {v!r}")


def _quiet_stdout():
    """Point stdout at /dev/null so that the interpreter's final flush into the closed pipe is silent."""
    try:
        fd = sys.stdout.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (AttributeError, OSError, ValueError):      # not a file (captured in a test): nothing to flush
        pass


def _error(msg: str):
    _say("kestrel: error: " + " ".join(msg.split()), sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
