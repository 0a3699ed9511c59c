#!/usr/bin/env bash
# Refresh every GPU figure in one command: the corpus table on CUDA, then the record and shrink
# benchmarks when their scripts exist. Each part runs under its own timeout. Result files go to
# benchmarks/results/ under their current names (corpus-<device>.md/.json, record-<device>.md/.json,
# shrink-<device>.md, truth-<device>.md: the date is inside), overwriting the last run's; logs (and
# copies of every result file) go to $OUT when it is set, else logs to benchmarks/results/logs/.
#
#   benchmarks/run_all.sh                    # corpus + record + shrink on cuda
#   benchmarks/run_all.sh corpus             # just the corpus table
#   benchmarks/run_all.sh truth              # ground truth without reprocut (flip verified=false)
#   CASES="cuda_ gnn" TAG=part1 benchmarks/run_all.sh corpus    # a subset: corpus-<device>-part1.*
#
# Env: DEVICE (cuda), JOBS (corpus cases at once, 3), CASES (name filters), TAG (result suffix),
#      TIMEOUT_CORPUS (560 s: the device allows 600 s a command; the table is rewritten after every case, so a cut run still leaves one), TIMEOUT_RECORD (900 s), TIMEOUT_SHRINK (900 s), NO_SHRINK=1.
set -u
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
LOG_DIR=${OUT:-benchmarks/results/logs}
mkdir -p "$LOG_DIR"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(corpus record shrink)
status=0

run_part() {
    local name=$1 limit=$2
    shift 2
    echo "== $name: $* (limit ${limit}s)"
    local start=$SECONDS
    timeout -k 15 "$limit" "$@" >"$LOG_DIR/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - start))s (log: $LOG_DIR/$name.log)"
    tail -n 8 "$LOG_DIR/$name.log"
    [ "$rc" -ne 0 ] && status=1
    return 0
}

for part in "${parts[@]}"; do
    case $part in
    corpus)
        args=(--device "$DEVICE" --jobs "${JOBS:-3}" --timeout 240)
        [ -n "${CASES:-}" ] && args+=(--cases ${CASES})
        [ -n "${TAG:-}" ] && args+=(--tag "$TAG")
        [ -n "${NO_SHRINK:-}" ] && args+=(--no-shrink)
        run_part corpus "${TIMEOUT_CORPUS:-560}" python benchmarks/run_corpus.py "${args[@]}"
        ;;
    truth)
        run_part truth "${TIMEOUT_TRUTH:-560}" python benchmarks/check_truth.py --device "$DEVICE" --jobs "${JOBS:-3}"
        ;;
    record)
        if [ -f benchmarks/bench_record.py ]; then
            run_part bench_record "${TIMEOUT_RECORD:-900}" python benchmarks/bench_record.py --device "$DEVICE"
        else
            echo "== record: benchmarks/bench_record.py not present, skipped"
        fi
        ;;
    shrink)
        if [ -f benchmarks/bench_shrink.py ]; then
            run_part bench_shrink "${TIMEOUT_SHRINK:-900}" python benchmarks/bench_shrink.py --device "$DEVICE"
        else
            echo "== shrink: benchmarks/bench_shrink.py not present, skipped"
        fi
        ;;
    *)
        echo "unknown part '$part' (truth, corpus, record, shrink)" >&2
        status=2
        ;;
    esac
done

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/results"
    cp benchmarks/results/*.md benchmarks/results/*.json "$OUT/results/" 2>/dev/null || true
fi
exit $status
