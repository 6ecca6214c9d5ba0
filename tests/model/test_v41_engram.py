"""V4.1 Engram: the token map from the checkpoint's tokenizer, the n-gram hash rows, and the gated
update of the streams, against the golden reference data (tests/data/v41-golden)."""

import json

import pytest
import torch

from v41_golden import GOLDEN, load_golden
from v4serve.config import ModelConfig
from v4serve.model.engram import Engram
from v4serve.model.engram_hash import EngramHashTables, ngram_history, normalize_token_text
from v4serve.model.v41_quant import dequant_fp8_blocks
from v4serve.model.v41_weights import tokenizer_token_map

META = json.loads((GOLDEN / "meta.json").read_text())["engram"]


@pytest.fixture(scope="module")
def config():
    return ModelConfig.from_pretrained(GOLDEN)


@pytest.fixture(scope="module")
def tables(config):
    return EngramHashTables.build(config, tokenizer_token_map(GOLDEN))


def test_token_map_from_the_tokenizer():
    assert torch.equal(tokenizer_token_map(GOLDEN), torch.arange(1024) // 2)  # README: id -> id // 2


def test_normaliser():
    assert normalize_token_text(" W3") == "w3" and normalize_token_text("Ça\t\n va ") == "ca va"
    assert normalize_token_text(" \t") == " "  # whitespace only stays one space


def test_derived_constants_match_the_reference(tables):
    assert tables.primes.tolist() == META["primes"]
    assert tables.offsets.tolist() == META["offsets"]
    assert tables.multipliers.tolist() == META["multipliers"]
    assert tables.pad_compressed_id == META["pad_compressed_id"]


def test_hash_rows_match_golden_prefill_and_decode(tables):
    g = load_golden()
    token_map = tokenizer_token_map(GOLDEN)
    ids = torch.cat((g["input_ids"], g["decode.tokens_in"]))
    pad = torch.full((tables.max_ngram - 1,), tables.pad_compressed_id)
    history = ngram_history(token_map[ids], pad, tables.max_ngram)
    want = torch.cat((g["prefill.engram_hash"], g["decode.engram_hash"]))
    for i in range(len(tables.layer_ids)):
        assert torch.equal(tables.hash(history, i), want[:, i])


def test_wrong_compressed_vocab_is_named(config):
    with pytest.raises(ValueError, match="engram_compressed_vocab_size"):
        EngramHashTables.build(config, torch.arange(1024) // 4)


@pytest.mark.parametrize("index, layer", [(0, 1), (1, 2)])
def test_engram_update_matches_golden_block_input(config, index, layer):
    """h_in (after Engram) from the previous block's golden output and the golden hash rows."""
    from safetensors.torch import load_file

    g, w = load_golden(), load_file(str(GOLDEN / "weights.safetensors"))
    m = Engram(config, config.v41.engram_num_embeddings[index]).to(torch.bfloat16)
    m.table = m.table.to(torch.float8_e4m3fn)  # `.to(dtype)` casts float8 buffers too; the table holds e4m3 codes
    p = f"layers.{layer}.engram."
    with torch.no_grad():
        m.table.copy_(w[p + "embed.weight"])
        m.table_scale.copy_(w[p + "embed.scale"].view(torch.uint8))
        m.wkv.weight.copy_(dequant_fp8_blocks(w[p + "wkv.weight"], w[p + "wkv.scale"]))
        m.q_weight.copy_(w[p + "q_weight"])
        m.k_weight.copy_(w[p + "k_weight"])
        x = g[f"prefill.layers.{layer - 1}.h_out"]
        got = m(x, g["prefill.engram_hash"][:, index])
    want = g[f"prefill.layers.{layer}.h_in"]
    update = (want.float() - x.float()).norm()
    assert (got.float() - want.float()).norm() / update < 1e-3
