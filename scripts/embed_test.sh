# embed_test.sh: scripts/embed.sh's assembler file, assembled and linked
# as the CUDA build does (cc -c): SYMBOL holds FILE's bytes exactly (NULs
# and a length that is no multiple of 8 included), NUL-terminated and
# 64-byte aligned, SYMBOL_len is the file's length; an empty file; a path
# the .incbin line cannot quote refused with nothing printed.
. tests/lib.sh

main_c() {
	cat >"$T_TMP/main.c" <<'EOC'
#include <stdint.h>
#include <stdio.h>
#include <string.h>
extern const unsigned char t_blob[];
extern const size_t t_blob_len;
int main(int argc, char **argv)
{
	static unsigned char b[1 << 20];
	FILE *f = fopen(argv[1], "rb");
	size_t n = f ? fread(b, 1, sizeof b, f) : 0;
	(void)argc;
	printf("len %zu file %zu same %d nul %d align %d\n", t_blob_len, n,
	    memcmp(b, t_blob, n) == 0, t_blob[n] == 0, (int)((uintptr_t)t_blob % 64));
	return 0;
}
EOC
}

# embed_run FILE: embeds FILE as t_blob, links it and prints what main sees.
embed_run() {
	sh scripts/embed.sh "$1" t_blob >"$T_TMP/blob.S"
	cc -c "$T_TMP/blob.S" -o "$T_TMP/blob.o"
	cc -Wall -Werror "$T_TMP/main.c" "$T_TMP/blob.o" -o "$T_TMP/main"
	"$T_TMP/main" "$1"
}

t_bytes() {
	main_c
	head -c 100003 /dev/urandom >"$T_TMP/f"
	printf '\0\0\0' >>"$T_TMP/f"
	out=$(embed_run "$T_TMP/f")
	[ "$out" = "len 100006 file 100006 same 1 nul 1 align 0" ] || fail "got: $out"
	: >"$T_TMP/empty"
	out=$(embed_run "$T_TMP/empty")
	[ "$out" = "len 0 file 0 same 1 nul 1 align 0" ] || fail "empty: $out"
}

t_bad_path() {
	expect 2 sh scripts/embed.sh "$T_TMP/a\"b" t_blob; says "a path with a quote"
	expect 2 sh scripts/embed.sh "$T_TMP/a\\b" t_blob; says "a path with a quote"
	grep -q incbin "$T_TMP/out" && fail "printed an assembler file"
	return 0
}

t_case t_bytes
t_case t_bad_path
t_done
