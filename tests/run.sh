#!/bin/sh
# run.sh BIN...: run every test binary given, then every test script
# (*/*_test.sh, *_test.py), each in its own process with a time limit, and
# add up their "N passed, N failed" lines. The last line is the total, for CI.
#
# run.sh --bins-only BIN...: the binaries alone (the GPU tests).
# run.sh --scripts SCRIPT...: the scripts given alone (python or sh by
# their name), each with its time (tests/reliability.sh).
# Scripts find the build through $BUILD (default build). A test binary or
# script that dies without its summary line counts as one failure.
set -u
BUILD=${BUILD:-build}
export BUILD
LIMIT=${TEST_LIMIT:-600}
pass=0 fail=0 failed_names=""
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run_one() {
	name=$1; shift
	echo "== $name"
	t0=$(date +%s)
	timeout -k 5 "$LIMIT" "$@" >"$log" 2>&1
	rc=$?
	cat "$log"
	[ "$timed" -eq 1 ] && echo "   ($name: $(( $(date +%s) - t0 )) s)"
	summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
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
	case $1 in
	*.py) run_one "$1" /usr/bin/python3 "$1" ;;
	*) run_one "$1" sh "$1" ;;
	esac
}

scripts=1 timed=0
case ${1:-} in
--bins-only) scripts=0; shift ;;
--scripts) scripts=0 timed=1; shift
	for s in "$@"; do run_script "$s"; done
	set -- ;;
esac
for t in "$@"; do
	run_one "$(basename "$t")" "$t"
done
[ "$scripts" -eq 1 ] && for s in $(ls */*_test.sh */*_test.py 2>/dev/null | sort); do
	run_script "$s"
done

[ -n "$failed_names" ] && echo "failed:$failed_names"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
