#!/bin/sh
# bench-model.sh [BUILD] [OUTDIR]: the model benchmark of issue 17 on one GPU.
# For each weight type (DTYPES, default "bf16 q4_K q6_K"): a synthetic
# Qwen3-30B-A3B-shaped arena (baton-arena create --synthetic-arch qwen3_moe
# --preset qwen3-30b-a3b; LAYERS overrides its 48 layers) made in SHM
# (default /dev/shm; bf16 is about 61 GB, q6_K 25, q4_K 17: one at a time,
# removed after its run), then baton-model-bench on it (decode at batch 1
# against the bandwidth measured in the same run, prefill of 512 and 2,048
# tokens, the first token after a release). Then the peer, the same shape in
# transformers on the same GPU (scripts/bench-model-peer.py; PEER=0 skips
# it), and a table of both with their ratios. OUTDIR gets every JSON
# (model-DTYPE.json, peer.json) and the arena creation times. BACKEND
# (default cuda), PROMPTS (default 512,2048) and MAX_BATCH (the rows of a
# prefill pass, default the bench's 512, llama.cpp's ubatch; transformers
# reads a prompt in one pass) go to baton-model-bench;
# PEER_STEPS (default 16) is the peer's timed decode steps (eager
# transformers takes most of a second per token at 48 layers).
set -eu
B=${1:-build-gpu}
OUT=${2:-$(mktemp -d)}
DTYPES=${DTYPES:-bf16 q4_K q6_K}
LAYERS=${LAYERS:-48}
SHM=${SHM:-/dev/shm}
PEER=${PEER:-1}
BACKEND=${BACKEND:-cuda}
PROMPTS=${PROMPTS:-512,2048}
MAX_BATCH=${MAX_BATCH:-512}
PEER_STEPS=${PEER_STEPS:-16}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
for dt in $DTYPES; do
	A="$SHM/baton-model-bench-$dt.arena"
	t0=$(date +%s.%N)
	"$B/bin/baton-arena" create --synthetic-arch qwen3_moe --preset qwen3-30b-a3b \
		--layers "$LAYERS" --dtype "$dt" --seed 17 --force "$A" | tail -n 1
	t1=$(date +%s.%N)
	echo "create $dt $(stat -c %s "$A") bytes $(awk "BEGIN { print $t1 - $t0 }") s" | tee -a "$OUT/create.txt"
	"$B/bin/baton-model-bench" --arena "$A" --backend "$BACKEND" --prompts "$PROMPTS" --max-batch "$MAX_BATCH" \
		--json "$OUT/model-$dt.json" ||
		echo "baton-model-bench $dt failed: $?"
	rm -f "$A"
done
if [ "$PEER" = 1 ]; then
	python3 "$HERE/bench-model-peer.py" --layers "$LAYERS" --prompts "$PROMPTS" \
		--steps "$PEER_STEPS" --json "$OUT/peer.json" ||
		echo "bench-model-peer.py failed: $?"
fi
python3 - "$OUT" $DTYPES <<'EOF'
import json, os, sys
out, dts = sys.argv[1], sys.argv[2:]
def load(n):
    p = os.path.join(out, n)
    return json.load(open(p)) if os.path.exists(p) else None
peer = load("peer.json")
print("\n  %-8s %10s %10s %9s %10s %9s %12s %12s %10s" % ("dtype", "BW GB/s", "decode t/s",
      "roofline", "vs peer", "pf512 t/s", "pf2048 t/s", "1st hot ms", "1st full"))
for dt in dts:
    m = load("model-%s.json" % dt)
    if not m:
        print("  %-8s (no result)" % dt)
        continue
    pf = {p["tokens"]: p["tok_s"] for p in m["prefill"]}
    vs = "%.2fx" % (m["decode_tok_s"] / peer["decode_tok_s"]) if peer else "-"
    print("  %-8s %10.0f %10.1f %9.3f %10s %9.0f %12.0f %12.1f %10.1f" % (dt, m["bandwidth_gbps"],
          m["decode_tok_s"], m["roofline_ratio"], vs, pf.get(512, 0), pf.get(2048, 0),
          m["first_hot_ms"], m["first_full_ms"]))
if peer:
    pf = {p["tokens"]: p["tok_s"] for p in peer["prefill"]}
    print("  %-8s %10s %10.1f %9s %10s %9.0f %12.0f   (%s)" % ("peer", "", peer["decode_tok_s"],
          "", "1.00x", pf.get(512, 0), pf.get(2048, 0), peer["peer"]))
    m = load("model-bf16.json")
    if m:
        mp = {p["tokens"]: p["tok_s"] for p in m["prefill"]}
        print("  bf16 vs peer: decode %.2fx, prefill 512 %.2fx, prefill 2048 %.2fx" % (
              m["decode_tok_s"] / peer["decode_tok_s"], mp.get(512, 0) / pf.get(512, 1),
              mp.get(2048, 0) / pf.get(2048, 1)))
print("  JSON in %s" % out)
EOF
