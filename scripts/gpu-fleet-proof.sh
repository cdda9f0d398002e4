#!/bin/sh
# gpu-fleet-proof.sh BUILD OUTDIR: issue 26's device run
# (scripts/gpu-fleet-proof.py says what it does and checks): two random
# ~16 GiB Qwen3-30B-A3B-shaped q4_K GGUF files (scripts/gguf-synth.py, seeds
# 1 and 2) served from one broker file under a device cap that holds one;
# the first request to a model whose engine is not running, then switches;
# each part of the time to first token (start: arena and engine, refill,
# prefill). BUILD holds a CUDA build (make CUDA=1, or make gpu-build). About
# 66 GiB of /dev/shm while it runs (two GGUF files and their arenas),
# removed after. OUTDIR gets summary.json, /metrics and /v1/models after
# each request and the broker's log. The last line says PASSED or FAIL.
# FLEET_PROOF_BACKEND=host (with FLEET_PROOF_LAYERS, default 1) is the dry
# run without a GPU; FLEET_PROOF_KEEP=1 keeps the files for the next run.
set -eu
B=${1:?usage: gpu-fleet-proof.sh BUILD OUTDIR}
OUT=${2:?usage: gpu-fleet-proof.sh BUILD OUTDIR}
set -- --build "$B" --out "$OUT" --backend "${FLEET_PROOF_BACKEND:-cuda}"
[ -n "${FLEET_PROOF_LAYERS:-}" ] && set -- "$@" --layers "$FLEET_PROOF_LAYERS"
[ -n "${FLEET_PROOF_GGUF_SYNTH:-}" ] && set -- "$@" --gguf-synth "$FLEET_PROOF_GGUF_SYNTH"
[ "${FLEET_PROOF_KEEP:-0}" = 1 ] && set -- "$@" --keep-files
exec python3 "$(dirname "$0")/gpu-fleet-proof.py" "$@"
