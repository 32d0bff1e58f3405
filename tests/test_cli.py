"""python -m kestrel, run in-process: every user error is one line `kestrel: error: ...` on stderr and
a non-zero exit (2: nothing ran), never a traceback; outputs are checked before the run starts."""
from __future__ import annotations

import functools
import json
import os

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import kestrel
from kestrel import speculative as spec
from kestrel.__main__ import main

TINY = os.path.join(os.path.dirname(kestrel.__file__), "assets", "tiny")


def run(argv, capsys):
    """(exit status, stdout, stderr lines) of main(argv)."""
    try:
        rc = main(argv)
    except SystemExit as e:           # --help
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err.splitlines()


def assert_usage_error(argv, capsys, *needles):
    rc, out, err = run(argv, capsys)
    assert rc == 2, (rc, out, err)
    assert len(err) == 1 and err[0].startswith("kestrel: error: "), err
    assert "Traceback" not in out + "".join(err)
    assert out == "", "nothing may run before the arguments are checked"
    for n in needles:
        assert n in err[0], (n, err[0])
    return err[0]


TINY_RUN = ["spec", "--model", "tiny", "--device", "cpu", "--starts", "0"]


# ---- one regression test per bad argument ---------------------------------------------------------
def test_k_zero(capsys):
    assert_usage_error(TINY_RUN + ["--k", "0"], capsys, "--k", ">= 1")


def test_T_zero(capsys):
    assert_usage_error(TINY_RUN + ["--T", "0"], capsys, "--T", ">= 1")


def test_T_beyond_the_model(capsys):
    assert_usage_error(TINY_RUN + ["--T", "100000"], capsys, "max_position_embeddings")


def test_hist_not_a_histogram(capsys):
    assert_usage_error(TINY_RUN + ["--drafter", "replay", "--hist", "a:b"], capsys, "--hist", "'a:b'")


def test_hist_beyond_k(capsys):
    assert_usage_error(TINY_RUN + ["--drafter", "replay", "--hist", "5:10", "--k", "3"], capsys, "n_ok=5 > k=3")


def test_hist_without_the_replay_drafter(capsys):
    assert_usage_error(TINY_RUN + ["--hist", "0:3"], capsys, "--drafter replay")


def test_profile_not_numbers(capsys):
    assert_usage_error(TINY_RUN + ["--drafter", "replay", "--profile", "abc"], capsys, "--profile", "'abc'")


def test_model_missing(capsys, tmp_path):
    assert_usage_error(TINY_RUN + ["--model", str(tmp_path / "nowhere")], capsys, "--model", "nowhere")


def test_model_corrupt_config(capsys, tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_next", ')
    assert_usage_error(TINY_RUN + ["--model", str(tmp_path)], capsys, "--model", "config.json")


def test_model_corrupt_weights(capsys, tmp_path):
    (tmp_path / "config.json").write_text(open(os.path.join(TINY, "config.json")).read())
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    assert_usage_error(TINY_RUN + ["--model", str(tmp_path)], capsys, "--model", "model.safetensors")


def test_model_directory_without_files(capsys, tmp_path):
    assert_usage_error(TINY_RUN + ["--model", str(tmp_path)], capsys, "--model")


def test_device_cuda_without_a_gpu(capsys):
    from kestrel.backend import cuda_available
    if cuda_available():
        pytest.skip("a GPU is present")
    assert_usage_error(TINY_RUN + ["--device", "cuda"], capsys, "--device cuda")


def test_accept_depth_zero(capsys):
    assert_usage_error(["accept", "--depth", "0", "--device", "cpu"], capsys, "--depth")


def test_costs_k_zero(capsys):
    assert_usage_error(["costs", "--k", "0", "--device", "cpu"], capsys, "--k")


def test_costs_reps_zero(capsys):
    assert_usage_error(["costs", "--reps", "0", "--device", "cpu"], capsys, "--reps")


def test_costs_hist_beyond_k(capsys):
    assert_usage_error(["costs", "--hist", "5:10", "--k", "3", "--device", "cpu"], capsys, "n_ok=5 > k=3")


def test_costs_profile_too_short(capsys):
    assert_usage_error(["costs", "--profile", "0.5", "--k", "3", "--device", "cpu"], capsys, "depth")


def test_starts_out_of_range(capsys):
    assert_usage_error(TINY_RUN[:-1] + ["--starts", "9"], capsys, "--starts")


def test_unknown_names(capsys):
    assert_usage_error(TINY_RUN + ["--policy", "fast"], capsys, "--policy", "checkpoint")
    assert_usage_error(TINY_RUN + ["--drafter", "mtp-seed"], capsys, "--drafter", "mtp-article")
    assert_usage_error([], capsys, "required")
    assert_usage_error(["spec", "--bogus"], capsys, "--bogus")


def test_json_in_a_missing_directory_fails_at_once(capsys, tmp_path):
    # the whole run would take long: the output path is checked before it starts (stdout stays empty)
    assert_usage_error(TINY_RUN + ["--json", str(tmp_path / "no" / "out.json")], capsys, "--json", "does not exist")
    assert_usage_error(["accept", "--device", "cpu", "--json", str(tmp_path / "no" / "a.json")], capsys, "--json")
    assert_usage_error(["costs", "--device", "cpu", "--json", str(tmp_path / "no" / "c.json")], capsys, "--json")


def test_json_not_writable_fails_at_once(capsys, tmp_path):
    assert_usage_error(TINY_RUN + ["--json", str(tmp_path)], capsys, "is a directory")
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_usage_error(TINY_RUN + ["--json", str(blocker / "out.json")], capsys, "--json")
    if os.geteuid() != 0:                       # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        assert_usage_error(TINY_RUN + ["--json", str(ro / "out.json")], capsys, "not writable")


def test_a_good_run_still_runs(capsys, tmp_path):
    out = tmp_path / "out.json"
    rc, text, err = run(TINY_RUN + ["--k", "3", "--T", "12", "--drafter", "mtp", "--policy", "checkpoint",
                                "--json", str(out)], capsys)
    assert rc == 0 and err == [] and "memcmp=0 => PASS" in text
    d = json.loads(out.read_text())
    assert spec.RunSummary.from_dict(d["summary"]).policy is spec.CHECKPOINT


def test_genuine_bugs_still_show_a_traceback(monkeypatch, capsys):
    """Only kestrel's own errors are reported in one line; anything else is a bug and propagates."""
    def broken(*a, **kw):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(spec, "run_spec", broken)
    with pytest.raises(ZeroDivisionError):
        main(TINY_RUN + ["--T", "4"])


# ---- any argument string ------------------------------------------------------------------------------
class Ran(Exception):
    """The arguments passed every check and the run would start."""


COMMON = ["--model", "--device", "--dtype", "--weights-seed", "--T", "--starts", "--json"]
FLAGS = {"spec": COMMON + ["--k", "--policy", "--drafter", "--hist", "--profile", "--pairing", "--seed", "--tail",
                           "--feed", "--no-greedy"],
         "accept": COMMON + ["--depth", "--pairing"],
         "costs": COMMON + ["--k", "--ctx", "--reps", "--hist", "--profile"]}
VALUES = ["0", "1", "2", "3", "5", "-1", "2.5", "1e9", "99999999999999999999", "a:b", "5:10", "0:24 1:6 2:11 3:4",
          "1:3", "0:3 0:2", "abc", "0.5,0.5", "0.7,0.4,0.5,0.75", "nan", "tiny", "test-a", "/nonexistent", "cpu",
          "cuda", "auto", "all", "0,1", "9", "replay", "flex-replay", "checkpoint", "mtp", "mtp-article", "article",
          "trained", "both", "fp32", "bf16", "plain", "shrink", "correct", "stale-hidden", "", "/", "out.json"]
PLAUSIBLE = {"--model": ["tiny", "test-a"], "--device": ["cpu", "auto"], "--dtype": ["fp32"], "--weights-seed": ["0"],
             "--T": ["4", "16", "3000"], "--starts": ["0", "all", "0,5"], "--json": ["out.json", "/nonexistent/x.json", "."],
             "--k": ["1", "3", "4"], "--policy": ["replay", "flex-replay", "checkpoint"],
             "--drafter": ["mtp-article", "mtp", "replay"], "--hist": ["0:24 1:6 2:11 3:4", "1:3", "5:10", "0:3 0:2"],
             "--profile": ["0.7,0.4,0.5,0.75", "0.5", "1.5,0.5"], "--pairing": ["article", "trained", "both"],
             "--seed": ["0", "7"], "--tail": ["plain", "shrink"], "--feed": ["correct", "stale-hidden"],
             "--depth": ["1", "4", "5000"], "--ctx": ["2", "16", "600"], "--reps": ["1", "3", "200"]}
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6).filter(
    lambda s: s not in ("-h", "--help") and not s.startswith("--h"))


@st.composite
def argvs(draw):
    """A command, then flags of that command (mostly) with values from a pool of good and bad ones."""
    cmd = draw(st.sampled_from(list(FLAGS) + ["nonsense"]))
    flags = FLAGS.get(cmd, COMMON)
    argv = [cmd]
    for _ in range(draw(st.integers(0, 5))):
        flag = draw(st.sampled_from(flags + ["--bogus"]))
        argv.append(flag)
        if flag != "--no-greedy":
            pick = draw(st.integers(0, 9))           # mostly plausible values, so that the later checks are reached
            argv.append(draw(st.sampled_from(PLAUSIBLE.get(flag, VALUES))) if pick < 6 else
                        draw(st.sampled_from(VALUES)) if pick < 9 else draw(TEXT))
    if draw(st.integers(0, 9)) == 0:
        argv.append(draw(TEXT))
    return argv


@pytest.fixture
def checks_only(monkeypatch, tmp_path):
    """Every check runs for real; the runs themselves (and model loads, cached) are stand-ins."""
    monkeypatch.setattr(kestrel, "load", functools.lru_cache(maxsize=None)(kestrel.load))

    def ran(*a, **kw):
        raise Ran
    for name in ("run_spec", "reference_stream", "teacher_forced", "measure_unit_costs"):
        monkeypatch.setattr(spec, name, ran)
    monkeypatch.chdir(tmp_path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=argvs())
def test_any_arguments_fail_in_one_line(checks_only, capsys, argv):
    try:
        rc, out, err = run(argv, capsys)
    except Ran:
        event("passed every check")
        assert capsys.readouterr().err == ""
        return
    event(f"exit {rc}" + (" (argparse)" if any(w in "".join(err) for w in ("argument", "unrecognized")) else ""))
    if rc != 0:
        assert rc == 2, (argv, rc, err)
        assert len(err) == 1 and err[0].startswith("kestrel: error: "), (argv, err)
        assert "Traceback" not in out


# ---- outputs, pipes, empty values and sizes ------------------------------------------------------
@pytest.mark.parametrize("target", ["/dev/full", "/dev/null", "fifo"])
def test_json_to_a_device_or_fifo_fails_at_once(capsys, tmp_path, target):
    """/dev/full accepts the open and fails the write after the run; a FIFO's open waits for a reader."""
    if target == "fifo":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    elif not os.path.exists(target):
        pytest.skip(f"{target} does not exist here")
    for cmd in (TINY_RUN, ["accept", "--device", "cpu"], ["costs", "--device", "cpu"]):
        assert_usage_error(cmd + ["--json", target], capsys, "--json", "FIFO" if "fifo" in target else "device")


def test_json_name_too_long_fails_at_once(capsys, tmp_path):
    assert_usage_error(TINY_RUN + ["--json", str(tmp_path / ("x" * 300 + ".json"))], capsys, "--json", "longer")


def test_json_write_failing_after_the_run_is_one_line(capsys, tmp_path, monkeypatch):
    """The directory vanishes while the run goes on: the write fails in one line, exit 2."""
    d = tmp_path / "d"
    d.mkdir()
    aggregate = spec.aggregate

    def vanish(results):
        d.rmdir()
        return aggregate(results)
    monkeypatch.setattr(spec, "aggregate", vanish)
    rc, out, err = run(TINY_RUN + ["--T", "4", "--no-greedy", "--json", str(d / "out.json")], capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith("kestrel: error: --json") and "cannot write" in err[0]


@pytest.mark.parametrize("argv,flag", [
    (["costs", "--hist", ""], "--hist"), (["costs", "--profile", " "], "--profile"),
    (TINY_RUN + ["--drafter", "replay", "--hist", ""], "--hist"), (TINY_RUN + ["--drafter", "replay", "--profile", ""],
                                                                    "--profile"),
    (["spec", "--starts", ""], "--starts"), (["accept", "--model", ""], "--model"), (TINY_RUN + ["--json", ""], "--json"),
])
def test_empty_values_are_refused_by_their_flag(capsys, argv, flag):
    """An empty value never means "the default", and the message names the flag that got it."""
    line = assert_usage_error(argv + ["--device", "cpu"], capsys, flag, "empty")
    assert line.startswith(f"kestrel: error: {flag}:"), line


@pytest.mark.parametrize("argv,needle", [
    (["costs", "--hist", "0:2000000000"], "1048576"),
    (["costs", "--hist", "0:" + "9" * 5000], "--hist"),
    (TINY_RUN + ["--drafter", "replay", "--hist", "3:2000000000"], "1048576"),
    (["accept", "--depth", "100000000"], "--depth"),
    (["accept", "--depth", "30000", "--T", "8"], "--depth"),
])
def test_small_strings_asking_for_huge_work_are_refused(capsys, argv, needle):
    assert_usage_error(argv + ["--device", "cpu"], capsys, needle)


def test_undecodable_model_path_is_one_line(capsys):
    line = assert_usage_error(TINY_RUN + ["--model", "/nonexistent/\udcff\udcfe"], capsys, "--model")
    assert "\\udcff" in line


def _kestrel(argv, **kw):
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(kestrel.__file__)))
    env = dict(os.environ, PYTHONPATH=repo, **kw.pop("env", {}))
    return subprocess.Popen([sys.executable, "-m", "kestrel"] + argv, cwd=repo, env=env, stderr=subprocess.PIPE, **kw)


def test_broken_pipe_exits_quietly():
    """`python -m kestrel spec | head -1`: the reader is gone; no traceback, status 141 as SIGPIPE gives."""
    import subprocess
    p = _kestrel(TINY_RUN + ["--T", "4", "--no-greedy"], stdout=subprocess.PIPE)
    p.stdout.close()                 # the reader leaves before the first line
    err = p.stderr.read().decode()
    assert p.wait() == 141 and err == "", err


def test_undecodable_checkpoint_directory_on_an_ascii_terminal(tmp_path):
    """A directory whose name is not UTF-8, printed to a terminal that only speaks ASCII: escapes, no traceback."""
    import shutil
    import subprocess
    d = os.path.join(os.fsencode(tmp_path), b"m\xff\xc3\xa9")
    shutil.copytree(os.fsencode(TINY), d)
    p = _kestrel(["spec", "--model", os.fsdecode(d), "--device", "cpu", "--starts", "0", "--T", "4", "--no-greedy"],
                 stdout=subprocess.PIPE, env={"LC_ALL": "C", "PYTHONIOENCODING": "ascii"})
    out, err = p.communicate()
    assert p.returncode == 0 and err == b"", err
    assert b"m\\udcff" in out.splitlines()[0] and b"Traceback" not in out
