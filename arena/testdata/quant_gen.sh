#!/bin/sh
# quant_gen.sh GGML_DIR: remakes arena/testdata/kquant_<type>.bin (q4_K,
# q5_K, q6_K) and quant_<type>.bin (q4_0, q4_1, q5_0, q5_1, q2_K, q3_K,
# iq4_nl, iq4_xs, mxfp4) from ggml's own code (not a port of it), so that
# arena/kquant_test.c (quantisation) and engine/backend/host/kquant_test.c
# and quant_test.c (dequantisation, dot products) check Baton against an
# independent reference.
#
# GGML_DIR is a checkout of https://github.com/ggml-org/ggml (the files were
# made at commit d99724f2 with gcc 12.2, x86-64, no -march: ggml's scalar
# reference code, no FMA). Nothing of ggml is committed here.
set -eu
ggml=${1:?usage: $0 GGML_DIR}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -std=gnu11 -ffp-contract=off -I"$ggml/src" -I"$ggml/include" \
    -c "$ggml/src/ggml-quants.c" -o "$tmp/ggml-quants.o"
cc -O2 -std=gnu11 -ffp-contract=off -I"$ggml/src" -I"$ggml/include" \
    "$here/quant_gen.c" "$tmp/ggml-quants.o" -lm -o "$tmp/quant_gen"
"$tmp/quant_gen" "$here"
