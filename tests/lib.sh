# lib.sh: sourced by shell tests. Cases are functions; `t_case NAME` runs one
# in a subshell with a timeout and counts it; `t_done` prints the summary.
#
# The timeout: TEST_CASE_LIMIT seconds (default 120) per case. A case still
# running then is killed with every process it started (a watchdog beside
# it), its log says so, and it counts as failed; the next case runs.
#
# What the cases share: `expect CODE CMD...` runs CMD and wants exit CODE
# (its output in $T_TMP/out), `says TEXT` wants TEXT in that output, and
# `fail MESSAGE...` fails the case with MESSAGE.
t_pass=0 t_fail=0
BUILD=${BUILD:-build}
BIN=$BUILD/bin
T_CASE_LIMIT=${TEST_CASE_LIMIT:-120}
T_TMP=$(mktemp -d /tmp/baton-test.XXXXXX)
trap 't_cleanup' EXIT
t_cleanup() {
	# Kill whatever a case left behind, then remove its files.
	pkill -KILL -g $$ -f "$T_TMP" 2>/dev/null
	rm -rf "$T_TMP"
}

# t_kill_tree PID SIGNAL: PID and every process below it, the children first.
t_kill_tree() {
	local c
	for c in $(pgrep -P "$1"); do t_kill_tree "$c" "$2"; done
	kill "-$2" "$1" 2>/dev/null
}

t_case() {
	# Not inside `if`: there the shell would ignore set -e in the case.
	( set -e; "$1" ) >"$T_TMP/case.log" 2>&1 </dev/null &
	t_pid=$!
	( sleep "$T_CASE_LIMIT"
	  echo "timed out after $T_CASE_LIMIT s (TEST_CASE_LIMIT)" >>"$T_TMP/case.log"
	  t_kill_tree "$t_pid" KILL ) >/dev/null 2>&1 &
	t_dog=$!
	wait "$t_pid" 2>/dev/null
	t_rc=$?
	# the watchdog before its sleep: killed children first, the watchdog
	# would wake and write "timed out" into a case that did not
	t_dog_kids=$(pgrep -P "$t_dog")
	kill -KILL "$t_dog" 2>/dev/null
	for t_k in $t_dog_kids; do kill -KILL "$t_k" 2>/dev/null; done
	wait "$t_dog" 2>/dev/null
	if [ "$t_rc" -eq 0 ]; then
		echo "ok   $1"; t_pass=$((t_pass + 1))
	else
		echo "FAIL $1"; sed 's/^/  /' "$T_TMP/case.log"; t_fail=$((t_fail + 1))
	fi
}
t_done() {
	echo "$t_pass passed, $t_fail failed"
	[ "$t_fail" -eq 0 ]
}

fail() { echo "$*"; exit 1; }

# expect CODE CMD...: runs CMD, wants exit CODE; its output in $T_TMP/out.
expect() {
	want=$1; shift
	set +e
	"$@" >"$T_TMP/out" 2>&1
	got=$?
	set -e
	if [ "$got" -ne "$want" ]; then
		cat "$T_TMP/out"; fail "exit $got, want $want: $*"
	fi
}

# says TEXT: the last expect's output holds TEXT.
says() { grep -q -- "$1" "$T_TMP/out" || { cat "$T_TMP/out"; fail "output lacks '$1'"; }; }
