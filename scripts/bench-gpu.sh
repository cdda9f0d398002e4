#!/bin/sh
# bench-gpu.sh [BUILD] [OUTDIR]: the GPU benchmark (engine/model/main_baton-bench.c)
# on the 14.6 GiB synthetic model the GPU tests use (13 layers x 128 experts,
# d_model 2048, d_ff 768, top-8, bf16). Prints the table; with OUTDIR also
# writes bench-gpu.json there. Then the peer tier's table (baton-bench
# --peer-device 1, bench-gpu-peer.json): it says skip on a one-GPU machine.
set -eu
B=${1:-build-gpu}
OUT=${2:-}
ARENA=${BATON_GPU_TEST_ARENA:-/dev/shm/baton/gpu-test.arena}
"$B/bin/baton-arena" create --synthetic --layers 13 --experts 128 --top-k 8 \
	--d-model 2048 --d-ff 768 --dtype bf16 --seed 2026 "$ARENA"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
	--format=csv,noheader 2>/dev/null || true
set -- --arena "$ARENA" --backend cuda --cycles 5 --batch 1 --steps 50
[ -n "$OUT" ] && set -- "$@" --json "$OUT/bench-gpu.json"
"$B/bin/baton-bench" "$@"
set -- --arena "$ARENA" --backend cuda --peer-device 1 --batch 1 --steps 50
[ -n "$OUT" ] && set -- "$@" --json "$OUT/bench-gpu-peer.json"
"$B/bin/baton-bench" "$@"
