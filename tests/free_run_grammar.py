"""A regex that allows what a free greedy run wrote, for tests that check a grammar changes no token.

`re.escape(text) + ".*"` of the run's decoded text is not enough: a random model writes tokens that
are parts of a UTF-8 character (byte-level BPE), and a text whose bytes end mid-character (or hold a
sequence no later token completes) decodes with U+FFFD. The regex then asks for the three bytes of
U+FFFD where the run wrote other bytes, and the grammar refuses the run's own token (on the H200:
token 731, bytes E6 8C, refused; 2779, bytes EF BF, the start of U+FFFD, taken instead).

So the regex is the text of the longest token prefix that decodes cleanly, then anything; the
tokens a test may compare are those of the prefix that the grammar itself accepts (checked with a
matcher, so special tokens and anything else the grammar refuses end it too).
"""

from __future__ import annotations

import re

from v4serve.engine.sampling_params import StructuredOutputsParams


def clean_prefix(tokenizer, token_ids: list[int]) -> tuple[str, int]:
    """(text, m): the longest prefix token_ids[:m] whose decoded text holds no U+FFFD."""
    for m in range(len(token_ids), -1, -1):
        text = tokenizer.decode(token_ids[:m])
        if "\ufffd" not in text:
            return text, m
    return "", 0


def allowing_grammar(structured, tokenizer, token_ids: list[int]) -> tuple[StructuredOutputsParams, int]:
    """(constraint, m): a regex allowing token_ids[:m] (then anything), and m, the number of leading
    tokens its matcher accepts (`structured`: the engine's StructuredOutputs)."""
    text, _ = clean_prefix(tokenizer, token_ids)
    params = StructuredOutputsParams(regex=re.escape(text) + ".*")
    matcher = structured.matcher(params)
    m = 0
    for token in token_ids:
        if not matcher.accept_token(token):
            break
        m += 1
    return params, m
