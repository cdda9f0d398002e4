# lib-gguf.sh: the random Qwen3-30B-A3B-shaped GGUF and its arena, for the
# benchmarks that run Baton and llama.cpp on one file (bench-chat.sh,
# bench-peer.sh); sourced, after they set B (the build), OUT, HERE (this
# folder), PY and the shape: LAYERS, SEED, EXPERTS, VOCAB, BACKEND, SHM.
#
# gguf_arena TAG: G is KEEP_GGUF (reused when there, written there and kept
# if not) or SHM/baton-TAG-LAYERS-SEED-EXPERTS-VOCAB.gguf (removed at the
# exit); scripts/gguf-synth.py writes it (OUT/gguf.txt says how long it
# took); baton-arena imports it into A, SHM/baton-TAG-PID.arena
# (OUT/arena.txt). With BACKEND=host, the host backend's device is a
# directory of this run's (BATON_HOSTDEV_DIR, HD). One trap removes the
# arena, that directory and the GGUF unless kept.
now() { date +%s.%N; }
since() { awk "BEGIN { printf \"%.1f\", $(now) - $1 }"; }

gguf_cleanup() {
	rm -f "$A" "$A.lock"
	[ -z "$HD" ] || rm -rf "$HD"
	[ "$KEEP" = 1 ] || rm -f "$G"
}

gguf_arena() {
	if [ -n "${KEEP_GGUF:-}" ]; then
		G=$KEEP_GGUF
		KEEP=1
	else
		G="$SHM/baton-$1-$LAYERS-$SEED-$EXPERTS-$VOCAB.gguf"
		KEEP=0
	fi
	A="$SHM/baton-$1-$$.arena"
	HD=
	if [ "$BACKEND" = host ]; then
		HD=$(mktemp -d)
		export BATON_HOSTDEV_DIR="$HD"
	fi
	trap gguf_cleanup EXIT
	trap 'exit 130' INT TERM # through the EXIT trap
	if [ "$KEEP" = 1 ] && [ -s "$G" ]; then
		echo "gguf: reusing $G ($(stat -c %s "$G") bytes)" | tee "$OUT/gguf.txt"
	else
		t0=$(now)
		"$PY" "$HERE/gguf-synth.py" --layers "$LAYERS" --seed "$SEED" --experts "$EXPERTS" \
			--vocab "$VOCAB" --out "$G" | tee "$OUT/gguf.txt"
		echo "gguf: written in $(since "$t0") s" | tee -a "$OUT/gguf.txt"
	fi
	t0=$(now)
	"$B/bin/baton-arena" create --gguf "$G" --force "$A" | tail -n 1 | tee "$OUT/arena.txt"
	echo "arena: imported in $(since "$t0") s" | tee -a "$OUT/arena.txt"
}
