/*
 * dtype_test.c: the dtype table, the tree's one f16/bf16 codec and the row
 * encoders.
 *
 * The codec is checked three ways: exhaustively against exact decoders
 * written here with ldexp, against a rounding found by search over every
 * code (ties, overflow, subnormals; a million random floats), and against
 * the hardware's own conversions (F16C's VCVTPS2PH / VCVTPH2PS, when the CPU
 * has them), NaNs included, which is the behaviour it promises.
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "arena/arena_int.h"
#include "tests/ref_math.h"
#include "tests/t.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) /* splitmix64 */
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bitsf(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* ---- the table ------------------------------------------------------------ */

static void t_dtype_table(void)
{
	static const struct { int dt; const char *name; uint32_t block, bytes; } want[] = {
		{ BATON_DT_F32, "f32", 1, 4 }, { BATON_DT_F16, "f16", 1, 2 },
		{ BATON_DT_Q4_0, "q4_0", 32, 18 }, { BATON_DT_Q4_1, "q4_1", 32, 20 },
		{ BATON_DT_Q5_0, "q5_0", 32, 22 }, { BATON_DT_Q5_1, "q5_1", 32, 24 },
		{ BATON_DT_Q8_0, "q8_0", 32, 34 }, { BATON_DT_Q8_1, "q8_1", 32, 36 },
		{ BATON_DT_Q2_K, "q2_K", 256, 84 }, { BATON_DT_Q3_K, "q3_K", 256, 110 },
		{ BATON_DT_Q4_K, "q4_K", 256, 144 }, { BATON_DT_Q5_K, "q5_K", 256, 176 },
		{ BATON_DT_Q6_K, "q6_K", 256, 210 }, { BATON_DT_Q8_K, "q8_K", 256, 292 },
		{ BATON_DT_IQ2_XXS, "iq2_xxs", 256, 66 }, { BATON_DT_IQ2_XS, "iq2_xs", 256, 74 },
		{ BATON_DT_IQ3_XXS, "iq3_xxs", 256, 98 }, { BATON_DT_IQ1_S, "iq1_s", 256, 50 },
		{ BATON_DT_IQ4_NL, "iq4_nl", 32, 18 }, { BATON_DT_IQ3_S, "iq3_s", 256, 110 },
		{ BATON_DT_IQ2_S, "iq2_s", 256, 82 }, { BATON_DT_IQ4_XS, "iq4_xs", 256, 136 },
		{ BATON_DT_I8, "i8", 1, 1 }, { BATON_DT_I16, "i16", 1, 2 },
		{ BATON_DT_I32, "i32", 1, 4 }, { BATON_DT_I64, "i64", 1, 8 },
		{ BATON_DT_F64, "f64", 1, 8 }, { BATON_DT_IQ1_M, "iq1_m", 256, 56 },
		{ BATON_DT_BF16, "bf16", 1, 2 }, { BATON_DT_TQ1_0, "tq1_0", 256, 54 },
		{ BATON_DT_TQ2_0, "tq2_0", 256, 66 }, { BATON_DT_MXFP4, "mxfp4", 32, 17 },
	};
	size_t n = sizeof want / sizeof want[0], known = 0;
	for (size_t i = 0; i < n; i++) {
		T_EQ_STR(baton_dtype_name(want[i].dt), want[i].name);
		T_EQ_INT(baton_dtype_parse(want[i].name), want[i].dt);
		T_EQ_INT(arena_dtype_block(want[i].dt), want[i].block);
		T_EQ_INT(arena_dtype_block_bytes(want[i].dt), want[i].bytes);
		uint64_t cols = (uint64_t)want[i].block * 16;
		T_EQ_INT(baton_dtype_row_bytes(want[i].dt, cols), 16u * want[i].bytes);
		if (want[i].block > 1)
			T_EQ_INT(baton_dtype_row_bytes(want[i].dt, cols + 1), 0);
		T_EQ_INT(baton_dtype_row_bytes(want[i].dt, 0), 0 * want[i].bytes);
	}
	for (int dt = -5; dt < BATON_DT_COUNT + 5; dt++)
		known += baton_dtype_name(dt) != NULL;
	T_EQ_INT(known, n); /* 4, 5, 31..33, 36..38 are gone from ggml */
	T_EQ_INT(baton_dtype_parse("Q4_K"), BATON_DT_Q4_K);
	T_EQ_INT(baton_dtype_parse("BF16"), BATON_DT_BF16);
	T_EQ_INT(baton_dtype_parse("q4_2"), -1);
	T_EQ_INT(baton_dtype_parse(""), -1);
	T_EQ_INT(baton_dtype_parse(NULL), -1);
	T_ASSERT(baton_dtype_name(4) == NULL && baton_dtype_name(40) == NULL);
	T_EQ_INT(baton_dtype_row_bytes(4, 32), 0);
	T_EQ_INT(baton_dtype_row_bytes(BATON_DT_F64, UINT64_MAX / 4), 0); /* overflow */
	T_EQ_INT(baton_dtype_row_bytes(BATON_DT_Q8_0, UINT64_MAX / 32 * 32), 0);
	T_EQ_INT(baton_dtype_row_bytes(BATON_DT_Q4_K, UINT64_MAX / 256 * 256), (UINT64_MAX / 256) * 144);
}


/* ---- exact decoders: ref_f16, ref_bf16 (tests/ref_math.h) ------------------- */

static void t_known_values(void)
{
	T_EQ_INT(baton_f32_to_f16(1.0f), 0x3c00);
	T_EQ_INT(baton_f32_to_f16(-2.0f), 0xc000);
	T_EQ_INT(baton_f32_to_f16(65504.0f), 0x7bff);
	T_EQ_INT(baton_f32_to_f16(65520.0f), 0x7c00);  /* rounds to infinity */
	T_EQ_INT(baton_f32_to_f16(65519.996f), 0x7bff);
	T_EQ_INT(baton_f32_to_f16(0x1.0p-24f), 0x0001);  /* smallest subnormal */
	T_EQ_INT(baton_f32_to_f16(0x1.0p-25f), 0x0000);  /* tie to even: 0 */
	T_EQ_INT(baton_f32_to_f16(0x1.000002p-25f), 0x0001);
	T_EQ_INT(baton_f32_to_f16(0x1.8p-24f), 0x0002);  /* 1.5 ulp: tie to even 2 */
	T_EQ_INT(baton_f32_to_f16(0x1.ff8p-15f), 0x03ff); /* largest subnormal */
	T_EQ_INT(baton_f32_to_f16(0x1.ffcp-15f), 0x0400); /* its tie with 2^-14: even */
	T_EQ_INT(baton_f32_to_f16(0x1p-14f), 0x0400);     /* smallest normal */
	T_EQ_INT(baton_f32_to_f16(1.0f + 0x1.0p-11f), 0x3c00); /* tie: even */
	T_EQ_INT(baton_f32_to_f16(1.0f + 0x1.8p-11f), 0x3c01); /* 0.75 ulp */
	T_EQ_INT(baton_f32_to_f16(1.0f + 0x1.8p-10f), 0x3c02); /* 1.5 ulp: tie, even */
	T_EQ_INT(baton_f32_to_f16(INFINITY), 0x7c00);
	T_EQ_INT(baton_f32_to_f16(-INFINITY), 0xfc00);
	T_EQ_INT(baton_f32_to_f16(-0.0f), 0x8000);
	T_EQ_INT(baton_f32_to_f16(1e-40f), 0x0000);
	/* NaNs: quiet, sign and top payload kept; a payload only in the low
	 * bits still gives a NaN, never infinity. */
	T_EQ_INT(baton_f32_to_f16(bitsf(0x7fc00000u)), 0x7e00);
	T_EQ_INT(baton_f32_to_f16(bitsf(0xffc00000u)), 0xfe00);
	T_EQ_INT(baton_f32_to_f16(bitsf(0x7f800001u)), 0x7e00); /* signalling */
	T_EQ_INT(baton_f32_to_f16(bitsf(0x7fa00000u)), 0x7f00);
	T_EQ_INT(baton_f32_to_f16(bitsf(0x7fffffffu)), 0x7fff);
	T_EQ_INT(fbits(baton_f16_to_f32(0x7c01)), 0x7fc02000u); /* quieted */
	T_EQ_INT(fbits(baton_f16_to_f32(0xfe00)), 0xffc00000u);
	T_EQ_INT(fbits(baton_f16_to_f32(0x0001)), 0x33800000u);
	T_EQ_INT(fbits(baton_f16_to_f32(0x8000)), 0x80000000u);

	T_EQ_INT(baton_f32_to_bf16(1.0f), 0x3f80);
	T_EQ_INT(baton_f32_to_bf16(-0.0f), 0x8000);
	T_EQ_INT(baton_f32_to_bf16(bitsf(0x7f7fffffu)), 0x7f80); /* FLT_MAX rounds up */
	T_EQ_INT(baton_f32_to_bf16(bitsf(0x00000001u)), 0x0000);
	T_EQ_INT(baton_f32_to_bf16(bitsf(0x00008000u)), 0x0000); /* tie to even */
	T_EQ_INT(baton_f32_to_bf16(bitsf(0x00018000u)), 0x0002);
	T_EQ_INT(baton_f32_to_bf16(bitsf(0x3f808000u)), 0x3f80); /* tie: even */
	T_EQ_INT(baton_f32_to_bf16(bitsf(0x3f818000u)), 0x3f82);
	T_EQ_INT(baton_f32_to_bf16(bitsf(0x7f800001u)), 0x7fc0); /* quiet NaN */
	T_EQ_INT(baton_f32_to_bf16(bitsf(0xffa10000u)), 0xffe1);
	T_EQ_INT(baton_f32_to_bf16(bitsf(0x7fffffffu)), 0x7fff); /* no carry into the sign */
	T_EQ_INT(baton_f32_to_bf16(INFINITY), 0x7f80);
	T_EQ_INT(fbits(baton_bf16_to_f32(0x7f81)), 0x7f810000u); /* the shift */
}

/* Every 16-bit code: the exact value, the sign, NaN as promised, and the
 * way back. */
static void t_every_code(void)
{
	for (uint32_t h = 0; h < 65536; h++) {
		float f = baton_f16_to_f32((uint16_t)h);
		double r = ref_f16((uint16_t)h);
		T_ASSERT_MSG(!!signbit(f) == !!(h & 0x8000), "f16 %04x: sign", h);
		if (isnan(r)) {
			T_ASSERT_MSG(fbits(f) == (((h & 0x8000u) << 16) | 0x7fc00000u |
			    (h & 0x3ffu) << 13), "f16 %04x: NaN bits %08x", h, fbits(f));
			T_EQ_INT(baton_f32_to_f16(f), h | 0x200u); /* quiet */
		} else {
			T_ASSERT_MSG((double)f == r, "f16 %04x: got %a, want %a", h, f, r);
			T_ASSERT_MSG(baton_f32_to_f16(f) == h, "f16 %04x -> %a -> %04x", h, f,
			    baton_f32_to_f16(f));
		}

		float g = baton_bf16_to_f32((uint16_t)h);
		r = ref_bf16((uint16_t)h);
		T_ASSERT_MSG(fbits(g) == h << 16, "bf16 %04x: bits %08x", h, fbits(g));
		if (isnan(r)) {
			T_EQ_INT(baton_f32_to_bf16(g), h | 0x40u);
		} else {
			T_ASSERT_MSG((double)g == r, "bf16 %04x: got %a, want %a", h, g, r);
			T_EQ_INT(baton_f32_to_bf16(g), h);
		}
	}
}

/* Nearest 16-bit code of a format to |v| (ties to even, overflow to the
 * infinity code max_finite + 1), by search over the format's values. */
static uint16_t ref_round(double v, double (*dec)(uint16_t), uint16_t max_finite)
{
	uint16_t sign = signbit(v) ? 0x8000 : 0;
	double a = fabs(v);
	double top = dec(max_finite), above = top + (top - dec(max_finite - 1));
	uint32_t lo = 0, hi = max_finite; /* largest code with dec <= a */

	if (a >= above)
		return sign | (uint16_t)(max_finite + 1);
	while (lo < hi) {
		uint32_t mid = (lo + hi + 1) / 2;
		if (dec((uint16_t)mid) <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	double vlo = dec((uint16_t)lo);
	double vhi = lo == max_finite ? above : dec((uint16_t)(lo + 1));
	if (vlo == a)
		return sign | (uint16_t)lo;
	double dlo = a - vlo, dhi = vhi - a;
	uint32_t pick = dlo < dhi ? lo : dlo > dhi ? lo + 1 : (lo & 1 ? lo + 1 : lo);
	return sign | (uint16_t)pick;
}

static void check_round(float f, int is_f16)
{
	uint16_t got = is_f16 ? baton_f32_to_f16(f) : baton_f32_to_bf16(f);
	uint16_t want = is_f16 ? ref_round(f, ref_f16, 0x7bff) : ref_round(f, ref_bf16, 0x7f7f);
	T_ASSERT_MSG(got == want, "%s(%a = %08x) = %04x, want %04x",
	    is_f16 ? "f16" : "bf16", f, fbits(f), got, want);
}

/* Every midpoint between neighbouring codes rounds to the even one; its
 * float neighbours round to the nearer. */
static void check_ties(int is_f16)
{
	double (*dec)(uint16_t) = is_f16 ? ref_f16 : ref_bf16;
	uint16_t max = is_f16 ? 0x7bff : 0x7f7f;

	for (uint32_t c = 0; c < max; c++) {
		double mid = (dec((uint16_t)c) + dec((uint16_t)(c + 1))) / 2;
		float m = (float)mid;
		T_ASSERT((double)m == mid);
		for (int s = 0; s < 2; s++) {
			float ms = s ? -m : m;
			uint16_t sign = s ? 0x8000 : 0;
			uint16_t want = sign | (uint16_t)(c & 1 ? c + 1 : c);
			uint16_t got = is_f16 ? baton_f32_to_f16(ms) : baton_f32_to_bf16(ms);
			T_ASSERT_MSG(got == want, "tie %a: got %04x want %04x", ms, got, want);
			check_round(nextafterf(ms, 0), is_f16);
			check_round(nextafterf(ms, s ? -INFINITY : INFINITY), is_f16);
		}
	}
}

static void t_f16_rounding(void)
{
	check_ties(1);
	float edges[] = { 65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e10f, INFINITY,
		0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1p-26f, 0x1p-14f, 0x1.ffcp-15f,
		0.0f, 1e-40f, 3.4e38f };
	for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
		check_round(edges[i], 1);
		check_round(-edges[i], 1);
	}
	/* Random floats: in the f16 range, and any bit pattern. */
	for (int i = 0; i < 1000000; i++) {
		uint32_t u = (uint32_t)rnd();
		if (i & 1)
			u = (u & 0x807fffffu) | (uint32_t)(127 - 28 + rnd() % 46) << 23;
		if ((u & 0x7fffffffu) > 0x7f800000u)
			continue;
		check_round(bitsf(u), 1);
	}
}

static void t_bf16_rounding(void)
{
	check_ties(0);
	for (int i = 0; i < 1000000; i++) {
		uint32_t u = (uint32_t)rnd();
		if ((u & 0x7fffffffu) > 0x7f800000u)
			continue;
		check_round(bitsf(u), 0);
	}
}

/* ---- against the hardware's conversions --------------------------------------- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f)
{
	return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
}

__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h)
{
	return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

static int has_f16c(void)
{
	unsigned a, b, c, d;
	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static void t_against_f16c(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	if (!has_f16c()) {
		printf("  no F16C on this CPU: skipped\n");
		return;
	}
	for (uint32_t h = 0; h < 65536; h++) {
		uint32_t got = fbits(baton_f16_to_f32((uint16_t)h));
		uint32_t want = fbits(hw_f16_to_f32((uint16_t)h));
		T_ASSERT_MSG(got == want, "f16 %04x: %08x, F16C %08x", h, got, want);
	}
	/* Every 4099th float pattern (NaNs of both kinds included), then
	 * random ones, then around each f16 code's upper midpoint. */
	uint64_t n = 0;
	for (uint64_t u = 0; u < 0x100000000u; u += 4099, n++) {
		float f = bitsf((uint32_t)u);
		T_ASSERT_MSG(baton_f32_to_f16(f) == hw_f32_to_f16(f), "%08x: %04x, F16C %04x",
		    (uint32_t)u, baton_f32_to_f16(f), hw_f32_to_f16(f));
	}
	for (int i = 0; i < 1000000; i++, n++) {
		float f = bitsf((uint32_t)rnd());
		T_ASSERT_MSG(baton_f32_to_f16(f) == hw_f32_to_f16(f), "%08x: %04x, F16C %04x",
		    fbits(f), baton_f32_to_f16(f), hw_f32_to_f16(f));
	}
	for (uint32_t h = 0; h < 65536; h++) {
		uint32_t c = fbits(hw_f16_to_f32((uint16_t)h));
		for (uint32_t d = 0; d < 8; d++, n++) { /* around the midpoint above */
			float f = bitsf(c + 0x1000u - 4 + d);
			T_EQ_INT(baton_f32_to_f16(f), hw_f32_to_f16(f));
		}
	}
	printf("  %" PRIu64 " floats and all 65536 halves against F16C\n", n);
#else
	printf("  not x86-64: skipped\n");
#endif
}

/* ---- encoders ----------------------------------------------------------------- */

static void t_encode_q8_0(void)
{
	float x[64];
	uint8_t q[68];
	for (int i = 0; i < 64; i++)
		x[i] = (float)sin(i * 0.7) * (i < 32 ? 0.05f : 3.0f);
	x[40] = 0.0f;
	T_OK(arena_encode_row(BATON_DT_Q8_0, x, 64, q));
	for (int b = 0; b < 2; b++) {
		float amax = 0;
		for (int j = 0; j < 32; j++)
			amax = fmaxf(amax, fabsf(x[32 * b + j]));
		uint16_t hd;
		memcpy(&hd, q + 34 * b, 2);
		T_EQ_INT(hd, baton_f32_to_f16(amax / 127.0f));
		float d = amax / 127.0f;
		for (int j = 0; j < 32; j++) {
			int8_t v = (int8_t)q[34 * b + 2 + j];
			T_EQ_INT(v, (int)roundf(x[32 * b + j] / d));
		}
	}
	T_EQ_ERR(arena_encode_row(BATON_DT_Q8_0, x, 31, q), BATON_EINVAL);
	T_EQ_ERR(arena_encode_row(BATON_DT_Q4_0, x, 64, q), BATON_EUNSUPPORTED);
}


T_MAIN(T_CASE(t_dtype_table), T_CASE(t_known_values), T_CASE(t_every_code),
    T_CASE_TIMEOUT(t_f16_rounding, 120), T_CASE_TIMEOUT(t_bf16_rounding, 120),
    T_CASE_TIMEOUT(t_against_f16c, 120), T_CASE(t_encode_q8_0))
