/*
 * create.c: the top of arena creation, the public creators (arena.h): the
 * dispatcher arena_create, which asks the source's planner (synth.c,
 * gguf.c, safetensors.c) for a plan and hands it to the builder (build.c),
 * the arena_create_* shorthands and the default path.
 */
#include <stdio.h>
#include <string.h>

#include "arena/arena_int.h"

int arena_default_path(const char *name, char *buf, size_t len)
{
	if (!name || !*name || strchr(name, '/') || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return BATON_EINVAL;
	int n = snprintf(buf, len, "/dev/shm/baton/%s.arena", name);
	if (n < 0 || (size_t)n >= len)
		return BATON_ETOOBIG;
	return 0;
}

int arena_create(const char *path, const struct baton_arena_source *src,
    const struct baton_create_opts *opts, struct baton_create_result *res,
    char *errbuf, size_t errlen)
{
	struct arena_plan plan;
	void (*plan_free)(struct arena_plan *);
	int rc;
	if (res)
		memset(res, 0, sizeof *res);
	if (!src)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "no source");
	memset(&plan, 0, sizeof plan);
	switch (src->kind) {
	case BATON_ARENA_SRC_SYNTHETIC:
		rc = arena_plan_synthetic(&src->synth, &plan, errbuf, errlen);
		plan_free = arena_synthetic_free;
		break;
	case BATON_ARENA_SRC_GGUF:
		rc = arena_plan_gguf(src->file, src->experts_only, &plan, errbuf, errlen);
		plan_free = arena_gguf_plan_free;
		break;
	case BATON_ARENA_SRC_SAFETENSORS:
		rc = arena_plan_safetensors(src->file, src->top_k, src->experts_only, &plan, errbuf,
		    errlen);
		plan_free = arena_st_plan_free;
		break;
	default:
		return arena_errf(errbuf, errlen, BATON_EINVAL, "unknown source kind %d", src->kind);
	}
	if (rc) /* a planner that fails leaves nothing to free */
		return rc;
	rc = arena_build(path, &plan, opts, res, errbuf, errlen);
	arena_plan_free_named(&plan);
	plan_free(&plan);
	return rc;
}

int arena_create_synthetic(const char *path, const struct baton_synth_params *p,
    int force, char *errbuf, size_t errlen)
{
	struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC };
	struct baton_create_opts o = { .force = force };
	if (!p)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "no parameters");
	src.synth = *p;
	return arena_create(path, &src, &o, NULL, errbuf, errlen);
}

int arena_create_gguf(const char *path, const char *gguf_file, int force,
    char *errbuf, size_t errlen)
{
	struct baton_arena_source src = { .kind = BATON_ARENA_SRC_GGUF, .file = gguf_file };
	struct baton_create_opts o = { .force = force };
	return arena_create(path, &src, &o, NULL, errbuf, errlen);
}

int arena_create_safetensors(const char *path, const char *srcpath, uint32_t top_k,
    int force, char *errbuf, size_t errlen)
{
	struct baton_arena_source src = {
		.kind = BATON_ARENA_SRC_SAFETENSORS, .file = srcpath, .top_k = top_k,
	};
	struct baton_create_opts o = { .force = force };
	return arena_create(path, &src, &o, NULL, errbuf, errlen);
}
