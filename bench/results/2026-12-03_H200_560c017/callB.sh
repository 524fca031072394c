# The README's benchmark on the landed tree (fourth session): 66 shapes, every column of a shape in
# turns in one process (sm90 attention alone, the one-call step, per layer, FlashMLA, paged:sm90).
set -uo pipefail
root=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONUNBUFFERED=1 DDTREE_COMMIT=560c017 PYTHONPATH=/tmp/site:$root DDTREE_CACHE_DIR=/tmp/ddc
timeout 150 python3 bench/build_libraries.py > $OUT/build.log 2>&1; echo "built $SECONDS"
timeout ${ALL_S:-420} python3 -m bench.verify --cases all --backends sm90,flashmla,paged:sm90 --out /tmp/r_all 2>&1 | grep --line-buffered -E "^NVIDIA|wrote" 
cp /tmp/r_all/results.json $OUT/results.json; echo "done $SECONDS"
python3 -c "import json; print(len(json.load(open('$OUT/results.json'))['rows']), 'shapes')"
