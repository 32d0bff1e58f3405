"""The exercises a reader checks: every chapter's check cell starts with no answer (each my_*
is None) and checks through kestrel.lab.exercises, which hides the run's value until an answer
is given and says right or wrong against it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kestrel.lab import exercises

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("ch*.ipynb"))
ASSIGN = re.compile(r"^(my_\w+)\s*=\s*(.+?)\s*(#.*)?$", re.M)


def _check_cells(path):
    nb = json.loads(path.read_text())
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"])
            if c["cell_type"] == "code" and ASSIGN.search("".join(c["source"]))]


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_every_chapter_has_a_check_cell_that_starts_empty(path):
    cells = _check_cells(path)
    assert cells, f"{path.name}: no cell where the reader types an answer"
    for i, src in cells:
        answers = ASSIGN.findall(src)
        filled = [name for name, value, _ in answers if value != "None"]
        assert not filled, f"{path.name} cell {i}: answers filled in: {filled}"
        checked = re.findall(r"exercises\.check\([^,]+,\s*(my_\w+)", src)
        assert sorted(checked) == sorted(name for name, _, _ in answers), \
            f"{path.name} cell {i}: answers {answers} but checks of {checked}"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_a_committed_check_cell_gives_nothing_away(path):
    nb = json.loads(path.read_text())
    for i, _ in _check_cells(path):
        text = "".join(t for o in nb["cells"][i].get("outputs", []) for t in o.get("text", ""))
        assert text, f"{path.name} cell {i}: not executed"
        lines = text.strip().splitlines()
        assert all(ln.endswith(": no answer yet") for ln in lines), \
            f"{path.name} cell {i}: {lines}"


def test_check_hides_the_value_until_answered(capsys):
    exercises.check("rounds", None, 17)
    assert capsys.readouterr().out == "rounds: no answer yet\n"
    exercises.check("rounds", 17, 17)
    assert capsys.readouterr().out == "rounds: right (yours 17, this run's 17)\n"
    exercises.check("rounds", 16, 17)           # negative control: a wrong answer is wrong
    assert capsys.readouterr().out == "rounds: wrong (yours 16, this run's 17)\n"


def test_matches():
    assert exercises.verdict(45.0, 46.0, exercises.near(0.05)) == "right"
    assert exercises.verdict(40.0, 46.0, exercises.near(0.05)) == "wrong"
    assert exercises.verdict(0.70, 0.75, exercises.within(0.026)) == "wrong"
    assert exercises.verdict(0.75, 0.75, exercises.within(0.026)) == "right"
    assert exercises.verdict(True, 1.0, exercises.within(0.5)) == "wrong"     # a bool is no number
    assert exercises.verdict("0.7", 0.75, exercises.within(0.1)) == "wrong"   # nor a string
    assert exercises.verdict(0.7, None, exercises.within(0.1)) == "wrong"     # no value to reach
    assert exercises.verdict("b", ["a", "b"], exercises.one_of) == "right"
    assert exercises.verdict("c", ["a", "b"], exercises.one_of) == "wrong"
    assert exercises.verdict({0: 1}, [{0: 1}], exercises.one_of) == "right"
    with pytest.raises(ValueError, match="rel"):
        exercises.near(0)
