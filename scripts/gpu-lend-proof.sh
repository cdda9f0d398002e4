#!/bin/sh
# gpu-lend-proof.sh BUILD OUTDIR: issue 27's two proofs on the GPU
# (scripts/gpu-lend-proof.py says what each does and checks): a Baton engine
# (cuda backend, a ~16 GiB q4_K Qwen3-30B-A3B-shaped arena made in /dev/shm)
# gives way to `baton run --mib 30000 -- python3 ... job` (28 GiB filled
# and checked with torch) and comes back answering the same; then a foreign
# PyTorch process of 24 GiB is parked for the engine (CUDA checkpoint) and
# resumed after it, its contents checked. BUILD holds a CUDA build (make
# CUDA=1, or make gpu-build); python3 on PATH needs torch. OUTDIR gets the
# views (status, top, /metrics, /v1/status) during the lease and the park,
# the events, the logs and summary.json. The last line says PASSED or FAIL.
# LEND_PROOF_BACKEND=host (with LEND_PROOF_LAYERS, default 1) is the dry run
# without a GPU; LEND_PROOF_KEEP_ARENA=1 keeps the arena for the next run.
set -eu
B=${1:?usage: gpu-lend-proof.sh BUILD OUTDIR}
OUT=${2:?usage: gpu-lend-proof.sh BUILD OUTDIR}
set -- --build "$B" --out "$OUT" --backend "${LEND_PROOF_BACKEND:-cuda}"
[ -n "${LEND_PROOF_LAYERS:-}" ] && set -- "$@" --layers "$LEND_PROOF_LAYERS"
[ "${LEND_PROOF_KEEP_ARENA:-0}" = 1 ] && set -- "$@" --keep-arena
exec python3 "$(dirname "$0")/gpu-lend-proof.py" "$@"
