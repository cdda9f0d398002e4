#!/bin/sh
# release-floor.sh BIN MODELS OUT [BACKEND]: issue 18's "what a fully released
# engine still holds on the GPU". An engine of a Qwen3-30B-A3B-shaped whole
# model (random bf16 weights; 8 layers so the arena is made quickly: the dense
# part and the KV pool scale with the layers, the floor does not) answers one
# request, is released (experts), then released with all (dense weights, KV
# pool, GEN routers); at each level nvidia-smi's per-process memory and the
# engine's /health go to OUT/floor.txt. A request then refills everything and
# its answer must equal the first (the script exits 1 otherwise).
#   BIN: baton-arena, baton-engine, baton-proto-tool (make gpu-build)
#   MODELS: the repo's models/ (kjv-qwen3-moe's tokenizer)
set -eu
BIN=$1 MODELS=$2 OUT=$3 BACKEND=${4:-cuda}
D=$(mktemp -d /dev/shm/baton-floor.XXXXXX)
EP=
trap '[ -n "$EP" ] && kill $EP 2>/dev/null; rm -rf $D' EXIT
R=$OUT/floor.txt
: > $R
# ARENA_ARGS, ENGINE_ARGS: for a small try on the host backend
"$BIN/baton-arena" create --synthetic-arch qwen3_moe ${ARENA_ARGS:---preset qwen3-30b-a3b --layers 8} \
    --tokenizer "$MODELS/kjv-qwen3-moe" --dtype bf16 --seed 1 $D/q.arena > /dev/null 2>> $R
"$BIN/baton-engine" --name q --shared-expert-arena $D/q.arena --listen ipc://$D/q.sock \
    --backend $BACKEND --expert-cache-release --ctx 4096 --kv-blocks 1024 \
    --http 127.0.0.1:0 ${ENGINE_ARGS:-} > $D/out 2> $OUT/engine.log &
EP=$!
for i in $(seq 900); do grep -q '^http:' $D/out 2>/dev/null && break; sleep 0.2; done
U=$(sed -n 's/^http: //p' $D/out)
[ -n "$U" ] || { echo "engine did not start" >> $R; exit 1; }
ask() {
    curl -s $U/v1/chat/completions -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Who was Noah?"}],"max_tokens":16,"temperature":0}' |
        sed 's/"id":"[^"]*",//; s/"created":[0-9]*,//'
}
level() {
    echo "== $1" >> $R
    curl -s $U/health >> $R
    echo >> $R
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | grep "^$EP," >> $R || true
    fi
}
release() {
    "$BIN/baton-proto-tool" encode release request name=q "$@" |
        "$BIN/baton-proto-tool" call ipc://$D/q.sock >> $R
}
t0=$(date +%s.%N); A=$(ask); t1=$(date +%s.%N)
echo "first answer in $(awk "BEGIN{print $t1 - $t0}") s: $A" >> $R
level "whole, after one request"
release
level "released (experts)"
release all=true
level "released --all (only the context should stay)"
t0=$(date +%s.%N); B=$(ask); t1=$(date +%s.%N)
echo "answer after release --all in $(awk "BEGIN{print $t1 - $t0}") s (refill included): $B" >> $R
level "refilled by the request"
grep -h "model refilled\|release" $OUT/engine.log >> $R || true
[ "$A" = "$B" ] || { echo "DIFFERENT ANSWERS" >> $R; exit 1; }
echo "same answer" >> $R
