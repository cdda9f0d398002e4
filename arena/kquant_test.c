/*
 * kquant_test.c: the K-quant encoders (kquant.c) against ggml's own
 * quantize_row_q{4,5,6}_K_ref: the same inputs give the same bytes
 * (arena/testdata, made by quant_gen.sh from ggml's code); bad input is
 * refused and nothing is written.
 */
#include <math.h>

#include "arena/arena_int.h"
#include "arena/testdata/kquant_fixture.h"

static const struct { const char *name; int dt; uint32_t bytes; } kinds[] = {
	{ "q4_K", BATON_DT_Q4_K, 144 },
	{ "q5_K", BATON_DT_Q5_K, 176 },
	{ "q6_K", BATON_DT_Q6_K, 210 },
};

static void t_quantize_matches_ggml(void)
{
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		struct kq_fixture fx;
		kq_fixture_load(&fx, kinds[k].name);
		T_EQ_INT(fx.type, kinds[k].dt);
		T_EQ_INT(fx.bytes, kinds[k].bytes);
		T_EQ_INT(baton_dtype_row_bytes(kinds[k].dt, 256), fx.bytes);

		uint8_t *got = malloc((size_t)fx.n_q * fx.bytes);
		T_OK(arena_encode_row(kinds[k].dt, fx.q_inputs, (uint64_t)fx.n_q * 256, got));
		for (uint32_t b = 0; b < fx.n_q; b++) {
			const uint8_t *g = got + (size_t)b * fx.bytes, *w = fx.q_blocks + (size_t)b * fx.bytes;
			for (uint32_t i = 0; i < fx.bytes; i++)
				T_ASSERT_MSG(g[i] == w[i], "%s row %u byte %u: 0x%02x, ggml 0x%02x",
				    kinds[k].name, b, i, g[i], w[i]);
		}
		/* One row at a time gives the same bytes as all at once. */
		uint8_t one[256];
		T_OK(arena_encode_row(kinds[k].dt, fx.q_inputs + 256 * 5, 256, one));
		T_ASSERT(memcmp(one, fx.q_blocks + 5 * fx.bytes, fx.bytes) == 0);
		printf("  %s: %u rows byte-exact with ggml\n", kinds[k].name, fx.n_q);
		free(got);
		kq_fixture_free(&fx);
	}
}

static void t_bad_input(void)
{
	float x[512];
	uint8_t out[420], before[420];

	for (int i = 0; i < 512; i++)
		x[i] = sinf((float)i);
	memset(out, 0xa5, sizeof out);
	memcpy(before, out, sizeof out);
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		int dt = kinds[k].dt;
		T_EQ_ERR(arena_encode_row(dt, x, 255, out), BATON_EINVAL);
		T_EQ_ERR(arena_encode_row(dt, x, 384, out), BATON_EINVAL);
		x[300] = NAN;
		T_EQ_ERR(arena_encode_row(dt, x, 512, out), BATON_EINVAL);
		x[300] = INFINITY;
		T_EQ_ERR(arena_encode_row(dt, x, 512, out), BATON_EINVAL);
		x[300] = 0.5f;
		T_ASSERT(memcmp(out, before, sizeof out) == 0);
	}
	/* Zero and constant rows make valid blocks (no NaN scale). */
	memset(x, 0, sizeof x);
	T_OK(arena_encode_row(BATON_DT_Q4_K, x, 256, out));
	for (int i = 0; i < 4; i++)
		T_EQ_INT(out[i], 0);
	T_OK(arena_encode_row(BATON_DT_Q6_K, x, 256, out));
	for (int i = 0; i < 210; i++)
		T_EQ_INT(out[i], 0);
}

T_MAIN(T_CASE(t_quantize_matches_ggml), T_CASE(t_bad_input))
