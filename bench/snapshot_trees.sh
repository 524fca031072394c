#!/usr/bin/env bash
# Source trees of git revisions for one device session's A/B (bench/device_ab.sh), made here:
#   bash bench/snapshot_trees.sh v14=v14 main=HEAD     ->  .snap/v14, .snap/main (git archive, no results)
# A revision may carry prepared variants (bench/variants/NAME.diff), applied to its tree in order:
#   bash bench/snapshot_trees.sh main=HEAD f8mma=HEAD+bench/variants/f8mma.diff
#   bash bench/snapshot_trees.sh f8fold=HEAD+bench/variants/f8mma.diff+bench/variants/f8fold.diff
# then run(command="bash bench/device_ab.sh main v14", carry=[".whl", ".snap"]).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
for spec in "$@"; do
  name=${spec%%=*} source=${spec#*=}
  rev=${source%%+*} diffs=""
  [ "$rev" != "$source" ] && diffs=${source#*+}
  rm -rf ".snap/$name" && mkdir -p ".snap/$name"
  git archive "$rev" | tar -x -C ".snap/$name"
  IFS=+ read -r -a diff_list <<< "$diffs"
  for diff in "${diff_list[@]}"; do
    git apply --directory=".snap/$name" "$diff"  # paths under the tree, from the repository root
  done
  rm -rf ".snap/$name/bench/results"
  echo "$name: $(git rev-parse --short "$rev")${diffs:+ + ${diffs//+/ + }} in .snap/$name"
done
du -sh .snap
