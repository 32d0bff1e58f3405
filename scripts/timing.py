"""Timing a fixed sequence of launches on a GPU: captured once as a CUDA graph, the graph replayed
and each replay timed with CUDA events (shared by the benchmark scripts and dev/)."""
import statistics


def med(xs):
    return float(statistics.median(xs)) if xs else float("nan")


def time_cupy_graph(cp, stream, issue, per_graph: int, reps: int) -> dict:
    """issue() enqueues per_graph launches on the current stream: warm-up, capture, replay."""
    with stream:
        issue()
    stream.synchronize()
    with stream:
        stream.begin_capture()
        try:
            issue()
        finally:
            g = stream.end_capture()
    for _ in range(2):
        g.launch(stream)
    stream.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        g.launch(stream)
        e1.record(stream)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / per_graph)
    return {"us": med(ts), "us_min": min(ts), "us_max": max(ts)}
