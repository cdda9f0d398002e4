/*
 * baton-arena: make, inspect and check arena files.
 *
 *   baton-arena create --synthetic --layers N --experts N --top-k N
 *                      --d-model N --d-ff N [--dtype f16] [--seed N] [opts] PATH
 *   baton-arena create --synthetic-arch ARCH [--preset NAME | sizes] [opts] PATH
 *   baton-arena create --gguf FILE [--experts-only] [opts] PATH
 *   baton-arena create --safetensors FILE|DIR [--experts-only] [--top-k N] [opts] PATH
 *   baton-arena info [--json [--entries]] PATH
 *   baton-arena verify PATH
 *
 * Exit status: 0 success, 1 failure (bad file, checksum mismatch), 2 usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "arena/arena_int.h"
/* A program sits above every library it links (docs/internals/layout.md):
 * the import checks the tokenizer with the engine's own loader. */
#include "text/text.h"

static const char usage_text[] =
    "usage: baton-arena create --synthetic --layers N --experts N --top-k N\n"
    "                          --d-model N --d-ff N [--dtype f32|f16|bf16|q8_0|q4_K|q6_K]\n"
    "                          [--seed N] [--force] [--threads N] PATH\n"
    "       baton-arena create --synthetic-arch qwen3_moe|qwen2_moe|mixtral|olmoe\n"
    "                          [--preset NAME] [--layers N --experts N --top-k N\n"
    "                          --d-model N --d-ff N] [--heads N] [--kv-heads N]\n"
    "                          [--head-dim N] [--vocab N] [--shared-ff N]\n"
    "                          [--tokenizer HF_DIR] [--dtype ...] [--seed N]\n"
    "                          [--force] PATH\n"
    "       baton-arena create --gguf FILE [--experts-only] [--force] [--threads N] PATH\n"
    "       baton-arena create --safetensors FILE|DIR [--experts-only] [--top-k N]\n"
    "                          [--force] PATH\n"
    "       baton-arena info [--json [--entries]] PATH\n"
    "       baton-arena verify PATH\n"
    "       baton-arena --help | --version\n"
    "\n"
    "PATH is a file path, or a bare NAME (no '/', not ending in .arena) for\n"
    "/dev/shm/baton/NAME.arena. create writes PATH.tmp.<pid>, seals it and\n"
    "renames it into place under a lock on PATH.lock; a valid arena of the same\n"
    "source already there is reused unless --force.\n"
    "--gguf and --safetensors import the whole model (weights, config, tokenizer)\n"
    "of a supported architecture and refuse anything else by name;\n"
    "--experts-only takes just the experts, routers and norms of any MoE.\n"
    "--synthetic makes the experts-only benchmark model; --synthetic-arch a whole\n"
    "random model of that architecture (presets: qwen3-30b-a3b, qwen3-235b-a22b,\n"
    "qwen1.5-moe-a2.7b, mixtral-8x7b, olmoe-1b-7b; explicit sizes override).\n"
    "info prints the header and a per-layer table (--json: as JSON; --entries\n"
    "adds every entry). verify recomputes every blob's checksum.\n"
    "Exit status: 0 ok, 1 failure, 2 bad usage.\n";

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "baton-arena: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n(baton-arena --help for usage)\n");
	return 2;
}

static int parse_u64(const char *opt, const char *s, uint64_t max, uint64_t *out)
{
	uint64_t v;
	int rc = baton_parse_u64(s, 0, max, &v);
	if (rc == BATON_EINVAL) {
		fprintf(stderr, "baton-arena: %s: \"%s\" is not a number\n", opt, s ? s : "");
		return 2;
	}
	if (rc) {
		fprintf(stderr, "baton-arena: %s: %s is larger than %" PRIu64 "\n", opt, s, max);
		return 2;
	}
	*out = v;
	return 0;
}

static const char *resolve(const char *arg, char *buf, size_t len)
{
	size_t n = strlen(arg);
	if (strchr(arg, '/') || (n > 6 && strcmp(arg + n - 6, ".arena") == 0))
		return arg;
	if (arena_default_path(arg, buf, len) != 0)
		return arg;
	return buf;
}

static void human_bytes(uint64_t b, char *buf, size_t len)
{
	if (b >= (1ull << 30))
		snprintf(buf, len, "%.2f GiB", (double)b / (double)(1ull << 30));
	else if (b >= (1ull << 20))
		snprintf(buf, len, "%.2f MiB", (double)b / (double)(1ull << 20));
	else if (b >= (1ull << 10))
		snprintf(buf, len, "%.2f KiB", (double)b / 1024.0);
	else
		snprintf(buf, len, "%" PRIu64 " B", b);
}

/* ---- create's progress bar: on a terminal only ------------------------------------ */

struct bar {
	const char *path;
	double t0, last;   /* started, last drawn */
	bool drawn;
};

/* "[#########...........]  45%  1.01 GiB of 2.25 GiB  812.00 MiB/s  4s left  NAME.arena",
 * on stderr, at most every 0.1 s and once at 100%. */
static void bar_step(void *ctx, uint64_t done, uint64_t total)
{
	struct bar *b = ctx;
	double now = baton_now_s();
	if (done < total && now - b->last < 0.1 && b->drawn)
		return;
	b->last = now;
	double f = total ? (double)done / (double)total : 1.0;
	char bar[24], d[32], t[32], rate[48] = "", left[32] = "";
	int fill = (int)(f * 20 + 0.5);
	for (int i = 0; i < 20; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[20] = 0;
	human_bytes(done, d, sizeof d);
	human_bytes(total, t, sizeof t);
	double el = now - b->t0;
	if (el > 0.05 && done) {
		double bps = (double)done / el;
		human_bytes((uint64_t)bps, rate, sizeof rate);
		strcat(rate, "/s");
		if (done < total)
			snprintf(left, sizeof left, "  %.0fs left", (double)(total - done) / bps + 0.5);
	}
	struct winsize ws;
	int cols = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 10 ? ws.ws_col : 80;
	char line[512];
	const char *base = strrchr(b->path, '/');
	int n = snprintf(line, sizeof line, "[%s] %3d%%  %s of %s  %s%s  %s", bar, (int)(f * 100), d, t, rate, left,
	    base ? base + 1 : b->path);
	if (n > cols - 1)
		n = cols - 1;
	fprintf(stderr, "\r%.*s\033[K", n, line);
	fflush(stderr);
	b->drawn = true;
}

static void bar_end(struct bar *b)
{
	if (b->drawn) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
	}
}

static const char *dn(uint32_t dt)
{
	const char *n = baton_dtype_name((int)dt);
	return n ? n : "?";
}

/* create's check hook: the tokenizer the arena will hold must load as the
 * engine loads it (generator_open: "the arena's tokenizer: ..."), so bogus
 * merges, an empty added token or a pre-tokenizer regex PCRE2 refuses are
 * refused here, before anything is written, with the engine's message. An
 * arena without a tokenizer (experts only) passes: the engine serves it
 * without text. */
static int check_tokenizer(void *ctx, int (*blob)(void *, const char *, const void **, uint64_t *),
    void *blobs, char *errbuf, size_t errlen)
{
	(void)ctx;
	const void *d;
	uint64_t n;
	if (blob(blobs, "tokenizer.json", &d, &n) != 0 && blob(blobs, "gguf_tokenizer.json", &d, &n) != 0)
		return 0;
	text_tok *t = NULL;
	char terr[400] = "";
	int rc = text_tok_load_blobs(&t, blob, blobs, terr, sizeof terr);
	text_tok_free(t);
	if (rc)
		snprintf(errbuf, errlen, "the arena's tokenizer: %s", terr);
	return rc;
}

static int cmd_create(int argc, char **argv)
{
	enum { O_SYN = 256, O_GGUF, O_ST, O_LAYERS, O_EXPERTS, O_TOPK, O_DMODEL, O_DFF,
		O_DTYPE, O_SEED, O_FORCE, O_THREADS, O_HELP, O_SYNARCH, O_PRESET, O_HEADS,
		O_KVHEADS, O_HEADDIM, O_VOCAB, O_SHARED, O_EXPONLY, O_TOKENIZER };
	static const struct option opts[] = {
		{ "synthetic", no_argument, NULL, O_SYN },
		{ "gguf", required_argument, NULL, O_GGUF },
		{ "safetensors", required_argument, NULL, O_ST },
		{ "layers", required_argument, NULL, O_LAYERS },
		{ "experts", required_argument, NULL, O_EXPERTS },
		{ "top-k", required_argument, NULL, O_TOPK },
		{ "d-model", required_argument, NULL, O_DMODEL },
		{ "d-ff", required_argument, NULL, O_DFF },
		{ "dtype", required_argument, NULL, O_DTYPE },
		{ "seed", required_argument, NULL, O_SEED },
		{ "force", no_argument, NULL, O_FORCE },
		{ "threads", required_argument, NULL, O_THREADS },
		{ "help", no_argument, NULL, O_HELP },
		{ "synthetic-arch", required_argument, NULL, O_SYNARCH },
		{ "preset", required_argument, NULL, O_PRESET },
		{ "heads", required_argument, NULL, O_HEADS },
		{ "kv-heads", required_argument, NULL, O_KVHEADS },
		{ "head-dim", required_argument, NULL, O_HEADDIM },
		{ "vocab", required_argument, NULL, O_VOCAB },
		{ "shared-ff", required_argument, NULL, O_SHARED },
		{ "experts-only", no_argument, NULL, O_EXPONLY },
		{ "tokenizer", required_argument, NULL, O_TOKENIZER },
		{ NULL, 0, NULL, 0 },
	};
	const char *synarch = NULL, *preset = NULL, *tokenizer = NULL;
	uint64_t extra[5] = { 0 }; /* heads, kv-heads, head-dim, vocab, shared-ff */
	int have_extra = 0;
	struct baton_arena_source src = { 0 };
	struct baton_create_opts co = { 0 };
	uint64_t v, layers = 0, experts = 0, top_k = 0, d_model = 0, d_ff = 0, seed = 0;
	int have_topk = 0, nsrc = 0, dtype = BATON_DT_F16, c, rc;
	int have[5] = { 0 };

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case O_SYN: src.kind = BATON_ARENA_SRC_SYNTHETIC; nsrc++; break;
		case O_GGUF: src.kind = BATON_ARENA_SRC_GGUF; src.file = optarg; nsrc++; break;
		case O_ST: src.kind = BATON_ARENA_SRC_SAFETENSORS; src.file = optarg; nsrc++; break;
		case O_LAYERS:
			if ((rc = parse_u64("--layers", optarg, BATON_ARENA_MAX_LAYERS, &layers)))
				return rc;
			have[0] = 1;
			break;
		case O_EXPERTS:
			if ((rc = parse_u64("--experts", optarg, BATON_ARENA_MAX_EXPERTS, &experts)))
				return rc;
			have[1] = 1;
			break;
		case O_TOPK:
			if ((rc = parse_u64("--top-k", optarg, BATON_ARENA_MAX_EXPERTS, &top_k)))
				return rc;
			have_topk = 1;
			break;
		case O_DMODEL:
			if ((rc = parse_u64("--d-model", optarg, ARENA_MAX_DIM - 1, &d_model)))
				return rc;
			have[2] = 1;
			break;
		case O_DFF:
			if ((rc = parse_u64("--d-ff", optarg, ARENA_MAX_DIM - 1, &d_ff)))
				return rc;
			have[3] = 1;
			break;
		case O_DTYPE:
			dtype = baton_dtype_parse(optarg);
			if (dtype != BATON_DT_F32 && dtype != BATON_DT_F16 && dtype != BATON_DT_BF16 &&
			    dtype != BATON_DT_Q8_0 && dtype != BATON_DT_Q4_K && dtype != BATON_DT_Q6_K)
				return usage_error("--dtype: \"%s\" is not one of f32, f16, bf16, q8_0, q4_K, "
						   "q6_K", optarg);
			break;
		case O_SEED:
			if ((rc = parse_u64("--seed", optarg, UINT64_MAX, &seed)))
				return rc;
			break;
		case O_FORCE: co.force = 1; break;
		case O_THREADS:
			if ((rc = parse_u64("--threads", optarg, 256, &v)))
				return rc;
			co.threads = (unsigned)v;
			break;
		case O_HELP: fputs(usage_text, stdout); return 0;
		case O_SYNARCH: src.kind = BATON_ARENA_SRC_SYNTHETIC; synarch = optarg; nsrc++; break;
		case O_PRESET: preset = optarg; break;
		case O_TOKENIZER: tokenizer = optarg; break;
		case O_EXPONLY: src.experts_only = 1; break;
		case O_HEADS: case O_KVHEADS: case O_HEADDIM: case O_VOCAB: case O_SHARED: {
			static const char *const nm[] = { "--heads", "--kv-heads", "--head-dim", "--vocab",
				"--shared-ff" };
			int i = c - O_HEADS;
			if ((rc = parse_u64(nm[i], optarg, i == 3 ? (1u << 24) : ARENA_MAX_DIM - 1, &extra[i])))
				return rc;
			if (extra[i] == 0)
				return usage_error("create: %s must be at least 1", nm[i]);
			have_extra = 1;
			break;
		}
		default:
			return usage_error("create: unknown or incomplete option \"%s\"", argv[optind - 1]);
		}
	}
	if (nsrc != 1)
		return usage_error("create: give exactly one of --synthetic, --synthetic-arch, --gguf, "
				   "--safetensors%s", "");
	if ((preset || have_extra) && !synarch)
		return usage_error("create: --preset, --heads, --kv-heads, --head-dim, --vocab and "
				   "--shared-ff go with --synthetic-arch%s", "");
	if (tokenizer && !synarch)
		return usage_error("create: --tokenizer goes with --synthetic-arch (an imported model "
				   "brings its own)%s", "");
	if (src.experts_only && src.kind == BATON_ARENA_SRC_SYNTHETIC)
		return usage_error("create: --experts-only is for --gguf and --safetensors (--synthetic "
				   "is experts-only already)%s", "");
	if (optind != argc - 1)
		return usage_error("create: give one arena PATH (got %s)",
		    optind >= argc ? "none" : "more than one");
	char pbuf[4096];
	const char *path = resolve(argv[optind], pbuf, sizeof pbuf);

	if (src.kind == BATON_ARENA_SRC_SYNTHETIC && synarch) {
		struct baton_synth_params sp = { 0 };
		if (preset) {
			if (arena_synth_preset(preset, &sp) != 0)
				return usage_error("create: unknown --preset \"%s\" (qwen3-30b-a3b, "
						   "qwen3-235b-a22b, qwen1.5-moe-a2.7b, mixtral-8x7b, olmoe-1b-7b)",
				    preset);
			if (strcmp(sp.arch, synarch) != 0)
				return usage_error("create: --preset %s is another architecture", preset);
		}
		/* explicit sizes override the preset's */
		if (have[0]) sp.layers = (uint32_t)layers;
		if (have[1]) sp.experts = (uint32_t)experts;
		if (have[2]) sp.d_model = (uint32_t)d_model;
		if (have[3]) sp.d_ff = (uint32_t)d_ff;
		if (have_topk) sp.top_k = (uint32_t)top_k;
		uint32_t *ex[5] = { &sp.heads, &sp.kv_heads, &sp.head_dim, &sp.vocab, &sp.shared_ff };
		for (int i = 0; i < 5; i++)
			if (extra[i])
				*ex[i] = (uint32_t)extra[i];
		if (!sp.layers || !sp.experts || !sp.top_k || !sp.d_model || !sp.d_ff)
			return usage_error("create --synthetic-arch needs --preset or all of --layers, "
					   "--experts, --top-k, --d-model, --d-ff%s", "");
		if (sp.top_k > sp.experts)
			return usage_error("create --synthetic-arch: --top-k is larger than --experts%s", "");
		sp.arch = synarch;
		sp.tokenizer = tokenizer;
		sp.dtype = (uint32_t)dtype;
		sp.seed = seed;
		src.synth = sp;
	} else if (src.kind == BATON_ARENA_SRC_SYNTHETIC) {
		static const char *const names[] = { "--layers", "--experts", "--d-model", "--d-ff" };
		for (int i = 0; i < 4; i++)
			if (!have[i])
				return usage_error("create --synthetic needs %s", names[i]);
		if (!have_topk)
			return usage_error("create --synthetic needs %s", "--top-k");
		if (layers == 0 || experts == 0 || top_k == 0 || d_model == 0 || d_ff == 0)
			return usage_error("create --synthetic: %s must be at least 1",
			    "layers, experts, top-k, d-model and d-ff");
		if (top_k > experts)
			return usage_error("create --synthetic: --top-k is larger than --experts%s", "");
		src.synth = (struct baton_synth_params){
			.layers = (uint32_t)layers, .experts = (uint32_t)experts,
			.top_k = (uint32_t)top_k, .d_model = (uint32_t)d_model,
			.d_ff = (uint32_t)d_ff, .dtype = (uint32_t)dtype, .seed = seed,
		};
	} else {
		if (have[0] || have[1] || have[2] || have[3])
			return usage_error("create: --layers, --experts, --d-model, --d-ff are for "
					   "--synthetic only%s", "");
		if (have_topk && src.kind == BATON_ARENA_SRC_GGUF)
			return usage_error("create --gguf: top-k comes from the file%s", "");
		src.top_k = (uint32_t)top_k;
	}

	char err[1024] = "";
	struct baton_create_result res;
	struct bar bar = { .path = path, .t0 = baton_now_s() };
	const char *term = getenv("TERM");
	if (isatty(STDERR_FILENO) && !(term && strcmp(term, "dumb") == 0)) {
		co.progress = bar_step; /* piped or logged: nothing */
		co.progress_ctx = &bar;
	}
	co.check = check_tokenizer;
	rc = arena_create(path, &src, &co, &res, err, sizeof err);
	bar_end(&bar);
	if (rc) {
		fprintf(stderr, "baton-arena: create %s: %s: %s\n", path, baton_errname(rc), err);
		return 1;
	}
	char hb[32];
	human_bytes(res.bytes, hb, sizeof hb);
	if (res.reused)
		printf("reused %s: %s, generation %" PRIu64 " (already there; --force rebuilds)\n",
		    path, hb, res.generation);
	else
		printf("built %s: %s, generation %" PRIu64 ", %.3f s (%.2f GiB/s)\n", path, hb,
		    res.generation, res.seconds,
		    res.seconds > 0 ? (double)res.bytes / res.seconds / (double)(1ull << 30) : 0.0);
	return 0;
}

static int open_or_fail(const char *path, struct baton_arena **a)
{
	char err[1024] = "";
	int rc = arena_open(path, a, err, sizeof err);
	if (rc) {
		fprintf(stderr, "baton-arena: %s: %s\n", baton_errname(rc), err);
		return 1;
	}
	return 0;
}

static json_t *tensor_json(const struct baton_arena_tensor *t, uint64_t blob_off)
{
	return json_pack("{s:s, s:I, s:I, s:I, s:I}", "dtype", dn(t->dtype),
	    "rows", (json_int_t)t->rows, "cols", (json_int_t)t->cols,
	    "offset", (json_int_t)(t->offset - blob_off), "bytes", (json_int_t)t->bytes);
}

static int info_json(const char *path, const struct baton_arena *a, int entries)
{
	const struct baton_arena_shape *s = arena_shape(a);
	/* generation: nanoseconds since 1970, below 2^63 until 2262 */
	json_t *root = json_pack(
	    "{s:s, s:i, s:I, s:s, s:I, s:I, s:i, s:i, s:i, s:i, s:i, s:{s:s, s:s, s:s, s:s, s:s}, s:I}",
	    "path", path, "version", ARENA_VERSION, "generation", (json_int_t)arena_generation(a),
	    "source", arena_source(a),
	    "size", (json_int_t)arena_size(a), "slot_bytes", (json_int_t)arena_max_expert_bytes(a),
	    "layers", (int)s->layers, "experts", (int)s->experts, "top_k", (int)s->top_k,
	    "d_model", (int)s->d_model, "d_ff", (int)s->d_ff,
	    "dtypes", "gate", dn(s->gate_dtype), "up", dn(s->up_dtype), "down", dn(s->down_dtype),
	    "router", dn(s->router_dtype), "norm", dn(s->norm_dtype),
	    "align", (json_int_t)BATON_ARENA_ALIGN);
	if (!root)
		return 1;
	struct baton_arena_tensor t;
	json_object_set_new(root, "has_router",
	    json_boolean(arena_tensor(a, 0, BATON_ROLE_ROUTER, &t) == 0));
	json_object_set_new(root, "has_norm",
	    json_boolean(arena_tensor(a, 0, BATON_ROLE_NORM, &t) == 0));
	json_t *layers = json_array();
	for (uint32_t l = 0; l < s->layers; l++) {
		uint32_t d[3];
		arena_layer_dtypes(a, l, d);
		json_array_append_new(layers, json_pack("{s:s, s:s, s:s}", "gate", dn(d[0]),
		    "up", dn(d[1]), "down", dn(d[2])));
	}
	json_object_set_new(root, "layer_dtypes", layers);
	json_object_set_new(root, "arch", json_string(arena_arch(a)));
	const void *cfg;
	uint64_t clen;
	json_t *cj = NULL;
	if (arena_blob(a, "config.json", &cfg, &clen) == 0) {
		/* exact integers where jansson reads them, else base.h's policy
		 * (an integer past 64 bits as a double) */
		cj = json_loadb(cfg, (size_t)clen, 0, NULL);
		if (!cj)
			cj = baton_json_load(cfg, (size_t)clen, 0, NULL);
	}
	json_object_set_new(root, "config", cj ? cj : json_null());
	json_object_set_new(root, "tokenizer", json_boolean(arena_blob(a, "tokenizer.json", NULL, NULL) == 0 ||
	    arena_blob(a, "gguf_tokenizer.json", NULL, NULL) == 0));
	uint64_t dense_bytes = 0;
	for (uint64_t i = 0; i < arena_dense_count(a); i++) {
		arena_dense_at(a, i, NULL, &t);
		dense_bytes += t.bytes;
	}
	json_object_set_new(root, "dense_tensors", json_integer((json_int_t)arena_dense_count(a)));
	json_object_set_new(root, "dense_bytes", json_integer((json_int_t)dense_bytes));
	json_t *blobs = json_array();
	for (uint64_t i = 0; i < arena_blob_count(a); i++) {
		const char *key;
		const void *data;
		uint64_t len;
		arena_blob_at(a, i, &key, &data, &len);
		json_array_append_new(blobs, json_pack("{s:s, s:I, s:I}", "key", key, "bytes", (json_int_t)len,
		    "offset", (json_int_t)((const uint8_t *)data - (const uint8_t *)arena_base(a))));
	}
	json_object_set_new(root, "metadata", blobs);
	if (entries) {
		json_t *arr = json_array();
		char ck[24];
		for (uint32_t l = 0; l < s->layers; l++)
			for (uint32_t x = 0; x < s->experts; x++) {
				struct baton_arena_expert e;
				struct baton_arena_tensor p[3];
				arena_expert(a, l, x, &e);
				arena_expert_parts(a, l, x, p);
				snprintf(ck, sizeof ck, "%016" PRIx64, e.checksum);
				json_array_append_new(arr, json_pack("{s:s, s:i, s:i, s:I, s:I, s:s, s:[o,o,o]}",
				    "role", "expert", "layer", (int)l, "expert", (int)x,
				    "offset", (json_int_t)e.offset, "bytes", (json_int_t)e.bytes, "checksum", ck,
				    "parts", tensor_json(&p[0], e.offset), tensor_json(&p[1], e.offset),
				    tensor_json(&p[2], e.offset)));
			}
		for (int r = BATON_ROLE_ROUTER; r <= BATON_ROLE_NORM; r++)
			for (uint32_t l = 0; l < s->layers; l++) {
				if (arena_tensor(a, l, (enum baton_role)r, &t) != 0)
					continue;
				snprintf(ck, sizeof ck, "%016" PRIx64, t.checksum);
				json_array_append_new(arr, json_pack("{s:s, s:i, s:i, s:I, s:I, s:s, s:[o]}",
				    "role", arena_role_name((uint32_t)r), "layer", (int)l, "expert", 0,
				    "offset", (json_int_t)t.offset, "bytes", (json_int_t)t.bytes, "checksum", ck,
				    "parts", tensor_json(&t, t.offset)));
			}
		/* every named tensor (routers and norms again, under their names) */
		json_t *dense = json_array();
		for (uint64_t i = 0; i < arena_dense_count(a); i++) {
			const char *name;
			arena_dense_at(a, i, &name, &t);
			snprintf(ck, sizeof ck, "%016" PRIx64, t.checksum);
			json_array_append_new(dense, json_pack("{s:s, s:s, s:i, s:i, s:I, s:I, s:s}",
			    "name", name, "dtype", dn(t.dtype), "rows", (int)t.rows, "cols", (int)t.cols,
			    "offset", (json_int_t)t.offset, "bytes", (json_int_t)t.bytes, "checksum", ck));
		}
		json_object_set_new(root, "entries", arr);
		json_object_set_new(root, "dense", dense);
	}
	int rc = json_dumpf(root, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER) == 0 ? 0 : 1;
	putchar('\n');
	json_decref(root);
	return rc;
}

static void info_human(const char *path, const struct baton_arena *a)
{
	const struct baton_arena_shape *s = arena_shape(a);
	char hb[32], eb[32];
	human_bytes(arena_size(a), hb, sizeof hb);
	human_bytes(arena_max_expert_bytes(a), eb, sizeof eb);
	struct baton_arena_tensor t;
	int router = arena_tensor(a, 0, BATON_ROLE_ROUTER, &t) == 0;
	int norm = arena_tensor(a, 0, BATON_ROLE_NORM, &t) == 0;
	printf("arena      %s\n", path);
	printf("format     version %u, sealed, generation %" PRIu64 "\n", ARENA_VERSION,
	    arena_generation(a));
	printf("source     %s\n", arena_source(a));
	printf("size       %s (%" PRIu64 " bytes)\n", hb, arena_size(a));
	printf("shape      %" PRIu32 " layers x %" PRIu32 " experts, top-k %" PRIu32
	       ", d_model %" PRIu32 ", d_ff %" PRIu32 "\n",
	    s->layers, s->experts, s->top_k, s->d_model, s->d_ff);
	printf("dtypes     gate %s, up %s, down %s, router %s, norm %s\n", dn(s->gate_dtype),
	    dn(s->up_dtype), dn(s->down_dtype), router ? dn(s->router_dtype) : "-",
	    norm ? dn(s->norm_dtype) : "-");
	printf("experts    %" PRIu64 " blobs, slot %s (each aligned to %u)\n",
	    (uint64_t)s->layers * s->experts, eb, BATON_ARENA_ALIGN);
	uint64_t dense_bytes = 0;
	for (uint64_t i = 0; i < arena_dense_count(a); i++) {
		arena_dense_at(a, i, NULL, &t);
		dense_bytes += t.bytes;
	}
	char db[32];
	human_bytes(dense_bytes, db, sizeof db);
	printf("arch       %s\n", arena_arch(a)[0] ? arena_arch(a) : "- (experts only)");
	printf("dense      %" PRIu64 " tensors, %s\n", arena_dense_count(a), db);
	const void *cfg;
	uint64_t clen;
	if (arena_blob(a, "config.json", &cfg, &clen) == 0) {
		json_t *cj = json_loadb(cfg, (size_t)clen, 0, NULL);
		if (!cj)
			cj = baton_json_load(cfg, (size_t)clen, 0, NULL);
		printf("config     ");
		static const char *const keys[] = { "hidden_size", "num_hidden_layers",
			"num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
			"rope_theta", "tie_word_embeddings" };
		for (size_t i = 0; cj && i < sizeof keys / sizeof keys[0]; i++) {
			const json_t *v = json_object_get(cj, keys[i]);
			if (json_is_integer(v))
				printf("%s %" JSON_INTEGER_FORMAT "%s", keys[i], json_integer_value(v), ", ");
			else if (json_is_real(v))
				printf("%s %g, ", keys[i], json_real_value(v));
			else if (json_is_boolean(v))
				printf("%s %s, ", keys[i], json_is_true(v) ? "true" : "false");
		}
		printf("(%" PRIu64 " bytes)\n", clen);
		json_decref(cj);
	}
	printf("tokenizer  %s\n", arena_blob(a, "tokenizer.json", NULL, NULL) == 0 ? "tokenizer.json"
	    : arena_blob(a, "gguf_tokenizer.json", NULL, NULL) == 0 ? "gguf_tokenizer.json" : "none");
	printf("metadata   ");
	for (uint64_t i = 0; i < arena_blob_count(a); i++) {
		const char *key;
		uint64_t len;
		arena_blob_at(a, i, &key, NULL, &len);
		printf("%s%s (%" PRIu64 " bytes)", i ? ", " : "", key, len);
	}
	printf("%s\n", arena_blob_count(a) ? "" : "none");
	printf("\n%-6s %-8s %-8s %-8s %12s %14s %14s\n", "layer", "gate", "up", "down",
	    "expert bytes", "first offset", "router bytes");
	for (uint32_t l = 0; l < s->layers; l++) {
		uint32_t d[3];
		struct baton_arena_expert e;
		arena_layer_dtypes(a, l, d);
		arena_expert(a, l, 0, &e);
		uint64_t rb = arena_tensor(a, l, BATON_ROLE_ROUTER, &t) == 0 ? t.bytes : 0;
		printf("%-6" PRIu32 " %-8s %-8s %-8s %12" PRIu64 " %14" PRIu64 " %14" PRIu64 "\n", l,
		    dn(d[0]), dn(d[1]), dn(d[2]), e.bytes, e.offset, rb);
	}
}

static int cmd_info(int argc, char **argv)
{
	int json = 0, entries = 0;
	const char *arg = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = 1;
		else if (strcmp(argv[i], "--entries") == 0)
			entries = 1;
		else if (strcmp(argv[i], "--help") == 0) {
			fputs(usage_text, stdout);
			return 0;
		} else if (argv[i][0] == '-' && argv[i][1])
			return usage_error("info: unknown option \"%s\"", argv[i]);
		else if (arg)
			return usage_error("info: give one PATH (extra \"%s\")", argv[i]);
		else
			arg = argv[i];
	}
	if (!arg)
		return usage_error("info: give an arena PATH%s", "");
	if (entries && !json)
		return usage_error("info: --entries goes with --json%s", "");
	char pbuf[4096];
	const char *path = resolve(arg, pbuf, sizeof pbuf);
	struct baton_arena *a;
	if (open_or_fail(path, &a))
		return 1;
	int rc = 0;
	if (json)
		rc = info_json(path, a, entries);
	else
		info_human(path, a);
	arena_close(a);
	return rc;
}

static int cmd_verify(int argc, char **argv)
{
	const char *arg = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0) {
			fputs(usage_text, stdout);
			return 0;
		} else if (argv[i][0] == '-' && argv[i][1])
			return usage_error("verify: unknown option \"%s\"", argv[i]);
		else if (arg)
			return usage_error("verify: give one PATH (extra \"%s\")", argv[i]);
		else
			arg = argv[i];
	}
	if (!arg)
		return usage_error("verify: give an arena PATH%s", "");
	char pbuf[4096];
	const char *path = resolve(arg, pbuf, sizeof pbuf);
	struct baton_arena *a;
	if (open_or_fail(path, &a))
		return 1;
	char err[1024] = "";
	uint64_t bad = 0;
	double t0 = baton_now_s();
	int rc = arena_verify(a, &bad, err, sizeof err);
	double dt = baton_now_s() - t0;
	uint64_t n = (uint64_t)arena_shape(a)->layers * arena_shape(a)->experts;
	if (rc) {
		fprintf(stderr, "baton-arena: verify %s: %s: %s; %" PRIu64 " bad entr%s\n", path,
		    baton_errname(rc), err, bad, bad == 1 ? "y" : "ies");
	} else {
		char hb[32];
		human_bytes(arena_size(a), hb, sizeof hb);
		printf("ok %s: %" PRIu64 " experts, %" PRIu64 " dense tensors and %" PRIu64
		       " metadata blobs match their checksums (%s, %.3f s)\n", path, n,
		    arena_dense_count(a), arena_blob_count(a), hb, dt);
	}
	arena_close(a);
	return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage_error("no command (create, info, verify)%s", "");
	const char *cmd = argv[1];
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
		fputs(usage_text, stdout);
		return 0;
	}
	if (strcmp(cmd, "--version") == 0) {
		printf("baton-arena %s\n", baton_version());
		return 0;
	}
	if (strcmp(cmd, "create") == 0)
		return cmd_create(argc - 1, argv + 1);
	if (strcmp(cmd, "info") == 0)
		return cmd_info(argc - 1, argv + 1);
	if (strcmp(cmd, "verify") == 0)
		return cmd_verify(argc - 1, argv + 1);
	return usage_error("unknown command \"%s\" (create, info, verify)", cmd);
}
