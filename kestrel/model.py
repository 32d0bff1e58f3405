"""A model: its config, its weights on one backend, and the programs that use them.

The layer structure lives in kestrel/program.py (one declarative program per pass); the
backend runs it (CPU: op by op through the NumPy twins; CUDA: one fused launch plan). The
functions here do no validation and own no state: the Engine does both and passes its
DeviceState (kestrel/state.py) in.
"""
from __future__ import annotations

from .config import Config
from .program import fold_program, main_program, mtp_fill_program, mtp_program


class Model:
    def __init__(self, cfg: Config, tensors: dict, backend, source: str = "", weight_dtype: str = "fp32",
                 stacks: dict | None = None):
        """stacks: stacked projection matrices that some tensors are row views of (weights drawn on
        the device straight into their stacks); the backend adopts them instead of copying."""
        self.cfg, self.be, self.source, self.weight_dtype = cfg, backend, source, weight_dtype
        self._drawn_stacks = stacks or {}
        self.w = {n: backend.put_weight(n, t, weight_dtype) for n, t in tensors.items()}
        self.head = self.w["embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
        self.main_prog = main_program(cfg)
        self.mtp_prog = mtp_program(cfg)
        self.mtp_fill_prog = mtp_fill_program(cfg)
        self.fold_prog = fold_program(cfg)
        self.tokenizer = None

    @property
    def has_mtp(self) -> bool:
        return self.mtp_prog is not None

    def forward(self, tokens, pos: int, state, gdn_mode: str = "in_place"):
        """Main model over M rows at positions pos..pos+M-1. Returns (hidden [M,D], logits [M,V]).
        gdn_mode (kestrel/program.py): in_place, checkpoint (row j's state into ring slot
        state.slot + 1 + j) or cache (the live state only read; the inputs kept in state.gdn_in)."""
        return self.be.run(self, self.main_prog, state, tokens, pos, gdn_mode=gdn_mode)

    def forward_batch(self, calls: list, room: tuple = (1, 1)) -> list:
        """Main model over several sequences' rows in one pass: calls = [(state, tokens [m_i],
        pos_i, gdn_mode_i)] -> [(hidden [m_i, D], logits [m_i, V])], each bit-identical to that
        call's forward() alone (kestrel/batch.py). room = (sequences, rows a sequence) the
        caller's passes can have: a backend that plans its passes (CUDA) plans for it."""
        return self.be.run_batch(self, self.main_prog, calls, room=room)

    def mtp_draft_batch(self, chains: list, room: tuple = (1, 1)) -> list:
        """Several sequences' draft chains at once: chains = [(state, token, hidden [1, D], pos, k,
        forced, fill)] -> [(tokens [k], hiddens [k, D])], each as mtp_draft alone (kestrel/batch.py)."""
        return self.be.mtp_chain_batch(self, self.mtp_prog, chains, room)

    def fold(self, n: int, state):
        """Run the first n rows of the last cached verify's GDN inputs into the live state, in
        place: S and hist become exactly what n plain steps would have left."""
        self.be.fold(self, self.fold_prog, state, n)

    def fold_batch(self, folds: list, room: tuple = (1, 1)):
        """fold() for several sequences at once: folds = [(n, state)], each as its fold alone
        (one batched pass on the GPU)."""
        self.be.fold_batch(self, self.fold_prog, folds, room)

    def mtp_forward(self, tokens, hidden, pos: int, state):
        """MTP head over M rows at positions pos.. of its own KV cache: (h' [M,D], logits [M,V])."""
        return self.be.run(self, self.mtp_prog, state, tokens, pos, hid=hidden)

    def mtp_fill(self, tokens, hidden, pos: int, state):
        """The MTP head's KV rows at positions pos.., as mtp_forward writes them; no output."""
        self.be.run(self, self.mtp_fill_prog, state, tokens, pos, hid=hidden)

    def mtp_draft(self, token: int, hidden, pos: int, k: int, state, forced=None, fill=None):
        """k MTP rows, each fed by the one before: row 0 reads (token, hidden [1, D]); row j+1
        reads (argmax of row j's logits, or forced[j]) and row j's h'. fill: (tokens [m], hidden
        [m, D]) rows written first, in the chain's first pass (so the rows start at pos + m).
        -> (the rows' argmax tokens [k], their h' [k, D]) as backend arrays. The CUDA backend runs
        the whole chain on the device (kestrel/cuda/backend.py: mtp_chain)."""
        return self.be.mtp_chain(self, self.mtp_prog, state, int(token), hidden, pos, k, forced, fill)

    def __repr__(self):
        c = self.cfg
        return (f"Model({c.name}: {c.num_layers} layers {len(c.gdn_layers)} GDN + {len(c.attn_layers)} attn, "
                f"H={c.hidden_size}, vocab={c.vocab_size}, mtp={c.mtp_layers}, backend={self.be.name})")
