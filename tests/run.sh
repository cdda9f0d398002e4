#!/bin/bash
# run.sh BIN...: run every test binary given, then every test script
# (*_test.py, *_test.sh at any depth under the source folders), each in its
# own process with a time limit, and add up their "N passed, N failed"
# lines. The last line is the total, for CI.
#
# Two kinds of test, one runner (as valkey's tests/unit and
# tests/integration): the binaries are the unit tests (build/test/*, from
# *_test.c: each case forks, nothing is shared, each host device lives in
# its own directory); the scripts are the system tests (they start brokers
# and engines, or other programs, as real processes). Each is labelled so
# in its "== unit NAME" / "== system NAME" heading.
#
# Both run TEST_JOBS at a time (default: twice the CPUs: they mostly wait);
# each one's output is printed whole when it ends. Scripts are isolated by
# directory: every case makes its own temporary directory (host device,
# sockets, logs) and HTTP servers listen on port 0. The few scripts that
# time what they see against fixed bounds, or want the whole machine, are
# in SERIAL_STEPS below: they run after the parallel ones, alone, step by
# step (the cases of a step that only wait on clocks at once).
#
# run.sh --bins-only BIN...: the binaries alone, one at a time (the GPU
# tests share one device).
# run.sh --no-scripts BIN...: the binaries alone, TEST_JOBS at a time.
# run.sh --scripts SCRIPT...: the scripts given alone (python or sh by
# their name), one at a time, each with its time (tests/reliability.sh).
# run.sh --skip-pure BIN...: as plain run.sh, without the scripts that run
# no compiled program (those marked "# test: pure" in their first 30
# lines): make test's sanitizer pass, where they would only repeat.
# run.sh --serial: the serial phase alone (to time it).
# run.sh --list-serial: its plan, one item a line: step number, script and
# the arguments it gets, tab-separated (tests/run_test.py checks it).
# Scripts find the build through $BUILD (default build). A test binary or
# script that dies without its summary line counts as one failure. With
# TEST_TOTALS set, the totals are also appended to that file as
# "PASSED FAILED" (make test adds its two passes up from it).
set -u
BUILD=${BUILD:-build}
export BUILD
# No __pycache__ left in the tree by the Python tests; tests/harness.py
# importable from a test at any depth (each test also finds it itself).
export PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
LIMIT=${TEST_LIMIT:-600}
JOBS=${TEST_JOBS:-$(( 2 * $(nproc 2>/dev/null || echo 1) ))}
pass=0 fail=0 failed_names="" cpu_sum=0 t_start=$(date +%s)
logdir=$(mktemp -d)
trap 'rm -rf "$logdir"' EXIT
timed=0

# The serial phase: after the others, alone on the machine, one step after
# the other. Each bounds the time of what it sees (heartbeat timeouts,
# refill steps against a command timeout, a stalled engine answered within
# a second, a browser's page read during a 2 s refill), or loads every core
# (the stress case, the soak, the benchmark, chromium). A step is one line;
# its items run at once (SERIAL_JOBS at a time, default 5, the first
# first). Those that load every core, and broker_test's cases that bound
# CPU time (engines started, requests served, an idle timer or a heartbeat
# read within a second or two, the choice between engines idle tenths of a
# second apart), are steps of one item, their cases one after the other;
# the last step holds what bounds a clock and not the CPU: ops_test's
# refills slowed by BATON_TEST_REFILL_STEP_MS (seconds of sleeping each,
# with margins of seconds) and broker_test's cases without a time bound.
# An item is a script, or SCRIPT::CASES: the cases named (comma-separated;
# -CASE: all but it, as tests/harness.py's run_cases takes them), or
# SCRIPT::rest: the cases no other item names (a case added to the script
# lands there). The items of one script are separate processes, each case
# with its own directories.
SERIAL_STEPS="broker/broker_test.py::t_stress
broker/api/dashboard_test.py
tests/soak_test.py
engine/model/model_bench_test.sh
broker/broker_test.py::t_two_engines_alternate,t_priority_and_idle_order,t_longest_idle,t_pinned_and_bounded_wait,t_pinned_leaves_part,t_idle_release,t_engine_silent,t_engine_kill_during_refill,t_engine_kill_during_gen,t_broker_restart_under_load,t_engine_without_broker
broker/broker_test.py::t_config_and_flags,t_headroom,t_total_mib,t_shrink_rather_than_release,t_event_bytes_are_device_memory,t_handoff_takes_only_what_b_lacks \
	broker/broker_test.py::rest broker/ops_test.py::t_progress_bar_on_terminal_only \
	broker/ops_test.py::t_diagnosis_counts_refilling broker/ops_test.py::t_cli_waits_while_the_broker_answers \
	broker/ops_test.py::t_release_during_refill_says_refilling broker/ops_test.py::t_long_refill_progresses \
	broker/ops_test.py::rest"
SERIAL_JOBS=${SERIAL_JOBS:-5}
# The scripts of the serial phase (each once, whatever cases its items name).
SERIAL=$(for i in $SERIAL_STEPS; do echo "${i%%::*}"; done | sort -u)

# Started first, longest first (as measured on the 2-core VM: the longer of
# each one's two passes, make test's two runs on 2026-12-02 04:15-04:40
# with other work beside them, load average 10 to 13): the pool then ends
# on short jobs instead of waiting for a long one started last (the
# scripts/ ones, last in the sorted list, did). A name not here keeps its
# place after them.
LONG_FIRST="engine_model engine/serve/structured_test.py engine/serve/serve_test.py broker/jobs_test.py
	tests/fault_test.py engine/serve/openai_test.py scripts/bench_peer_test.sh broker/door/door_test.py
	proto/interop_test.py text_tokenize tests/kill_test.py engine/serve/responses_test.py broker/cli/cli_test.py
	arena/sources_test.py engine_serve_sched broker/api/http_test.py broker/door/fleet_test.py arena/kill_test.py
	scripts/bench_chat_test.sh scripts/gguf_synth_test.py broker/peer_test.py proto_transport
	broker/security_test.py tests/hostile_test.py arena_open engine/serve/peer_test.py engine/serve/faces_test.py
	proto/hangup_test.py engine_cache engine_backend_moe"

# long_first ITEM...: the items, those of LONG_FIRST first in its order
# (a binary matched by its file name, a script by its path).
long_first() {
	local l i
	local -A taken=()
	for l in $LONG_FIRST; do
		for i in "$@"; do
			if [ "$i" = "$l" ] || [ "$(basename "$i")" = "$l" ]; then
				echo "$i"; taken[$i]=1
			fi
		done
	done
	for i in "$@"; do
		[ -n "${taken[$i]:-}" ] || echo "$i"
	done
}

# run_one NAME CMD...: runs CMD into $logdir/NAME.log and its exit status
# into $logdir/NAME.rc (so several can run at once).
run_one() {
	local name=$1; shift
	local t0; t0=$(date +%s)
	timeout -k 5 "$LIMIT" "$@" >"$logdir/$name.log" 2>&1
	echo "$? $(( $(date +%s) - t0 ))" >"$logdir/$name.rc"
	# the CPU time of what it started and waited for (user + system, the
	# second line of times: its children), as load does not change it
	times >"$logdir/$name.cpu"
}

# cpu_of NAME: the CPU seconds (user + system) run_one recorded.
cpu_of() {
	tail -n 1 "$logdir/$1.cpu" | awk '{ t = 0
		for (i = 1; i <= NF; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }
		printf "%d", t + 0.5 }'
}

# report KIND NAME: prints a finished test's output and adds up its summary.
report() {
	local kind=$1 name=$2 rc secs summary p f c
	read -r rc secs <"$logdir/$name.rc"
	echo "== $kind $name"
	cat "$logdir/$name.log"
	if [ "$timed" -eq 1 ]; then
		c=$(cpu_of "$name")
		cpu_sum=$((cpu_sum + c))
		echo "   ($name: $secs s, CPU $c s)"
	fi
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
		[ "$rc" -eq 124 ] && echo "FAIL $name: killed after $LIMIT s (TEST_LIMIT)"
		echo "FAIL $name: exit $rc with no summary line"
		fail=$((fail + 1)); failed_names="$failed_names $name"
	fi
}

# start ITEM: starts a binary (a path under build/) or a script in the
# background, named for its log.
# item_args ITEM: the arguments an item gives its script, one a line: the
# cases after SCRIPT::, or for SCRIPT::rest those every other item of the
# script names, each as -CASE.
item_args() {
	local path=${1%%::*} cases=() i c more
	[ "$path" != "$1" ] || return 0
	IFS=, read -r -a cases <<<"${1#*::}"
	if [ "${cases[*]}" = rest ]; then
		cases=()
		for i in $SERIAL_STEPS; do
			[ "${i%%::*}" = "$path" ] && [ "$i" != "$1" ] && [ "$i" != "$path" ] || continue
			IFS=, read -r -a more <<<"${i#*::}"
			for c in "${more[@]}"; do cases+=("-$c"); done
		done
	fi
	for c in "${cases[@]}"; do echo "$c"; done
}

# An item SCRIPT::CASES runs SCRIPT with those cases as its arguments.
start() {
	local path=${1%%::*} cases=()
	mapfile -t cases < <(item_args "$1")
	case $path in
	*.py) run_one "$(name_of "$1")" /usr/bin/python3 "$path" "${cases[@]}" ;;
	*.sh) run_one "$(name_of "$1")" sh "$path" "${cases[@]}" ;;
	*) run_one "$(basename "$1")" "$1" ;;
	esac
}
name_of() {
	local n
	case ${1%%::*} in
	*.py | *.sh) n=${1//\//_}; n=${n//,/+}; echo "${n:0:200}" ;;
	*) basename "$1" ;;
	esac
}
kind_of() {
	case ${1%%::*} in
	*.py | *.sh) echo system ;;
	*) echo unit ;;
	esac
}

# run_all ITEM...: JOBS at a time, each reported when it ends.
run_all() {
	local -A item_of=()
	local t pid running=0
	for t in "$@"; do
		start "$t" &
		item_of[$!]=$t
		running=$((running + 1))
		if [ "$running" -ge "$JOBS" ]; then
			wait -n -p pid
			report "$(kind_of "${item_of[$pid]}")" "$(name_of "${item_of[$pid]}")"
			running=$((running - 1))
		fi
	done
	while [ "$running" -gt 0 ]; do
		wait -n -p pid
		report "$(kind_of "${item_of[$pid]}")" "$(name_of "${item_of[$pid]}")"
		running=$((running - 1))
	done
}

# The test scripts at any depth under the source folders (not the build,
# hidden folders or installed node modules), sorted.
find_scripts() {
	find . \( -path './.*' -o -name build -o -name 'build-*' -o -name node_modules -o -path "./${BUILD#./}" \) -prune -o \
		-type f \( -name '*_test.py' -o -name '*_test.sh' \) -print 2>/dev/null | sed 's|^\./||' | sort
}

# is_pure SCRIPT: marked as running no compiled program.
is_pure() {
	head -n 30 "$1" | grep -q '^# test: pure'
}

scripts=1 skip_pure=0 serial_only=0
case ${1:-} in
--serial) serial_only=1; shift ;;
--list-serial)
	n=0
	while IFS= read -r line; do
		n=$((n + 1))
		for i in $line; do
			printf '%s\t%s' "$n" "${i%%::*}"
			item_args "$i" | while IFS= read -r a; do printf '\t%s' "$a"; done
			echo
		done
	done <<<"$SERIAL_STEPS"
	exit 0 ;;
--bins-only) scripts=0; JOBS=1; shift ;;
--no-scripts) scripts=0; shift ;;
--skip-pure) skip_pure=1; shift ;;
--scripts) scripts=0 timed=1; shift
	for s in "$@"; do
		(start "$s") # a subshell of its own: its children's CPU time alone
		report system "$(name_of "$s")"
	done
	set -- ;;
esac
if [ "$scripts" -eq 1 ]; then
	timed=1
	parallel=() serial=()
	for s in $(find_scripts); do
		[ "$skip_pure" -eq 1 ] && is_pure "$s" && continue
		case " $(echo $SERIAL) " in
		*" $s "*) serial+=("$s") ;;
		*) parallel+=("$s") ;;
		esac
	done
	if [ "$serial_only" -eq 0 ]; then
		mapfile -t ordered < <(long_first "$@" "${parallel[@]}")
		run_all "${ordered[@]}"
	fi
	# the serial phase: its steps one after the other, the items of a step
	# at once (those of scripts left out above left out here too)
	while IFS= read -r line; do
		items=()
		for i in $line; do
			case " ${serial[*]} " in *" ${i%%::*} "*) items+=("$i") ;; esac
		done
		[ ${#items[@]} -gt 0 ] && JOBS=$SERIAL_JOBS run_all "${items[@]}"
	done <<<"$SERIAL_STEPS"
else
	[ $# -gt 0 ] && run_all "$@"
fi

# the items' CPU time against the CPUs' time: what more parallel items
# could gain (little when the CPUs were busy), on a machine of its own
if [ "$timed" -eq 1 ]; then
	w=$(( $(date +%s) - t_start )) n=$(nproc 2>/dev/null || echo 1)
	echo "run.sh: $w s, the items' CPU time $cpu_sum s ($(( 100 * cpu_sum / ((w > 0 ? w : 1) * n) ))% of $n CPUs)"
fi
[ -n "$failed_names" ] && echo "failed:$failed_names"
[ -n "${TEST_TOTALS:-}" ] && echo "$pass $fail" >>"$TEST_TOTALS"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
