#!/bin/sh
# demo.sh [BUILD]: `make demo`. A broker and three engines of one synthetic
# MoE model (192 MiB of experts, made here in a second) share one device
# that holds two of them: requests go to each engine in turn, so the device
# is handed around; then a scripted handoff; then (host backend) a fourth
# engine on a second device borrows the first one's free memory as its peer
# tier, and gives it back when an engine of that device needs it; then two
# trained chat models (models/) answer questions in turn on one device
# that holds one of them. Prints the status table, each
# request's time and every handoff's parts, and stops everything cleanly.
#
# The device is the host backend's (a 512 MiB shared "device" in RAM), or
# the GPU when one is present and the build has CUDA (then the broker
# manages 512 MiB of it: [gpu "*"] total_mib). DEMO_BACKEND=host|cuda
# chooses. Everything lives in a temporary directory, removed at the end.
set -eu
BUILD=${1:-build}
B=$BUILD/bin
for p in baton baton-broker baton-engine baton-arena; do
	[ -x "$B/$p" ] || { echo "demo: $B/$p is missing (make first)" >&2; exit 2; }
done
dir=$(mktemp -d /tmp/baton-demo.XXXXXX)
pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	for p in $pids; do wait "$p" 2>/dev/null || true; done
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

backend=${DEMO_BACKEND:-}
if [ -z "$backend" ]; then
	backend=host
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
		backend=cuda
	fi
fi
DEV_MIB=512
export BATON_HOSTDEV_DIR=$dir BATON_BROKER=ipc://$dir/broker.sock BATON_EVENTS=ipc://$dir/events.sock

say() { printf '\n== %s\n' "$*"; }

say "model: 4 layers x 16 experts of 3 MiB (d_model 512, d_ff 1024, f16), one shared arena"
"$B/baton-arena" create --synthetic --layers 4 --experts 16 --top-k 2 --d-model 512 --d-ff 1024 \
	--dtype f16 --seed 1 "$dir/demo.arena"

cat >"$dir/broker.ini" <<EOF
[broker]
control = $BATON_BROKER
events = $BATON_EVENTS
acquire_wait_ms = 5000
http = 127.0.0.1:0
EOF
[ "$backend" = cuda ] && printf '[gpu "*"]\ntotal_mib = %d\n' $DEV_MIB >>"$dir/broker.ini"

say "broker"
"$B/baton-broker" --config "$dir/broker.ini" >"$dir/broker.out" 2>"$dir/broker.log" &
pids="$pids $!"
for _ in $(seq 100); do grep -q ^ready "$dir/broker.out" 2>/dev/null && break; sleep 0.05; done
grep ^ready "$dir/broker.out" >/dev/null || { cat "$dir/broker.log"; exit 1; }
echo "listening on $BATON_BROKER, events on $BATON_EVENTS"
"$B/baton" events >"$dir/events.log" 2>&1 &
pids="$pids $!"
sleep 0.2

start_engine() { # NAME [FLAGS...]: an engine under the broker, waited for until ready
	name=$1; shift
	"$B/baton-engine" --name "$name" --listen "ipc://$dir/$name.sock" --broker "$BATON_BROKER" \
		--expert-cache-release --vram-elastic "$@" >"$dir/$name.out" 2>"$dir/$name.log" &
	pids="$pids $!"
	eval "pid_$name=$!"
	for _ in $(seq 300); do grep -q ^ready "$dir/$name.out" 2>/dev/null && return 0; sleep 0.05; done
	echo "engine $name did not start:" >&2
	cat "$dir/$name.log" >&2
	return 1
}
start_demo_engine() { # NAME PRIORITY: an engine of the synthetic model on device 0
	start_engine "$1" --shared-expert-arena "$dir/demo.arena" --priority "$2" \
		--backend "$backend" --host-device-mib $DEV_MIB --vram-segment-mib 32
}

seen=0
new_events() { # prints the events since the last call, indented
	n=$(wc -l <"$dir/events.log")
	if [ "$n" -gt "$seen" ]; then
		tail -n +"$((seen + 1))" "$dir/events.log" | head -n "$((n - seen))" | sed 's/^/    /'
	fi
	seen=$n
}

say "three engines (a: priority 0, b: 1, c: 2) on one $backend device of $DEV_MIB MiB: room for two"
if ! start_demo_engine a 0; then
	if [ "$backend" = cuda ]; then
		echo "(no CUDA engine in this build: the host backend instead)"
		backend=host
		sed -i '/^\[gpu/,$d' "$dir/broker.ini"
		start_demo_engine a 0
	else
		exit 1
	fi
fi
start_demo_engine b 1
start_demo_engine c 2
sleep 0.3
new_events
"$B/baton" status

say "requests to each engine in turn: the one asked takes the device from an idle one"
for round in 1 2; do
	for e in a b c; do
		printf '%s: ' "$e"
		"$B/baton" gen "ipc://$dir/$e.sock" --steps 4 --batch 2 --seed "$round"
		sleep 0.1
		new_events
	done
done

say "scripted handoff: b gives the device to a"
"$B/baton" handoff b a
sleep 0.1
new_events
"$B/baton" status

if [ "$backend" = host ]; then
	say "peer tier: b is released; engine d starts on a second device (host-1) whose own cache holds 64 of the model's 192 MiB, and the broker lends it host-0's free memory"
	"$B/baton" release b
	"$B/baton-engine" --name d --shared-expert-arena "$dir/demo.arena" \
		--listen "ipc://$dir/d.sock" --broker "$BATON_BROKER" --device 1 --peer-device 0 \
		--backend host --host-device-mib $DEV_MIB --vram-segment-mib 32 --cache-mib 64 \
		>"$dir/d.out" 2>"$dir/d.log" &
	pids="$pids $!"
	pid_d=$!
	for _ in $(seq 300); do grep -q ^ready "$dir/d.out" 2>/dev/null && break; sleep 0.05; done
	sleep 0.5
	printf 'd: '
	"$B/baton" gen "ipc://$dir/d.sock" --steps 4 --batch 2 --seed 1
	sleep 0.2
	new_events
	"$B/baton" status
	say "b gets a request: d's loan on host-0 is taken back first, then b refills"
	printf 'b: '
	"$B/baton" gen "ipc://$dir/b.sock" --steps 4 --batch 2 --seed 3
	sleep 0.2
	new_events
	printf 'd, from its own device and the host arena (same checksum): '
	"$B/baton" gen "ipc://$dir/d.sock" --steps 4 --batch 2 --seed 1
	"$B/baton" engines
fi

say "two trained MoE chat models (models/README.md) take turns on host device 2, which holds one of them: qwen (qwen3_moe) and mixtral"
"$B/baton-arena" create --safetensors models/kjv-qwen3-moe "$dir/kjv-qwen3-moe.arena" | sed 's/^/  /'
"$B/baton-arena" create --safetensors models/kjv-mixtral "$dir/kjv-mixtral.arena" | sed 's/^/  /'
start_chat_engine() { # NAME ARENA: a trained model on host device 2 (18 MiB)
	start_engine "$1" --shared-expert-arena "$dir/$2.arena" --backend host --device 2 \
		--host-device-mib 18 --vram-segment-mib 2 --ctx 512 --http 127.0.0.1:0
}
start_chat_engine qwen kjv-qwen3-moe
start_chat_engine mixtral kjv-mixtral
sleep 0.3
new_events
ask() { # ENGINE QUESTION: one chat turn, greedy, then who holds the device
	printf '%s> %s\n' "$1" "$2"
	"$B/baton" chat "$1" "$2" --temperature 0 --repetition-penalty 1.2 --max-tokens 48 --no-thinking \
		| sed 's/^/    /'
	sleep 0.1
	new_events
}
ask qwen "Tell me of light."
ask mixtral "Tell me of light."
ask qwen "Continue: In the beginning God"
ask mixtral "Tell me of the sea."
"$B/baton" engines

say "the same two models through the broker's OpenAI front door: POST /v1/chat/completions, routed by \"model\"; the device switches between them in batches, each switch with its drain and refill"
door_url=$(awk '{print $4}' "$dir/broker.out")
door_token=$(cat "$dir/http.token")
door() { # MODEL QUESTION: one chat request through the front door (as an OpenAI client sends it)
	printf '%s> %s\n' "$1" "$2"
	python3 - "$door_url" "$door_token" "$1" "$2" <<'PY'
import json, sys, urllib.request
url, token, model, q = sys.argv[1:]
body = {"model": model, "messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 48,
        "repetition_penalty": 1.2, "chat_template_kwargs": {"enable_thinking": False}}
r = urllib.request.urlopen(urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
    {"Authorization": "Bearer " + token, "Content-Type": "application/json"}), timeout=60)
print("    " + json.load(r)["choices"][0]["message"]["content"].strip().replace("\n", "\n    "))
PY
}
door kjv-qwen3-moe "Tell me of light."
door kjv-mixtral "Tell me of light."
door kjv-qwen3-moe "Tell me of the sea."
python3 -c 'import json, sys, urllib.request
for m in json.load(urllib.request.urlopen(sys.argv[1] + "/v1/models"))["data"]:
    print("  %-14s %-9s %s" % (m["id"], m["state"], ", ".join(e["name"] + " " + e["state"] for e in m["engines"])))' "$door_url"
# the switches, from the broker's own event history (GET /v1/events)
python3 -c 'import json, sys, urllib.request
for e in json.load(urllib.request.urlopen(sys.argv[1] + "/v1/events?since=0"))["events"]:
    if e["kind"] == "door.switch":
        print("  %10.3f ms  %s" % (e["ms"], e["reason"]))' "$door_url"

say "every handoff, in parts (decide: the broker's choice; release: the idle engine's release or shrink, acknowledged; refill: the copy back from the pinned host arena)"
awk '$3 == "handoff" {
	printf "  to %-2s %10s ms  ", $4, $8
	for (i = 10; i <= NF; i++) printf "%s ", $i
	printf "\n"
}' "$dir/events.log"

say "stopping"
pid_d=${pid_d:-}
for e in a b c d qwen mixtral; do
	eval "[ -n \"\$pid_$e\" ] && kill \$pid_$e" 2>/dev/null || true
done
for e in a b c d qwen mixtral; do
	eval "[ -n \"\$pid_$e\" ] && wait \$pid_$e" 2>/dev/null || true
done
new_events
"$B/baton" status | sed -n '/^ENGINE/,$p'
echo "(engines that stopped cleanly leave the table)"
cleanup
trap - EXIT
echo "demo done"
