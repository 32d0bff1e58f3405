"""Byte-level tokenizer: token id == byte value (vocab 256). Ships with the tiny model."""
from __future__ import annotations

from .errors import TokenError
from .inputs import token_ids


class ByteTokenizer:
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TokenError(f"ByteTokenizer.encode takes a str, got {text!r:.40} ({type(text).__name__})")
        try:
            return list(text.encode("utf-8"))
        except UnicodeEncodeError as e:      # a lone surrogate has no UTF-8 bytes
            raise TokenError(f"ByteTokenizer.encode: the text holds {text[e.start:e.end]!r}, which UTF-8 "
                             f"cannot encode") from None

    def decode(self, ids) -> str:
        """Token ids (ints in [0, 256), as the engine's entries take them) -> text."""
        if isinstance(ids, (list, tuple)) and not ids:
            return ""
        return bytes(token_ids(ids, self.vocab_size, "ByteTokenizer.decode").tolist()).decode("utf-8", errors="replace")
