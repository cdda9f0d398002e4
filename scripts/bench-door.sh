#!/bin/sh
# bench-door.sh [BUILD] [OUTDIR]: the front door's benchmark (scripts/bench-door.py)
# on the GPU: two models that contend for one device under a memory cap,
# N clients alternating between them; the door against both models
# resident and against restarting the engine per switch, in one run.
#
# The models: BENCH_DOOR_A and BENCH_DOOR_B, two whole-model arenas with a
# tokenizer; by default two Qwen3-30B-A3B-shaped random models (seeds 1
# and 2; the preset's layer shape, BENCH_DOOR_LAYERS of its 48 layers,
# default 24 so that both fit the host memory of a one-GPU machine; bf16)
# with the tokenizer and chat template of models/kjv-qwen3-moe, made once
# into /dev/shm/baton/door-a.arena and door-b.arena.
# BENCH_DOOR_CAP_MIB: [gpu "*"] total_mib, room for the experts of one
# model and not two (default: 1.5 x the larger model's experts).
# BENCH_DOOR_CLIENTS (4), BENCH_DOOR_REQUESTS per client (8),
# BENCH_DOOR_MAX_TOKENS (64). BENCH_DOOR_BACKEND: cuda (default) or host
# (a 1 GiB host device: for trying the script at a small shape).
set -eu
B=${1:-build-gpu}
OUT=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${BENCH_DOOR_A:-}" ]; then
	for x in a b; do
		seed=1; [ $x = b ] && seed=2
		"$B/bin/baton-arena" create --synthetic-arch qwen3_moe --preset qwen3-30b-a3b \
			--layers "${BENCH_DOOR_LAYERS:-24}" --dtype bf16 --seed $seed \
			--tokenizer "$ROOT/models/kjv-qwen3-moe" /dev/shm/baton/door-$x.arena >&2
	done
	BENCH_DOOR_A=/dev/shm/baton/door-a.arena
	BENCH_DOOR_B=/dev/shm/baton/door-b.arena
fi
A=$BENCH_DOOR_A
Bm=${BENCH_DOOR_B:?set BENCH_DOOR_B too}
if [ -z "${BENCH_DOOR_CAP_MIB:-}" ]; then
	BENCH_DOOR_CAP_MIB=$(for f in "$A" "$Bm"; do "$B/bin/baton-arena" info --json "$f"; done | python3 -c '
import json, sys
dec = json.JSONDecoder(); s = sys.stdin.read(); i = 0; sizes = []
while i < len(s):
    if s[i].isspace(): i += 1; continue
    o, i = dec.raw_decode(s, i)
    sizes.append(o["slot_bytes"] * o["layers"] * o["experts"])
print(int(max(sizes) * 1.5 / 2**20))')
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
set -- --build "$B" --backend "${BENCH_DOOR_BACKEND:-cuda}" --device-mib 1024 \
	--arena "$A" --arena "$Bm" --cap-mib "$BENCH_DOOR_CAP_MIB" \
	--clients "${BENCH_DOOR_CLIENTS:-4}" --requests "${BENCH_DOOR_REQUESTS:-8}" \
	--max-tokens "${BENCH_DOOR_MAX_TOKENS:-64}" --engine-flag=--ctx --engine-flag=4096
[ -n "$OUT" ] && set -- "$@" --json "$OUT/bench-door.json"
exec python3 "$(dirname "$0")/bench-door.py" "$@"
