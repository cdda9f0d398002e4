#!/bin/sh
# embed.sh FILE SYMBOL: print a C file that defines `SYMBOL` (the bytes of
# FILE, NUL-terminated) and `SYMBOL_len`, so a CUDA fatbin travels inside
# the binary instead of beside it.
set -eu
f=$1 sym=$2
echo "/* generated from $f by scripts/embed.sh; do not edit */"
echo "#include <stddef.h>"
echo "const unsigned char ${sym}[] __attribute__((aligned(64))) = {"
od -An -v -tx1 "$f" | sed -e 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g'
echo "0x00 };"
echo "const size_t ${sym}_len = sizeof(${sym}) - 1;"
