"""The README's package section runs as written.

Its ```python blocks are run in order, in one namespace, on this machine (the CPU where there
is no GPU); a line whose comment says `# GPU only` is left out. The sample of the CLI's output
is compared, line by line with every number masked, with what the same command prints now.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GPU_ONLY = "# GPU only"


def _blocks(lang: str) -> list:
    return re.findall(rf"^```{lang}\n(.*?)^```$", README, re.M | re.S)


def _cpu_lines(block: str) -> str:
    return "\n".join(ln for ln in block.splitlines() if GPU_ONLY not in ln)


def test_readme_python_blocks_run_on_the_cpu(capsys):
    blocks = _blocks("python")
    assert len(blocks) >= 2, "the README's package section has lost its python blocks"
    assert any(GPU_ONLY in b for b in blocks), "the size sweep over the 27B shape is marked GPU only"
    ns: dict = {"__name__": "readme"}
    for i, block in enumerate(blocks):
        exec(compile(_cpu_lines(block), f"README.md python block {i + 1}", "exec"), ns)
    out = capsys.readouterr().out
    assert "memcmp=0 => PASS" in out, out[-2000:]
    assert ns["r"].bit_exact and len(ns["out"]) == 64


def _shape(line: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", line.strip())


def test_readme_cli_sample_matches_the_cli():
    cmd = "python -m kestrel spec --k 3 --T 32 --starts 0 --drafter mtp --policy checkpoint"
    assert f"`{cmd}`" in README
    samples = [b for b in _blocks("text") if "[spec]" in b]
    assert len(samples) == 1, "the README shows one sample of the spec command's output"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, *cmd.split()[1:]], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = {_shape(ln) for ln in proc.stdout.splitlines()}
    stale = [ln for ln in samples[0].splitlines() if ln.strip() and _shape(ln) not in printed]
    assert not stale, "README sample lines the command no longer prints:\n" + "\n".join(stale)
