"""Byte-level tokenizer: token id == byte value (vocab 256). Ships with the tiny model."""
from __future__ import annotations


class ByteTokenizer:
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < 256]
        if bad:
            raise ValueError(f"token ids out of byte range [0, 256): {bad[:5]}")
        return bytes(ids).decode("utf-8", errors="replace")
