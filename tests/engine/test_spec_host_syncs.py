"""Host work of a speculative step on the device path (`engine/verify_runner.py`): every host read of
a tensor value (`.tolist()`, `.item()`, `int(t)`, ...) is a device->host synchronisation on CUDA,
which leaves the GPU idle while the host catches up. A greedy step reads one packed block of
results (tokens, accepted counts, logprobs, next drafts), once. On the CPU every tensor is a host
tensor, so the count below is of reads of any tensor: the step's one read of its (pinned, on CUDA)
results block is the only one allowed.

Also: the last steps before max_tokens, where fewer than k drafts fit, stay on the device path
(their acceptance capped on the device) instead of falling back to the eager step."""

from __future__ import annotations

import torch

from v4serve.engine import Engine, EngineArgs, SamplingParams

torch.set_num_threads(1)

_READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy", "cpu")


def _count_host_reads(monkeypatch) -> list[str]:
    """Wraps the tensor methods that copy values to Python (or to the CPU); returns the list
    each call appends its name to. (A patch, not a TorchFunctionMode: that would slow every op of
    the forward.)"""
    calls: list[str] = []
    for name in _READS:
        method = getattr(torch.Tensor, name)

        def counted(self, *args, _method=method, _name=name, **kwargs):
            calls.append(_name)
            return _method(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


def _engine() -> Engine:
    return Engine(EngineArgs(model="tiny", device="cpu", max_num_seqs=2, progress=False,
                             speculative_config={"method": "mtp", "num_speculative_tokens": 3}))


def test_a_greedy_device_step_reads_the_host_once(monkeypatch):
    engine = _engine()
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    for i, prompt in enumerate((list(range(20, 31)), list(range(40, 49)))):
        engine.add_request(str(i), prompt, params)
    engine.step()  # the prefill (eager)
    calls, reads_per_call = _count_host_reads(monkeypatch), []
    steps_before = engine.spec.device_steps
    while engine.has_unfinished():
        calls.clear()
        engine.step()
        reads_per_call.append(list(calls))
    # 5 tokens, at least one per step, the first from the prefill step; every later step decodes
    # both sequences with k drafts or fewer (the tail): all on the device path, each read once
    # (a step is read in the call after its launch, beside its continuation's launch).
    device_steps = engine.spec.device_steps - steps_before
    assert device_steps >= 2 and engine.spec.continuations >= 1
    assert all(names in ([], ["tolist"]) for names in reads_per_call), reads_per_call
    assert sum(len(names) for names in reads_per_call) == device_steps


def test_steps_near_max_tokens_stay_on_the_device_path():
    engine = _engine()
    # max_tokens 3 with k = 3: after the prefill's token, at most 1 then 0 drafts fit.
    engine.add_request("0", list(range(20, 33)), SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert engine.spec.eager_steps == 1 and engine.spec.device_steps >= 1  # only the prefill step is eager
    m = engine.spec.metrics
    assert m.num_draft_tokens <= 1  # the padded drafts are neither counted nor kept
