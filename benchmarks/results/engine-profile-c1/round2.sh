#!/bin/bash
cd /work/main
for rep in 1 2; do
  for off in 8 11; do
    for mode in "fixed --k 3" "adaptive --k 3" "adaptive --k 7"; do
      tag=$(echo "$mode" | tr -d ' -')
      timeout 300 .venv/bin/python -m benchmarks.engine_profile $mode --batch 1 --repeats 3 --offset $off 2>/dev/null \
        | grep '^{' | sed "s/^{/{\"offset\": $off, \"proc\": $rep, \"tag\": \"$tag\", /" >> runs/prof-ab/rows2.jsonl
      echo "$(date +%T) rep $rep off $off $tag done"
    done
  done
done
