#!/bin/sh
# embed.sh FILE SYMBOL: print an assembler file (cc -c, preprocessed .S)
# that defines `SYMBOL` (the bytes of FILE, NUL-terminated, 64-byte
# aligned) and `SYMBOL_len`, so a CUDA fatbin travels inside the binary
# instead of beside it. The assembler reads FILE itself (.incbin): the
# bytes are never spelled out as a C array, which cost seconds of the
# compiler per megabyte (moe.cu's fatbin is 4 MB).
set -eu
f=$1 sym=$2
case $f in
*'"'* | *'\'*) echo "embed.sh: $f: a path with a quote or a backslash" >&2; exit 2 ;;
esac
cat <<EOT
/* generated from $f by scripts/embed.sh; do not edit */
	.section .rodata
	.balign 64
	.globl $sym
	.type $sym, "object"
$sym:
	.incbin "$f"
.L${sym}_end:
	.byte 0
	.size $sym, . - $sym
	.balign 8
	.globl ${sym}_len
	.type ${sym}_len, "object"
${sym}_len:
	.quad .L${sym}_end - $sym
	.size ${sym}_len, 8
	.section .note.GNU-stack, "", %progbits
EOT
