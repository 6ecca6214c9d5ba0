"""Server-sent events framing for OpenAI streams: `data: {json}\n\n` ... `data: [DONE]\n\n`."""

from __future__ import annotations

import json

DONE = "data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MEDIA_TYPE = "text/event-stream"


def event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"
