#!/bin/sh
# fuzz.sh BIN...: run each libFuzzer binary for $FUZZ_SECONDS (default 60)
# on a corpus kept under $BUILD/corpus/<name> (seeded from
# tests/corpus/<name> and, for the arena readers, tests/arena_fuzz_seeds.py).
# Prints each target's executions; exits 1 if any target found a crash
# (the crashing input is left in $BUILD/crashes/<name>/).
set -u
BUILD=${BUILD:-build}
SECS=${FUZZ_SECONDS:-60}
fail=0
# A UBSan report stops the target, so it counts as a crash.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
for bin in "$@"; do
	name=$(basename "$bin")
	corpus=$BUILD/corpus/$name
	crashes=$BUILD/crashes/$name
	mkdir -p "$corpus" "$crashes"
	[ -d "tests/corpus/$name" ] && cp -n tests/corpus/"$name"/* "$corpus"/ 2>/dev/null
	case $name in
	arena_*)
		[ -z "$(ls -A "$corpus")" ] && [ -x "$BUILD/../bin/baton-arena" ] &&
			/usr/bin/python3 tests/arena_fuzz_seeds.py "$BUILD/corpus" "$BUILD/../bin/baton-arena" >/dev/null 2>&1
		;;
	esac
	log=$BUILD/fuzz-$name.log
	# Inputs that crashed an earlier run: one that passes now (its bug
	# fixed) joins the corpus as a regression seed; one that still fails
	# fails this run.
	for f in "$crashes"/*; do
		[ -f "$f" ] || continue
		if "$bin" "$f" >/dev/null 2>&1; then
			mv "$f" "$corpus/fixed-$(basename "$f")"
			echo "fuzz $name: $(basename "$f") passes now; kept in the corpus"
		fi
	done
	"$bin" -max_total_time="$SECS" -print_final_stats=1 -artifact_prefix="$crashes/" \
		-timeout=10 -rss_limit_mb=2048 "$corpus" >"$log" 2>&1
	rc=$?
	execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
	if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$crashes")" ]; then
		echo "fuzz $name: FAILED after ${execs:-?} executions (exit $rc); see $log and $crashes"
		tail -n 30 "$log"
		fail=1
	else
		echo "fuzz $name: ${execs:-?} executions in ${SECS}s, no crash"
	fi
done
exit $fail
