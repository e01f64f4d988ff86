#!/usr/bin/env bash
# The GPU benchmarks in one run, for a session that is lent a GPU machine (one H200): run it once,
# then copy the tables, the date and the device from $OUT into docs/benchmarks.md.
#
#   bash bench/gpu_run.sh            # everything below, about 5-9 minutes on an H200 with the 8B shape
#   bash bench/gpu_run.sh compat     # only the transformers-release check
#   bash bench/gpu_run.sh worker     # only bench/worker_gpu.py
#   bash bench/gpu_run.sh profile    # only bench/profile_gpu.py
#   bash bench/gpu_run.sh matrix     # only the resident temperature x context matrix (issue 22 item 9)
#   bash bench/gpu_run.sh quantized  # only bench/quantized.py --device cuda (issue 31: weight dtypes), its own
#                                    # device command: `all` already fills one 600 s command
#
# Each bench runs under `timeout` and writes its output (stdout and stderr) to $OUT:
#   $OUT/env.txt          date, nvidia-smi, Python, torch, transformers
#   $OUT/compat.txt       tests/test_profiler_engine.py on that machine's transformers (5.17: `past_key_values=`),
#                         the worker's and the profiler's forward through the one KV-argument adapter; and
#                         tests/test_profiler_gpu_share.py (the profiler's memory cap refuses past it on the GPU)
#   $OUT/worker_gpu.txt   bench/worker_gpu.py (the worker engine's table; exit 1 = a target missed)
#   $OUT/profile_gpu.txt  bench/profile_gpu.py (time to profile an 8B, predicted vs measured peak memory)
#   $OUT/matrix_t{0,1}_p{200,8000}.txt  bench/worker_gpu.py --resident-only at temperature 0 and 1 (top-p 0.95,
#                         sampled on the device) with 200- and 8000-token prompts: B=1 ms/token against the
#                         roofline (<= 1.3x) and B=8 aggregate against B=1 (>= 6x) at each cell; the
#                         measured ms/token / roofline at 200 tokens is the efficiency that replaces the
#                         estimate's constant (contract/estimate.py) once recorded in docs/benchmarks.md
#   $OUT/quantized_gpu.txt  bench/quantized.py --device cuda: 8 layers of the Llama-3.1-8B shape in bfloat16,
#                         int8 and int4: int8 resident decode ms/token ÷ bfloat16's, and each elastic step ÷ the
#                         PCIe floor of the bytes it streams (<= 1.2x), with the streamed bytes per token
# A bench that fails or times out does not stop the next one; the script exits with the first failure.
#
# What to carry. The GPU machine has Python 3.12 with torch, transformers 5.17, accelerate, safetensors,
# tokenizers, jinja2, pyyaml, prometheus-client, nvidia-ml-py, attrs and typing-extensions. The benches
# also import jsonschema and fastjsonschema (profile validation, worker config). Before the run, in the
# repository root on the machine without the GPU:
#
#   echo /.whl/ >> "$(git rev-parse --git-path info/exclude)"
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl jsonschema referencing jsonschema-specifications rpds-py fastjsonschema 'torchao==0.18.*'
#
# (one version of each; about 0.5 MB, and torchao for `quantized`: engine/quantize.py's quantizers) and run this script with carry [".whl"] and a 600 s limit. The
# script installs what .whl holds into /tmp/site when the folder is there. The project is imported from
# the checkout (each bench puts the repository root on sys.path); nothing else is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-run}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PYTHON="${PYTHON:-python3}"
COMPAT_TIMEOUT_S=60    # the three limits add up to less than one 600 s device command
WORKER_TIMEOUT_S=300
PROFILE_TIMEOUT_S=200
MATRIX_TIMEOUT_S=120   # per cell; `matrix` is its own device command (4 cells, under 600 s)
QUANTIZED_TIMEOUT_S=420  # `quantized` is its own device command too

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_run: installing the carried wheels failed" >&2; exit 3; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv \
    || echo "nvidia-smi: not available"
  "$PYTHON" -c 'import platform, torch, transformers; print("python", platform.python_version(), "torch",
torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())'
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

status=0
step() {  # step NAME TIMEOUT_S COMMAND...: run one bench under timeout, its output into $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name (timeout ${limit}s): $*"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc$([ "$rc" = 124 ] && echo ' (timed out)')" | tee -a "$OUT/$name.txt"
  [ "$status" = 0 ] && status=$rc
}

compat() {  # no pytest plugins beyond pytest's own: the machine has not this project's test extras
  PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 step compat "$COMPAT_TIMEOUT_S" "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/test_profiler_engine.py tests/test_profiler_gpu_share.py
}

matrix() {  # the resident rows at temperature 0 and 1, 200 and 8000 tokens of context
  for temperature in 0 1; do
    for prompt in 200 8000; do
      step "matrix_t${temperature}_p${prompt}" "$MATRIX_TIMEOUT_S" "$PYTHON" bench/worker_gpu.py --resident-only \
        --temperature "$temperature" --prompt-tokens "$prompt" --decode-tokens 32
    done
  done
}

case "${1:-all}" in
  all) compat
       step worker_gpu "$WORKER_TIMEOUT_S" "$PYTHON" bench/worker_gpu.py
       step profile_gpu "$PROFILE_TIMEOUT_S" "$PYTHON" bench/profile_gpu.py ;;
  compat) compat ;;
  worker) step worker_gpu "$WORKER_TIMEOUT_S" "$PYTHON" bench/worker_gpu.py ;;
  profile) step profile_gpu "$PROFILE_TIMEOUT_S" "$PYTHON" bench/profile_gpu.py ;;
  matrix) matrix ;;
  quantized) step quantized_gpu "$QUANTIZED_TIMEOUT_S" "$PYTHON" bench/quantized.py --device cuda ;;
  *) echo "usage: bash bench/gpu_run.sh [all|compat|worker|profile|matrix|quantized]" >&2; exit 2 ;;
esac
exit "$status"
