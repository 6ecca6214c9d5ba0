"""Structured outputs with xgrammar: a grammar per request, its next-token bitmask per step.

`StructuredOutputs` compiles a request's `StructuredOutputsParams` (JSON schema, any JSON object,
regex, choice, EBNF grammar) against the model's vocabulary once per distinct constraint (cached)
and gives each request its own `GrammarMatcher`. Each step, `bitmask(matchers)` fills the rows of
the requests that have one into a host int32 [B, ceil(V/32)] tensor (xgrammar's layout, see
ops/token_bitmask_reference.py; rows without a grammar allow every token), which the sampler
copies to the device and applies to the logits. The engine advances a matcher with each token
once the host knows it (`accept`).

The vocabulary is the tokenizer's byte-level BPE strings (tokenizer.json), padded with
unreachable ids up to the model's vocab size; end-of-sequence ids are the grammar's stop tokens,
allowed once the grammar is complete.
"""

from __future__ import annotations

import json
import threading

import torch

from v4serve.engine.sampling_params import StructuredOutputsParams


def _xgrammar():
    try:
        import xgrammar
    except ImportError as e:  # pragma: no cover - a dependency, but name it if it is missing
        raise ValueError("structured outputs need the `xgrammar` package (`pip install xgrammar`)") from e
    return xgrammar


def ebnf_literal(text: str) -> str:
    """`text` as an EBNF string literal (xgrammar's dialect: C-like escapes)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


def choice_grammar(choices: list[str]) -> str:
    return "root ::= " + " | ".join(ebnf_literal(c) for c in choices)


def check_structured_outputs(params: StructuredOutputsParams, field: str) -> None:
    """Parse the constraint without a vocabulary (cheap): a ValueError that names `field` when it
    is not a valid schema / regex / grammar."""
    xgr = _xgrammar()
    kind, _ = params.key
    try:
        if kind == "json":
            xgr.Grammar.from_json_schema(json.dumps(params.json))
        elif kind == "regex":
            xgr.Grammar.from_regex(params.regex)
        elif kind == "grammar":
            xgr.Grammar.from_ebnf(params.grammar)
        elif kind == "choice":
            xgr.Grammar.from_ebnf(choice_grammar(params.choice))
    except Exception as e:  # xgrammar raises RuntimeError / ValueError subclasses with its reason
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{field}: not a valid {kind}: {reason}") from None


class StructuredOutputs:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...], max_threads: int = 2):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = list(stop_token_ids)
        self.max_threads = max_threads
        self._compiler = None
        self._compiler_lock = threading.Lock()  # `prepare` may run on another thread
        self._compiled: dict[tuple[str, str], object] = {}

    @property
    def words(self) -> int:
        return -(-self.vocab_size // 32)

    def prepare(self) -> None:
        """Build the vocabulary's grammar compiler now (seconds for a 129K vocabulary: the server
        starts it on a thread of its own, so the first structured request does not stall the
        engine)."""
        self._get_compiler()

    def _get_compiler(self):
        with self._compiler_lock:
            return self._build_compiler()

    def _build_compiler(self):
        if self._compiler is None:
            xgr = _xgrammar()
            vocab = self.tokenizer.vocab()
            encoded = [""] * min(len(vocab), self.vocab_size)
            for token, index in vocab.items():
                if index < len(encoded):
                    encoded[index] = token
            info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=self.vocab_size,
                                     stop_token_ids=self.stop_token_ids)
            self._compiler = xgr.GrammarCompiler(info, max_threads=self.max_threads)
        return self._compiler

    def compile(self, params: StructuredOutputsParams):
        key = params.key
        if key not in self._compiled:
            check_structured_outputs(params, "structured_outputs." + key[0])
            compiler = self._get_compiler()
            kind = key[0]
            if kind == "json":
                grammar = compiler.compile_json_schema(key[1], any_whitespace=False)
            elif kind == "json_object":
                grammar = compiler.compile_builtin_json_grammar()
            elif kind == "regex":
                grammar = compiler.compile_regex(params.regex)
            elif kind == "choice":
                grammar = compiler.compile_grammar(choice_grammar(params.choice))
            else:
                grammar = compiler.compile_grammar(params.grammar)
            self._compiled[key] = grammar
        return self._compiled[key]

    def matcher(self, params: StructuredOutputsParams):
        """A fresh matcher for one request."""
        return _xgrammar().GrammarMatcher(self.compile(params))

    def bitmask(self, matchers: list) -> torch.Tensor | None:
        """Host int32 [B, W]: each row's allowed tokens (every bit set where `matchers[i]` is None);
        None when no row has a matcher."""
        if all(m is None for m in matchers):
            return None
        mask = torch.full((len(matchers), self.words), -1, dtype=torch.int32)
        for i, m in enumerate(matchers):
            if m is not None and not m.is_terminated():
                m.fill_next_token_bitmask(mask, i)
        return mask


    def only_stops(self, mask: torch.Tensor, rows: list[int]) -> set[int]:
        """The `rows` of a host bitmask that allow nothing but stop tokens (the grammar must end
        there: `min_tokens` cannot hold the end back, or no token would be left)."""
        stops = torch.zeros(self.words, dtype=torch.int64)
        for t in self.stop_token_ids:
            stops[t // 32] |= 1 << (t % 32)
        keep = (~stops).to(torch.int32)  # bit patterns of int32 words, stop bits cleared
        return {i for i in rows if not bool((mask[i] & keep).any())}


def accept(matcher, token: int) -> bool:
    """Advance a request's matcher by its new token; False if the grammar rejects it."""
    return matcher.is_terminated() or matcher.accept_token(token)
