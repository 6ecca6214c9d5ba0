"""`bench engine` on the CPU with the tiny model: TTFT and TPOT rows for every concurrency, one JSON
line last (the GPU-idle profile needs CUDA and is skipped here; it is exercised on the GPU)."""

import json

import pytest
import torch

from v4serve.bench import engine as bench_engine


def test_bench_engine_reports_ttft_and_tpot_for_every_concurrency(capsys):
    args = ["--model", "tiny", "--hf-overrides", "{}", "--concurrency", "1", "2", "--prompt-len", "48",
            "--output-len", "8", "--max-model-len", "512", "--max-num-seqs", "4"]
    assert bench_engine.main(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["max_num_seqs"] == 4 and result["kv_pages"] > 0
    assert len(result["ttft_ms"]) == 3 and all(t > 0 for t in result["ttft_ms"])
    assert [row["concurrency"] for row in result["tpot"]] == [1, 2]
    assert all(row["tpot_ms"] > 0 and row["tpot_max_ms"] >= row["tpot_ms"] for row in result["tpot"])
    # out tok/s is the decode rate over TPOT's span (concurrency tokens a TPOT), not the whole run's
    c1 = result["tpot"][0]
    assert c1["output_tok_s"] == pytest.approx(1e3 / c1["tpot_ms"], rel=0.05)
    assert result["profile"] == []


def test_bench_engine_reports_spec_decode_counters(capsys):
    args = ["--model", "tiny", "--hf-overrides", "{}", "--concurrency", "2", "--prompt-len", "40",
            "--output-len", "6", "--max-model-len", "256", "--max-num-seqs", "2",
            "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}']
    assert bench_engine.main(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    spec = result["spec_decode"]
    assert spec["num_drafts"] > 0 and spec["num_draft_tokens"] >= spec["num_drafts"]
    assert len(spec["accepted_per_position"]) == 2 and spec["mean_acceptance_length"] >= 1.0


def _prefix_run(capsys, *extra: str) -> dict:
    args = ["--model", "tiny", "--hf-overrides", "{}", "--concurrency", "1", "--prefix-len", "64", "--prompt-len", "8",
            "--max-num-batched-tokens", "64", "--max-model-len", "256", *extra]
    assert bench_engine.main(args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_bench_engine_prefix_mode_reports_cold_and_warm_ttft_with_the_hits(capsys):
    """A 64-token prefix on a 64-token chunk grid: every warm turn finds the whole prefix cached."""
    result = _prefix_run(capsys)
    assert result["prefix_caching"] and result["chunk_grid"] == 64 and result["max_num_batched_tokens"] == 64
    assert len(result["ttft_cold_ms"]) == len(result["ttft_warm_ms"]) == 3
    assert all(t > 0 for t in result["ttft_cold_ms"] + result["ttft_warm_ms"])
    assert result["warm_cached_tokens"] == [64, 64, 64]
    assert "tpot" not in result  # the prefix mode measures nothing else


def test_bench_engine_prefix_mode_without_caching_finds_nothing_cached(capsys):
    result = _prefix_run(capsys, "--no-enable-prefix-caching")
    assert not result["prefix_caching"] and result["chunk_grid"] is None
    assert result["warm_cached_tokens"] == [0, 0, 0]


def test_kernel_growth_lists_the_kernels_a_verify_step_adds_time_to_first():
    from v4serve.bench.spec_decode import kernel_growth

    plain = {"moe": (2.0, 50.0), "attn": (1.0, 10.0), "head": (1.0, 30.0)}
    verify = {"moe": (2.0, 190.0), "attn": (1.0, 14.0), "head": (1.0, 30.0), "accept": (1.0, 3.0)}
    rows = kernel_growth(plain, verify, top=3)
    assert [r[0] for r in rows] == ["moe", "attn", "accept"]
    assert rows[0] == ("moe", 2.0, 50.0, 2.0, 190.0) and rows[2] == ("accept", 0.0, 0.0, 1.0, 3.0)


def test_spec_verify_rows_run_on_the_cpu_in_both_routings(capsys):
    args = ["--model", "tiny", "--hf-overrides", "{}", "--spec-verify", "--routing", "uniform", "zipf", "--spec-k",
            "1", "--spec-e2e-k", "1", "--spec-lengths", "2.0", "--concurrency", "1", "--output-len", "4",
            "--max-model-len", "512", "--spec-profile"]
    assert bench_engine.main(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    uniform, zipf = result["speculative"]
    assert (uniform["routing"], zipf["routing"], zipf["zipf_exponent"]) == ("uniform", "zipf", 1.0)
    for mode in (uniform, zipf):
        (row,) = mode["step_costs"]
        assert row["plain_ms"] > 0 and [r["k"] for r in row["k"]] == [1]
        assert not row["plain_graph"] and not row["k"][0]["graphs"]  # the CPU captures nothing
        assert "kernel_growth" not in row["k"][0]  # CUDA kernels only: no profile on the CPU
    assert [r["forced_length"] for r in uniform["end_to_end"]] == [None, 2.0]
    assert zipf["end_to_end"] == []  # end to end in the first mode only


def test_rows32_rule_sets_the_17_to_32_row_fp8_choice_only_while_open():
    from v4serve.bench.spec_decode import rows32_rule
    from v4serve.ops.fp8_linear_triton import w8a16_decode_choice

    def choice(m):
        return w8a16_decode_choice(4096, 4096, (128, 128), torch.device("cpu"), m=m)

    before_16, before_32 = choice(16), choice(32)
    assert before_32 == {"KERNEL": "tiles", "SUM_LAST": True}  # production since session 23
    with rows32_rule("sum-kernel"):
        assert choice(32) == {"KERNEL": "tiles", "SUM_LAST": False}
        assert choice(16) == before_16  # the 1..16-row rule is not touched
    assert choice(32) == before_32
    with pytest.raises(RuntimeError), rows32_rule("sum-kernel"):
        raise RuntimeError("a failed capture")
    assert choice(32) == before_32  # restored on the way out of an error too


def test_draft_head_choice_sets_the_lm_head_aside_and_restores_it():
    from types import SimpleNamespace

    from v4serve.bench.spec_decode import draft_head_choice

    head = object()
    model = SimpleNamespace(draft_head=head)
    with draft_head_choice(model, "shared"):
        assert model.draft_head is None
    with draft_head_choice(model, "fp8"):
        assert model.draft_head is head
    with pytest.raises(RuntimeError), draft_head_choice(model, "shared"):
        raise RuntimeError("a failed capture")
    assert model.draft_head is head
    with pytest.raises(ValueError, match="draft_head"):
        with draft_head_choice(SimpleNamespace(draft_head=None), "fp8"):
            pass


def test_spec_verify_step_costs_once_per_rows32_rule(capsys, tmp_path):
    args = ["--json-out", str(tmp_path / "spec.json"), "--model", "tiny", "--hf-overrides", "{}", "--spec-verify", "--spec-k", "1", "--spec-e2e-k", "1",
            "--spec-lengths", "2.0", "--concurrency", "1", "--output-len", "2", "--max-model-len", "512",
            "--spec-rows32", "production", "sum-last", "--spec-draft-head", "shared", "fp8"]
    assert bench_engine.main(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    (mode,) = json.loads(out[-1])["speculative"]
    assert [(row["rows32_rule"], row["draft_head"]) for row in mode["step_costs"]] == [
        ("production", "shared"), ("production", "fp8"), ("sum-last", "shared"), ("sum-last", "fp8")]
    assert mode["end_to_end"] and all(row["draft_head"] == "fp8" for row in mode["end_to_end"])
    assert all(row["plain_ms"] > 0 and [r["k"] for r in row["k"]] == [1] for row in mode["step_costs"])
    assert any("17..32-row FP8 linears: sum-last" in line for line in out)
    assert json.loads((tmp_path / "spec.json").read_text())["speculative"] == [mode]
