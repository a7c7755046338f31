#!/usr/bin/env bash
# Co-evolution on AHD with a code-capable local model on one GPU (issue 30, part 5): the ahd
# suite's grid (parameters only, contexts only, both; bin packing and TSP x sizes x seeds) at
# equal GPU-minutes (wall seconds of one GPU), generation by esbox's vLLM backend, replies long
# enough for a real heuristic. Not run in CI; not run by the session that wrote it (no GPU was
# available): no result yet.
#
#   MODEL=/models/Qwen2.5-Coder-1.5B-Instruct MINUTES=15 bash benchmarks/ahd_gpu.sh
#
# Needs: pip install -e '.[vllm]' on a CUDA machine (no -c constraints/cpu.txt), bubblewrap for
# the sandbox (docs/agents.md, "Sandbox"), and the model as a local Hugging Face folder
# (nothing is downloaded). The protocol is the CPU suite's (docs/ahd.md, "Co-evolution").
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?set MODEL to a local model folder}"
MINUTES="${MINUTES:-15}"
OUT="${OUT:-benchmark-results/ahd-gpu}"
python -m benchmarks ahd \
  --binpacking "${BINPACKING:-100,250}" --tsp "${TSP:-30,50}" --seeds "${SEEDS:-2}" \
  --model "$MODEL" --clock wall --cpu-minutes "$MINUTES" --heldout "${HELDOUT:-32}" --jobs 1 \
  --set problem.backend=vllm --set problem.dtype=bfloat16 \
  --set problem.max_new_tokens=512 --set problem.proposer_max_new_tokens=512 \
  --set options.population=16 --set problem.batch_size=8 \
  --out "$OUT" --json "$OUT/raw.json" "$@"
