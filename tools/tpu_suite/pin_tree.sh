#!/usr/bin/env bash
# Workstation: pin the code the chip's suite runs, so one default-suite run can span sessions while
# main moves on (the whole suite takes about an hour of the v5e, a session lends 30 minutes).
#   bash tools/tpu_suite/pin_tree.sh        # after `make`, with nothing uncommitted
# writes .tpu/tree.tgz: HEAD's tracked files, its built extension modules and a PINNED file naming
# the commit; and starts .tpu/tree_done.txt, the pinned run's list of finished tests. Carry both (and
# .tpu/env.sh) with `steps.sh suite SECONDS`: it then runs the pinned tree, not the checkout, and
# its suite.tgz brings back done.txt: copy that over .tpu/tree_done.txt before the next call.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "pin_tree: commit first (the pinned tree is HEAD's, its extension modules the ones built here)" >&2
  exit 1
fi
ls src/torchtpu/_C*.so >/dev/null 2>&1 || { echo "pin_tree: no built extension: run make first" >&2; exit 1; }
stage=$(mktemp -d)
git archive HEAD | tar x -C "$stage"
find src -name '*.so' -exec cp --parents {} "$stage/" \;
git rev-parse --short HEAD > "$stage/PINNED"
mkdir -p .tpu
tar czf .tpu/tree.tgz -C "$stage" .
rm -rf "$stage"
: > .tpu/tree_done.txt
echo "pinned $(git rev-parse --short HEAD): .tpu/tree.tgz ($(du -h .tpu/tree.tgz | cut -f1)); .tpu/tree_done.txt emptied"
