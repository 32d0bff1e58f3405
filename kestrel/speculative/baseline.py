"""The greedy baseline: plain M=1 decoding of the same tokens, timed like the speculative run."""
from __future__ import annotations

from ..engine import Engine, generate
from .errors import SpecArgumentError
from .inputs import check_length, check_tokens


def check_engine(engine, model, need: int, what: str, mmax: int | None = None, batch: str | None = None):
    """SpecArgumentError unless a caller's engine fits the run (checked before anything is reset)."""
    if not isinstance(engine, Engine):
        raise SpecArgumentError(f"{what}: engine= takes a kestrel Engine, got {type(engine).__name__}")
    if engine.model is not model:
        raise SpecArgumentError(f"{what}: engine= belongs to another model")
    if engine.max_seq < need:
        raise SpecArgumentError(f"{what}: engine= has max_seq={engine.max_seq}, the run needs {need}")
    if mmax is not None and engine.mmax != mmax:
        raise SpecArgumentError(f"{what}: engine= has mmax={engine.mmax}, the run needs mmax == k == {mmax}")
    if batch is not None and engine.batch != batch:
        raise SpecArgumentError(f"{what}: engine= has batch={engine.batch!r}, the policy needs {batch!r}")


def greedy_need(model, P: int, T: int) -> int:
    """Positions a greedy run of T tokens after P prompt tokens uses (the prefill, T-1 steps, one spare)."""
    return min(P + T + 1, model.cfg.max_position_embeddings)


def greedy_timed(model, prompt, T: int, engine=None):
    """Plain greedy decoding of T tokens, timed with the backend's clock (CUDA events on GPU).
    Like the spec driver, it consumes every emitted token (T steps), so both end in the same
    state. Returns (stream, decode_ms, prefill_ms); the stream equals kestrel.generate's.
    engine: an Engine to reuse (reset first), e.g. to keep a GPU backend's captured plans
    (a GPU backend keys them on the engine's buffers)."""
    prompt = check_tokens(prompt, model, "prompt")
    T = check_length(T, model, len(prompt))
    need = greedy_need(model, len(prompt), T)
    if engine is not None:
        check_engine(engine, model, need, "greedy_timed")
        engine.reset()
        eng = engine
    else:
        eng = Engine(model, max_seq=need, mmax=1, batch="flex")
    be = model.be
    a = be.now()
    lg = eng.prefill(prompt).logits[-1]
    b = be.now()
    out = []
    for _ in range(T):
        t = int(be.argmax(lg))
        out.append(t)
        lg = eng.step(eng.cursor, t).logits
    c = be.now()
    return out, be.elapsed_ms(b, c), be.elapsed_ms(a, b)


def reference_stream(model, prompt, T: int) -> list:
    """The greedy reference (kestrel.generate)."""
    return generate(model, list(prompt), T)
