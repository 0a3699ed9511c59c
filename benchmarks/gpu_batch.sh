#!/usr/bin/env bash
# One device call refreshes the GPU evidence: every @pytest.mark.cuda test (4 workers) and the
# corpus on CUDA side by side, then the shrink benchmark. Every part has its own timeout; logs
# and result files go to $OUT (or benchmarks/results/logs).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/logs}
mkdir -p "$OUT"
(
    timeout -k 10 "${TESTS_LIMIT:-330}" python3 -m pytest -v -p no:cacheprovider -m cuda -n 4 \
        --timeout 240 tests/ >"$OUT/gpu_tests.log" 2>&1
    echo "pytest exit $?" >>"$OUT/gpu_tests.log"
) &
timeout -k 10 "${CORPUS_LIMIT:-380}" python3 benchmarks/run_corpus.py --device cuda --jobs 6 \
    --timeout 200 --out "$OUT" >"$OUT/corpus.log" 2>&1
echo "corpus exit $?" >>"$OUT/corpus.log"
wait
timeout -k 10 "${SHRINK_LIMIT:-110}" python3 benchmarks/bench_shrink.py --device cuda --repeats 5 \
    --max-time 20 --out "$OUT/shrink-cuda.md" >"$OUT/bench_shrink.log" 2>&1
echo "bench_shrink exit $?" >>"$OUT/bench_shrink.log"
grep -E "PASSED|FAILED|ERROR|passed|failed|exit" "$OUT/gpu_tests.log" | tail -40
tail -3 "$OUT/corpus.log" "$OUT/bench_shrink.log"
