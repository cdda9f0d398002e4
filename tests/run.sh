#!/bin/bash
# run.sh BIN...: run every test binary given, then every test script
# (*/*_test.sh, *_test.py), each in its own process with a time limit, and
# add up their "N passed, N failed" lines. The last line is the total, for CI.
#
# The binaries are unit tests with nothing shared (each case forks, each
# host device lives in its own directory), so TEST_JOBS of them run at once
# (default: twice the CPUs: they mostly wait); each one's output is printed whole when it
# ends. The scripts start brokers and engines and some time what they see,
# so they run one at a time.
#
# run.sh --bins-only BIN...: the binaries alone, one at a time (the GPU
# tests share one device).
# run.sh --no-scripts BIN...: the binaries alone, TEST_JOBS at a time.
# run.sh --scripts SCRIPT...: the scripts given alone (python or sh by
# their name), each with its time (tests/reliability.sh).
# Scripts find the build through $BUILD (default build). A test binary or
# script that dies without its summary line counts as one failure. With
# TEST_TOTALS set, the totals are also appended to that file as
# "PASSED FAILED" (make test adds its two passes up from it).
set -u
BUILD=${BUILD:-build}
export BUILD
LIMIT=${TEST_LIMIT:-600}
JOBS=${TEST_JOBS:-$(( 2 * $(nproc 2>/dev/null || echo 1) ))}
pass=0 fail=0 failed_names=""
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT
timed=0

# run_one NAME CMD...: runs CMD into $logdir/NAME.log and its exit status
# into $logdir/NAME.rc (so several can run at once).
run_one() {
	local name=$1; shift
	local t0; t0=$(date +%s)
	timeout -k 5 "$LIMIT" "$@" >"$logdir/$name.log" 2>&1
	echo "$? $(( $(date +%s) - t0 ))" >"$logdir/$name.rc"
}

# report NAME: prints a finished test's output and adds up its summary.
report() {
	local name=$1 rc secs summary p f
	read -r rc secs <"$logdir/$name.rc"
	echo "== $name"
	cat "$logdir/$name.log"
	[ "$timed" -eq 1 ] && echo "   ($name: $secs s)"
	summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$logdir/$name.log" | tail -n 1)
	if [ -n "$summary" ]; then
		p=${summary%% passed*}
		f=${summary#*passed, }; f=${f%% failed}
		pass=$((pass + p)); fail=$((fail + f))
		if [ "$f" -ne 0 ] || [ "$rc" -ne 0 ]; then
			failed_names="$failed_names $name"
			[ "$f" -eq 0 ] && fail=$((fail + 1))
		fi
	else
		echo "FAIL $name: exit $rc with no summary line"
		fail=$((fail + 1)); failed_names="$failed_names $name"
	fi
}

run_script() {
	local name=${1//\//_}
	case $1 in
	*.py) run_one "$name" /usr/bin/python3 "$1" ;;
	*) run_one "$name" sh "$1" ;;
	esac
	report "$name"
}

# run_bins BIN...: JOBS at a time, each reported when it ends.
run_bins() {
	local -A name_of=()
	local t pid running=0
	for t in "$@"; do
		run_one "$(basename "$t")" "$t" &
		name_of[$!]=$(basename "$t")
		running=$((running + 1))
		if [ "$running" -ge "$JOBS" ]; then
			wait -n -p pid
			report "${name_of[$pid]}"
			running=$((running - 1))
		fi
	done
	while [ "$running" -gt 0 ]; do
		wait -n -p pid
		report "${name_of[$pid]}"
		running=$((running - 1))
	done
}

scripts=1
case ${1:-} in
--bins-only) scripts=0; JOBS=1; shift ;;
--no-scripts) scripts=0; shift ;;
--scripts) scripts=0 timed=1; shift
	for s in "$@"; do run_script "$s"; done
	set -- ;;
esac
[ $# -gt 0 ] && run_bins "$@"
if [ "$scripts" -eq 1 ]; then
	for s in $(find proto arena text http engine broker deploy docs tests -name "*_test.sh" -o -name "*_test.py" 2>/dev/null | sort); do
		run_script "$s"
	done
fi

[ -n "$failed_names" ] && echo "failed:$failed_names"
[ -n "${TEST_TOTALS:-}" ] && echo "$pass $fail" >>"$TEST_TOTALS"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
