/*
 * plan.c: the bottom of arena creation, the plan API the planners (gguf.c,
 * safetensors.c, synth.c) fill a struct arena_plan with: the named list of
 * routers, norms, dense tensors and blobs (arena_int.h). It calls nothing
 * of theirs, nor the builder.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_int.h"

struct arena_named *arena_plan_add(struct arena_plan *p, uint32_t role, const char *name)
{
	if (strlen(name) > ARENA_MAX_NAME)
		return NULL;
	if (p->n_named == p->cap_named) {
		uint64_t nc = p->cap_named ? 2 * p->cap_named : 64;
		struct arena_named *nn = realloc(p->named, nc * sizeof *nn);
		if (!nn)
			return NULL;
		p->named = nn;
		p->cap_named = nc;
	}
	struct arena_named *n = &p->named[p->n_named++];
	memset(n, 0, sizeof *n);
	n->role = role;
	snprintf(n->name, sizeof n->name, "%s", name);
	return n;
}

int arena_plan_add_tensor(struct arena_plan *p, const struct arena_model_tensor *m, uint32_t dtype, uint64_t src,
    char *errbuf, size_t errlen)
{
	struct arena_named *n = arena_plan_add(p, m->role, m->name);
	if (!n)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	n->layer = m->layer;
	n->rows = m->rows;
	n->cols = m->cols;
	n->dtype = dtype;
	n->src = src;
	return 0;
}

int arena_plan_add_blob(struct arena_plan *p, const char *key, void *data, uint64_t len,
    char *errbuf, size_t errlen)
{
	struct arena_named *n = arena_plan_add(p, BATON_ROLE_BLOB, key);
	if (!n) {
		free(data);
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	}
	n->data = data;
	n->bytes = len;
	return 0;
}

void arena_plan_free_named(struct arena_plan *p)
{
	for (uint64_t i = 0; i < p->n_named; i++)
		free(p->named[i].data);
	free(p->named);
	p->named = NULL;
	p->n_named = p->cap_named = 0;
}
