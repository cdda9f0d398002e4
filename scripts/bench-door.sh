#!/bin/sh
# bench-door.sh [BUILD] [OUTDIR]: the front door's benchmark (scripts/bench-door.py)
# on the GPU: two models that contend for one device under a memory cap,
# N clients alternating between them; the door against both models
# resident and against restarting the engine per switch, in one run.
#
# The models: BENCH_DOOR_A and BENCH_DOOR_B, two whole-model arenas WITH a
# tokenizer (made by `baton-arena create --gguf` or `--safetensors`; the
# engines serve chat through it). `--synthetic-arch` arenas have no
# tokenizer yet, so a Qwen3-30B-A3B-shaped pair needs real files (or an
# arena option that adds a tokenizer to a synthetic model).
# BENCH_DOOR_CAP_MIB: [gpu "*"] total_mib, room for the experts of one
# model and not two (default: 1.5 x the larger model's experts, from
# `baton-arena info --json`). BENCH_DOOR_CLIENTS (4), BENCH_DOOR_REQUESTS
# per client (8), BENCH_DOOR_MAX_TOKENS (64).
set -eu
B=${1:-build-gpu}
OUT=${2:-}
A=${BENCH_DOOR_A:?set BENCH_DOOR_A and BENCH_DOOR_B to two whole-model arenas with tokenizers}
Bm=${BENCH_DOOR_B:?set BENCH_DOOR_B}
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
set -- --build "$B" --backend cuda --arena "$A" --arena "$Bm" --cap-mib "$BENCH_DOOR_CAP_MIB" \
	--clients "${BENCH_DOOR_CLIENTS:-4}" --requests "${BENCH_DOOR_REQUESTS:-8}" \
	--max-tokens "${BENCH_DOOR_MAX_TOKENS:-64}" --engine-flag=--ctx --engine-flag=4096
[ -n "$OUT" ] && set -- "$@" --json "$OUT/bench-door.json"
exec python3 "$(dirname "$0")/bench-door.py" "$@"
