/*
 * model_fixture.h: the rig of the tests that run a whole model
 * (engine/model/model_test.c, kv_test.c, generate_test.c and
 * engine/serve/sched_test.c), included by each of them once: a fresh
 * directory, an arena made there from a Hugging Face folder (or a GGUF
 * file), an engine on it and a model or a generator, and the cleanup.
 *
 *   BATON_MODEL_BACKEND  the backend under test (default host; cuda on the
 *                        GPU machine, where the same references hold)
 *   BATON_FIXTURES       engine/model/fixtures: tiny random models, one
 *                        per architecture, with transformers' references
 *   BATON_MODELS         models/: the two trained models (make demo's)
 */
#ifndef BATON_ENGINE_MODEL_FIXTURE_H
#define BATON_ENGINE_MODEL_FIXTURE_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/model/model.h"
#include "tests/t.h"

/* A test uses some of these helpers, not all. */
#define RIG_UNUSED __attribute__((unused))

struct rig {
	char dir[64], arena[128];
	struct baton_engine *e;
	struct baton_model *m;      /* rig_model */
	struct baton_generator *g;  /* rig_generator */
	uint32_t V;                 /* the model's vocabulary (rig_model) */
	json_t *ref;                /* what the test compares with (its own; rig_close frees it) */
};

RIG_UNUSED static const char *rig_backend(void)
{
	const char *b = getenv("BATON_MODEL_BACKEND");
	return b && *b ? b : "host";
}

RIG_UNUSED static const char *rig_fixtures(void)
{
	const char *d = getenv("BATON_FIXTURES");
	return d && *d ? d : "engine/model/fixtures";
}

RIG_UNUSED static const char *rig_models(void)
{
	const char *d = getenv("BATON_MODELS");
	return d && *d ? d : "models";
}

/* A fresh directory for the rig's files (r->dir), r->arena named in it. */
RIG_UNUSED static void rig_dir(struct rig *r)
{
	*r = (struct rig){ 0 };
	snprintf(r->dir, sizeof r->dir, "/tmp/baton-rig-XXXXXX");
	T_ASSERT(mkdtemp(r->dir) != NULL);
	snprintf(r->arena, sizeof r->arena, "%s/m.arena", r->dir);
}

/* The arena of source s, then an engine named `name` on it (warm). */
RIG_UNUSED static void rig_engine_from(struct rig *r, const struct baton_arena_source *s, const char *name)
{
	char err[512] = "";
	int rc = arena_create(r->arena, s, NULL, NULL, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "creating the arena of %s: %s", s->file, err);
	struct baton_engine_config ec = {
		.name = name, .arena_path = r->arena, .backend = rig_backend(), .warm = 1,
	};
	rc = engine_open(&ec, &r->e, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "engine_open %s: %s", name, err);
}

/* rig_dir, then the engine of the Hugging Face folder dir/model. */
RIG_UNUSED static void rig_engine(struct rig *r, const char *dir, const char *model, const char *name)
{
	char src[512];
	rig_dir(r);
	snprintf(src, sizeof src, "%s/%s", dir, model);
	struct baton_arena_source s = { .kind = BATON_ARENA_SRC_SAFETENSORS, .file = src };
	rig_engine_from(r, &s, name);
}

/* The model on the rig's engine (mo NULL: the defaults). */
RIG_UNUSED static void rig_model(struct rig *r, const struct baton_model_opts *mo)
{
	char err[512] = "";
	int rc = model_open(r->e, mo, &r->m, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "model_open: %s", err);
	r->V = model_config(r->m)->vocab;
}

/* The generator on the rig's engine (mo NULL: the defaults). */
RIG_UNUSED static void rig_generator(struct rig *r, const struct baton_model_opts *mo)
{
	char err[512] = "";
	int rc = generator_open(r->e, mo, &r->g, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "generator_open: %s", err);
}

/* The JSON file dir/name as r->ref. */
RIG_UNUSED static void rig_ref(struct rig *r, const char *dir, const char *name)
{
	char path[1100];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	json_error_t je;
	r->ref = json_load_file(path, 0, &je);
	T_ASSERT_MSG(r->ref, "%s: %s", path, je.text);
}

/* Closes what is open and removes the rig's files. */
RIG_UNUSED static void rig_close(struct rig *r)
{
	generator_close(r->g);
	model_close(r->m);
	engine_close(r->e);
	json_decref(r->ref);
	unlink(r->arena);
	char lock[160];
	snprintf(lock, sizeof lock, "%s.lock", r->arena);
	unlink(lock);
	rmdir(r->dir);
	*r = (struct rig){ 0 };
}

#endif
