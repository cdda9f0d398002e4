#!/bin/sh
# ppl-peer.sh BUILD OUTDIR: Baton's perplexity against llama.cpp's on the
# same GGUF files (issue 24). BUILD holds bin/baton-arena and
# bin/baton-model-bench (make gpu-build's, for the GPU); OUTDIR gets two
# files: table.txt and logs.txt (the tail of every step's log); the GGUFs,
# arenas and logs are made in WORK (default a new directory under /tmp,
# removed at the end unless KEEP=1).
#
# With LLAMA_CPP=DIR (llama.cpp's source tree, for convert_hf_to_gguf.py
# and gguf-py; LLAMA_BIN=DIR its built llama-quantize and
# llama-perplexity, default the first of DIR/build/bin, /tmp/lb/bin that
# has them), for each demo model (models/kjv-qwen3-moe, models/kjv-mixtral):
#   1. llama.cpp's convert_hf_to_gguf.py writes the bf16 GGUF (through
#      scripts/ppl_convert.py: the demo tokenizers' pre-tokenizer hashes are
#      not in llama.cpp's table; Qwen3's split pattern is llama.cpp's qwen2);
#   2. llama-quantize makes Q4_K_M, Q3_K_M and IQ4_XS of it (rows of 192
#      and 128: llama-quantize falls back to q5_0, q5_1, q8_0, q4_0, iq4_nl);
#   3. llama-perplexity -c CTX -f TEXT on each of the four files;
#   4. baton-arena create --gguf, then baton-model-bench --perplexity TEXT
#      --ctx CTX on BACKEND (default cuda);
# and prints the table: file, its type mix as Baton imported it, llama.cpp's
# ppl, Baton's, their ratio, ok when within 1% (exit 1 otherwise).
#
# Without LLAMA_CPP (a host-only check, BACKEND=host by default there):
# Baton's own test quantizer (engine/model/fixtures/hf_to_gguf.py --quant,
# HOST_TYPES, default q4_0 q5_1 iq4_nl) writes each demo model in those
# types and the twin with the decoded f32 values; the table compares the
# quantized file's ppl with its twin's (the same figure: the host decodes
# exactly), over CHUNKS chunks (default 8 there).
#
# TEXT defaults to models/heldout/coriolanus.txt (Shakespeare, public
# domain), CTX to 256. Run from the source tree's root.
set -eu
[ $# -eq 2 ] || { echo "usage: [LLAMA_CPP=DIR] [BACKEND=cuda|host] scripts/ppl-peer.sh BUILD OUTDIR" >&2; exit 2; }
B=$1
OUT=$2
TEXT=${TEXT:-models/heldout/coriolanus.txt}
CTX=${CTX:-256}
PY=${PYTHON:-python3}
MODELS="kjv-qwen3-moe kjv-mixtral"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DEST=$OUT
OUT=${WORK:-$(mktemp -d /tmp/ppl-peer.XXXXXX)}
mkdir -p "$OUT"
finish() {
	for f in "$OUT"/*.log; do
		[ -f "$f" ] && { echo "==== $(basename "$f")"; tail -40 "$f"; }
	done > "$DEST/logs.txt" 2>/dev/null
	[ "${KEEP:-0}" = 1 ] || [ -n "${WORK:-}" ] || rm -rf "$OUT"
}
trap finish EXIT
for p in baton-arena baton-model-bench; do
	[ -x "$B/bin/$p" ] || { echo "ppl-peer: $B/bin/$p is missing" >&2; exit 2; }
done
[ -f "$TEXT" ] || { echo "ppl-peer: no text $TEXT" >&2; exit 2; }
T0=$(date +%s)
say() { echo "ppl-peer [$(( $(date +%s) - T0 )) s]: $*"; }

# the type mix of an arena as "q8_0 x12, q5_0 x30, ..." (expert parts and
# dense tensors, one count per tensor)
mix() {
	"$B/bin/baton-arena" info --json --entries "$1" | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
n = {}
seen = set()
for e in d.get("entries", []):
    for i, p in enumerate(e.get("parts", [])):
        k = (e.get("layer"), i)  # one per layer and part: the stacked tensor
        if k not in seen:
            seen.add(k)
            n[p["dtype"]] = n.get(p["dtype"], 0) + 1
for t in d.get("dense", []):
    n[t["dtype"]] = n.get(t["dtype"], 0) + 1
print(" ".join("%s:%d" % kv for kv in sorted(n.items(), key=lambda kv: -kv[1])))'
}

# baton's ppl of arena $1 into $2.json; extra flags after
baton_ppl() {
	a=$1; j=$2; shift 2
	# the host backend's device: one of this run's own (the shared one may
	# be full of other engines' memory)
	BATON_HOSTDEV_DIR=${BATON_HOSTDEV_DIR:-$OUT/hostdev} \
	"$B/bin/baton-model-bench" --arena "$a" --backend "$BACKEND" --perplexity "$TEXT" \
	    --ctx "$CTX" --json "$j.json" "$@" > "$j.log" 2>&1 || { cat "$j.log" >&2; return 1; }
	"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.4f %d" % (d["ppl"], d["chunks"]))' "$j.json"
}

ROWS=$OUT/rows.txt
: > "$ROWS"
row() { # file mix ref baton refchunks batonchunks
	echo "$1|$2|$3|$4|$5|$6" >> "$ROWS"
}

if [ -n "${LLAMA_CPP:-}" ]; then
	BACKEND=${BACKEND:-cuda}
	LB=${LLAMA_BIN:-}
	if [ -z "$LB" ]; then
		for d in "$LLAMA_CPP/build/bin" /tmp/lb/bin "$LLAMA_CPP/bin"; do
			[ -x "$d/llama-perplexity" ] && { LB=$d; break; }
		done
	fi
	[ -n "$LB" ] && [ -x "$LB/llama-quantize" ] && [ -x "$LB/llama-perplexity" ] ||
	    { echo "ppl-peer: no llama-quantize and llama-perplexity (set LLAMA_BIN)" >&2; exit 2; }
	for m in $MODELS; do
		pre=
		[ "$m" = kjv-qwen3-moe ] && pre=qwen2
		say "converting models/$m (convert_hf_to_gguf.py, bf16)"
		BATON_PPL_PRE=$pre "$PY" scripts/ppl_convert.py "$LLAMA_CPP" "models/$m" \
		    --outfile "$OUT/$m-bf16.gguf" --outtype bf16 > "$OUT/$m-convert.log" 2>&1 ||
		    { tail -30 "$OUT/$m-convert.log" >&2; exit 1; }
		for q in Q4_K_M Q3_K_M IQ4_XS; do
			"$LB/llama-quantize" "$OUT/$m-bf16.gguf" "$OUT/$m-$q.gguf" "$q" \
			    > "$OUT/$m-$q-quantize.log" 2>&1 ||
			    { tail -30 "$OUT/$m-$q-quantize.log" >&2; exit 1; }
		done
	done
	for m in $MODELS; do
		for q in bf16 Q4_K_M Q3_K_M IQ4_XS; do
			f=$m-$q
			say "$f: llama-perplexity"
			# a file that fails on either side is a row of "?", not the end
			"$LB/llama-perplexity" -m "$OUT/$f.gguf" -f "$TEXT" -c "$CTX" -ngl 99 \
			    > "$OUT/$f-llama.log" 2>&1 || tail -20 "$OUT/$f-llama.log" >&2
			ref=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$OUT/$f-llama.log")
			rch=$(sed -n 's/.*calculating perplexity over \([0-9]*\) chunks.*/\1/p' "$OUT/$f-llama.log")
			say "$f: baton ($BACKEND)"
			rm -f "$OUT/$f.arena"
			r="? ?"
			mx="?"
			if "$B/bin/baton-arena" create --gguf "$OUT/$f.gguf" "$OUT/$f.arena" \
			    > "$OUT/$f-arena.log" 2>&1; then
				mx=$(mix "$OUT/$f.arena")
				r=$(baton_ppl "$OUT/$f.arena" "$OUT/$f-baton") || r="? ?"
			else
				cat "$OUT/$f-arena.log" >&2
			fi
			set -- $r
			row "$f.gguf" "$mx" "${ref:-?}" "$1" "${rch:-?}" "$2"
			rm -f "$OUT/$f.arena" "$OUT/$f.arena.lock"
		done
	done
	REF="llama.cpp"
else
	BACKEND=${BACKEND:-host}
	CH=${CHUNKS:-8}
	for m in $MODELS; do
		for q in ${HOST_TYPES:-q4_0 q5_1 iq4_nl}; do
			f=$m-$q
			say "$f: engine/model/fixtures/hf_to_gguf.py --quant $q"
			"$PY" engine/model/fixtures/hf_to_gguf.py "models/$m" "$OUT/$f.gguf" --quant "$q" \
			    "$OUT/$f-twin.gguf" > "$OUT/$f-gguf.log" 2>&1 || { cat "$OUT/$f-gguf.log" >&2; exit 1; }
			for g in "$f" "$f-twin"; do
				rm -f "$OUT/$g.arena"
				"$B/bin/baton-arena" create --gguf "$OUT/$g.gguf" "$OUT/$g.arena" \
				    > "$OUT/$g-arena.log" 2>&1 || { cat "$OUT/$g-arena.log" >&2; exit 1; }
			done
			say "$f: baton ($BACKEND), $CH chunks"
			r=$(baton_ppl "$OUT/$f-twin.arena" "$OUT/$f-twin-baton" --chunks "$CH" \
			    --tokenizer "models/$m/tokenizer.json") || exit 1
			set -- $r
			ref=$1 rch=$2
			r=$(baton_ppl "$OUT/$f.arena" "$OUT/$f-baton" --chunks "$CH" \
			    --tokenizer "models/$m/tokenizer.json") || exit 1
			set -- $r
			row "$f.gguf" "$(mix "$OUT/$f.arena")" "$ref" "$1" "$rch" "$2"
			rm -f "$OUT"/$f*.arena "$OUT"/$f*.arena.lock "$OUT"/$f*.gguf
		done
	done
	REF="f32 twin"
fi

rc=0
"$PY" - "$ROWS" "$REF" "$BACKEND" "$CTX" "$TEXT" > "$DEST/table.txt" <<'EOF' || rc=$?
import sys
rows, ref, backend, ctx, text = sys.argv[1:6]
print("perplexity over %s, chunks of %s; Baton on %s; reference: %s" % (text, ctx, backend, ref))
print("%-26s %-44s %12s %12s %8s %s" % ("file", "types (tensors)", ref, "baton", "ratio", ""))
bad = 0
for line in open(rows):
    f, mix, r, b, rc, bc = line.rstrip("\n").split("|")
    try:
        ratio = float(b) / float(r)
        ok = abs(ratio - 1) <= 0.01 and rc == bc
    except ValueError:
        ratio, ok = float("nan"), False
    bad += not ok
    note = "ok" if ok else "OFF" + ("" if rc == bc else " (chunks %s vs %s)" % (rc, bc))
    print("%-26s %-44s %12s %12s %8.4f %s" % (f, mix, r, b, ratio, note))
print("%d of %d within 1%%" % (sum(1 for _ in open(rows)) - bad, sum(1 for _ in open(rows))))
sys.exit(1 if bad else 0)
EOF
cat "$DEST/table.txt"
say "done"
exit $rc
