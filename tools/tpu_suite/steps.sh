#!/usr/bin/env bash
# TPU side: one step of a round, ending SECONDS from now, after .tpu/on_tpu.sh and source .tpu/env.sh:
#   bash tools/tpu_suite/steps.sh suite SECONDS [pytest args]   # e.g. -m "not slow" tests/test_ops.py
#   bash tools/tpu_suite/steps.sh demo|fresh|verify|changed|profile|execute|jax|devprof|examples|exsteps|timeline|resnet SECONDS
#   bash tools/tpu_suite/steps.sh bench SECONDS demo|decode|big|warm|flash
#   bash tools/tpu_suite/steps.sh conf SECONDS N K [THREADS]  # conformance parts K..N of N (or a list K1,K2-K3), threaded
# Results come back in $OUT/STEP.tgz; the list of tests run stays in /tmp/done.txt while the host is warm.
# A call brings back at most 8 files from $OUT (more are dropped: the twelfth round lost four
# conformance parts that way), so a step writes under a work folder and leaves in $OUT only
# STEP.tgz of it, plus the tier-3 cache parts. Give SECONDS at least 20 below the call's limit.
set -uo pipefail
step=$1; secs=$2; end=$(( $(date +%s) + secs - 10 ))  # the last 10 s pack the results
left() { echo $(( end - $(date +%s) )); }
RETURN=$OUT; OUT=/tmp/round/$step; rm -rf "$OUT"; mkdir -p "$OUT"; export OUT
pack() {
  mv "$OUT"/t3.tgz.* "$RETURN"/ 2>/dev/null
  tar czf "$RETURN/$step.tgz" -C "$OUT" . && echo "results: $step.tgz ($(du -h "$RETURN/$step.tgz" | cut -f1))"
}
trap 'kill $guard 2>/dev/null; pack' EXIT
# every step's memory guard (a test run has its own, suite_run.sh's, at a higher floor, which names the test): a
# host out of memory is given back by the device tool with nothing of the call. Below STEP_MEM_FLOOR_MB available,
# the step's processes running then are killed and memory.txt says which were largest
descendants() { local c; for c in $(ps -o pid= --ppid "$1"); do echo "$c"; descendants "$c"; done; }
(
  me=$BASHPID; floor_kb=$(( ${STEP_MEM_FLOOR_MB:-3072} * 1024 ))
  while sleep 2; do
    avail=$(awk '/^MemAvailable:/ {print $2}' "${SUITE_MEMINFO:-/proc/meminfo}")
    [ "$avail" -ge "$floor_kb" ] && continue
    { echo "step memory guard: $((avail / 1024)) MiB available; killed the step's processes"
      ps -eo rss,pid,args --sort=-rss | head -6; } >> "$OUT/memory.txt"
    kill -KILL $(descendants $$ | grep -vx "$me") 2>/dev/null  # (and goes on watching: the step's next command)
  done
) &
guard=$!
quiet() { grep -v "Warning\|warn\|^WARNING\|^I0000\|^W0000\|^E0000"; }  # a probe's output without Python's warnings and libtpu's log lines
[ -e .tpu/hf.tgz ] && [ ! -e /tmp/torchtpu-site/transformers ] && tar xzf .tpu/hf.tgz -C /tmp/torchtpu-site  # pack_packages.py
# (.tpu/done_seed.txt, carried: tests run in an earlier call of this round on a host since given back)
[ -e .tpu/done_seed.txt ] && cat .tpu/done_seed.txt >> /tmp/done.txt
mkdir -p .tpu/suite && cp tools/tpu_suite/* .tpu/suite/ && touch /tmp/done.txt && cp /tmp/done.txt .tpu/suite/done.txt
python3 -c "import importlib.metadata as m; print('libtpu', m.version('libtpu'), 'jax', m.version('jax'))" 2>&1 | tee -a $OUT/versions.txt
git log -1 --format=%h 2>/dev/null | tee -a $OUT/versions.txt
case $step in
suite)  # pytest arguments follow SECONDS; with .tpu/tree.tgz carried (pin_tree.sh), in that pinned tree
  shift 2
  if [ -e .tpu/tree.tgz ]; then
    tree=/tmp/suite_tree; rm -rf $tree; mkdir -p $tree; tar xzf .tpu/tree.tgz -C $tree
    echo "pinned tree $(cat $tree/PINNED)" | tee -a $OUT/versions.txt
    mkdir -p $tree/.tpu && cp -r .tpu/suite $tree/.tpu/
    # the pinned run's own lists (a warm host's /tmp/done.txt may hold tests of another commit)
    cat .tpu/tree_done.txt /tmp/tree_done.txt 2>/dev/null | sort -u > $tree/.tpu/suite/done.txt
    cat .tpu/tree_outcomes.txt /tmp/tree_outcomes.txt 2>/dev/null > $tree/.tpu/suite/outcomes.txt
    # the tree's src first, before the checkout's (env.sh put it last); the rest of PYTHONPATH names
    # the host's JAX and libtpu: replacing it lost libtpu ("Failed to load the backend extension")
    (cd $tree && PYTHONPATH=$tree/src:$PYTHONPATH bash .tpu/suite/suite_run.sh suite $(( $(left) - 5 )) "$@")
    cp $OUT/done.txt /tmp/tree_done.txt; cp $OUT/outcomes.txt /tmp/tree_outcomes.txt
  else
    bash .tpu/suite/suite_run.sh suite $(( $(left) - 5 )) "$@"
    cp $OUT/done.txt /tmp/done.txt
  fi ;;
changed)  # at this checkout, the tests changed since the pinned suite's commit (pinned_run.txt's first line),
  # picked by tools/tpu_suite/changed_tests.py (the tests a changed line touches, and new test ids): with the
  # pinned run, the default suite as it stands now
  python3 tools/tpu_suite/changed_tests.py --why > $OUT/changed.txt || { tail -5 $OUT/changed.txt; exit 1; }
  # the fuzz tests last: the longest, and the most programs compiled in one process
  mapfile -t ids < <(cut -f1 $OUT/changed.txt | grep -v test_fuzz_as_cpu; cut -f1 $OUT/changed.txt | grep test_fuzz_as_cpu)
  echo "tests changed since $(awk 'NR == 1 {print $3}' tools/tpu_suite/pinned_run.txt): ${#ids[@]}" | tee -a $OUT/versions.txt
  if [ "${#ids[@]}" -gt 0 ]; then
    # first those that start a child process, in a pytest of their own: on a chip the child opens the chip,
    # which a process that has run other tests holds (the 30th session's changed run failed one so)
    bash .tpu/suite/suite_run.sh changed_fresh $(( $(left) - 5 )) -m fresh_process "${ids[@]}"
    cp $OUT/done.txt .tpu/suite/done.txt; cp $OUT/outcomes.txt .tpu/suite/outcomes.txt
    bash .tpu/suite/suite_run.sh changed $(( $(left) - 5 )) -m "not fresh_process" "${ids[@]}"
    cp $OUT/done.txt /tmp/done.txt
  fi ;;
demo)
  for m in strict debug defer_and_fuse; do
    [ "$(left)" -lt 70 ] && break
    timeout $(( $(left) - 10 )) python3 -m torchtpu.demo --mode $m 2>&1 | tr "\r" "\n" | grep -v "step/s" | tail -6 | tee $OUT/demo_$m.log
  done ;;
fresh)  # (tools/tpu_suite/fresh_done.txt: those that passed in earlier rounds, skipped)
  grep -v '^#' tools/tpu_suite/fresh_done.txt >> .tpu/suite/done.txt
  bash .tpu/suite/suite_run.sh fresh $(( $(left) - 5 )) -m "fresh_process and not slow" tests
  cp $OUT/done.txt /tmp/done.txt ;;
bench)  # (BENCH_ARGS: more bench/tpu.py options) SET (third argument): demo = TPUGraph replay against JAX on the demo GPT; decode; big = flash at seq 2048 and the 100M GPT; warm = warm start; flash; train100
  export TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=
  case ${3:-demo} in
  demo)
    timeout $(( $(left) - 5 )) python3 bench/tpu.py ${BENCH_ARGS:-} --only gpt_demo --modes ${BENCH_MODES:-jax_jit,compiled,compiled_graph} --timeout 100 --out $OUT/bdemo.json 2>&1 | tee $OUT/bench1.log | tail -14 ;;
  decode)  # greedy decoding at batch 1 and 8 (BENCH_ONLY: one of them): the compiled step per token, and replayed
    # from a TPUGraph (BENCH_ARGS="--pack-max-bytes 0": nothing packed, which the device-bound b8 step prefers)
    timeout $(( $(left) - 5 )) python3 bench/tpu.py ${BENCH_ARGS:-} --only ${BENCH_ONLY:-decode_b1,decode_b8} --modes ${BENCH_MODES:-jax_jit,compiled,compiled_graph,compiled_replayed} --timeout 110 --out $OUT/bdecode.json 2>&1 | tee $OUT/bench4.log | tail -14 ;;
  warm)  # the demo GPT's first step cold, then in a second process from the filled tier 3 (seconds, compiles)
    timeout $(( $(left) - 5 )) python3 bench/tpu.py ${BENCH_ARGS:-} --only warm_start --modes ${BENCH_MODES:-jax_jit,strict,defer,compiled} --timeout 120 --out $OUT/bwarm.json 2>&1 | tee $OUT/bench5.log | tail -12 ;;
  train100)  # the 100M GPT's step against JAX (BENCH_ONLY: gpt_100m, gpt_100m_bf16 or both): compiled (the
    # lane-layout flash kernels), DeferAndFuse with early-launch chunks, without, and with cuts of several blocks
    # (which a device-bound step prefers)
    timeout $(( $(left) - 5 )) python3 bench/tpu.py ${BENCH_ARGS:-} --only ${BENCH_ONLY:-gpt_100m} \
      --modes ${BENCH_MODES:-jax_jit,compiled,defer,defer_unchunked,defer_long_cuts} --timeout 150 --out $OUT/b100train.json 2>&1 | tee $OUT/bench8.log | tail -12 ;;
  big)
    timeout $(( $(left) - 5 )) python3 bench/tpu.py ${BENCH_ARGS:-} --only gpt_100m --modes jax_jit,compiled,compiled_graph --timeout 150 --out $OUT/b100.json 2>&1 | tee $OUT/bench3.log | tail -14
    timeout $(( $(left) - 5 )) python3 bench/tpu.py ${BENCH_ARGS:-} --only flash_s2048 --timeout 130 --out $OUT/f2048.json 2>&1 | tee $OUT/bench2.log | tail -24 ;;
  flash)  # flash attention: the kernel alone (bench/flash_attention.py, bf16 at the 100M GPT's shape, in the GPT's
    # layout; FLASH_BLOCKS), head-major and lane-layout, then the bf16 100M step against JAX, with the lane-layout
    # kernels (compiled, the default), with the head-major kernel and with the math lowering
    timeout $(( $(left) - 5 )) python3 bench/flash_attention.py --dtype bfloat16 --lanes --blocks ${FLASH_BLOCKS:-512x512} \
      --out $OUT/fdq.json 2>&1 | quiet | tee $OUT/bench6.log | tail -8
    [ "$(left)" -gt 120 ] && timeout $(( $(left) - 5 )) python3 bench/tpu.py ${BENCH_ARGS:-} --only gpt_100m_bf16 \
      --modes ${BENCH_MODES:-jax_jit,compiled,compiled_head_major,compiled_math} --timeout 150 --out $OUT/bbf16.json 2>&1 | tee -a $OUT/bench7.log | tail -8 ;;
  esac ;;
timeline)  # decoding's device busy and idle time per step, per mode (probe_decode_timeline.py): host- or chip-bound
  # (TIMELINE_RUNS: "workload:mode[:pack bytes]" items; the default compares the three torch modes at batch 1 and 8)
  for run in ${TIMELINE_RUNS:-decode_b1:compiled decode_b1:compiled_graph decode_b1:compiled_replayed decode_b8:compiled decode_b8:compiled_graph decode_b8:compiled_graph:0 decode_b8:compiled_replayed}; do
    [ "$(left)" -lt 50 ] && break
    IFS=: read -r w m pack <<< "$run"
    timeout $(( $(left) - 5 )) python3 tools/tpu_suite/probe_decode_timeline.py $w $m ${pack:+--pack-max-bytes $pack} 2>&1 \
      | quiet | tee -a $OUT/timeline.log | tail -9
  done ;;
resnet)  # the ResNet example on tpu against CPU: one step's gradients against float64, then the 30 steps' losses
  timeout $(( $(left) - 5 )) python3 tools/tpu_suite/probe_resnet_steps.py ${RESNET_ARGS:-} 2>&1 \
    | quiet | tee $OUT/resnet.log | tail -45 ;;
exsteps)  # per optimizer step of a training example: wall, launches, time inside execute, compiles, reads
  # (EXAMPLE=resnet_amp_channels_last by default; EXAMPLE_ARGS="--steps 6")
  timeout $(( $(left) - 5 )) python3 tools/tpu_suite/probe_example_steps.py ${EXAMPLE:-resnet_amp_channels_last} \
    ${EXAMPLE_ARGS:---steps 6} 2>&1 | quiet | tee $OUT/exsteps.log | tail -12 ;;
examples)  # each example of examples/ at its default size on the chip: its loss and speed line (tools/run_examples.py)
  timeout $(( $(left) - 5 )) python3 tools/run_examples.py --timeout ${EXAMPLE_TIMEOUT:-150} --out $OUT/examples.json 2>&1 | tee $OUT/examples.log | grep "^|" ;;
profile)  # where a step's time goes (bench/step_profile.py; PROFILE_WORKLOAD gpt_demo or gpt_100m), per mode: wall,
  # host, execute, launched alone
  for m in $(echo "${PROFILE_MODES:-compiled,compiled_graph}" | tr "," " "); do
    [ "$(left)" -lt 40 ] && break
    timeout $(( $(left) - 5 )) python3 bench/step_profile.py --mode $m --workload ${PROFILE_WORKLOAD:-gpt_demo} > $OUT/profile_$m.log 2>&1
    grep -A8 "first step" $OUT/profile_$m.log
  done ;;
devprof)  # per-XLA-op device time of the demo step's programs (torch writes them, JAX profiles them), and of JAX's step
  w=${DEVPROF_WORKLOAD:-gpt_demo}  # (gpt_100m: the 100M GPT's programs, JAX's step of it; decode_b1/_b8: generation)
  # (each program's optimized HLO comes back beside it: programs/*.opt.hlo)
  timeout $(( $(left) / 2 )) python3 tools/tpu_suite/probe_device_profile.py --dump $OUT/programs --workload $w --mode ${DEVPROF_MODE:-compiled_graph} > $OUT/dump.log 2>&1; tail -2 $OUT/dump.log
  timeout $(( $(left) - 5 )) python3 tools/tpu_suite/probe_device_profile.py --profile $OUT/programs --workload $w --top ${DEVPROF_TOP:-25} > $OUT/devprof.log 2>&1
  quiet < $OUT/devprof.log | head -150 ;;
jax)  # JAX-only probes (no torch needed: the first call of a round, before the install, can run them)
  for probe in probe_compile_effort probe_gather_compile; do
    [ "$(left)" -lt 30 ] && break
    timeout $(( $(left) - 5 )) python3 tools/tpu_suite/$probe.py 2>&1 | grep -v "^WARNING\|^I1\|^W1\|UserWarning\|warnings.warn" | tee $OUT/$probe.log
  done ;;
execute)  # host time of a PJRT execute by argument count and launch form, then JAX's dispatch (its own process)
  timeout $(( $(left) / 2 )) python3 tools/tpu_suite/probe_execute_cost.py > $OUT/execute.log 2>&1; grep "^torchtpu" $OUT/execute.log
  timeout $(( $(left) - 5 )) python3 tools/tpu_suite/probe_execute_cost.py --jax > $OUT/execute_jax.log 2>&1; grep "^jax" $OUT/execute_jax.log ;;
verify)  # the samples and functions of tools/tpu_suite/verify.txt (last round's fixes), then their tests
  specs=$(grep -v '^#' tools/tpu_suite/verify.txt | grep ':' | tr '\n' ' ')
  funcs=$(grep -v '^#' tools/tpu_suite/verify.txt | grep '^fn ' | cut -c4- | tr '\n' ' ')
  if [ -n "$specs" ]; then  # (each script opens the chip: ~8 s)
    timeout $(( $(left) / 3 )) python3 tools/tpu_suite/dump_mismatches.py $OUT/dm $specs > $OUT/dm.log 2>&1
    grep "==" $OUT/dm.log
  fi
  if [ -n "$funcs" ]; then
    timeout 90 python3 tools/tpu_suite/probe_unary.py $funcs > $OUT/probe.log 2>&1; grep -v "^    x=" $OUT/probe.log
  fi
  grep '^probe ' tools/tpu_suite/verify.txt | cut -c7- | while read -r script; do
    t=$(( $(left) / 3 )); [ "$t" -gt 200 ] && t=200  # a slow probe leaves the tests their share
    timeout $t python3 "tools/tpu_suite/$script" > "$OUT/$script.log" 2>&1; grep -v "^    " "$OUT/$script.log"
  done
  i=0
  grep '^test ' tools/tpu_suite/verify.txt | cut -c6- | while read -r args; do  # one pytest per line
    i=$((i + 1)); eval "bash .tpu/suite/suite_run.sh verify$i $(( $(left) - 5 )) $args"
    cp $OUT/done.txt /tmp/done.txt; cp $OUT/done.txt .tpu/suite/done.txt  # the next run starts from it
  done ;;
conf)  # parts K..N of an N-way split in one worker, THREADS ops at once; each part's file lands as it completes
  # a part cut short goes on from its finished items: put the *.partial.jsonl files that came back
  # in .tpu/conf/ and carry them (with .tpu/conf itself named in carry); carry .tpu/hf.tgz too, or
  # the model checks come out "transformers is not installed" (as parts 5-10 did in round twelve)
  python3 -c "import transformers" 2>/dev/null || echo "WARNING: no transformers: model checks will not run"
  n=$3; k=$4; threads=${5:-1}  # (8 threads: ~1.4 s an item on the v5e, ~9 s serially: docs/tpu_shards/README.md)
  resume=(); [ -d .tpu/conf ] && resume=(--resume .tpu/conf)
  spec=$k-$n/$n; [[ $k == *,* ]] && spec=$k/$n  # K: parts K..N; a list (1,2,4-5): those parts
  timeout $(( $(left) - 10 )) python3 -m torchtpu.conformance --shard $spec --threads $threads --out $OUT/conf "${resume[@]}" 2>&1 \
    | quiet > $OUT/conf_full.log; tail -5 $OUT/conf_full.log | tee -a $OUT/conf.log
  ls $OUT/conf | tee -a $OUT/conf.log ;;
esac
