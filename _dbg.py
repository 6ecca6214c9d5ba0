import torch
torch.set_num_threads(1)
from v4serve import LLM, SamplingParams
from v4serve.engine.sampling_params import StructuredOutputsParams as S
import v4serve.engine.engine as E
llm = LLM('tiny', device='cpu', max_model_len=256, max_num_seqs=4, progress=False, overlap_decode=False)
orig = llm.engine.sampler.sample
def wrapped(logits, requests, in_flight=0, pending=None, bitmask=None):
    t = orig(logits, requests, in_flight, pending, bitmask)
    for i, r in enumerate(requests):
        if bitmask is not None:
            w = bitmask[i, t[i] // 32].item()
            print(i, int(t[i]), (w >> (int(t[i]) % 32)) & 1, repr(llm.tokenizer.decode([int(t[i])])), r.grammar is not None)
    return t
llm.engine.sampler.sample = wrapped
o = llm.generate(['Hello'], SamplingParams(temperature=1.0, seed=2, max_tokens=20, structured_outputs=S(json={"type":"object","properties":{"name":{"type":"string","maxLength":6}},"required":["name"]})))
print(repr(o[0].outputs[0].text), o[0].outputs[0].stop_reason)
