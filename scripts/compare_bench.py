#!/usr/bin/env python3
"""Before/after table of two engine benchmarks measured in the same GPU session.

    python3 scripts/compare_bench.py BEFORE.json AFTER.json --label-before X --label-after Y --out results/NAME

Reads two results files written by scripts/bench_engine.py and writes NAME.json and NAME.md:
per preset, greedy ms/token, the graph-replayed step, verify_checkpointed(M)/step, the MTP
step and mark/rollback, before and after, with after/before. Nothing is re-measured here.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

ROWS = [("greedy ms/token", lambda r: r.get("greedy_ms")),
        ("graph replay step ms", lambda r: r.get("replay_ms", {}).get("step1")),
        ("eager step ms", lambda r: r.get("eager_greedy_ms")),
        ("verify_ckpt(4)/step", lambda r: r.get("verify_ckpt_over_step", {}).get("4")),
        ("step_m(4)/step", lambda r: r.get("step_m_over_step", {}).get("4")),
        ("MTP step ms", lambda r: r.get("mtp_step_ms")),
        ("mark ms", lambda r: r.get("mark", {}).get("ms")),
        ("rollback ms", lambda r: r.get("mark", {}).get("rollback_ms"))]


def _recorded(argv: list) -> list:
    """The command as recorded: input and output files by their names alone."""
    return [Path(x).name if ("/" in x and not x.startswith("-")) else x for x in argv]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--label-before", default="before")
    ap.add_argument("--label-after", default="after")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    B, A = (json.loads(Path(p).read_text()) for p in (a.before, a.after))
    bp = {r["preset"]: r for r in B["presets"] if "error" not in r}
    out = {"device": A["device"], "date_before": B["date"], "date_after": A["date"],
           "command": "python3 scripts/compare_bench.py " + " ".join(shlex.quote(x) for x in _recorded(argv or sys.argv[1:])),
           "labels": [a.label_before, a.label_after], "presets": {}}
    L = ["# Engine benchmark before and after", "",
         f"Device: **{A['device']}**; {a.label_before} measured {B['date']}, {a.label_after} measured {A['date']}, "
         f"one session, the same machine; each column by `scripts/bench_engine.py` (medians of CUDA-event timings). "
         f"Written by `{out['command']}`.", "",
         "| preset | quantity | " + a.label_before + " | " + a.label_after + " | after/before |", "|---|---|---|---|---|"]
    for r in A["presets"]:
        if "error" in r or r["preset"] not in bp:
            continue
        b = bp[r["preset"]]
        rows = {}
        for label, get in ROWS:
            x, y = get(b), get(r)
            if x is None or y is None:
                continue
            rows[label] = {"before": x, "after": y, "ratio": y / x if x else None}
            L.append(f"| {r['preset']} | {label} | {x:.4f} | {y:.4f} | {y / x:.3f} |")
        out["presets"][r["preset"]] = rows
    Path(a.out + ".json").write_text(json.dumps(out, indent=1))
    Path(a.out + ".md").write_text("\n".join(L) + "\n")
    print("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
