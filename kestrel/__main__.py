"""Command line: python -m kestrel <command> ...

  spec    speculative decoding over the starts, with the seed's log lines per start and overall
          python -m kestrel spec --k 3 --T 64 --starts all --drafter mtp --policy checkpoint \\
                                 --model tiny --device auto --json out.json
  accept  teacher-forced MTP acceptance on the greedy streams (the seed's E16)
          python -m kestrel accept --depth 4 --T 64 --starts all --pairing both --model tiny
  costs   measure unit costs and predict ms/token and speedup for a histogram or profile
          python -m kestrel costs --k 3 --hist "0:24 1:6 2:11 3:4" --model tiny
"""
from __future__ import annotations

import argparse
import json
import sys


def _load(args):
    import kestrel
    return kestrel.load(args.model, device=args.device, dtype=args.dtype, seed=args.weights_seed)


def _starts(model, which: str):
    from kestrel.spec import default_starts
    allst = default_starts(model)
    if which == "all":
        return list(enumerate(allst))
    try:
        idx = [int(x) for x in which.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--starts takes 'all' or comma-separated indices 0..{len(allst) - 1}, got {which!r}")
    bad = [i for i in idx if not 0 <= i < len(allst)]
    if bad or not idx:
        raise SystemExit(f"--starts: indices must be in 0..{len(allst) - 1}, got {which!r}")
    return [(i, allst[i]) for i in idx]


def _common(p):
    p.add_argument("--model", default="tiny", help="'tiny', a preset name (random weights), or a checkpoint directory")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="projection weights")
    p.add_argument("--weights-seed", type=int, default=0, help="seed of random preset weights")
    p.add_argument("--T", type=int, default=64, help="tokens to generate per start")
    p.add_argument("--starts", default="all", help="'all' or indices, e.g. 0,2,5")
    p.add_argument("--json", default=None, help="write the full results here")


def _label(lab: str) -> str:
    return repr(lab) if len(lab) <= 40 else repr(lab[:37] + "...")


def cmd_spec(args) -> int:
    from kestrel import spec
    model = _load(args)
    starts = _starts(model, args.starts)
    kw = {}
    if args.drafter == "replay":
        if sum(x is not None for x in (args.hist, args.profile)) != 1:
            raise SystemExit("--drafter replay needs one of --hist '0:24 1:6 2:11 3:4' or --profile '0.714,0.364,...'")
        kw = dict(hist=args.hist, profile=spec.parse_profile(args.profile) if args.profile else None,
                  pairing=args.pairing, seed=args.seed)
    results = []
    print(f"[spec] model={model.cfg.name} ({model.source}) device={getattr(model.be, 'device_name', model.be.name)} "
          f"policy={args.policy} drafter={args.drafter} k={args.k} T={args.T}")
    for i, (lab, toks) in starts:
        r = spec.run_spec(model, toks, args.T, args.k, args.policy, args.drafter, tail=args.tail, feed=args.feed,
                          greedy=not args.no_greedy,
                          reference=None if not args.no_greedy else spec.reference_stream(model, toks, args.T), **kw)
        results.append((i, lab, r))
        print(f"== start {i}: {_label(lab)} (P={len(toks)})")
        for line in r.log_lines():
            print(line)
        if model.tokenizer is not None:
            print(f"[spec] text: {model.tokenizer.decode(r.stream)!r}")
    s = spec.aggregate([r for _, _, r in results])
    print(f"== overall: {len(results)} start(s)")
    for line in spec.log_lines(s):
        print(line)
    if args.json:
        out = {"command": " ".join(["python -m kestrel"] + sys.argv[1:]), "summary": s,
               "starts": [{"index": i, "label": lab, **r.to_dict()} for i, lab, r in results]}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(f"[spec] wrote {args.json}")
    return 0 if s.get("bit_exact") in (True, None) else 1


def cmd_accept(args) -> int:
    from kestrel import spec
    model = _load(args)
    starts = _starts(model, args.starts)
    pairings = ("mtp", "seed") if args.pairing == "both" else (args.pairing,)
    out = {}
    for pairing in pairings:
        accs = []
        for i, (lab, toks) in starts:
            a = spec.teacher_forced(model, toks, T=args.T, depth=args.depth, pairing=pairing)
            accs.append(a)
            print(f"start {i} {_label(lab)}: {a.line()}")
        tot = spec.combine(accs)
        print(f"overall: {tot.line()}")
        adv = tot.to_dict()["advance"]
        print("[accept] expected advance/round by k: " + ", ".join(f"k={k}: {v:.3f}" for k, v in adv.items()))
        out[pairing] = {"overall": tot.to_dict(), "starts": [a.to_dict() for a in accs]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"[accept] wrote {args.json}")
    return 0


def cmd_costs(args) -> int:
    from kestrel import spec
    model = _load(args)
    u = spec.measure_unit_costs(model, k_max=max(args.k, 1), ctx=args.ctx, reps=args.reps)
    print(f"[costs] {model.cfg.name} on {u.meta['device']}, context {args.ctx} (median of {args.reps}), ms:")
    print(f"  step(M=1) {u.step:.3f}  draft(MTP M=1 + argmax) {u.draft:.3f}  mark {u.mark:.3f}  "
          f"rollback {u.rollback:.3f}  select {u.select:.3f}  argmax {u.argmax:.3f}")
    for m in sorted(u.step_m):
        print(f"  M={m}: step_m {u.step_m[m]:.3f}  verify_checkpointed {u.ckpt[m]:.3f}  mtp batch {u.mtp[m]:.3f}")
    src = dict(hist=args.hist) if args.hist else dict(profile=spec.parse_profile(args.profile or "0.714,0.364,0.5,0.75"))
    preds = []
    for pol in spec.POLICIES:
        for pairing in ("seed", "mtp"):
            try:
                pr = spec.predict(u, pol, pairing, args.k, **src)
            except Exception as e:          # e.g. a histogram with n_ok = 0 under pairing mtp
                print(f"  {pol:12s} pairing={pairing}: n/a ({e})")
                continue
            preds.append(pr)
            print(f"  {pol:12s} pairing={pairing}: {pr['ms_per_token']:.3f} ms/token, advance/round "
                  f"{pr['advance_per_round']:.3f}, predicted speedup {pr['speedup']:.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"units": u.to_dict(), "predictions": preds}, f, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kestrel", description="kestrel: speculative decoding with an MTP "
                                 "draft head on hybrid GDN + attention models")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("spec", help="speculative decoding with the seed's log lines")
    _common(p)
    p.add_argument("--k", type=int, default=3, help="drafts per round")
    p.add_argument("--policy", default="checkpoint", choices=("replay", "flex-replay", "checkpoint"))
    p.add_argument("--drafter", default="mtp", choices=("mtp-seed", "mtp", "replay"))
    p.add_argument("--hist", default=None, help="replay drafter: n_ok histogram, e.g. '0:24 1:6 2:11 3:4'")
    p.add_argument("--profile", default=None, help="replay drafter: per-depth acceptance, e.g. '0.714,0.364,0.5,0.75'")
    p.add_argument("--pairing", default="seed", choices=("seed", "mtp"), help="replay drafter: MTP pairing")
    p.add_argument("--seed", type=int, default=0, help="replay drafter: schedule seed")
    p.add_argument("--tail", default=None, choices=("plain", "shrink"),
                   help="fewer than k tokens left: plain M=1 steps (strict default) or a short batch (flex default)")
    p.add_argument("--feed", default="correct", choices=("correct", "seed-pairing", "stale-hidden"),
                   help="mtp drafter inputs (wrong ones on purpose: bit-exact, acceptance collapses)")
    p.add_argument("--no-greedy", action="store_true", help="skip the timed greedy baseline")
    p.set_defaults(fn=cmd_spec)
    p = sub.add_parser("accept", help="teacher-forced MTP acceptance (E16)")
    _common(p)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--pairing", default="both", choices=("mtp", "seed", "both"))
    p.set_defaults(fn=cmd_accept)
    p = sub.add_parser("costs", help="unit costs and cost-model predictions")
    _common(p)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--hist", default=None)
    p.add_argument("--profile", default=None)
    p.set_defaults(fn=cmd_costs)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except FileNotFoundError as e:
        print(f"kestrel: {e} (random presets work meanwhile: --model test-a)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
