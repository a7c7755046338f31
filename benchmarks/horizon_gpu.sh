#!/usr/bin/env bash
# ES against GRPO at 8-15-turn horizons on one GPU (issue 28, part 5): the horizon suite with a
# bigger local model and vLLM generation on both sides, at equal GPU-minutes (wall seconds of
# one GPU): the chain task at h = 4 and 8 (h + 1 turns) and Sudoku with 8 and 15 empty cells.
# Not run in CI; not run by the session that wrote it (no GPU was available): no result yet.
#
#   MODEL=/models/Qwen2.5-1.5B-Instruct MINUTES=20 bash benchmarks/horizon_gpu.sh
#
# Needs: pip install -e '.[rl,vllm,environments]' on a CUDA machine (no -c constraints/cpu.txt),
# and the model as a local Hugging Face folder (nothing is downloaded). ES generates with
# esbox's vLLM backend (problem.backend: vllm, docs/vllm.md), GRPO with TRL's own vLLM in
# colocate mode (grpo.use_vllm); both train in bf16. The protocol is the CPU suite's
# (docs/benchmarks.md, "ES against GRPO as the horizon grows").
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?set MODEL to a local model folder}"
MINUTES="${MINUTES:-20}"
OUT="${OUT:-benchmark-results/horizon-gpu}"
python -m benchmarks horizon \
  --chain "${CHAIN:-4,8}" --sudoku "${SUDOKU:-8,15}" --model "$MODEL" --clock wall \
  --cpu-minutes "$MINUTES" --tuning "${TUNING:-3}" --seeds "${SEEDS:-2}" --jobs 1 \
  --es-set problem.backend=vllm --es-set problem.dtype=bfloat16 \
  --grpo-set problem.device=cuda --grpo-set problem.dtype=bfloat16 \
  --grpo-set grpo.use_vllm=true --grpo-set grpo.vllm_mode=colocate \
  --out "$OUT" "$@"
