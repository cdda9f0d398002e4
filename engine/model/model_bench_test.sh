# model_bench_test.sh: baton-model-bench's command line and one whole run on
# the host backend with a tiny synthetic qwen3_moe arena: every figure of
# the table and of --json is there and sane (the GPU figures are in
# docs/measurements/performance.md; this keeps the program from rotting between runs).
. tests/lib.sh
B=$BIN/baton-model-bench

arena() {
	$BIN/baton-arena create --synthetic-arch qwen3_moe --layers 2 --experts 8 --top-k 2 \
		--d-model 256 --d-ff 256 --heads 4 --kv-heads 2 --head-dim 64 --vocab 1000 \
		--dtype "$1" --seed 5 --force "$T_TMP/m-$1.arena" >/dev/null
}

t_usage() {
	expect 0 $B --help; says "usage: baton-model-bench --arena PATH"; says "--bandwidth-mib"
	expect 0 $B --version; says "baton-model-bench "
	expect 2 $B; says "usage:"
	expect 2 $B --arena x --steps 0; says "--steps wants an integer in 1..100000"
	expect 2 $B --arena x --prompts 8,,x; says "--prompts wants an integer"
	expect 2 $B --arena x --prompts 1,2,3,4,5,6,7,8,9; says "at most 8 lengths"
	expect 2 $B --arena x extra; says "usage:"
	expect 1 $B --arena "$T_TMP/none.arena" --backend host; says "opening the engine"
}

# One run per weight type the bench is used with: the table's lines, and
# the JSON's figures positive, finite and consistent with each other.
t_run() {
	export BATON_HOSTDEV_DIR=$T_TMP
	for dt in bf16 q4_K; do
		arena $dt
		expect 0 $B --arena "$T_TMP/m-$dt.arena" --backend host --steps 3 --prompts 8,16 \
			--first-prompt 4 --bandwidth-mib 8 --json "$T_TMP/$dt.json"
		says "decode, batch 1 (vs memory roofline)"; says "prefill, 16-token prompt"
		says "with the host's greedy pick each step"
		says "first token after release, hot-first (4 tokens)"
		says "one layer's ops, queued as forward.c queues them"
		python3 - "$T_TMP/$dt.json" "$dt" <<'EOF'
import json, math, sys
j = json.load(open(sys.argv[1]))
assert j["dtype"] == sys.argv[2] and j["layers"] == 2 and j["top_k"] == 2, j
pos = ["bandwidth_gbps", "step_bytes", "decode_tok_s", "decode_ms", "decode_greedy_tok_s", "roofline_ms",
       "roofline_ratio", "layer_us", "attn_us", "route_us", "experts_us", "head_us",
       "first_hot_ms", "first_full_ms", "refill_bytes"]
for k in pos:
    assert j[k] > 0 and math.isfinite(j[k]), (k, j[k])
assert j["bandwidth_bytes"] == 8 << 20, j["bandwidth_bytes"]
assert j["device_route"] is True, j  # the host backend has route_dev
assert [p["tokens"] for p in j["prefill"]] == [8, 16], j["prefill"]
assert all(p["tok_s"] > 0 for p in j["prefill"]), j["prefill"]
# the ratio is the roofline time over the measured one; the JSON gives
# both times to 4 decimals, so r carries their rounding (half a unit each:
# at a tiny arena's 0.01 ms of roofline that alone is 0.5%)
r = j["roofline_ms"] / j["decode_ms"]
rounding = 0.5e-4 / j["decode_ms"] + r * 0.5e-4 / j["decode_ms"]
assert abs(r - j["roofline_ratio"]) <= 1e-3 * max(r, 1e-9) + 1e-4 + rounding, (r, j["roofline_ratio"], j["roofline_ms"])
assert abs(1000 / j["decode_ms"] - j["decode_tok_s"]) <= 0.01 * j["decode_tok_s"], j
# the step with the host's greedy pick is the step and more
assert j["decode_greedy_tok_s"] <= j["decode_tok_s"] * 1.001, j
EOF
	done
}

t_case t_usage
t_case t_run
t_done
