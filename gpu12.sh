#!/usr/bin/env bash
# session 12's last GPU call (untracked; deleted after the run)
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/.gpu_deps PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
O=${OUT:-/tmp/out}; mkdir -p $O
t0=$SECONDS
stamp() { echo "== $1 at $((SECONDS - t0)) s"; }
T="python3 -m pytest -m gpu -q -p no:cacheprovider"
timeout 70 $T tests/engine/test_gpu_spec_decode.py::test_gpu_speculative_greedy_equals_plain tests/ops/test_fp32_head.py > $O/pytest_spec_head.log 2>&1
timeout 60 $T tests/ops/test_fp8_linear_decode.py > $O/pytest_fp8dec.log 2>&1
timeout 50 $T tests/ops/test_fp8_linear.py -k "(flash or v41) and not 2048" > $O/pytest_fp8.log 2>&1
timeout 60 $T tests/ops/test_v41_index_gpu.py -k "early_chain or swept_variant or products_are_rounded or candidate_mode_equals or (full_mode_at_the_pr_shapes and decode)" > $O/pytest_v41.log 2>&1
timeout 60 $T tests/ops/test_packed_kernels_gpu.py -k "decode and not indexer" > $O/pytest_packed.log 2>&1
DECODE_FUSION_TESTS
for f in $O/pytest_*.log; do echo "$(basename $f): $(grep -E '[0-9]+ (passed|failed)' $f | tail -1)"; grep -E '^FAILED' $f | head -5 | cut -c1-180; done
stamp tests
timeout 110 python3 -m v4serve.bench.kernels --no-cold --json $O/bench.json \
  --only 'fp32 head|staged1M|NC16384|sparse decode r|linear flash wq_a M1|linear flash wq_a M8|linear flash wq_b M1|linear flash wkv M1|linear flash wkv M8|linear flash wo_b M1|linear flash shared_w1 M1|linear flash shared_w1 M8|linear flash shared_w2 M1|linear flash shared_w2 M8|DECODE_FUSION_ROWS' \
  > $O/bench.log 2>&1; grep -v '^{\|^# built' $O/bench.log | cut -c1-100; stamp bench
timeout 75 python3 -m v4serve.bench.engine --profile-only --concurrency 1 --max-model-len 4096 --cuda-graph-sizes 1 > $O/profile.log 2>&1
python3 - $O/profile.log <<'PY'
import ast, sys
s = open(sys.argv[1]).read(); i = s.find("{'concurrency'")
if i >= 0:
    d = ast.literal_eval(s[i:s.find("\n", i)])
    print({k: round(d[k], 3) for k in ("gpu_busy_ms_per_step", "kernels_per_step", "wall_ms_per_step_unprofiled")})
    for row in d["top_kernels"][:14]: print(row)
PY
stamp profile
for kv in auto bf16; do
  timeout 80 python3 -m v4serve.bench.engine --kv-cache-dtype $kv --concurrency 1 8 64 --output-len 64 --ttft-prompt-lens 2048 --ttft-repeats 2 --no-profile --json-out $O/engine_$kv.json > $O/engine_$kv.log 2>&1
  grep -E "^ +[0-9]+ +[0-9.]+|TTFT median|KV bytes per token" $O/engine_$kv.log | sed "s/^/$kv /"
done; stamp engine
timeout 100 python3 -m v4serve.bench.engine --model deepseek-v4.1-flash --hf-overrides '{"num_hidden_layers": 12, "engram_vocab_size": 1000000}' --max-model-len 4096 --num-kv-pages 1024 --ttft-prompt-lens 2048 --ttft-repeats 1 --concurrency 1 8 --cuda-graph-sizes 1 8 --output-len 48 --no-profile > $O/v41.log 2>&1
grep -E "^ +[0-9]+ +[0-9.]+|TTFT median|load " $O/v41.log | sed 's/^/v41 /'; stamp v41
