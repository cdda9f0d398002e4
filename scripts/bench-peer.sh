#!/bin/sh
# bench-peer.sh BUILD OUTDIR: Baton against llama.cpp on the same GGUF file
# and GPU (issue 23's "The peer in the benchmark").
#
#  1. scripts/gguf-synth.py writes a random model of Qwen3-30B-A3B's shape
#     in llama.cpp's layout (48 layers, 128 experts, top-8, q4_K weights,
#     q6_K head: 16.1 GiB) into SHM (default /dev/shm), or KEEP_GGUF=PATH:
#     that file, reused when it is there (written there and kept if not);
#  2. baton-arena create --gguf imports it (1 and 2: scripts/lib-gguf.sh);
#  3. baton-model-bench: decode at batch 1, prefill of PROMPTS (512,2048);
#     again with BATON_CUDA_GRAPH=1 (decode as a replayed graph; GRAPH=0
#     skips it);
#  4. scripts/bench-serve.py: SEQS (16) concurrent sequences of SERVE_PROMPT
#     (128) prompt + SERVE_GEN (128) generated tokens through baton-engine's
#     scheduler (continuous batching), total and generated tokens/s;
#  5. with LLAMA_CPP=DIR (a built llama.cpp tree: DIR/bin, DIR/build/bin or
#     DIR holding llama-bench and llama-batched-bench): llama-bench -ngl 99
#     -p PROMPTS -n 128 and llama-batched-bench -ngl 99 -npp SERVE_PROMPT
#     -ntg SERVE_GEN -npl SEQS on the same file;
#  6. one table of the figures and their ratios; OUTDIR gets baton-model.json,
#     serve.json, llama-bench.json, llama-batched.jsonl, summary.json and
#     the logs.
#
# LAYERS (48), SEED (17), BACKEND (cuda), EXPERTS and VOCAB (the full shape)
# size the run; MODEL_BENCH_FLAGS go to baton-model-bench; SERVE=0 skips
# the serving run, GRAPH=0 the graph row; LAYERS=2 BACKEND=host PROMPTS=16 SEQS=2 SERVE_PROMPT=8
# SERVE_GEN=8 is the quick host check (scripts/bench_peer_test.sh).
# llama.cpp is a peer, never part of Baton: nothing of it is in this tree.
set -eu
B=${1:?usage: bench-peer.sh BUILD OUTDIR}
OUT=${2:?usage: bench-peer.sh BUILD OUTDIR}
LAYERS=${LAYERS:-48}
SEED=${SEED:-17}
BACKEND=${BACKEND:-cuda}
EXPERTS=${EXPERTS:-128}
VOCAB=${VOCAB:-151936}
PROMPTS=${PROMPTS:-512,2048}
SEQS=${SEQS:-16}
SERVE_PROMPT=${SERVE_PROMPT:-128}
SERVE_GEN=${SERVE_GEN:-128}
SHM=${SHM:-/dev/shm}
LLAMA_CPP=${LLAMA_CPP:-}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
B=$(cd "$B" && pwd)
. "$HERE/lib-gguf.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
	tee "$OUT/gpu.txt" || true
"$B/bin/baton-model-bench" --version 2>&1 | head -n 1 | tee "$OUT/baton-version.txt" || true

# 1, 2. the GGUF and the arena (the host backend's device: 8 GiB unless said)
if [ "$BACKEND" = host ]; then
	export BATON_HOSTDEV_MIB=${BATON_HOSTDEV_MIB:-8192}
fi
gguf_arena peer

# 3. baton-model-bench
# shellcheck disable=SC2086
"$B/bin/baton-model-bench" --arena "$A" --backend "$BACKEND" --prompts "$PROMPTS" ${MODEL_BENCH_FLAGS:-} \
	--json "$OUT/baton-model.json" 2>&1 | tee "$OUT/baton-model.txt" ||
	echo "baton-model-bench failed" | tee -a "$OUT/baton-model.txt"

# 3b. decode again with the decode step as a replayed CUDA graph, asked for
# by name (the engine's default since 2026-12-02, so step 3 replays graphs
# too unless BATON_CUDA_GRAPH=0 is in the environment; GRAPH=0 skips this row)
if [ "${GRAPH:-1}" != 0 ]; then
	# shellcheck disable=SC2086
	BATON_CUDA_GRAPH=1 "$B/bin/baton-model-bench" --arena "$A" --backend "$BACKEND" \
		--prompts "${PROMPTS%%,*}" ${MODEL_BENCH_FLAGS:-} --json "$OUT/baton-model-graph.json" \
		>"$OUT/baton-model-graph.txt" 2>&1 || echo "baton-model-bench (graphs) failed"
fi

# 4. serving, continuous batching
if [ "${SERVE:-1}" != 0 ]; then
	"$PY" "$HERE/bench-serve.py" --build "$B" --arena "$A" --backend "$BACKEND" --seqs "$SEQS" \
		--prompt "$SERVE_PROMPT" --gen "$SERVE_GEN" --json "$OUT/serve.json" 2>&1 |
		tee "$OUT/serve.txt" || echo "bench-serve.py failed" | tee -a "$OUT/serve.txt"
fi
rm -f "$A"

# 5. llama.cpp on the same file
if [ -n "$LLAMA_CPP" ]; then
	LB=
	for d in "$LLAMA_CPP/bin" "$LLAMA_CPP/build/bin" "$LLAMA_CPP"; do
		[ -x "$d/llama-bench" ] && { LB=$d; break; }
	done
	if [ -z "$LB" ]; then
		echo "no llama-bench under $LLAMA_CPP (bin, build/bin)" | tee "$OUT/llama-bench.txt"
	else
		"$LB/llama-bench" -m "$G" -ngl 99 -p "$PROMPTS" -n 128 -o json \
			>"$OUT/llama-bench.json" 2>"$OUT/llama-bench.log" ||
			echo "llama-bench failed: $(tail -n 3 "$OUT/llama-bench.log")"
		CTX=$(( SEQS * (SERVE_PROMPT + SERVE_GEN) + 256 ))
		"$LB/llama-batched-bench" -m "$G" -ngl 99 -c "$CTX" -npp "$SERVE_PROMPT" \
			-ntg "$SERVE_GEN" -npl "$SEQS" --output-format jsonl \
			>"$OUT/llama-batched.jsonl" 2>"$OUT/llama-batched.log" ||
			echo "llama-batched-bench failed: $(tail -n 3 "$OUT/llama-batched.log")"
	fi
fi

# 6. the table
"$PY" - "$OUT" "$G" "$LAYERS" <<'EOF'
import json, os, sys
out, gguf, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])

def load(n):
    p = os.path.join(out, n)
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None

m, s, lb = load("baton-model.json"), load("serve.json"), load("llama-bench.json")
bb = None
for name in ("llama-batched.jsonl", "llama-batched.log"):  # stdout, else its log
    try:
        for line in open(os.path.join(out, name), errors="replace"):
            line = line.strip()
            if line.startswith("{") and '"speed"' in line:
                bb = json.loads(line)
    except (OSError, ValueError):
        pass
    if bb:
        break
rows = []  # (what, baton, llama.cpp)
pf = {p["tokens"]: p["tok_s"] for p in (m or {}).get("prefill", [])}
lt = {}
for r in lb or []:
    if r.get("n_gen", 0) and not r.get("n_prompt", 0):
        lt["tg%d" % r["n_gen"]] = r["avg_ts"]
    elif r.get("n_prompt", 0) and not r.get("n_gen", 0):
        lt["pp%d" % r["n_prompt"]] = r["avg_ts"]
rows.append(("decode, batch 1 (tg128)", m and m["decode_tok_s"], lt.get("tg128")))
if m and m.get("decode_greedy_tok_s"):  # llama-bench samples nothing: Baton's own greedy pick added
    rows.append(("decode, batch 1, + host greedy pick", m["decode_greedy_tok_s"], lt.get("tg128")))
mg = load("baton-model-graph.json")
if mg:
    rows.append(("decode, batch 1, BATON_CUDA_GRAPH=1", mg["decode_tok_s"], lt.get("tg128")))
for n in sorted(pf):
    rows.append(("prefill, %d tokens (pp%d)" % (n, n), pf[n], lt.get("pp%d" % n)))
if s:
    tag = "%d seqs x (%d + %d)" % (s["seqs"], s["prompt"], s["gen"])
    rows.append(("serving %s, total tok/s" % tag, s["total_tok_s"], bb and bb["speed"]))
    rows.append(("serving %s, generated tok/s" % tag, s["generated_tok_s"],
                 bb and bb["pl"] * bb["tg"] / bb["t"]))
print("\n  %-48s %12s %12s %10s" % ("tok/s, the same GGUF (%d layers)" % layers, "Baton", "llama.cpp",
                                     "ratio"))
summary = {"gguf": os.path.basename(gguf), "gguf_bytes": os.path.getsize(gguf) if os.path.exists(gguf) else None,
           "layers": layers, "rows": []}
for what, a, b in rows:
    ratio = a / b if a and b else None
    print("  %-48s %12s %12s %10s" % (what, "%.1f" % a if a else "-", "%.1f" % b if b else "-",
                                       "%.3fx" % ratio if ratio else "-"))
    summary["rows"].append({"what": what, "baton": a, "llama_cpp": b, "ratio": ratio})
if m:
    print("  Baton decode: %.2f ms a token, %.3f of the roofline at %.0f GB/s measured" % (
        m["decode_ms"], m["roofline_ratio"], m["bandwidth_gbps"]))
if s:
    print("  Baton serving: %d of %d tokens generated, finish %s, slowest request %.2f s" % (
        s["generated_tokens"], s["seqs"] * s["gen"], ",".join(s["finish_reasons"]), s["request_s_max"]))
if lb:
    r = lb[0]
    summary["llama_cpp"] = {k: r.get(k) for k in ("build_commit", "build_number", "gpu_info", "model_type",
                                                   "model_size", "n_gpu_layers", "flash_attn")}
    print("  llama.cpp %s (build %s), %s, %s" % (r.get("build_commit"), r.get("build_number"),
                                                 r.get("gpu_info"), r.get("model_type")))
if bb:
    print("  llama-batched-bench: S_TG %.1f tok/s (decode alone), T %.2f s" % (bb["speed_tg"], bb["t"]))
summary["baton_model"], summary["serve"], summary["llama_batched"] = m, s, bb
summary["baton_model_graph"] = mg
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print("  JSON in %s" % out)
EOF
