#!/usr/bin/env bash
# ES against GRPO on one GPU (issue 27, part 6): the rl suite's protocol with a 0.5-4B local
# model and vLLM generation on both sides, at equal GPU-minutes (wall seconds of one GPU).
# Not run in CI; not run by the session that wrote it (no GPU was available): no result yet.
#
#   MODEL=/models/Qwen2.5-0.5B-Instruct MINUTES=20 bash benchmarks/rl_gpu.sh
#
# Needs: pip install -e '.[rl,vllm]' on a CUDA machine (no -c constraints/cpu.txt), and the
# model as a local Hugging Face folder (nothing is downloaded). ES generates with esbox's vLLM
# backend (problem.backend: vllm, docs/vllm.md); GRPO with TRL's own vLLM in colocate mode
# (grpo.use_vllm). Both train in bf16 on the GPU; tuning, seeds and the held-out test are as on
# a CPU (docs/grpo.md, "ES against GRPO, side by side").
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?set MODEL to a local model folder}"
MINUTES="${MINUTES:-20}"
python -m benchmarks rl \
  --tasks "${TASKS:-arithmetic,agent-math}" --model "$MODEL" --clock wall \
  --cpu-minutes "$MINUTES" --jobs 1 \
  --es-set problem.backend=vllm --es-set problem.dtype=bfloat16 \
  --grpo-set problem.device=cuda --grpo-set problem.dtype=bfloat16 \
  --grpo-set grpo.use_vllm=true --grpo-set grpo.vllm_mode=colocate \
  --out "${OUT:-benchmark-results/rl-gpu}" --json "${OUT:-benchmark-results/rl-gpu}/raw.json" \
  "$@"
