# bench_chat_test.sh: scripts/bench-chat.sh end to end on the host backend
# with a tiny file of the benchmark's layout (1 layer, 8 experts, 4,096
# tokens), 2 clients of 2 turns: the chats with and without the prefix
# cache (the second turn finds the first one's blocks, the answers equal),
# a stand-in LLAMA_CPP whose llama-server answers as llama-server does
# (streamed /v1/completions, timings with cache_n), and the switch through
# the front door with the KV back from host memory and read again (the
# answers equal), and its answers' pass (EXACT_PASS=1: on the host it runs
# the same kernels, so it only checks the plumbing); the table's ratios
# from the modes' figures, and which kernels ran.
. tests/lib.sh
HERE=$(pwd)/scripts

fake_llama() {
	mkdir -p "$1/bin"
	cat >"$1/bin/llama-server" <<'EOF'
#!/usr/bin/python3
import json, sys, http.server
args = sys.argv[1:]
open(__file__ + ".args", "a").write(" ".join(args) + "\n")
port = int(args[args.index("--port") + 1])
seen = {}

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status":"ok"}')

    def do_POST(self):
        b = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert b["cache_prompt"] is True and b["stream"] is True, b
        p = b["prompt"]
        best = max((n for n in range(len(p)) if tuple(p[:n]) in seen), default=0)
        for n in range(len(p) + 1):
            seen[tuple(p[:n])] = 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(b["max_tokens"]):
            ev = {"choices": [{"text": "t%d " % i, "index": 0}]}
            if i == b["max_tokens"] - 1:
                ev["timings"] = {"cache_n": best, "prompt_n": len(p) - best}
            self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")

http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
EOF
	chmod +x "$1/bin/llama-server"
}

t_run() {
	case "$BUILD" in
	*/san | san)
		# the sanitizers' pass: benchmark plumbing over the model paths
		# the engine's own sanitizer tests cover; the plain pass runs it
		echo "skipped under the sanitizers" >&2
		return 0 ;;
	esac
	fake_llama "$T_TMP/llama"
	mkdir -p "$T_TMP/dev"
	expect 0 env LAYERS=1 EXPERTS=8 VOCAB=4096 BACKEND=host CLIENTS=2 TURNS=2 FIRST=20 GROW=20 GEN=4 \
		SHM="$T_TMP" LLAMA_CPP="$T_TMP/llama" LLAMA_FLAGS="-ngl 0" BATON_HOSTDEV_DIR="$T_TMP/dev" \
		EXACT_PASS=1 EXACT_TURNS=2 sh "$HERE/bench-chat.sh" "$BUILD" "$T_TMP/res"
	says "ran: host backend (exact by construction)"
	says "chat answers, with the cache vs without: identical token for token (4 of 4 answers)"
	says "switch answers, the KV from host vs read again: identical token for token (4 of 4 answers)"
	says "switch answers, the answers' pass (BATON_CUDA_GEMM=0, 2 turns), the KV from host vs read again: identical"
	says "  llama turn 1: prompt 40, ttft median"
	ls "$T_TMP"/*.arena 2>/dev/null && fail "the arena was left behind"
	grep -q -- "-ngl 99 -c 216 -np 2 --host 127.0.0.1 --port [0-9]* -ngl 0\$" "$T_TMP/llama/bin/llama-server.args" ||
		fail "llama-server args: $(cat "$T_TMP/llama/bin/llama-server.args")"
	python3 - "$T_TMP/res" <<'EOF'
import json, sys
d = sys.argv[1]
s = json.load(open(d + "/summary.json"))
assert s["chat_answers_equal"] and s["switch_answers_equal"], s
assert s["switch_answers_exact"]["identical"] and s["switch_answers_exact"]["answers"] == 4, s
ex = json.load(open(d + "/switch-host-exact.json"))
assert ex["gemm"] == "0" and ex["turns"] == 2 and len(ex["pieces"][0][1]) == 4, ex
c = {r["turn"]: r for r in s["chat"]}
assert c[0]["prompt"] == 20 and c[1]["prompt"] == 40 and c[1]["cached"] == 16, c
for r in s["chat"]:
    assert r["cache_s"] > 0 and r["nocache_s"] > 0 and r["llama_s"] > 0, r
    assert abs(r["nocache_over_cache"] - round(r["nocache_s"] / r["cache_s"], 3)) < 1e-9, r
ll = json.load(open(d + "/llama.json"))
assert ll["per_turn"][1]["cached_tokens_median"] == 20, ll["per_turn"]  # cache_n of the stand-in
nc = json.load(open(d + "/chat-nocache.json"))
assert nc["per_turn"][1]["cached_tokens_median"] == 0 and not nc["prefix_cache"]["enabled"], nc
sh = json.load(open(d + "/switch-host.json"))
sd = json.load(open(d + "/switch-drop.json"))
assert sh["per_turn"][1]["cached_tokens_median"] == 16, sh["per_turn"]  # from host memory
assert sd["per_turn"][1]["cached_tokens_median"] == 0, sd["per_turn"]   # dropped at the release
assert sh["release_all_s_median"] > 0, sh
EOF
	# MODES: the chat alone (no switch, so no answers' pass either)
	expect 0 env LAYERS=1 EXPERTS=8 VOCAB=4096 BACKEND=host CLIENTS=1 TURNS=2 FIRST=20 GROW=20 GEN=4 \
		SHM="$T_TMP" BATON_HOSTDEV_DIR="$T_TMP/dev" MODES=chat EXACT_PASS=1 \
		sh "$HERE/bench-chat.sh" "$BUILD" "$T_TMP/res2"
	says "chat answers, with the cache vs without: identical token for token (2 of 2 answers)"
	[ -e "$T_TMP/res2/chat-cache.json" ] && [ ! -e "$T_TMP/res2/switch-host.json" ] &&
		[ ! -e "$T_TMP/res2/switch-host-exact.json" ] || fail "MODES=chat ran: $(ls "$T_TMP/res2")"
}

t_usage() {
	expect 2 sh "$HERE/bench-chat.sh"; says "usage: bench-chat.sh BUILD OUTDIR"
}

TEST_CASE_LIMIT=${TEST_CASE_LIMIT:-300}
T_CASE_LIMIT=$TEST_CASE_LIMIT
t_case t_usage
t_case t_run
t_done
