/*
 * kquant_test.c: the K-quant encoders (kquant.c) against ggml's own
 * quantize_row_q{4,5,6}_K_ref: the same inputs give the same bytes
 * (arena/testdata, made by kquant_gen.sh from ggml's code); bad input is
 * refused and nothing is written; a synthetic arena in a K-quant holds the
 * quantisation of the same arena's f32 values.
 */
#include <math.h>

#include "arena/arena_int.h"
#include "arena/testdata/kquant_fixture.h"
#include "tests/arena_util.h"

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

/* The synthetic model in q4_K / q5_K / q6_K: every expert part is the
 * encoding of the f32 synthetic model's values; router and norm stay f32. */
static void t_synthetic(void)
{
	char dir[PATH_MAX - 64], pf[PATH_MAX], pk[PATH_MAX], err[512];
	struct baton_synth_params p = {
		.layers = 2, .experts = 3, .top_k = 2, .d_model = 512, .d_ff = 256,
		.dtype = BATON_DT_F32, .seed = 11,
	};
	struct baton_arena *af, *ak;

	au_tmpdir(dir, sizeof dir);
	snprintf(pf, sizeof pf, "%s/f32.arena", dir);
	au_create(pf, &p);
	T_OK(arena_open(pf, &af, err, sizeof err));
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		p.dtype = (uint32_t)kinds[k].dt;
		snprintf(pk, sizeof pk, "%s/%s.arena", dir, kinds[k].name);
		au_create(pk, &p);
		T_OK(arena_open(pk, &ak, err, sizeof err));
		T_EQ_INT(arena_shape(ak)->gate_dtype, kinds[k].dt);
		T_EQ_INT(arena_shape(ak)->down_dtype, kinds[k].dt);
		T_EQ_INT(arena_shape(ak)->router_dtype, BATON_DT_F32);
		T_OK(arena_verify(ak, NULL, err, sizeof err));
		for (uint32_t l = 0; l < p.layers; l++)
			for (uint32_t e = 0; e < p.experts; e++) {
				struct baton_arena_tensor tf[3], tk[3];
				T_OK(arena_expert_parts(af, l, e, tf));
				T_OK(arena_expert_parts(ak, l, e, tk));
				for (int i = 0; i < 3; i++) {
					T_EQ_INT(tk[i].dtype, kinds[k].dt);
					T_EQ_INT(tk[i].bytes, tk[i].rows * baton_dtype_row_bytes(kinds[k].dt, tk[i].cols));
					uint8_t *want = malloc(tk[i].bytes);
					T_OK(arena_encode_row(kinds[k].dt, (const float *)(const void *)tf[i].data,
					    (uint64_t)tf[i].rows * tf[i].cols, want));
					T_ASSERT_MSG(memcmp(want, tk[i].data, tk[i].bytes) == 0,
					    "%s layer %u expert %u part %d", kinds[k].name, l, e, i);
					free(want);
				}
			}
		arena_close(ak);
	}
	/* Rows not a multiple of 256 are refused, naming the rule. */
	p.d_ff = 128;
	snprintf(pk, sizeof pk, "%s/bad.arena", dir);
	int rc = arena_create_synthetic(pk, &p, 0, err, sizeof err);
	T_EQ_ERR(rc, BATON_EINVAL);
	T_ASSERT_MSG(strstr(err, "multiples of 256") != NULL, "%s", err);
	arena_close(af);
	au_rmdir(dir);
}

T_MAIN(T_CASE(t_quantize_matches_ggml), T_CASE(t_bad_input), T_CASE_TIMEOUT(t_synthetic, 60))
