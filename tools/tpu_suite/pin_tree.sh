#!/usr/bin/env bash
# Workstation: pin the code the chip's suite runs, so one default-suite run can span sessions while
# main moves on (the whole suite takes over an hour of the v5e, a session lends 30 minutes).
#   bash tools/tpu_suite/pin_tree.sh            # pin HEAD and start a new record (after `make`, nothing uncommitted)
#   bash tools/tpu_suite/pin_tree.sh --resume   # pin again the commit tools/tpu_suite/pinned_run.txt names
# writes .tpu/tree.tgz: the commit's tracked files, the extension modules built here (built for the commit
# in the tree when its C++ differs from the checkout's) and a PINNED file naming the commit; and .tpu/tree_done.txt
# and .tpu/tree_outcomes.txt, the record's tests so far. Carry the three (and .tpu/env.sh) with
# `steps.sh suite SECONDS`: it runs the pinned tree, not the checkout; merge each returned suite.tgz
# into the record (`pinned_record.py update`), commit the record, and stage it again (`pinned_record.py
# stage`) before the next call: the record outlives the session's checkout, .tpu/ does not.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
record=tools/tpu_suite/pinned_record.py
build=0  # 1: the pinned commit's C++ differs from the checkout's: build its extensions in the tree
if [ "${1:-}" = --resume ]; then
  commit=$(sed -n 's/^# pinned //p' tools/tpu_suite/pinned_run.txt)
  if ! git diff --quiet "$commit" HEAD -- src/torchtpu/csrc setup.py; then
    echo "pin_tree: $commit's C++ differs from HEAD's: building its extensions (a few minutes)"
    build=1
  fi
else
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    echo "pin_tree: commit first (the pinned tree is HEAD's, its extension modules the ones built here)" >&2
    exit 1
  fi
  commit=$(git rev-parse --short HEAD)
  python3 $record new "$commit"
fi
ls src/torchtpu/_C*.so >/dev/null 2>&1 || { echo "pin_tree: no built extension: run make first" >&2; exit 1; }
stage=$(mktemp -d)
git archive "$commit" | tar x -C "$stage"
if [ $build = 1 ]; then  # with this checkout's venv (the same torch), as make test-asan builds apart
  (cd "$stage" && TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$root/.venv/bin/python" setup.py -q build_ext --inplace >/dev/null)
  rm -rf "$stage/build"
  ls "$stage"/src/torchtpu/_C*.so >/dev/null
else
  find src -name '*.so' -exec cp --parents {} "$stage/" \;
fi
echo "$commit" > "$stage/PINNED"
mkdir -p .tpu
tar czf .tpu/tree.tgz -C "$stage" .
rm -rf "$stage"
python3 $record stage
echo "pinned $commit: .tpu/tree.tgz ($(du -h .tpu/tree.tgz | cut -f1)); .tpu/tree_done.txt and tree_outcomes.txt from the record"
