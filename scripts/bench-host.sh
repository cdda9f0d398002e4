#!/bin/sh
# bench-host.sh [BUILD]: the engine benchmark on the host backend, on a
# 1.5 GiB synthetic model (8 layers x 32 experts, d_model 1024, d_ff 1024,
# f16) and a private 4 GiB host device. Not a test: it prints figures.
set -eu
B=${1:-build}
dir=$(mktemp -d /tmp/baton-bench.XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$B/bin/baton-arena" create --synthetic --layers 8 --experts 32 --top-k 2 \
	--d-model 1024 --d-ff 1024 --dtype f16 --seed 1 "$dir/bench.arena" >/dev/null
BATON_HOSTDEV_DIR=$dir "$B/bin/baton-bench" --arena "$dir/bench.arena" --backend host \
	--host-device-mib 4096 --segment-mib 64 --cycles 3 --batch 4 --steps 10
