/*
 * model_config_fuzz.c: libFuzzer target for model_config_parse, which reads
 * config.json out of an arena (a file, so untrusted). Any bytes must give 0
 * with a configuration the forward pass can size its buffers from, or an
 * error with a message; never a crash, a leak or an overflow. An empty
 * corpus is seeded with the four fixtures' configs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "tests/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static const char *const archs[] = { "qwen3_moe", "mixtral", "olmoe", "qwen2_moe" };
	const char *corpus = fuzz_empty_corpus(*argc, *argv);
	for (int i = 0; corpus && i < 4; i++) {
		char src[256], dst[4096], buf[8192];
		snprintf(src, sizeof src, "engine/model/fixtures/%s/config.json", archs[i]);
		snprintf(dst, sizeof dst, "%s/seed-%s", corpus, archs[i]);
		FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
		size_t n = in && out ? fread(buf, 1, sizeof buf, in) : 0;
		if (out)
			fwrite(buf, 1, n, out);
		if (in)
			fclose(in);
		if (out)
			fclose(out);
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct baton_model_config c;
	char err[256] = "";
	int rc = model_config_parse((const char *)data, size, &c, err, sizeof err);
	if (rc == 0) {
		/* what model_open relies on */
		if (!c.arch || !c.vocab || !c.hidden || !c.layers || !c.heads || !c.kv_heads ||
		    c.heads % c.kv_heads || !c.head_dim || (c.head_dim & 1) || !c.top_k ||
		    c.top_k > c.n_experts || !c.moe_ff || !(c.eps > 0) || !(c.rope_theta > 1) ||
		    !(c.rope_factor >= 1) || (c.arch->shared_expert && !c.shared_ff))
			abort();
		if (!(c.rope_mscale > 0) || !isfinite(c.rope_mscale))
			abort();
		float *inv = malloc(c.head_dim / 2 * sizeof *inv);
		if (inv) {
			model_rope_inv_freq(&c, inv);
			for (uint32_t i = 0; i < c.head_dim / 2; i++)
				if (!(inv[i] >= 0) || !isfinite(inv[i]))
					abort(); /* a frequency the rope op cannot use */
			free(inv);
		}
	} else if (!err[0]) {
		abort(); /* every refusal names its reason */
	}
	return 0;
}
