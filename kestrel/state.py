"""The device state of one sequence: what the engine owns and passes to a backend.

    S       [nslots, n_gdn, nv, dk, dv]  fp32  GDN recurrent state, a ring of slots
    hist    [nslots, n_gdn, C, K-1]      fp32  GDN conv window (the last K-1 inputs), same ring
    kc, vc  [n_attn, max_seq, nkv, hd]   fp32  attention KV cache (rows past the cursor unused)
    mtp_kc, mtp_vc [max_seq, nkv, hd]          the MTP head's own KV cache (None without MTP)
    gdn_in  [n_gdn, mmax, C + nv*dv + 2nv]     a cached verify's GDN inputs (the in-projection's
                                               rows [qkv | z | b | a]), folded in by fold()
    S_snap, hist_snap                          mark()'s one-shot copy of the live slot
    slot                                       the live GDN slot

A plain call updates the live slot in place. A checkpointed verify writes row j's state into
slot (slot + 1 + j) mod nslots and leaves the live slot as it was; accepting n rows moves
`slot`. Backends read and write these buffers and `slot`, nothing else of the engine: cursors,
validation and the snapshot's bookkeeping stay in kestrel/engine.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import Config
from .memory import ensure_fits


@dataclass
class DeviceState:
    S: object
    hist: object
    kc: object
    vc: object
    S_snap: object
    hist_snap: object
    mtp_kc: object = None
    mtp_vc: object = None
    gdn_in: object = None
    max_seq: int = 0
    slot: int = 0

    @classmethod
    def allocate(cls, cfg: Config, be, max_seq: int, nslots: int, mtp: bool) -> "DeviceState":
        n_gdn, n_attn = len(cfg.gdn_layers), len(cfg.attn_layers)
        nv, dk, dv = cfg.lin_num_value_heads, cfg.lin_key_head_dim, cfg.lin_value_head_dim
        kv = (max_seq, cfg.num_kv_heads, cfg.head_dim)
        ensure_fits(cls.bytes_needed(cfg, max_seq, nslots, mtp), f"an engine of {cfg.name} with max_seq={max_seq}, "
                    f"{nslots} GDN slots", be.name)
        st = cls(S=be.zeros((nslots, n_gdn, nv, dk, dv)), hist=be.zeros((nslots, n_gdn, cfg.conv_dim, cfg.conv_kernel - 1)),
                 kc=be.zeros((n_attn,) + kv), vc=be.zeros((n_attn,) + kv),
                 S_snap=be.zeros((n_gdn, nv, dk, dv)), hist_snap=be.zeros((n_gdn, cfg.conv_dim, cfg.conv_kernel - 1)),
                 max_seq=max_seq)
        width = cfg.gdn_in_width
        st.gdn_in = be.zeros((n_gdn, nslots - 1, width)) if n_gdn else be.zeros((0, 1, 1))
        if mtp:
            st.mtp_kc, st.mtp_vc = be.zeros(kv), be.zeros(kv)
        return st

    @staticmethod
    def bytes_needed(cfg: Config, max_seq: int, nslots: int, mtp: bool) -> int:
        """fp32 bytes of every buffer allocate() makes."""
        n_gdn, n_attn = len(cfg.gdn_layers), len(cfg.attn_layers)
        gdn = n_gdn * (cfg.lin_num_value_heads * cfg.lin_key_head_dim * cfg.lin_value_head_dim
                       + cfg.conv_dim * (cfg.conv_kernel - 1))
        kv_rows = (2 * n_attn + (2 if mtp else 0)) * max_seq * cfg.num_kv_heads * cfg.head_dim
        gdn_in = n_gdn * (nslots - 1) * cfg.gdn_in_width if n_gdn else 1
        return 4 * ((nslots + 1) * gdn + kv_rows + gdn_in)

    @property
    def nslots(self) -> int:
        return int(self.S.shape[0])

    def buffers(self) -> dict:
        d = {"S": self.S, "hist": self.hist, "kc": self.kc, "vc": self.vc, "S_snap": self.S_snap,
             "hist_snap": self.hist_snap, "gdn_in": self.gdn_in}
        if self.mtp_kc is not None:
            d["mtp_kc"], d["mtp_vc"] = self.mtp_kc, self.mtp_vc
        return d

    def zero(self):
        for a in self.buffers().values():
            a[...] = 0
        self.slot = 0

    def kv(self, ref: tuple):
        """(kc, vc) of an attention op's state reference."""
        kind, i = ref
        return (self.mtp_kc, self.mtp_vc) if kind == "mtp_kv" else (self.kc[i], self.vc[i])

    def gdn_slots(self, g: int, m: int, mode: str):
        """(S live, hist live, S targets, hist targets) of GDN layer g for an M-row call in
        `mode` (kestrel/program.py GDN_MODES): targets None = update in place; "cache" = private
        copies of the live slot, dropped after the call; "checkpoint" = one slot per row."""
        s, n = self.slot, self.nslots
        if mode == "in_place":
            return self.S[s, g], self.hist[s, g], None, None
        if mode == "cache":
            return self.S[s, g].copy(), self.hist[s, g].copy(), None, None
        rows = [(s + 1 + j) % n for j in range(m)]
        return self.S[s, g], self.hist[s, g], [self.S[r, g] for r in rows], [self.hist[r, g] for r in rows]
