#!/bin/bash
# In-process batch-1 A/B, alternating configurations and prompts, two processes each:
#   round 1: bash ab.sh "0 8 3 11" round1.jsonl "fixed --k 3" "adaptive" "fixed --k 7"
#   round 2: bash ab.sh "8 11" round2.jsonl "fixed --k 3" "adaptive --k 3" "adaptive --k 7"
# rounds 3 and 4 ran the same loop with VLLM_ENABLE_V1_MULTIPROCESSING set per row ("mp": 0 or
# 1; round 3 with 1 only) over "0 8" and "fixed --k 3" "adaptive", three processes in round 4
# (run from the repository root; each row gains offset, proc and tag fields)
offsets=$1; out=$2; shift 2
for rep in 1 2; do
  for off in $offsets; do
    for mode in "$@"; do
      tag=$(echo "$mode" | tr -d ' -')
      timeout 300 .venv/bin/python -m benchmarks.engine_profile $mode --batch 1 --repeats 3 \
        --offset "$off" 2>/dev/null | grep '^{' \
        | sed "s/^{/{\"offset\": $off, \"proc\": $rep, \"tag\": \"$tag\", /" >> "$out"
      echo "$(date +%T) rep $rep off $off $tag done"
    done
  done
done
