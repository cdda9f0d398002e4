#!/bin/sh
# reliability.sh SCRIPT...: run each given test script (python or sh) in its
# own process with a time limit ($TEST_LIMIT, default 1800 s), as run.sh
# does for the whole suite, and add up their "N passed, N failed" lines; the
# last line is the total. Used by make test-reliability and make test-tsan.
set -u
BUILD=${BUILD:-build}
export BUILD
LIMIT=${TEST_LIMIT:-1800}
pass=0 fail=0 failed_names=""
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for s in "$@"; do
	echo "== $s"
	t0=$(date +%s)
	case $s in
	*.py) timeout -k 5 "$LIMIT" /usr/bin/python3 "$s" >"$log" 2>&1 ;;
	*) timeout -k 5 "$LIMIT" sh "$s" >"$log" 2>&1 ;;
	esac
	rc=$?
	cat "$log"
	echo "   ($s: $(( $(date +%s) - t0 )) s)"
	summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
	if [ -n "$summary" ]; then
		p=${summary%% passed*}
		f=${summary#*passed, }; f=${f%% failed}
		pass=$((pass + p)); fail=$((fail + f))
		if [ "$f" -ne 0 ] || [ "$rc" -ne 0 ]; then
			failed_names="$failed_names $s"
			[ "$f" -eq 0 ] && fail=$((fail + 1))
		fi
	else
		echo "FAIL $s: exit $rc with no summary line"
		fail=$((fail + 1)); failed_names="$failed_names $s"
	fi
done
[ -n "$failed_names" ] && echo "failed:$failed_names"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
