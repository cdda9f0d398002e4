/*
 * completion.h: the engine's COMPLETE request (proto.h) turned into a
 * generator request (engine/model/model.h): the prompt or the messages (a JSON array
 * of {"role", "content"}), the stop strings (a JSON array), the sampling
 * fields over the sampler's defaults. Every field is checked here, before
 * the request waits for the engine, so a bad one costs nothing.
 */
#ifndef BATON_ENGINE_COMPLETION_H
#define BATON_ENGINE_COMPLETION_H

#include <stddef.h>

#include "engine/model/model.h"
#include "proto/proto.h"

#define BATON_COMPLETE_MAX_MESSAGES 1024u

struct completion {
	struct baton_gen_request q;  /* points into the fields below and the message */
	void *msgs_json, *stop_json; /* the parsed JSON (jansson), owned */
	struct text_msg *msgs;
	const char **stop;
};

/* Fills *c from req; the message must outlive *c. BATON_EINVAL or
 * BATON_ERANGE with a sentence naming the field; *c owns nothing then. */
int completion_parse(const struct baton_msg *req, struct completion *c, char *errbuf, size_t errlen);
/* Idempotent. */
void completion_free(struct completion *c);

#endif
