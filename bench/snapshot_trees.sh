#!/usr/bin/env bash
# Source trees of git revisions for one device session's A/B (bench/device_ab.sh), made here:
#   bash bench/snapshot_trees.sh v14=v14 main=HEAD     ->  .snap/v14, .snap/main (git archive, no results)
# then run(command="bash bench/device_ab.sh main v14", carry=[".whl", ".snap"]).
set -euo pipefail
cd "$(dirname "$0")/.."
for spec in "$@"; do
  name=${spec%%=*} rev=${spec#*=}
  rm -rf ".snap/$name" && mkdir -p ".snap/$name"
  git archive "$rev" | tar -x -C ".snap/$name"
  rm -rf ".snap/$name/bench/results"
  echo "$name: $(git rev-parse --short "$rev") in .snap/$name"
done
du -sh .snap
