/*
 * stored.c: which engine keeps each stored response (door_int.h). An
 * engine keeps its /v1/responses answers in its own memory, and a
 * response's id does not say which model's engine made it, so the door
 * remembers, for each answer it passed on with store on, id -> model and
 * engine: the last DOOR_STORED_MAX, the least recently used going first
 * (counted). GET and DELETE /v1/responses/{id} and a POST's
 * previous_response_id are routed by it (intake.c, responses.c).
 *
 * The id is read from the answer itself: a whole reply's "id", a
 * stream's first event (response.created), held here until it is whole.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "broker/door/door_int.h"

struct door_stored_ent {
	char id[DOOR_STORED_ID_MAX];
	char model[BROKER_NAME_MAX], eng[BROKER_NAME_MAX];
	int hnext;          /* the next in its hash chain, -1: none */
	int prev, next;     /* the use order: prev more recent, -1: none */
	bool used;
};

#define NBUCKET (DOOR_STORED_MAX * 2)

struct door_stored {
	struct door_stored_ent ent[DOOR_STORED_MAX];
	int bucket[NBUCKET];
	int head, tail;     /* the most and the least recently used */
	int n;
	uint64_t evicted;
};

static unsigned hash(const char *s)
{
	unsigned h = 2166136261u; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h % NBUCKET;
}

struct door_stored *door_stored_new(void)
{
	struct door_stored *m = calloc(1, sizeof *m);
	if (!m)
		return NULL;
	for (int i = 0; i < NBUCKET; i++)
		m->bucket[i] = -1;
	m->head = m->tail = -1;
	return m;
}

void door_stored_free(struct door_stored *m)
{
	free(m);
}

static int find(const struct door_stored *m, const char *id)
{
	for (int i = m->bucket[hash(id)]; i >= 0; i = m->ent[i].hnext)
		if (strcmp(m->ent[i].id, id) == 0)
			return i;
	return -1;
}

static void unlink_use(struct door_stored *m, int i)
{
	struct door_stored_ent *e = &m->ent[i];
	if (e->prev >= 0)
		m->ent[e->prev].next = e->next;
	else
		m->head = e->next;
	if (e->next >= 0)
		m->ent[e->next].prev = e->prev;
	else
		m->tail = e->prev;
}

static void push_front(struct door_stored *m, int i)
{
	struct door_stored_ent *e = &m->ent[i];
	e->prev = -1;
	e->next = m->head;
	if (m->head >= 0)
		m->ent[m->head].prev = i;
	m->head = i;
	if (m->tail < 0)
		m->tail = i;
}

/* Takes entry i out of its chain and the use order; its slot is free. */
static void drop(struct door_stored *m, int i)
{
	int *pp = &m->bucket[hash(m->ent[i].id)];
	while (*pp != i)
		pp = &m->ent[*pp].hnext;
	*pp = m->ent[i].hnext;
	unlink_use(m, i);
	m->ent[i].used = false;
	m->n--;
}

bool door_stored_id_ok(const char *id)
{
	size_t n = strlen(id);
	if (n == 0 || n >= DOOR_STORED_ID_MAX)
		return false;
	for (const char *c = id; *c; c++)
		if (*c <= ' ' || *c >= 127 || *c == '/')
			return false;
	return true;
}

bool door_stored_put(struct door_stored *m, const char *id, const char *model, const char *eng)
{
	if (!m || !door_stored_id_ok(id))
		return false;
	int i = find(m, id);
	if (i >= 0) {
		unlink_use(m, i);
	} else {
		if (m->n == DOOR_STORED_MAX) { /* full: the least recently used goes */
			drop(m, m->tail);
			m->evicted++;
		}
		for (i = 0; m->ent[i].used; i++)
			;
		struct door_stored_ent *e = &m->ent[i];
		snprintf(e->id, sizeof e->id, "%s", id);
		e->used = true;
		unsigned h = hash(id);
		e->hnext = m->bucket[h];
		m->bucket[h] = i;
		m->n++;
	}
	snprintf(m->ent[i].model, sizeof m->ent[i].model, "%s", model);
	snprintf(m->ent[i].eng, sizeof m->ent[i].eng, "%s", eng);
	push_front(m, i);
	return true;
}

bool door_stored_get(struct door_stored *m, const char *id, char *model, size_t mn, char *eng, size_t en)
{
	int i = m && door_stored_id_ok(id) ? find(m, id) : -1;
	if (i < 0)
		return false;
	unlink_use(m, i);
	push_front(m, i);
	if (model)
		snprintf(model, mn, "%s", m->ent[i].model);
	if (eng)
		snprintf(eng, en, "%s", m->ent[i].eng);
	return true;
}

bool door_stored_forget(struct door_stored *m, const char *id)
{
	int i = m && door_stored_id_ok(id) ? find(m, id) : -1;
	if (i < 0)
		return false;
	drop(m, i);
	return true;
}

size_t door_stored_count(const struct door_stored *m, uint64_t *evicted)
{
	if (evicted)
		*evicted = m ? m->evicted : 0;
	return m ? (size_t)m->n : 0;
}

/* ---- the id in an answer ---- */

/* The response object's id, when it is stored (store is not false). */
static bool id_of(json_t *resp, char *id, size_t n)
{
	json_t *jid = json_object_get(resp, "id");
	if (!json_is_string(jid) || json_is_false(json_object_get(resp, "store")))
		return false;
	snprintf(id, n, "%s", json_string_value(jid));
	return door_stored_id_ok(id);
}

bool door_stored_id_of_body(const char *buf, size_t len, char *id, size_t n)
{
	json_t *j = json_loadb(buf, len, 0, NULL);
	bool ok = json_is_object(j) && id_of(j, id, n);
	json_decref(j);
	return ok;
}

bool door_sniff_feed(struct door_sniff *s, const char *in, size_t n)
{
	if (s->done)
		return true;
	/* the first event ends at its blank line ("\n\n"; "\r\n\r\n" ends in "\n\r\n") */
	size_t take = n;
	for (size_t i = 0; i < n; i++) {
		char prev = i ? in[i - 1] : s->last, prev2 = i > 1 ? in[i - 2] : i == 1 ? s->last : s->last2;
		if (in[i] == '\n' && (prev == '\n' || (prev == '\r' && prev2 == '\n'))) {
			take = i + 1;
			s->done = true;
			break;
		}
	}
	if (n) {
		s->last2 = n > 1 ? in[n - 2] : s->last;
		s->last = in[n - 1];
	}
	if (s->len + take > DOOR_SNIFF_MAX) {
		s->done = s->over = true; /* too large an event to be held: not remembered */
		return true;
	}
	if (s->len + take > s->cap) {
		size_t cap = s->cap ? s->cap : 4096;
		while (cap < s->len + take)
			cap *= 2;
		char *b = realloc(s->buf, cap);
		if (!b) {
			s->done = s->over = true;
			return true;
		}
		s->buf = b;
		s->cap = cap;
	}
	memcpy(s->buf + s->len, in, take);
	s->len += take;
	return s->done;
}

bool door_sniff_id(const struct door_sniff *s, char *id, size_t n)
{
	if (!s->done || s->over || !s->buf)
		return false;
	/* its data: lines, joined by newlines (the SSE rule) */
	char *data = malloc(s->len + 1);
	if (!data)
		return false;
	size_t dn = 0;
	for (size_t i = 0; i < s->len;) {
		size_t e = i;
		while (e < s->len && s->buf[e] != '\n')
			e++;
		size_t l = e > i && s->buf[e - 1] == '\r' ? e - 1 - i : e - i;
		if (l >= 5 && memcmp(s->buf + i, "data:", 5) == 0) {
			size_t o = i + 5 + (l > 5 && s->buf[i + 5] == ' ');
			if (dn)
				data[dn++] = '\n';
			memcpy(data + dn, s->buf + o, l - (o - i));
			dn += l - (o - i);
		}
		i = e + 1;
	}
	json_t *j = json_loadb(data, dn, 0, NULL);
	free(data);
	json_t *t = json_object_get(j, "type");
	bool ok = json_is_string(t) && strcmp(json_string_value(t), "response.created") == 0 &&
	    id_of(json_object_get(j, "response"), id, n);
	json_decref(j);
	return ok;
}

void door_sniff_free(struct door_sniff *s)
{
	free(s->buf);
	memset(s, 0, sizeof *s);
}
