"""Shared fixtures. Every check draws fresh random inputs (seeded per test for replay)."""
import os
import zlib

import numpy as np
import pytest

import kestrel


def pytest_report_header(config):
    from kestrel.backend import cuda_available
    return f"kestrel: CUDA {'available' if cuda_available() else 'not available (GPU tests skip)'}"


@pytest.fixture
def rng(request):
    # A fresh seed per test (derived from its name and a run salt): new inputs, replayable.
    salt = int(os.environ.get("KESTREL_TEST_SALT", np.random.SeedSequence().entropy % 10**6))
    seed = zlib.crc32(request.node.nodeid.encode()) * 1_000_003 + salt
    print(f"rng seed: KESTREL_TEST_SALT={salt} -> {seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def model_a():
    return kestrel.load("test-a", device="cpu", seed=11)


@pytest.fixture(scope="session")
def model_b():
    return kestrel.load("test-b", device="cpu", seed=12)


@pytest.fixture(params=["test-a", "test-b"])
def model(request, model_a, model_b):
    return {"test-a": model_a, "test-b": model_b}[request.param]


def toc_docnames(root) -> list:
    """The book's pages from _toc.yml (root first, then every chapter and section in order),
    as docnames without extension."""
    import yaml
    from pathlib import Path
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text())
    names = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                names.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))
            for part in e.get("parts") or []:
                walk(part.get("chapters"))

    walk(toc.get("chapters"))
    for part in toc.get("parts") or []:
        walk(part.get("chapters"))
    return [str(Path(n).with_suffix("")) for n in names]


def fresh_engine(model, prompt, **kw):
    kw.setdefault("max_seq", 64)
    eng = kestrel.Engine(model, **kw)
    s = eng.prefill(prompt)
    return eng, s


def with_mtp_rows(model, prompt, q: int):
    """A fresh engine holding `prompt` and MTP rows 0..q-1 (written by one mtp_step)."""
    e, s = fresh_engine(model, prompt, mmax=3)
    if q:
        e.mtp_step(0, prompt[1:q + 1], s.hidden[:q])
    return e


def mtp_rows_both_ways(model, prompt, q: int, toks, hid, calls: int = 1) -> dict:
    """Two engines holding `prompt` and MTP rows 0..q-1; one writes rows q.. with mtp_step, the
    other with mtp_fill (each `calls` times, truncated back to q first: on a GPU the second call
    replays the captured graph). -> {"mtp_step": engine, "mtp_fill": engine}"""
    out = {}
    for entry in ("mtp_step", "mtp_fill"):
        e = with_mtp_rows(model, prompt, q)
        for _ in range(calls):
            e.mtp_truncate(q)
            assert (getattr(e, entry)(q, toks, hid) is None) == (entry == "mtp_fill")
        out[entry] = e
    return out


def draft_by_steps(eng, pos, token, hidden, k, forced=None, fill_tokens=None, fill_hidden=None) -> kestrel.Draft:
    """The draft chain as k mtp_step calls from the host, each fed the argmax of the row before
    (forced[j] instead, when given) and its hidden, after an mtp_fill of the fill rows when
    given: what Engine.mtp_draft must equal."""
    be = eng.be
    if fill_tokens is not None:
        eng.mtp_fill(pos, fill_tokens, fill_hidden)
        pos += len(fill_tokens)
    toks, rows, x, h = [], [], token, hidden
    for j in range(k):
        st = eng.mtp_step(pos + j, x, h)
        toks.append(int(be.argmax(st.logits)))
        rows.append(st.hidden)
        x, h = (toks[-1] if forced is None else int(forced[j])), st.hidden
    return kestrel.Draft(toks, be.xp.stack(rows), owner=eng)


def draft_both_ways(model, prompt, q: int, x: int, h, k: int, forced=None, calls: int = 1, fill=None):
    """Two engines holding `prompt` and MTP rows 0..q-1; one drafts k rows from (x, h) with one
    mtp_draft, the other with k mtp_step calls, each fed the argmax of the row before (forced[j]
    instead, when given) and its hidden (each `calls` times, truncated back to q first: on a GPU
    the second call replays the captured graphs). fill = (tokens [m], hidden [m, D]): rows
    written first, by mtp_draft's first pass on one side and by an mtp_fill on the other.
    -> {entry: (engine, drafts, hiddens [k, D] on the host)}"""
    out = {}
    kw = {} if fill is None else {"fill_tokens": fill[0], "fill_hidden": fill[1]}
    for entry, chain in (("mtp_draft", kestrel.Engine.mtp_draft), ("mtp_step", draft_by_steps)):
        e = with_mtp_rows(model, prompt, q)
        for _ in range(calls):
            e.mtp_truncate(q)
            d = chain(e, q, x, h, k, forced=forced, **kw)
        out[entry] = (e, d.tokens, model.be.to_numpy(d.hidden))
    return out


def verify_fed_both_ways(model, prompt, head, x: int, h, k: int, entry: str = "verify_checkpointed"):
    """Two engines holding `prompt`, each drafting k tokens with one mtp_draft from (x, h), then
    verifying head + the drafts at the cursor: one fed the DraftFeed (drafted tokens device to
    device), the other the same tokens read to the host first.
    -> [(engine, Step of the verify, verified tokens)] for (feed, list)"""
    out = []
    for fed in (True, False):
        e, _ = fresh_engine(model, prompt, mmax=len(head) + k)
        d = e.mtp_draft(0, x, h, k)
        toks = d.feed(head) if fed else list(head) + d.tokens
        s = getattr(e, entry)(e.cursor, toks)
        out.append((e, s, list(head) + d.tokens))
    return out


@pytest.fixture(scope="module")
def be():
    """The CUDA backend (GPU tests only)."""
    from kestrel.cuda import CUDABackend
    return CUDABackend()


@pytest.fixture
def poison():
    """Fill every scratch and output buffer the CUDA backend makes with NaN first, so a kernel
    that leaves an element unwritten fails its test."""
    from kestrel import nvrtc as L
    old = L.POISON
    L.POISON = True
    yield
    L.POISON = old
