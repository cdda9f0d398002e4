/*
 * usage.c: the engine's usage report, which the front door asks for
 * (X-Baton-Usage: 1) and counts its serving metrics and access log by
 * (door_int.h): a header of a whole reply, a comment line of a stream in
 * its [DONE] event (engine/serve/usage.c writes both).
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "broker/door/door_int.h"

void door_usage_parse(const char *s, struct door_usage *u)
{
	char fin[16] = "";
	if (sscanf(s, "prompt_tokens=%lu completion_tokens=%lu ttft_s=%lf finish=%15s", &u->prompt, &u->completion,
	    &u->ttft_s, fin) == 4) {
		u->have = true;
		snprintf(u->finish, sizeof u->finish, "%s", fin);
	}
}

void door_usage_of_body(const char *buf, size_t n, struct door_usage *u)
{
	json_t *j = json_loadb(buf, n, 0, NULL), *us = json_object_get(j, "usage");
	json_t *p = json_object_get(us, "prompt_tokens"), *c = json_object_get(us, "completion_tokens");
	if (json_is_integer(p) && json_is_integer(c)) {
		u->have = true;
		u->prompt = (unsigned long)json_integer_value(p);
		u->completion = (unsigned long)json_integer_value(c);
		snprintf(u->finish, sizeof u->finish, "stop");
	}
	json_decref(j);
}

static const char MARK[] = ": baton-usage ";

size_t door_strip_usage(struct door_strip *s, const char *in, size_t n, char *out, struct door_usage *u)
{
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		char c = in[i];
		if (s->held) {
			if (s->n < sizeof s->line - 1)
				s->line[s->n++] = c;
			else { /* too long to be ours: pass it on */
				memcpy(out + o, s->line, s->n);
				o += s->n;
				out[o++] = c;
				s->held = false;
				s->mid = c != '\n';
				continue;
			}
			if (c == '\n') {
				s->line[s->n] = 0;
				s->held = false;
				s->mid = false;
				if (strncmp(s->line, MARK, sizeof MARK - 1) == 0) {
					door_usage_parse(s->line + sizeof MARK - 1, u);
				} else {
					memcpy(out + o, s->line, s->n);
					o += s->n;
				}
			}
			continue;
		}
		if (!s->mid && c == ':') {
			s->held = true;
			s->line[0] = c;
			s->n = 1;
			continue;
		}
		out[o++] = c;
		s->mid = c != '\n';
	}
	return o;
}
