"""Per-request limits shared by the app and the `serve` flags (no fastapi import here)."""

MAX_SEQS_PER_REQUEST = 256  # prompts x n of one request (--max-seqs-per-request)
