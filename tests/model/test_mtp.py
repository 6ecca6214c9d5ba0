"""The MTP layer against an oracle built from transformers' modules, float32 on the CPU.

transformers' DeepseekV4ForCausalLM has no MTP module (it skips `mtp.*`), so the oracle composes
its pieces by the reference formula (architecture reference §3, "MTP (V4)"):

    X_main = transformers' last decoder layer output (streams), e = enorm(embed(next)),
    X = e_proj(e) + h_proj(hnorm(X_main)), X = DeepseekV4DecoderLayer (sliding attention, score MoE)(X),
    logits = lm_head(norm(DeepseekV4HyperHead(X)))

The checkpoint is transformers' `save_pretrained` output plus a second file with the MTP
tensors, its own ones in the official names (`mtp.0.e_proj.weight`, `mtp.0.hc_head_fn`, ...) and
the block's in both spellings (official `mtp.0.attn.*` / `ffn.experts.E.w1`, transformers-style
`mtp.0.self_attn.*`), so the loader's MTP name mapping is exercised too.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from oracle import make_hf_model, random_prompt
from v4serve.cache import SequenceChunk
from v4serve.engine import Engine, EngineArgs

SEQ = 80  # > 2 windows of config "a" (window 32): the MTP window wraps


def _hf_mtp(hf):
    """The MTP parts as transformers modules: a decoder layer (sliding attention, score-routed MoE,
    layer id = num_hidden_layers), enorm / hnorm / norm, e_proj / h_proj, a hyper head. Random."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    raw = hf.config.to_dict()
    n = raw["num_hidden_layers"]
    raw.update(num_hidden_layers=n + 1, layer_types=[*raw["layer_types"], "sliding_attention"],
               mlp_layer_types=[*raw["mlp_layer_types"], "moe"])
    config = DeepseekV4Config(**{k: v for k, v in raw.items() if k not in ("architectures", "transformers_version")})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    d = config.hidden_size
    parts = torch.nn.ModuleDict(dict(
        block=m.DeepseekV4DecoderLayer(config, n), enorm=m.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps),
        hnorm=m.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps), norm=m.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps),
        e_proj=torch.nn.Linear(d, d, bias=False), h_proj=torch.nn.Linear(d, d, bias=False),
        hc_head=m.DeepseekV4HyperHead(config),
    )).float().eval()
    gen = torch.Generator().manual_seed(77)
    with torch.no_grad():
        for name, p in parts.named_parameters():
            if name.endswith(("sinks", "e_score_correction_bias", "base", "hc_base")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return parts, config


def _official_names(parts) -> dict[str, torch.Tensor]:
    """The MTP tensors as a checkpoint would hold them (mixed spellings, see the module docstring)."""
    own = {"e_proj.weight": "e_proj.weight", "h_proj.weight": "h_proj.weight", "enorm.weight": "enorm.weight",
           "hnorm.weight": "hnorm.weight", "norm.weight": "norm.weight", "hc_head.hc_fn": "hc_head_fn",
           "hc_head.hc_base": "hc_head_base", "hc_head.hc_scale": "hc_head_scale"}
    official_block = {"self_attn.q_a_proj.weight": "attn.wq_a.weight", "self_attn.sinks": "attn.attn_sink",
                      "input_layernorm.weight": "attn_norm.weight", "mlp.gate.weight": "ffn.gate.weight",
                      "mlp.gate.e_score_correction_bias": "ffn.gate.bias"}
    out = {}
    for name, t in parts.state_dict().items():
        if name.startswith("block."):
            rest = name.removeprefix("block.")
            if rest == "mlp.experts.gate_up_proj":  # per-expert w1 / w3, as the official checkpoint has them
                half = t.shape[1] // 2
                for e in range(t.shape[0]):
                    out[f"mtp.0.ffn.experts.{e}.w1.weight"] = t[e, :half].clone()
                    out[f"mtp.0.ffn.experts.{e}.w3.weight"] = t[e, half:].clone()
                continue
            out["mtp.0." + official_block.get(rest, rest)] = t.contiguous()
        else:
            out["mtp.0." + own[name]] = t.contiguous()
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_mtp")
    hf = make_hf_model("a")
    hf.save_pretrained(path)
    parts, config = _hf_mtp(hf)
    save_file(_official_names(parts), str(path / "mtp.safetensors"), metadata={"format": "pt"})
    index = path / "model.safetensors.index.json"
    if index.exists():  # a sharded save: name the MTP file in the index too
        data = json.loads(index.read_text())
        data["weight_map"].update({k: "mtp.safetensors" for k in _official_names(parts)})
        index.write_text(json.dumps(data))
    return path, hf, parts, config


def _oracle(hf, parts, config, ids: list[int], next_ids: list[int]):
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import create_sliding_window_causal_mask

    captured = {}
    hook = hf.model.layers[-1].register_forward_hook(lambda mod, args, out: captured.setdefault("x", out))
    with torch.no_grad():
        hf(torch.tensor([ids]))
        hook.remove()
        x_main = captured["x"]  # [1, S, hc, D]
        e = parts["enorm"](hf.model.embed_tokens(torch.tensor([next_ids])))
        x = parts["e_proj"](e)[:, :, None] + parts["h_proj"](parts["hnorm"](x_main))
        pos = torch.arange(len(ids))[None]
        mask = create_sliding_window_causal_mask(config=config, inputs_embeds=e, attention_mask=None,
                                                 past_key_values=None, position_ids=pos)
        rope = {"main": hf.model.rotary_emb(e, position_ids=pos, layer_type="main"),
                "compress": hf.model.rotary_emb(e, position_ids=pos, layer_type="compress")}
        x = parts["block"](x, position_embeddings=rope, position_ids=pos, attention_mask=mask,
                           input_ids=torch.tensor([next_ids]))
        logits = hf.lm_head(parts["norm"](parts["hc_head"](x)))[0].float()
    return x_main[0], logits


def test_mtp_layer_matches_the_transformers_oracle(setup):
    path, hf, parts, config = setup
    ids = random_prompt(SEQ + 1, seed=5)
    ids, next_ids = ids[:-1], ids[1:]
    want_streams, want_logits = _oracle(hf, parts, config, ids, next_ids)

    engine = Engine(EngineArgs(model=str(path), device="cpu", max_num_seqs=1, max_num_batched_tokens=128,
                               progress=False, speculative_config={"method": "mtp", "num_speculative_tokens": 1}))
    slot = engine.cache.open_sequence()
    engine.cache.reserve(slot, SEQ)
    # Two chunks, so the MTP window carries rows from one step to the next through its own cache.
    got_streams, got_logits = [], []
    for start, end in ((0, 50), (50, SEQ)):
        chunk = [SequenceChunk(slot, start, end - start, 0)]
        _, streams = engine.runner.prefill_with_streams(chunk, ids[start:end], [end - start - 1])
        logits, _ = engine.spec.drafter._run(chunk, next_ids[start:end], streams, list(range(end - start)))
        got_streams.append(streams)
        got_logits.append(logits)
    torch.testing.assert_close(torch.cat(got_streams), want_streams, atol=2e-4, rtol=1e-4)
    got = torch.cat(got_logits)
    assert (got - want_logits).abs().max() < 1e-3
    assert torch.equal(got.argmax(-1), want_logits.argmax(-1))


def test_mtp_tensors_are_skipped_without_speculation(setup):
    path = setup[0]
    engine = Engine(EngineArgs(model=str(path), device="cpu", max_num_seqs=1, progress=False))
    assert not hasattr(engine.model, "mtp") and engine.spec is None


def test_tiny_preset_has_an_mtp_layer():
    engine = Engine(EngineArgs(model="tiny", device="cpu", max_num_seqs=1, progress=False,
                               speculative_config={"method": "mtp", "num_speculative_tokens": 2}))
    names = {n for n, _ in engine.model.named_parameters() if n.startswith("mtp.0.")}
    for part in ("e_proj.weight", "h_proj.weight", "enorm.weight", "hnorm.weight", "norm.weight", "hc_head.hc_fn",
                 "self_attn.q_a_proj.weight", "mlp.gate.weight", "mlp.experts.gate_up_proj", "attn_hc.fn"):
        assert "mtp.0." + part in names, part
    assert not any("compressor" in n for n in names)  # window-only attention
    assert engine.model.mtp[0].self_attn.layer == engine.config.num_hidden_layers
