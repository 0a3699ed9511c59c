#!/usr/bin/env bash
# One device call refreshes the GPU evidence. STAGES picks what runs (default: all), in order:
#   tests    every @pytest.mark.cuda test but the source reducer's and test_nan.py's (4 workers)
#   source_tests  the source reducer's cuda tests (3 workers, one per custom-kernel case)
#   record   benchmarks/bench_record.py --device cuda
#   source   benchmarks/bench_source.py --device cuda (reprocut vs shrinkray on the GPU cases)
#   corpus   benchmarks/run_corpus.py --device cuda
#   shrink   benchmarks/bench_shrink.py --device cuda
#   pipeline benchmarks/bench_pipeline.py --device cuda (crash to verified repro, per phase;
#            not in the default list: it wants the machine to itself, run it alone, ~6 min)
#   nan      the NaN/inf origin cuda tests (nan_tests: tests/test_nan.py and
#            tests/test_nan_flags.py -m cuda), then
#            benchmarks/bench_nan.py (nan_bench)
#   ranks    torchrun jobs: tests/test_ranks_cuda.py (2 ranks sharing the GPU over gloo, the two
#            jobs side by side, each maybe run twice: a rank that dies before reporting has the
#            job rerun; NCCL one GPU per rank where there are 2+ GPUs); ~2 min, at most 5.5
#   speed    issue #11: what each source-reduction check costs on the GPU cases (one at a time,
#            torch-only server vs preloaded imports + candidates side by side); not in the
#            default list: STAGES=speed, about 7 minutes (SPEED_CONFIGS=parallel: about 4)
#   faults   issues #11, #23 (~6 min, at most FAULTS_LIMIT): the memcheck, agreement, localization and facts cuda tests
#            beside benchmarks/bench_faults.py: record + shrink at its default settings of the 11
#            memory-fault and custom-op corpus cases (all recorded first, FAULTS_RECORD_JOBS=3 at
#            once, then shrunk FAULTS_JOBS=3 at once; FAULTS_JOBS=1: each shrink alone): verified, same bug
#            (memcheck fingerprints), time; FAULTS_GENERIC=1 adds the generic reducer after each
#            shrink on the same limit; faults-cuda.md/.json and faults-cuda-repros/, and
#            logs/faults/check-summary.md (each shrink's checks pass by pass, check_log_summary.py)
#            and logs/faults/rule-audit.md (the static rules against the checks' verdicts);
#            shrinkray comes from $SHRINKRAY, PATH, or the wheels
#            carried in .whl/shrinkray (installed into a virtual environment of its own)
#   compile  issue #25: the compiled-model corpus case (corpus/compile/compile_embedding_vocab)
#            recorded with --shrink on the GPU: the Inductor Triton kernel's device-side assert,
#            the verdict (fails eagerly too) and the verified eager repro; compile-cuda.json;
#            about 1-2 min, at most COMPILE_LIMIT
#   profile  issue #14: benchmarks/profile_record.py --device cuda (plain, record, record --nan on
#            the launch-bound loop, 3 rounds, then one profiled run of each; ~2 min, at most
#            PROFILE_LIMIT); not in the default list: STAGES=profile
#   memory   issues #24, #31: the memory cuda tests (allocator snapshot, cuBLAS workspace;
#            ~20 s), then benchmarks/bench_memory.py --device cuda: the 9 corpus/memory OOM
#            cases recorded one at a time (report within the first run + rerun + 30 s and the
#            case's bound_s, op, step, phase, line, request, why, holders within 5 % of the
#            allocator and agreeing with the error, leak only where there is one, the variable
#            holding the memory, picture, snapshot, fragmentation) and each one's report.md
#            (op-level repros on torch.empty inputs verified; held ones exit 9 with report.md);
#            no case starts after MEMORY_BUDGET (330) s, all in MEMORY_LIMIT (420) s;
#            MEMORY_CASES: some cases only; MEMORY_OVERHEAD=1 adds record's overhead; about
#            7 minutes (9 cases of 25-75 s each), at most 8: STAGES=memory
#   docs     issue #32: the docs' GPU examples (the bash blocks marked "# needs a GPU": a device
#            assert on CUDA, the Triton memory fault with shrink and sanitize, the triton_op
#            custom op), run as the docs show them, side by side (tests/test_docs.py -m cuda);
#            ~3 min, at most DOCS_LIMIT; not in the default list: STAGES=docs
#   start    benchmarks/cuda_start_probe.py: a check process's context start, kernel and
#            teardown, START_WIDTHS (1,8) at once, default vs START_ENV; ~1 min: STAGES=start
#   timing   the probe of benchmarks/check_timing.py: CUDA checks a second with TIMING_WIDTHS
#            (1,2,4,8,16) oracles at once, TIMING_COUNT (6) each; ~2 min: STAGES=timing
#   stall    benchmarks/fault_stall_probe.py: whether one process's fault storm (forked, fresh,
#            under memcheck) or clean GPU work holds up small faulting checks beside it; at
#            most STALL_LIMIT (240 s): STAGES=stall; STALL_ARGS=--watch watches a real case's
#            plain run and memchecks to their end (fault-stall-watch.md)
# Stages run one after another, or all at once with PARALLEL=1; PACK=1 packs $OUT into one archive. Every part has its own timeout
# (*_LIMIT, seconds). Result files go to $OUT (default benchmarks/results) under their current
# names (faults-cuda.md, corpus-cuda.md, ...: the date is inside), overwriting the last run's;
# logs go to $OUT/logs (cuda-tests.log, source-cuda-tests.log, faults-cuda-tests.log,
# nan-cuda-tests.log, ranks-cuda-tests.log, one per benchmark); benchmarks/results/gpu-tests.md
# sums up the test logs.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
LOGS=$OUT/logs
STAGES=${STAGES:-tests source_tests record source corpus shrink nan ranks compile}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
# the commit this tree is (the device copy's git metadata is stale): .whl/COMMIT, written by the caller
[ -f .whl/COMMIT ] && export REPROCUT_COMMIT=$(cat .whl/COMMIT)

# what else runs, before the stages and after them (logs/processes-start.txt, -end.txt): a
# process left by an earlier call on a warm machine, or by this one, slows or stalls what follows
processes() {
    { date -u; ps -eo pid,ppid,etimes,pcpu,rss,args --sort=-pcpu | cut -c1-200 | head -40
      nvidia-smi --query-compute-apps=pid,used_memory,process_name --format=csv 2>/dev/null
      ls -la "${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"/*/*/lock 2>/dev/null
    } > "$LOGS/processes-$1.txt" 2>&1
}
processes start

stage_tests() {
    timeout -k 10 "${TESTS_LIMIT:-330}" python3 -m pytest -v -p no:cacheprovider -m cuda -n 4 \
        --timeout 240 --ignore tests/test_source_reducer.py --ignore tests/test_nan.py \
        --ignore tests/test_nan_flags.py \
        --ignore tests/test_ranks_cuda.py --ignore tests/test_compile.py \
        --ignore tests/test_docs.py ${TESTS:-tests/} >"$LOGS/cuda-tests.log" 2>&1
    echo "pytest exit $?" >>"$LOGS/cuda-tests.log"
    grep -hE "PASSED|FAILED|ERROR|passed|failed|exit" "$LOGS/cuda-tests.log"
}

stage_source_tests() {
    timeout -k 10 "${SOURCE_TESTS_LIMIT:-540}" python3 -m pytest -v -p no:cacheprovider -m cuda \
        -n 3 --timeout 530 tests/test_source_reducer.py >"$LOGS/source-cuda-tests.log" 2>&1
    echo "pytest exit $?" >>"$LOGS/source-cuda-tests.log"
    grep -hE "PASSED|FAILED|ERROR|passed|failed|exit" "$LOGS/source-cuda-tests.log"
}

stage_record() {
    timeout -k 10 "${RECORD_LIMIT:-300}" python3 benchmarks/bench_record.py --device cuda \
        --repeats "${RECORD_REPEATS:-2}" --out "$OUT" >"$LOGS/bench_record.log" 2>&1
    echo "bench_record exit $?" >>"$LOGS/bench_record.log"
    tail -25 "$LOGS/bench_record.log"
}

stage_profile() {
    timeout -k 10 "${PROFILE_LIMIT:-300}" python3 benchmarks/profile_record.py --device cuda \
        --rounds "${PROFILE_ROUNDS:-3}" --out "$OUT/profile-record-cuda.md" \
        >"$LOGS/profile_record.log" 2>&1
    echo "profile_record exit $?" >>"$LOGS/profile_record.log"
    head -12 "$OUT/profile-record-cuda.md" 2>/dev/null || tail -5 "$LOGS/profile_record.log"
}

stage_source() {
    # one process per GPU case, side by side (reprocut's reducer to its fixed point, shrinkray
    # SOURCE_MAX_TIME per case; SOURCE_CLI=1 adds `reprocut record` + `shrink --source` rows)
    local name
    for name in ${SOURCE_CASES:-cuda_triton_expand_bias cuda_cupy_misaligned_vec4 cuda_cupy_contiguous_pe}; do
        timeout -k 10 "${SOURCE_LIMIT:-560}" python3 benchmarks/bench_source.py --device cuda \
            --max-time "${SOURCE_MAX_TIME:-120}" --timeout 60 --cases "$name" \
            $([ -z "${SOURCE_CLI:-}" ] && echo --no-cli) \
            --out "$LOGS/source-cuda-$name.md" >"$LOGS/bench_source-$name.log" 2>&1 &
    done
    wait
    # source-cuda.md: the per-case tables, one after another
    cat "$LOGS"/source-cuda-*.md >"$OUT/source-cuda.md"
    grep -hE "^\| cuda" "$OUT/source-cuda.md"
}

stage_corpus() {
    # CORPUS_CASES: name parts to run (a partial run, tagged "partial": merge it with --merge)
    timeout -k 10 "${CORPUS_LIMIT:-380}" python3 benchmarks/run_corpus.py --device cuda --jobs "${CORPUS_JOBS:-6}" \
        --timeout "${CORPUS_TIMEOUT:-200}" --out "$OUT" \
        ${CORPUS_CASES:+--cases $CORPUS_CASES --tag partial} >"$LOGS/corpus.log" 2>&1
    echo "corpus exit $?" >>"$LOGS/corpus.log"
    tail -4 "$LOGS/corpus.log"  # the last: facts checked, false facts found
}

stage_shrink() {
    timeout -k 10 "${SHRINK_LIMIT:-110}" python3 benchmarks/bench_shrink.py --device cuda \
        --repeats 5 --max-time 20 --out "$OUT/shrink-cuda.md" >"$LOGS/bench_shrink.log" 2>&1
    echo "bench_shrink exit $?" >>"$LOGS/bench_shrink.log"
    tail -3 "$LOGS/bench_shrink.log"
}

stage_pipeline() {
    # one case at a time; no case starts after PIPELINE_BUDGET s, so the stage ends within ~8 min
    timeout -k 10 "${PIPELINE_LIMIT:-470}" python3 benchmarks/bench_pipeline.py --device cuda \
        --budget "${PIPELINE_BUDGET:-330}" --timeout 120 --out "$OUT" \
        ${PIPELINE_CASES:+--cases $PIPELINE_CASES} >"$LOGS/bench_pipeline.log" 2>&1
    echo "bench_pipeline exit $?" >>"$LOGS/bench_pipeline.log"
    tail -22 "$LOGS/bench_pipeline.log"
}

stage_compile() {
    REPROCUT_COMPILE_OUT="$OUT/compile-cuda.json" timeout -k 10 "${COMPILE_LIMIT:-240}" \
        python3 -m pytest -v -rA -p no:cacheprovider -m cuda --timeout 230 tests/test_compile.py \
        >"$LOGS/compile-cuda-tests.log" 2>&1
    echo "pytest exit $?" >>"$LOGS/compile-cuda-tests.log"
    grep -hE "PASSED|FAILED|ERROR|passed|failed|exit" "$LOGS/compile-cuda-tests.log"
}

stage_docs() {
    timeout -k 10 "${DOCS_LIMIT:-420}" python3 -m pytest -v -rA -p no:cacheprovider -m cuda \
        --timeout 410 tests/test_docs.py >"$LOGS/docs-cuda-tests.log" 2>&1
    echo "pytest exit $?" >>"$LOGS/docs-cuda-tests.log"
    grep -hE "PASSED|FAILED|ERROR|passed|failed|exit" "$LOGS/docs-cuda-tests.log"
}

stage_nan_tests() {
    # the NaN/inf origin cuda tests (9 corpus cases, 3 at a time) and the per-step check's
    # reuse of pinned buffers and events (one 40-step loop)
    timeout -k 10 "${NAN_TESTS_LIMIT:-150}" python3 -m pytest -v -p no:cacheprovider -m cuda -n 3 \
        --timeout 140 tests/test_nan.py tests/test_nan_flags.py >"$LOGS/nan-cuda-tests.log" 2>&1
    echo "pytest exit $?" >>"$LOGS/nan-cuda-tests.log"
    grep -hE "PASSED|FAILED|ERROR|passed|failed|exit" "$LOGS/nan-cuda-tests.log"
}

stage_nan_bench() {
    # --nan's overhead and time to the producing op: run it with nothing else on the machine
    timeout -k 10 "${NAN_LIMIT:-210}" python3 benchmarks/bench_nan.py --device cuda \
        --repeats "${NAN_REPEATS:-1}" --out "$OUT" >"$LOGS/bench_nan.log" 2>&1
    echo "bench_nan exit $?" >>"$LOGS/bench_nan.log"
    tail -22 "$LOGS/bench_nan.log"
}

stage_nan() {
    stage_nan_tests
    stage_nan_bench
}

stage_ranks() {
    # the two gloo jobs run side by side on the one GPU (the fixture); -rA: their progress lines
    timeout -k 10 "${RANKS_LIMIT:-330}" python3 -m pytest -v -rA -p no:cacheprovider -m cuda \
        --timeout 300 tests/test_ranks_cuda.py >"$LOGS/ranks-cuda-tests.log" 2>&1
    echo "pytest exit $?" >>"$LOGS/ranks-cuda-tests.log"
    grep -hE "PASSED|FAILED|ERROR|SKIPPED|passed|failed|exit" "$LOGS/ranks-cuda-tests.log"
}

install_shrinkray() {
    # the generic reducer for bench_faults.py, in an environment of its own, so its rich and
    # libcst do not replace the ones reprocut runs on; nothing when it is there or not carried
    if [ -n "${SHRINKRAY:-}" ] || command -v shrinkray >/dev/null || [ ! -d .whl/shrinkray ]; then
        return 0
    fi
    local log="$LOGS/shrinkray_install.log" venv=/tmp/reprocut-shrinkray
    if python3 -m venv "$venv" >>"$log" 2>&1 &&
        "$venv/bin/pip" install -q --no-index --find-links .whl/shrinkray shrinkray >>"$log" 2>&1; then
        export SHRINKRAY="$venv/bin/shrinkray"
    elif python3 -m pip install -q --no-index --find-links .whl/shrinkray --target "$venv-lib" \
        shrinkray >>"$log" 2>&1; then  # no venv module: a folder of its own and a launcher
        printf '#!/bin/sh\nPYTHONPATH=%s exec python3 -m shrinkray "$@"\n' "$venv-lib" >"$venv-run"
        chmod +x "$venv-run"
        export SHRINKRAY="$venv-run"
    fi
    echo "shrinkray: ${SHRINKRAY:-not installed}" >>"$log"
}

stage_speed() {
    timeout -k 10 "${SPEED_LIMIT:-480}" python3 benchmarks/bench_source_speed.py --device cuda \
        --configs ${SPEED_CONFIGS:-sequential parallel} --jobs "${SPEED_JOBS:-3}" \
        --parallel "${SPEED_PARALLEL:-4}" --max-time "${SPEED_MAX_TIME:-90}" --timeout 60 \
        --cases ${SPEED_CASES:-cuda_triton_expand_bias cuda_cupy_misaligned_vec4 cuda_cupy_contiguous_pe cuda_triton_int32_offsets cuda_cupy_hashed_ids cuda_cublas_transposed_keys} \
        --out "$OUT/source-speed-cuda.md" >"$LOGS/bench_source_speed.log" 2>&1
    echo "bench_source_speed exit $?" >>"$LOGS/bench_source_speed.log"
    grep -hE "^\| cuda|exit" "$OUT/source-speed-cuda.md" "$LOGS/bench_source_speed.log"
}

stage_memory() {
    # the allocator-snapshot cuda tests first (seconds), then the OOM cases one at a time: no
    # case starts after MEMORY_BUDGET s: about 7 minutes in all, at most 8
    timeout -k 10 60 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_memory.py \
        tests/test_oom_report.py >"$LOGS/memory-cuda-tests.log" 2>&1
    echo "pytest exit $?" >>"$LOGS/memory-cuda-tests.log"
    timeout -k 10 "${MEMORY_LIMIT:-420}" python3 benchmarks/bench_memory.py --device cuda \
        --budget "${MEMORY_BUDGET:-330}" --timeout 150 --out "$OUT" \
        ${MEMORY_CASES:+--cases $MEMORY_CASES} ${MEMORY_OVERHEAD:+--overhead} \
        >"$LOGS/bench_memory.log" 2>&1
    echo "bench_memory exit $?" >>"$LOGS/bench_memory.log"
    tail -n 3 "$LOGS/memory-cuda-tests.log"
    grep -hE "^\| |ok=|exit" "$LOGS/bench_memory.log"
}

stage_timing() {
    # how many CUDA checks a second the machine runs with 1..16 at once (check_timing's probe)
    timeout -k 10 "${TIMING_LIMIT:-240}" python3 benchmarks/check_timing.py \
        --together "${TIMING_WIDTHS:-1,2,4,8,16}" --count "${TIMING_COUNT:-6}" \
        --out "$OUT/timing" >"$LOGS/check_timing.log" 2>&1
    echo "check_timing exit $?" >>"$LOGS/check_timing.log"
    tail -12 "$LOGS/check_timing.log"
}

stage_start() {
    # what a check's process costs (context start, kernel, teardown) with START_WIDTHS at once,
    # by default and under START_ENV settings (benchmarks/cuda_start_probe.py); ~1 min
    timeout -k 10 "${START_LIMIT:-150}" python3 benchmarks/cuda_start_probe.py \
        --together "${START_WIDTHS:-1,8}" --count "${START_COUNT:-3}" \
        --env "${START_ENV:-CUDA_DEVICE_MAX_CONNECTIONS=1}" \
        --out "$OUT/start" >"$LOGS/cuda_start_probe.log" 2>&1
    echo "cuda_start_probe exit $?" >>"$LOGS/cuda_start_probe.log"
    tail -12 "$LOGS/cuda_start_probe.log"
}

stage_stall() {
    # do faults hold each other up across processes (benchmarks/fault_stall_probe.py)
    # shellcheck disable=SC2086
    timeout -k 10 "${STALL_LIMIT:-240}" python3 benchmarks/fault_stall_probe.py ${STALL_ARGS:-} \
        --out "$OUT/stall" >"$LOGS/fault_stall_probe.log" 2>&1
    echo "fault_stall_probe exit $?" >>"$LOGS/fault_stall_probe.log"
    tail -12 "$LOGS/fault_stall_probe.log"
}

stage_faults() {
    # not in the default STAGES: run it with STAGES=faults, alone (reductions run to their fixed
    # point: at most FAULTS_LIMIT, 9.5 min). 2026-12-04 at 3211a85: the eight cases of
    # faults-cuda.md, FAULTS_JOBS=4, in 259-274 s; the other three (int32_offsets, gnn, pad_rows)
    # took a call of their own (efa25f0: 3 at once, pad_rows past 340 s)
    install_shrinkray
    # FAULTS_TESTS=0: the shrinks alone on the machine (the tests take it for their first minutes)
    local tests=""
    if [ "${FAULTS_TESTS:-1}" = 1 ]; then
        timeout -k 10 "${FAULTS_TESTS_LIMIT:-300}" python3 -m pytest -v -p no:cacheprovider -m cuda -n 2 \
            --timeout 240 tests/test_sanitizer.py tests/test_agreement.py tests/test_localize_cuda.py \
            tests/test_facts.py >"$LOGS/faults-cuda-tests.log" 2>&1 &
        tests=$!
    fi
    # shrink at its default settings (FAULTS_MAX_TIME: a limit instead), no generic reducer
    # unless FAULTS_GENERIC=1: 11 memory-fault and custom-op cases, FAULTS_JOBS at once
    timeout -k 10 "${FAULTS_LIMIT:-560}" python3 benchmarks/bench_faults.py --device cuda \
        --jobs "${FAULTS_JOBS:-3}" --record-jobs "${FAULTS_RECORD_JOBS:-3}" ${FAULTS_MAX_TIME:+--max-time $FAULTS_MAX_TIME} --check-timeout 30 \
        --record-timeout 150 --tail 150 --out "$OUT" --logs "$LOGS/faults" ${FAULTS_CASES:+--cases $FAULTS_CASES} \
        $([ "${FAULTS_GENERIC:-0}" = 1 ] || echo --no-generic) >"$LOGS/bench_faults.log" 2>&1
    echo "bench_faults exit $?" >>"$LOGS/bench_faults.log"
    # where each shrink's checks went, pass by pass (benchmarks/check_log_summary.py)
    ls "$LOGS"/faults/*.shrink.checks.jsonl >/dev/null 2>&1 && python3 benchmarks/check_log_summary.py \
        "$LOGS"/faults/*.shrink.checks.jsonl >"$LOGS/faults/check-summary.md" 2>&1
    # this checkout's static rules against the device's verdicts (benchmarks/rule_audit.py)
    ls "$LOGS"/faults/*.shrink.checks.jsonl >/dev/null 2>&1 && python3 benchmarks/rule_audit.py \
        "$LOGS"/faults/*.shrink.checks.jsonl >"$LOGS/faults/rule-audit.md" 2>&1
    if [ -n "$tests" ]; then
        wait "$tests"
        echo "pytest exit $?" >>"$LOGS/faults-cuda-tests.log"
        grep -hE "PASSED|FAILED|ERROR|SKIPPED|passed|failed|exit" "$LOGS/faults-cuda-tests.log"
    fi
    grep -hE "^\| |Median|exit" "$LOGS/bench_faults.log" | tail -14
}

for stage in $STAGES; do
    echo "== $stage $(date -u +%H:%M:%S)"
    "stage_$stage" &
    [ -n "${PARALLEL:-}" ] || wait
done
wait
processes end

# PACK=1: everything under $OUT in one archive, $OUT/gpu-batch.tgz (a device call brings back
# at most 8 files: the faults stage alone writes 6 per case, and its logs came back last)
if [ -n "${PACK:-}" ]; then
    packed=$(mktemp -d)
    tar czf "$packed/gpu-batch.tgz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "$packed/gpu-batch.tgz" "$OUT/"
    echo "packed: $OUT/gpu-batch.tgz (tar xzf it into benchmarks/results)"
fi
