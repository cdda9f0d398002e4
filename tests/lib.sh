# lib.sh: sourced by shell tests. Cases are functions; `t_case NAME` runs one
# in a subshell with a timeout and counts it; `t_done` prints the summary.
t_pass=0 t_fail=0
BUILD=${BUILD:-build}
BIN=$BUILD/bin
T_TMP=$(mktemp -d /tmp/baton-test.XXXXXX)
trap 't_cleanup' EXIT
t_cleanup() {
	# Kill whatever a case left behind, then remove its files.
	pkill -KILL -g $$ -f "$T_TMP" 2>/dev/null
	rm -rf "$T_TMP"
}
t_case() {
	# Not inside `if`: there the shell would ignore set -e in the case.
	( set -e; "$1" ) >"$T_TMP/case.log" 2>&1
	if [ $? -eq 0 ]; then
		echo "ok   $1"; t_pass=$((t_pass + 1))
	else
		echo "FAIL $1"; sed 's/^/  /' "$T_TMP/case.log"; t_fail=$((t_fail + 1))
	fi
}
t_done() {
	echo "$t_pass passed, $t_fail failed"
	[ "$t_fail" -eq 0 ]
}
