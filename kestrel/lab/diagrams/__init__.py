"""Diagrams of the mechanism, drawn by code: one speculative round as a timeline per policy, the
GDN state ring with the slots a verify writes and the one a round keeps, and the KV cursors
beside the MTP head's own slot. Each function returns a plotly figure; show it with
``kestrel.lab.plots.show`` (offline, like every figure of the book)::

    from kestrel.lab import diagrams
    from kestrel.lab.plots import show
    show(diagrams.round_timeline("replay", k=3, n_ok=1))          # schematic lengths
    show(diagrams.round_timelines(k=3, n_ok=2, unit_costs=u))     # lengths from measured UnitCosts
    show(diagrams.state_ring(nslots=4, live=0, k=3, n_ok=1))      # slot live+1+j per row, keep live+n_ok
    show(diagrams.state_ring(k=3, n_ok=1, policy="input-cache", cfg=model.cfg))   # bytes to scale
    show(diagrams.cursors(pos=12, k=3, n_ok=1))                   # cursor lands on pos+max(n_ok, 1)

The numbers drawn are the engine's own rules (kestrel/engine.py, kestrel/speculative/): a checkpointed
verify writes row j's state into slot (live + 1 + j) mod nslots and accepting n_ok makes slot
(live + n_ok) mod nslots live; a verify at the cursor pos appends rows pos..pos+k-1 and the round
leaves the cursor at pos + max(n_ok, 1) (n_ok = 0 still consumes a_p); the MTP cursor starts the
round at p = pos - 1 and ends it at p + max(n_ok, 1). tests/test_diagrams.py checks each against
a running engine. The lengths of a timeline are the cost model's (spec.round_cost) for the unit
costs given, or a schematic set of costs that says so on the figure.
"""
from .common import K_MAX, POLICY_NAMES, DiagramError, legend_below
from .cursors import cursors
from .ring import state_ring
from .timeline import round_timeline, round_timelines

__all__ = ["round_timeline", "round_timelines", "state_ring", "cursors", "DiagramError", "POLICY_NAMES", "K_MAX",
           "legend_below"]
