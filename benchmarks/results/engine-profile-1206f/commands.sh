# 2026-12-06, 22:39-22:58 UTC, AMD EPYC (2 cores), commit 4b8b299, nothing else running.
# In-process (engine core and worker in one process), compiled, float32, 16 prompts x 96 tokens.
for m in k0 adaptive k0 adaptive; do
  echo "== $m"; python -m benchmarks.engine_profile $m --compiled --repeats 3
done                                      # -> k0-vs-adaptive.txt
for k in 2 4; do
  echo "== fixed k$k"; python -m benchmarks.engine_profile fixed --k $k --batch 16 --compiled --repeats 2
done                                      # -> fixed-k2-k4.txt
# 23:37-23:42 UTC, the same machine and code:
python -m benchmarks.engine_profile fixed --k 3 --batch 1 --compiled --repeats 3
python -m benchmarks.engine_profile plain --batch 1 --compiled --repeats 2   # -> one-request-k3-vs-plain.txt
