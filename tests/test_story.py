"""The 27B decomposition (kestrel/lab/story.py) read from the committed results file."""
import pytest

from kestrel.lab import results, story


@pytest.fixture(scope="module")
def section():
    return results.load_bench("bench_spec")


@pytest.mark.parametrize("k", [2, 3, 4])
def test_decomposition_adds_up(section, k):
    """Five runs, one change each; each run's replay phase is its recomputed rows plus its plain
    steps, the plain steps are the n_ok = 0 rounds' (none under the trained pairing, whose first
    draft is free), and checkpoints recompute nothing."""
    steps = story.decomposition(section, k=k)
    assert [(s.policy, s.pairing) for s in steps] == [(p, q) for _, p, q in story.STEPS]
    for s in steps:
        assert s.plain_step_ms + s.recompute_ms == pytest.approx(s.phases.get("replay", 0.0))
        assert s.plain_step_ms >= 0 and s.recompute_ms >= -1e-9
        assert (s.zero_rounds == 0) == (s.pairing == "trained")
        if s.policy == "checkpoint":
            assert s.recompute_ms == pytest.approx(0.0, abs=1e-9)
    assert steps[-1].speedup > 1 > steps[0].speedup       # the story's two ends, as measured


def test_two_by_two_and_its_interaction(section):
    grid = story.pairing_by_undo(section, k=3)
    assert set(grid) == {(p, q) for p in ("article", "trained") for q in ("replay", "checkpoint")}
    base = grid[("article", "replay")]
    want = (grid[("trained", "checkpoint")] / base) / (
        (grid[("article", "checkpoint")] / base) * (grid[("trained", "replay")] / base))
    assert story.interaction(grid) == pytest.approx(want)
    assert len(story.rows(story.decomposition(section, k=3))[0]) == len(story.HEAD)
