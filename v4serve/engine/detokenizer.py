"""Incremental detokenization: the text of a growing list of token ids, decoding a few tokens per
step instead of the whole output.

Byte-level BPE tokens may end inside a multi-byte UTF-8 character; their decoded text then ends
in U+FFFD. Such tokens are held back (no new text) until a later token completes the character,
or until the request finishes (`flush`).
"""

from __future__ import annotations

from v4serve.tokenizer import Tokenizer


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """One token as text, as users read it: `'Ġnesta'` (the byte-level vocabulary entry) is
    `' nesta'`; special tokens are kept; a token holding part of a multi-byte character reads as
    U+FFFD. What `Logprob.decoded_token` holds and what the server shows for a token."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # ids[_prefix:_read] decode to the text's known tail (context for the next token)
        self._read = 0

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[start:end], self.skip_special_tokens)

    def append(self, token: int) -> str:
        """Add a token; return the text it completes (possibly empty)."""
        self.ids.append(token)
        known = self._decode(self._prefix, self._read)
        extended = self._decode(self._prefix)
        if extended.endswith("\ufffd"):
            return ""
        new = extended[len(known):]
        self.text += new
        self._prefix, self._read = self._read, len(self.ids)
        return new

    def flush(self) -> str:
        """The text of any held-back tokens (the request is finishing)."""
        known = self._decode(self._prefix, self._read)
        new = self._decode(self._prefix)[len(known):]
        self.text += new
        self._prefix = self._read = len(self.ids)
        return new
