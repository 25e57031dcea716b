#!/usr/bin/env bash
# bash bench/gpu.sh: the GPU checks in one go, on a lent GPU machine (results under $OUT, see BENCHMARKS.md).
#
# Installs nothing heavy: the machine's own torch, plus the pure-Python packages its image lacks, carried as
# wheels in .whl/ (pydantic, trl, datasets, transformers of our version, DeepSpeed; bench/gpu.sh --fetch-wheels gets them
# here; they are for the machine's Python, 3.12). The PRM benches read models/ and data/ from `make run` when
# they are carried; the gpu profile's bench builds its model there. Each part has its own
# time limit and gets at most what is left of $BUDGET seconds (the limits add up to more: the last parts take
# the slack), and what finished stays in $OUT.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch-wheels" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
    pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
    trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0 transformers==5.24.0 hjson==3.1.0
  # DeepSpeed (for tests/gpu/test_fsdp.py's ZeRO-3 half) is on PyPI as source only: built here without its ops
  # (DS_BUILD_OPS=0; the tests train with torch's AdamW, so nothing is compiled there), by a Python with torch
  DS_BUILD_OPS=0 "${PYTHON:-.venv/bin/python}" -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
  exit
fi
OUT=${OUT:-/tmp/gpu-out}
BUDGET=${BUDGET:-500}
START=$(date +%s)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi

# part NAME SECONDS COMMAND...: run with the smaller of SECONDS and what is left of BUDGET; output to $OUT/NAME.txt
part() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - ($(date +%s) - START)))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -le 5 ]; then echo "== $name: skipped, no time left"; return; fi
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name: exit $? in $(( $(date +%s) - t0 )) s (limit $limit s)"
  tr '\r' '\n' < "$OUT/$name.txt" | grep -v -E "Warning|warn|%\||LOAD REPORT|MISSING|^Key|^---|^score|^Notes|newly initialized|^ *$" \
    | tail -n 25
}

part env 30 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "
import torch, transformers, trl, datasets, pyarrow, pydantic
print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"-\")
print(\"transformers\", transformers.__version__, \"trl\", trl.__version__, \"datasets\", datasets.__version__, \"pyarrow\", pyarrow.__version__, \"pydantic\", pydantic.__version__)"'
# (not the PRM training test that logs through dvclive: the image has no dvclive)
part pytest 240 python3 -m pytest tests/gpu tests/unit/test_prm.py tests/unit/test_generation.py \
  tests/unit/test_lora.py tests/unit/test_launch.py -q -p no:cacheprovider -k "not prm_train_batches"
# The gpu profile's 0.3B student at random init (nothing carried): matrix rate, packed SFT, greedy decoding (and
# vLLM where installed), PRM scoring, GRPO steps; JSON in $OUT/gpu_profile.json
part gpu_profile 300 python3 bench/gpu_profile.py "$OUT" ${GPU_PROFILE_PARTS:+--parts "$GPU_PROFILE_PARTS"}
# The same SFT steps with the model compiled (sft.torch_compile: torch.compile, inductor), for the MFU target; JSON in
# $OUT/compiled/gpu_profile.json
part gpu_profile_compiled 180 python3 bench/gpu_profile.py "$OUT/compiled" --parts sft -S sft.torch_compile=true
# These read the default CPU run's models/ and data/ (carry them): run only where they are here.
if [ -d models/prm ] && [ -d data/prm_data ]; then
  part sft_step 60 python3 bench/sft_step.py --steps 30
  part prm_scoring 90 python3 bench/prm_scoring.py --repeats 2
  part prm_scoring_wide 40 python3 bench/prm_scoring.py --repeats 2 --batch 512 --workloads heldout best_of_n
  part prm_wide_vocab 60 python3 bench/prm_wide_vocab.py --layers 4 --paths 512
fi
echo "== total $(( $(date +%s) - START )) s" | tee "$OUT/total.txt"
