"""`engine/graph_capture.capture_ladder`, the capture loop both step runners use: what it captures, in
which order, into which pool, and what it returns when a capture fails. (The graphs themselves are
GPU-only: tests/engine/test_gpu_decode.py and test_gpu_spec_decode.py replay them against eager
steps.) The CUDA pool handle is replaced by a stand-in so that this runs on the CPU."""

from __future__ import annotations

import logging

import pytest
import torch

from v4serve.engine.graph_capture import capture_ladder


@pytest.fixture
def pool(monkeypatch):
    handle = object()
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: handle)
    return handle


def test_every_size_captured_once_largest_first_into_one_pool_under_inference_mode(pool):
    calls = []

    def capture_size(size, got_pool):
        calls.append((size, got_pool, torch.is_inference_mode_enabled()))
        return f"graphs of {size}"

    graphs = capture_ladder([1, 2, 4, 6], capture_size, "test steps")
    assert calls == [(6, pool, True), (4, pool, True), (2, pool, True), (1, pool, True)]
    assert graphs == {1: "graphs of 1", 2: "graphs of 2", 4: "graphs of 4", 6: "graphs of 6"}


def test_a_failed_capture_leaves_no_graph_and_says_so(pool, caplog):
    def capture_size(size, _pool):
        if size == 2:
            raise RuntimeError("operation not permitted when stream is capturing")
        return size

    with caplog.at_level(logging.WARNING, logger="v4serve.engine.graph_capture"):
        assert capture_ladder([1, 2, 4], capture_size, "test steps") == {}
    assert "test steps" in caplog.text and "not permitted" in caplog.text


def test_other_errors_are_not_swallowed(pool):
    def capture_size(size, _pool):
        raise ValueError("a bug, not an uncapturable op")

    with pytest.raises(ValueError):
        capture_ladder([1], capture_size, "test steps")
