#!/usr/bin/env bash
# TPU side: run the listed test paths (default: the whole suite) in one pytest process, going on
# from what earlier calls ran, stopping cleanly SECONDS from now (before the call's time limit).
#   source .tpu/env.sh; bash .tpu/suite/suite_run.sh TAG SECONDS [pytest args and paths...]
#   bash .tpu/suite/suite_run.sh restore    # unpack a carried .tpu/t3 (compile cache) into /tmp/t3
# The list of tests already run travels: .tpu/suite/done.txt in (with .tpu/suite), $OUT/done.txt
# back (copy it to .tpu/suite/done.txt on the workstation); it is written as tests finish, so a
# cut call loses nothing. Logs and junit go to $OUT/TAG.log and $OUT/TAG.xml.
# Compiles dominate a TPU run, so the suite fills a tier-3 cache in /tmp/t3; with SUITE_T3_BACK=1 its largest
# entries (the slowest compiles, roughly) come back at the end as $OUT/t3.tgz.NN (at most 4 parts of 15 MiB):
# put them in .tpu/t3/ and carry that folder, alone, with `suite_run.sh restore` on a fresh host.
set -uo pipefail
T3=/tmp/t3
if [ "${1:-}" = restore ]; then
  ls .tpu/t3/t3.tgz.* >/dev/null 2>&1 || { echo "no .tpu/t3 parts"; exit 1; }
  mkdir -p "$T3" && cat .tpu/t3/t3.tgz.* | tar xz -C "$T3" && echo "restored $(find "$T3" -type f | wc -l) cache entries"
  exit 0
fi
tag=$1; secs=$2; shift 2
touch "$OUT/done.txt"; [ -e .tpu/suite/done.txt ] && cp .tpu/suite/done.txt "$OUT/done.txt"
touch "$OUT/outcomes.txt"; [ -e .tpu/suite/outcomes.txt ] && cp .tpu/suite/outcomes.txt "$OUT/outcomes.txt"
# SUITE_T3_BACK=1: ~40 s are kept at the end for packing the compile cache to send back. Off by default: the
# pinned suite never runs a test twice, and after it /tmp/t3 holds ~600 MB, which verify's runs would tar
# again after each of its lines
t3_back=${SUITE_T3_BACK:-0}
pytest_secs=$(( secs - (t3_back == 1 ? 40 : 5) ))
export TPU_SUITE_DONE="$OUT/done.txt" TPU_SUITE_OUTCOMES="$OUT/outcomes.txt" TPU_SUITE_DEADLINE=$(( $(date +%s) + pytest_secs ))
export PYTHONPATH="$PWD/.tpu/suite:${PYTHONPATH:-}"
export TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT="${TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT:-$T3}"
# pytest stops starting tests near the deadline, but a test already in a long XLA compile (C++, where
# pytest-timeout's signal waits) can run past it, and the call's limit then took every result with it:
# killed at the deadline, it loses only the test in progress (not in done.txt, so the next call runs it)
# the host's memory: in the 30th session one test of `steps.sh changed` filled the host's 40 GiB, and the device
# tool gave the machine back with nothing of the call (its install gone too). Below SUITE_MEM_FLOOR_MB of available
# memory the watchdog records the test running (failed, in outcomes and done, so the next call goes on past it)
# and the largest processes in $OUT/memory.txt, then kills pytest (SUITE_MEMINFO: another meminfo file, for its test)
export TPU_SUITE_CURRENT="$OUT/current.txt"; rm -f "$TPU_SUITE_CURRENT"
mem_lines=$(cat "$OUT/memory.txt" 2>/dev/null | wc -l)  # (a step's earlier runs share $OUT: this run's lines only)
floor_kb=$(( ${SUITE_MEM_FLOOR_MB:-6144} * 1024 ))
timeout -s KILL "$pytest_secs" python3 -m pytest -p suite_resume -p pytest_timeout --timeout 300 -q -rfEs \
  -p no:cacheprovider --junitxml "$OUT/$tag.xml" "${@:-tests}" > "$OUT/$tag.log" 2>&1 &
run=$!
(
  while sleep 1; do
    avail=$(awk '/^MemAvailable:/ {print $2}' "${SUITE_MEMINFO:-/proc/meminfo}")
    [ "$avail" -ge "$floor_kb" ] && continue
    test_id=$(cat "$TPU_SUITE_CURRENT" 2>/dev/null)
    { echo "memory: $((avail / 1024)) MiB available, below the floor; killed pytest in ${test_id:-?}"
      ps -eo rss,pid,args --sort=-rss | head -6; } >> "$OUT/memory.txt"
    if [ -n "$test_id" ]; then echo "$test_id" >> "$OUT/done.txt"; echo "failed $test_id" >> "$OUT/outcomes.txt"; fi
    # this run's pytest only (by its parent, timeout): a suite_run.sh inside a test of an outer one (its
    # own test) killed the outer pytest too when it matched by command line
    pkill -KILL -P "$run"; exit 0
  done
) &
watchdog=$!
wait "$run"; status=$?
kill $watchdog 2>/dev/null
grep -v PASSED "$OUT/$tag.log" | tail -120
if [ "$(cat "$OUT/memory.txt" 2>/dev/null | wc -l)" -gt "$mem_lines" ]; then tail -n +$((mem_lines + 1)) "$OUT/memory.txt"
elif [ "$status" = 137 ]; then echo "pytest killed at the deadline; the test it was running runs again next call"; fi
echo "done so far: $(wc -l < "$OUT/done.txt"); outcomes: $(awk '{o[$2] = $1} END {for (t in o) n[o[t]]++; for (k in n) printf "%s %d  ", k, n[k]}' "$OUT/outcomes.txt")"
# the largest cache entries, as many as fit 4 parts of 15 MiB compressed
if [ "$t3_back" = 1 ] && [ -d "$T3" ]; then
  budget=$((240 * 1024 * 1024))
  while :; do
    find "$T3" -type f -printf '%s %P\n' | sort -rn | awk -v b="$budget" '{s += $1; if (s > b) exit; print $2}' > /tmp/t3.list
    tar czf /tmp/t3.tgz -C "$T3" -T /tmp/t3.list
    [ "$(stat -c %s /tmp/t3.tgz)" -le $((60 * 1024 * 1024)) ] && break
    budget=$((budget / 2))
  done
  rm -f "$OUT"/t3.tgz.*; split -b 15m -d /tmp/t3.tgz "$OUT/t3.tgz."
  echo "tier 3: $(find "$T3" -type f | wc -l) entries, $(du -sh "$T3" | cut -f1); $(wc -l < /tmp/t3.list) largest sent back ($(du -h /tmp/t3.tgz | cut -f1))"
fi
