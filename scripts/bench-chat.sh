#!/bin/sh
# bench-chat.sh BUILD OUTDIR: the multi-turn chat benchmark of issue 29 (the
# prefix cache, and conversations that survive a switch), in one run.
#
#  1. scripts/gguf-synth.py writes the random Qwen3-30B-A3B-shaped GGUF
#     (LAYERS 48, SEED 17: q4_K, 16.1 GiB) into SHM (default /dev/shm), or
#     KEEP_GGUF=PATH (reused when there); baton-arena imports it
#     (scripts/lib-gguf.sh);
#  2. scripts/bench-chat.py chat: CLIENTS (4) conversations at once, TURNS
#     (8) turns each, the first prompt FIRST (500) tokens, GROW (500) more
#     per turn (the last prompt 4,000), GEN (64) generated per turn; time
#     to first token per turn with the prefix cache, then again with
#     --no-prefix-cache; the answers must be the same;
#  3. with LLAMA_CPP=DIR (DIR/bin, DIR/build/bin or DIR holding
#     llama-server): the same conversations against llama-server on the
#     same GGUF, cache_prompt on;
#  4. scripts/bench-chat.py switch: two engines of the model (A, B) behind
#     the broker's front door, their conversations interleaved turn by turn,
#     the other model released --all before each turn (its weights and KV
#     pool leave the device); the KV comes back from host memory
#     (--kv-host-mib KV_HOST_MIB, default 8192), then again with
#     --kv-host-mib 0 (read again from the first token); the answers must
#     be the same;
#  5. unless the run is exact already (EXACT=1, or BACKEND=host), step 4
#     again with BATON_CUDA_GEMM=0 BATON_CUDA_EXACT=1 for EXACT_TURNS (3) turns: the answers
#     compared there (EXACT_PASS=0 skips it, 1 runs it on any backend);
#  6. one table: OUTDIR/summary.json and summary.txt (which kernels ran,
#     and whether each pair of modes gave the same answers token for
#     token), the modes' JSON (chat-cache.json, chat-nocache.json,
#     llama.json, switch-host.json, switch-drop.json, switch-host-exact.json,
#     switch-drop-exact.json) and logs.
#
# EXACT=1 runs the engines with BATON_CUDA_GEMM=0 BATON_CUDA_EXACT=1 (the exact kernels: on
# cuda's default tensor-core path a pass's sums depend on its shape, and a
# cached prefix's rows were made in passes of other shapes than a full read
# makes them, so the answers with and without the cache, or with the KV
# from host and read again, agree within that path's tolerance, bit for bit
# only so; docs/internals/prefix-cache.md). Without it the run measures the
# default path and step 5 gives the identical answers. LLAMA_FLAGS go to
# llama-server (e.g. -ngl 0 without a GPU). MODES (chat llama switch) picks
# steps 2 (chat), 3 (llama) and 4 with 5 (switch), to split a run in two.
# BACKEND (cuda), EXPERTS and VOCAB size the model; the quick host check:
#   LAYERS=2 EXPERTS=8 VOCAB=4096 BACKEND=host CLIENTS=2 TURNS=3 FIRST=40 GROW=40 GEN=8
# llama.cpp is a peer, never part of Baton: nothing of it is in this tree.
set -eu
B=${1:?usage: bench-chat.sh BUILD OUTDIR}
OUT=${2:?usage: bench-chat.sh BUILD OUTDIR}
LAYERS=${LAYERS:-48}
SEED=${SEED:-17}
BACKEND=${BACKEND:-cuda}
EXPERTS=${EXPERTS:-128}
VOCAB=${VOCAB:-151936}
CLIENTS=${CLIENTS:-4}
TURNS=${TURNS:-8}
FIRST=${FIRST:-500}
GROW=${GROW:-500}
GEN=${GEN:-64}
KV_HOST_MIB=${KV_HOST_MIB:-8192}
SHM=${SHM:-/dev/shm}
LLAMA_CPP=${LLAMA_CPP:-}
LLAMA_FLAGS=${LLAMA_FLAGS:-}
MODES=${MODES:-chat llama switch}
EXACT=${EXACT:-0}
EXACT_TURNS=${EXACT_TURNS:-3}
if [ "$EXACT" = 1 ]; then
	export BATON_CUDA_GEMM=0 BATON_CUDA_EXACT=1
fi
if [ -z "${EXACT_PASS:-}" ]; then
	EXACT_PASS=1
	if [ "$EXACT" = 1 ] || [ "$BACKEND" = host ]; then
		EXACT_PASS=0
	fi
fi
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
B=$(cd "$B" && pwd)
. "$HERE/lib-gguf.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
	tee "$OUT/gpu.txt" || true
gguf_arena chat

RUN_TURNS=$TURNS
run() { # name, then bench-chat.py's arguments (RUN_TURNS turns)
	n=$1
	shift
	W="--clients $CLIENTS --turns $RUN_TURNS --first $FIRST --grow $GROW --gen $GEN"
	# shellcheck disable=SC2086
	"$PY" "$HERE/bench-chat.py" "$@" $W --json "$OUT/$n.json" >"$OUT/$n.txt" 2>&1 ||
		echo "bench-chat.py $n failed (see $OUT/$n.txt)" | tee -a "$OUT/failed.txt"
	tail -n "$RUN_TURNS" "$OUT/$n.txt"
}
has() { case " $MODES " in *" $1 "*) return 0 ;; esac; return 1; }
if has chat; then
	run chat-cache chat --build "$B" --arena "$A" --backend "$BACKEND"
	run chat-nocache chat --build "$B" --arena "$A" --backend "$BACKEND" --engine-flag=--no-prefix-cache
fi
if [ -n "$LLAMA_CPP" ] && has llama; then
	LS=
	for d in "$LLAMA_CPP/bin" "$LLAMA_CPP/build/bin" "$LLAMA_CPP"; do
		[ -x "$d/llama-server" ] && { LS=$d/llama-server; break; }
	done
	if [ -z "$LS" ]; then
		echo "no llama-server under $LLAMA_CPP (bin, build/bin)" | tee "$OUT/llama.txt"
	else
		set --
		for f in $LLAMA_FLAGS; do
			set -- "$@" "--server-flag=$f"
		done
		run llama llama --server "$LS" --gguf "$G" --vocab "$VOCAB" "$@"
	fi
fi
if has switch; then
	run switch-host switch --build "$B" --arena "$A" --backend "$BACKEND" --engine-flag=--kv-host-mib \
		--engine-flag="$KV_HOST_MIB"
	run switch-drop switch --build "$B" --arena "$A" --backend "$BACKEND" --engine-flag=--kv-host-mib \
		--engine-flag=0
fi
if [ "$EXACT_PASS" = 1 ] && has switch; then
	# the answers' pass: the exact kernels, a few turns
	RUN_TURNS=$EXACT_TURNS
	export BATON_CUDA_GEMM=0 BATON_CUDA_EXACT=1
	run switch-host-exact switch --build "$B" --arena "$A" --backend "$BACKEND" \
		--engine-flag=--kv-host-mib --engine-flag="$KV_HOST_MIB"
	run switch-drop-exact switch --build "$B" --arena "$A" --backend "$BACKEND" \
		--engine-flag=--kv-host-mib --engine-flag=0
	unset BATON_CUDA_GEMM BATON_CUDA_EXACT
fi

"$PY" - "$OUT" "$BACKEND" "$EXACT" <<'EOF'
import json, os, sys
out, backend, exact = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
names = ("chat-cache", "chat-nocache", "llama", "switch-host", "switch-drop", "switch-host-exact",
         "switch-drop-exact")

def load(n):
    try:
        return json.load(open(os.path.join(out, n + ".json")))
    except (OSError, ValueError):
        return None

runs = {n: load(n) for n in names}

def col(n, key="ttft_median_s"):
    r = runs[n]
    return [t[key] for t in r["per_turn"]] if r else None

def ratio(x, y):
    return round(x / y, 3) if x and y else None

def cell(v):
    return "-" if v is None else v

def kernels(r):
    if backend == "host":
        return "host backend (exact by construction)"
    if r and r.get("gemm") == "0":
        return "cuda, BATON_CUDA_GEMM=0 BATON_CUDA_EXACT=1 (the exact kernels)"
    return "cuda, the default tensor-core path (passes of 64 rows or more)"

def same(x, y):
    """Compares two runs' answers token for token (the streamed pieces)."""
    if not (runs[x] and runs[y]):
        return None
    px, py = runs[x].get("pieces"), runs[y].get("pieces")
    n, eq, first = 0, 0, None
    for k, (cx, cy) in enumerate(zip(px, py)):
        for t, (ax, ay) in enumerate(zip(cx, cy)):
            n += 1
            if ax is not None and ax == ay:
                eq += 1
            elif first is None:
                ax, ay = ax or [], ay or []
                at = next((i for i, (u, v) in enumerate(zip(ax, ay)) if u != v), min(len(ax), len(ay)))
                first = {"client": k, "turn": t, "token": at}
    return {"identical": n > 0 and eq == n, "answers": n, "equal": eq, "first_difference": first,
            "kernels": kernels(runs[x])}

def say(what, c):
    if c is None:
        return
    if c["identical"]:
        lines.append("%s: identical token for token (%d of %d answers) [%s]" % (what, c["equal"], c["answers"],
                                                                             c["kernels"]))
    else:
        f = c["first_difference"] or {}
        lines.append("%s: NOT identical, %d of %d answers equal, the first difference at client %s turn %s "
                     "token %s [%s]" % (what, c["equal"], c["answers"], f.get("client"), f.get("turn"),
                                        f.get("token"), c["kernels"]))

lines, summ = [], {"modes": {n: bool(r) for n, r in runs.items()}, "backend": backend}
main = runs["chat-cache"] or runs["switch-host"]
summ["kernels"] = kernels(main)
lines.append("ran: %s%s" % (summ["kernels"], "" if backend == "host" or exact or not runs["switch-host-exact"]
                            else "; the switch's answers again with BATON_CUDA_GEMM=0 BATON_CUDA_EXACT=1 (%d turns)"
                            % runs["switch-host-exact"]["turns"]))
c, nc, ll, sh, sd = (col(n) for n in ("chat-cache", "chat-nocache", "llama", "switch-host", "switch-drop"))
ref = runs["chat-cache"] or runs["chat-nocache"]
if ref:
    prompts = [t["prompt_tokens"] for t in ref["per_turn"]]
    cached = col("chat-cache", "cached_tokens_median") or [None] * len(prompts)
    lcached = col("llama", "cached_tokens_median") or [None] * len(prompts)
    lines.append("chat: %d clients, %d turns (time to first token, median over clients, s)" %
                 (ref["clients"], ref["turns"]))
    lines.append("%5s %7s %7s %9s %9s %7s %9s %7s %9s" % ("turn", "prompt", "cached", "cache", "no cache",
                                                       "ratio", "llama.cpp", "cached", "ratio"))
    rows = []
    for i, p in enumerate(prompts):
        row = {"turn": i, "prompt": p, "cached": cached[i], "cache_s": c[i] if c else None,
               "nocache_s": nc[i] if nc else None, "llama_s": ll[i] if ll else None,
               "llama_cached": lcached[i]}
        row["nocache_over_cache"] = ratio(row["nocache_s"], row["cache_s"])
        row["llama_over_cache"] = ratio(row["llama_s"], row["cache_s"])
        rows.append(row)
        lines.append("%5d %7s %7s %9s %9s %7s %9s %7s %9s" % tuple(cell(v) for v in (
            i, p, cached[i], row["cache_s"], row["nocache_s"], row["nocache_over_cache"], row["llama_s"],
            lcached[i], row["llama_over_cache"])))
    summ["chat"] = rows
    cmp = same("chat-cache", "chat-nocache")
    if cmp:
        summ["chat_answers"] = cmp
        summ["chat_answers_equal"] = cmp["identical"]
        say("chat answers, with the cache vs without", cmp)
    if runs["chat-cache"]:
        summ["prefix_cache"] = runs["chat-cache"].get("prefix_cache")
if sh or sd:
    r = runs["switch-host"] or runs["switch-drop"]
    lines.append("switch: two models through the door, the other released --all before each turn")
    lines.append("%5s %7s %11s %11s %7s" % ("turn", "prompt", "KV from host", "re-prefill", "ratio"))
    rows = []
    for i, t in enumerate(r["per_turn"]):
        row = {"turn": i, "prompt": t["prompt_tokens"], "host_s": sh[i] if sh else None,
               "drop_s": sd[i] if sd else None}
        row["drop_over_host"] = ratio(row["drop_s"], row["host_s"])
        rows.append(row)
        lines.append("%5d %7s %11s %11s %7s" % tuple(cell(v) for v in (i, row["prompt"], row["host_s"],
                                                                      row["drop_s"], row["drop_over_host"])))
    summ["switch"] = rows
    cmp = same("switch-host", "switch-drop")
    if cmp:
        summ["switch_answers"] = cmp
        say("switch answers, the KV from host vs read again", cmp)
    ex = same("switch-host-exact", "switch-drop-exact")
    if ex:
        summ["switch_answers_exact"] = ex
        say("switch answers, the answers' pass (BATON_CUDA_GEMM=0, %d turns), the KV from host vs read again"
            % runs["switch-host-exact"]["turns"], ex)
    # the identical answers: the exact pass's where there is one, else the run's own
    best = ex or cmp
    if best:
        summ["switch_answers_equal"] = best["identical"]
    for n in ("switch-host", "switch-drop"):
        if runs[n]:
            summ[n + "_release_all_s_median"] = runs[n].get("release_all_s_median")
text = "\n".join(lines)
print(text)
open(os.path.join(out, "summary.txt"), "w").write(text + "\n")
json.dump(summ, open(os.path.join(out, "summary.json"), "w"), indent=1)
EOF
[ ! -s "$OUT/failed.txt" ]
