#!/bin/sh
# gpu-test.sh [BUILD]: the GPU tests, on a machine with an NVIDIA GPU and
# its driver. BUILD (default build-gpu) holds binaries made by
# `make gpu-build` (CUDA=1, STATIC=1), which need nothing installed beyond
# the driver, so they can be built elsewhere and copied over.
# The last line is "N passed, N failed".
set -u
B=${1:-build-gpu}
for t in engine_backend_cuda engine_backend_cuda_quant engine_backend_cuda_ops engine_backend_cuda_ops_attn engine_backend_cuda_ops_tc engine_backend_cuda_gemv16 engine_backend_cuda_mmvq_rows engine_backend_cuda_lt engine_cache_conformance engine_model_cuda_cache engine_backend_moe engine_model_cuda_peer \
	engine_model engine_model_kv engine_model_generate engine_model_perplexity engine_model_prefix; do
	[ -x "$B/test/$t" ] || { echo "gpu-test: $B/test/$t is missing: run make gpu-build" >&2; exit 2; }
done
# engine_model_cuda_peer needs two GPUs that can reach each other; with one it
# prints skip and passes.
# engine_model, engine_model_kv, engine_model_generate, engine_model_perplexity and
# engine_model_prefix (the prefix cache: outputs from cached blocks, and after a release to
# host memory, bitwise those of a model without it) run the forward pass on the cuda backend
# (BATON_MODEL_BACKEND; the other tests ignore it) against the references
# of engine/model/fixtures and models/.
# GPU tests run one after the other; nothing else may use the GPU meanwhile.
exec env BUILD="$B" TEST_LIMIT=900 BATON_MODEL_BACKEND=cuda tests/run.sh --bins-only \
	"$B/test/engine_backend_cuda" "$B/test/engine_backend_cuda_quant" "$B/test/engine_backend_cuda_ops" \
	"$B/test/engine_backend_cuda_ops_attn" "$B/test/engine_backend_cuda_ops_tc" "$B/test/engine_backend_cuda_gemv16" "$B/test/engine_backend_cuda_mmvq_rows" "$B/test/engine_backend_cuda_lt" \
	"$B/test/engine_cache_conformance" "$B/test/engine_model_cuda_cache" "$B/test/engine_backend_moe" "$B/test/engine_model_cuda_peer" \
	"$B/test/engine_model" "$B/test/engine_model_kv" "$B/test/engine_model_generate" \
	"$B/test/engine_model_perplexity" "$B/test/engine_model_prefix"
