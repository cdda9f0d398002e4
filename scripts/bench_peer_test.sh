# bench_peer_test.sh: scripts/bench-peer.sh end to end on the host backend
# with a tiny file of the same layout (2 layers, 8 experts, 2,048 tokens):
# the GGUF written, imported, benchmarked and served, KEEP_GGUF reused, and
# the table's ratios computed from llama.cpp's own output formats (a
# stand-in LLAMA_CPP whose llama-bench and llama-batched-bench print what
# llama-bench -o json and llama-batched-bench --output-format jsonl print).
. tests/lib.sh
HERE=$(pwd)/scripts

fake_llama() {
	mkdir -p "$1/bin"
	cat >"$1/bin/llama-bench" <<'EOF'
#!/bin/sh
echo "$@" >>"$(dirname "$0")/args"
echo "ggml_cuda_init: found 1 CUDA devices" >&2
cat <<'J'
[
  {
    "build_commit": "abc1234",
    "build_number": 7000,
    "gpu_info": "NVIDIA H200",
    "model_type": "qwen3moe 30B.A3B Q4_K - Medium",
    "n_gpu_layers": 99,
    "flash_attn": "auto",
    "n_prompt": 16,
    "n_gen": 0,
    "avg_ts": 48.000000,
    "samples_ts": [ 48.0 ]
  },
  {
    "build_commit": "abc1234",
    "build_number": 7000,
    "gpu_info": "NVIDIA H200",
    "model_type": "qwen3moe 30B.A3B Q4_K - Medium",
    "n_gpu_layers": 99,
    "flash_attn": "auto",
    "n_prompt": 0,
    "n_gen": 128,
    "avg_ts": 9.600000,
    "samples_ts": [ 9.6 ]
  }
]
J
EOF
	cat >"$1/bin/llama-batched-bench" <<'EOF'
#!/bin/sh
echo "$@" >>"$(dirname "$0")/args"
echo "llama_model_loader: loaded meta data" >&2
echo '{"n_kv_max": 512, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, "is_pp_shared": 0, "n_gpu_layers": 99, "n_threads": 8, "n_threads_batch": 8, "pp": 8, "tg": 8, "pl": 2, "n_kv": 32, "t_pp": 0.500000, "speed_pp": 32.000000, "t_tg": 1.500000, "speed_tg": 10.666667, "t": 2.000000, "speed": 16.000000}'
EOF
	chmod +x "$1/bin/llama-bench" "$1/bin/llama-batched-bench"
}

t_run() {
	case "$BUILD" in
	*/san | san)
		# the sanitizers' pass: the same shell and python plumbing over
		# binaries whose host kernels run seconds a token under ASan (past
		# 300 s here); the plain pass runs it, the kernels have their own
		# sanitizer tests
		echo "skipped under the sanitizers" >&2
		return 0 ;;
	esac
	fake_llama "$T_TMP/llama"
	G=$T_TMP/keep.gguf
	expect 0 env LAYERS=2 EXPERTS=8 VOCAB=2048 BACKEND=host PROMPTS=16 SEQS=2 SERVE_PROMPT=8 \
		SERVE_GEN=8 MODEL_BENCH_FLAGS="--steps 2 --bandwidth-mib 8" SHM="$T_TMP" KEEP_GGUF="$G" \
		LLAMA_CPP="$T_TMP/llama" sh "$HERE/bench-peer.sh" "$BUILD" "$T_TMP/res"
	says "tok/s, the same GGUF (2 layers)"; says "decode, batch 1 (tg128)"
	says "serving 2 seqs x (8 + 8), total tok/s"; says "llama.cpp abc1234 (build 7000)"
	[ -s "$G" ] || fail "KEEP_GGUF not kept"
	ls "$T_TMP"/*.arena 2>/dev/null && fail "the arena was left behind"
	grep -q -- "-m $G -ngl 99 -p 16 -n 128 -o json" "$T_TMP/llama/bin/args" || fail "llama-bench args"
	grep -q -- "-m $G -ngl 99 -c 288 -npp 8 -ntg 8 -npl 2 --output-format jsonl" \
		"$T_TMP/llama/bin/args" || fail "llama-batched-bench args"
	python3 - "$T_TMP/res" <<'EOF'
import json, math, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
rows = {r["what"]: r for r in s["rows"]}
m, v = s["baton_model"], s["serve"]
def check(what, baton, peer):
    r = rows[what]
    assert r["baton"] == baton and r["llama_cpp"] == peer, r
    assert abs(r["ratio"] - baton / peer) < 1e-9, r
check("decode, batch 1 (tg128)", m["decode_tok_s"], 9.6)
check("decode, batch 1, BATON_CUDA_GRAPH=1", s["baton_model_graph"]["decode_tok_s"], 9.6)
check("prefill, 16 tokens (pp16)", m["prefill"][0]["tok_s"], 48.0)
check("serving 2 seqs x (8 + 8), total tok/s", v["total_tok_s"], 16.0)
check("serving 2 seqs x (8 + 8), generated tok/s", v["generated_tok_s"], 8.0)
assert v["generated_tokens"] == 16 and v["prompt_tokens"] == 16, v
assert v["finish_reasons"] == ["length"], v
assert s["llama_cpp"]["build_commit"] == "abc1234", s["llama_cpp"]
EOF
	# the kept file is reused, not written again; GRAPH=0 and SERVE=0 leave their rows out
	expect 0 env GRAPH=0 SERVE=0 LAYERS=2 EXPERTS=8 VOCAB=2048 BACKEND=host PROMPTS=16 SEQS=1 SERVE_PROMPT=4 \
		SERVE_GEN=2 MODEL_BENCH_FLAGS="--steps 1 --bandwidth-mib 8" SHM="$T_TMP" KEEP_GGUF="$G" \
		sh "$HERE/bench-peer.sh" "$BUILD" "$T_TMP/res2"
	says "gguf: reusing $G"
	grep -q "BATON_CUDA_GRAPH=1\|serving" "$T_TMP/out" && fail "GRAPH=0 SERVE=0 still ran them"
	[ ! -e "$T_TMP/res2/serve.json" ] || fail "SERVE=0 still served"
}

t_usage() {
	expect 2 sh "$HERE/bench-peer.sh"; says "usage: bench-peer.sh BUILD OUTDIR"
}

TEST_CASE_LIMIT=${TEST_CASE_LIMIT:-300}
T_CASE_LIMIT=$TEST_CASE_LIMIT
t_case t_usage
t_case t_run
t_done
