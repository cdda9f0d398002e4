/*
 * stored_test.c: which engine keeps each stored response (stored.c): the
 * map's put, get, forget; its least recently used going when full (a get
 * makes an entry recent), counted; ids it refuses; the id read from a
 * whole answer and from a stream's first event whatever the reads cut it
 * into, and not when store is false or the first event is another.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/door/door_int.h"
#include "tests/t.h"

static void t_put_get_forget(void)
{
	struct door_stored *m = door_stored_new();
	T_ASSERT(m);
	char model[BROKER_NAME_MAX], eng[BROKER_NAME_MAX];
	T_ASSERT(!door_stored_get(m, "resp_a", model, sizeof model, eng, sizeof eng));
	T_ASSERT(door_stored_put(m, "resp_a", "qwen", "e1"));
	T_ASSERT(door_stored_put(m, "resp_b", "mixtral", "e2"));
	T_ASSERT(door_stored_get(m, "resp_a", model, sizeof model, eng, sizeof eng));
	T_EQ_STR(model, "qwen");
	T_EQ_STR(eng, "e1");
	T_ASSERT(door_stored_get(m, "resp_b", model, sizeof model, eng, sizeof eng));
	T_EQ_STR(eng, "e2");
	/* put again: the engine replaced, not a second entry */
	T_ASSERT(door_stored_put(m, "resp_a", "qwen", "e3"));
	uint64_t ev = 9;
	T_EQ_INT(door_stored_count(m, &ev), 2);
	T_EQ_INT(ev, 0);
	T_ASSERT(door_stored_get(m, "resp_a", NULL, 0, eng, sizeof eng));
	T_EQ_STR(eng, "e3");
	T_ASSERT(door_stored_forget(m, "resp_a"));
	T_ASSERT(!door_stored_forget(m, "resp_a"));
	T_ASSERT(!door_stored_get(m, "resp_a", NULL, 0, NULL, 0));
	T_EQ_INT(door_stored_count(m, NULL), 1);
	/* ids that are no path segment, or too long */
	T_ASSERT(!door_stored_put(m, "", "qwen", "e1"));
	T_ASSERT(!door_stored_put(m, "a/b", "qwen", "e1"));
	T_ASSERT(!door_stored_put(m, "a b", "qwen", "e1"));
	char longid[DOOR_STORED_ID_MAX + 1];
	memset(longid, 'x', sizeof longid - 1);
	longid[sizeof longid - 1] = 0;
	T_ASSERT(!door_stored_put(m, longid, "qwen", "e1"));
	T_EQ_INT(door_stored_count(m, NULL), 1);
	door_stored_free(m);
}

static void t_least_recently_used_goes(void)
{
	struct door_stored *m = door_stored_new();
	char id[32];
	for (int i = 0; i < DOOR_STORED_MAX; i++) {
		snprintf(id, sizeof id, "resp_%d", i);
		T_ASSERT(door_stored_put(m, id, "qwen", "e1"));
	}
	uint64_t ev;
	T_EQ_INT(door_stored_count(m, &ev), DOOR_STORED_MAX);
	T_EQ_INT(ev, 0);
	/* resp_0 used now: resp_1 is the oldest */
	T_ASSERT(door_stored_get(m, "resp_0", NULL, 0, NULL, 0));
	T_ASSERT(door_stored_put(m, "resp_new", "qwen", "e2"));
	T_EQ_INT(door_stored_count(m, &ev), DOOR_STORED_MAX);
	T_EQ_INT(ev, 1);
	T_ASSERT(door_stored_get(m, "resp_0", NULL, 0, NULL, 0));
	T_ASSERT(!door_stored_get(m, "resp_1", NULL, 0, NULL, 0));
	T_ASSERT(door_stored_get(m, "resp_new", NULL, 0, NULL, 0));
	/* a full turn over: only the last DOOR_STORED_MAX put are there */
	for (int i = 0; i < DOOR_STORED_MAX; i++) {
		snprintf(id, sizeof id, "again_%d", i);
		T_ASSERT(door_stored_put(m, id, "qwen", "e1"));
	}
	T_EQ_INT(door_stored_count(m, &ev), DOOR_STORED_MAX);
	T_EQ_INT(ev, 1 + DOOR_STORED_MAX);
	T_ASSERT(!door_stored_get(m, "resp_new", NULL, 0, NULL, 0));
	T_ASSERT(door_stored_get(m, "again_0", NULL, 0, NULL, 0));
	T_ASSERT(door_stored_get(m, "again_4095", NULL, 0, NULL, 0));
	/* a slot freed by forget is taken again without an eviction */
	T_ASSERT(door_stored_forget(m, "again_7"));
	T_ASSERT(door_stored_put(m, "resp_x", "qwen", "e1"));
	T_EQ_INT(door_stored_count(m, &ev), DOOR_STORED_MAX);
	T_EQ_INT(ev, 1 + DOOR_STORED_MAX);
	door_stored_free(m);
}

static void t_id_of_body(void)
{
	char id[DOOR_STORED_ID_MAX];
	const char a[] = "{\"id\":\"resp_1\",\"object\":\"response\",\"store\":true,\"output\":[]}";
	T_ASSERT(door_stored_id_of_body(a, strlen(a), id, sizeof id));
	T_EQ_STR(id, "resp_1");
	const char b[] = "{\"id\":\"resp_2\",\"object\":\"response\"}"; /* store left out: kept */
	T_ASSERT(door_stored_id_of_body(b, strlen(b), id, sizeof id));
	T_EQ_STR(id, "resp_2");
	const char c[] = "{\"id\":\"resp_3\",\"store\":false}";
	T_ASSERT(!door_stored_id_of_body(c, strlen(c), id, sizeof id));
	T_ASSERT(!door_stored_id_of_body("{\"id\":7}", 8, id, sizeof id));
	T_ASSERT(!door_stored_id_of_body("[]", 2, id, sizeof id));
	T_ASSERT(!door_stored_id_of_body("not json", 8, id, sizeof id));
}

static const char STREAM[] =
	"event: response.created\n"
	"data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_s\",\"store\":true}}\n\n"
	"event: response.in_progress\n"
	"data: {\"type\":\"response.in_progress\",\"response\":{\"id\":\"resp_other\"}}\n\n";

static void t_stream_first_event_at_every_split(void)
{
	size_t n = strlen(STREAM);
	char id[DOOR_STORED_ID_MAX];
	for (size_t step = 1; step <= n; step++) {
		struct door_sniff s = { 0 };
		bool done = false;
		for (size_t i = 0; i < n && !done; i += step)
			done = door_sniff_feed(&s, STREAM + i, step < n - i ? step : n - i);
		T_ASSERT(done);
		T_ASSERT_MSG(door_sniff_id(&s, id, sizeof id), "step %zu", step);
		T_EQ_STR(id, "resp_s");
		door_sniff_free(&s);
	}
	/* CRLF lines, a data: line without its space */
	const char crlf[] = "event: response.created\r\ndata:{\"type\":\"response.created\",\"response\":{\"id\":\"r9\"}}"
	    "\r\n\r\nevent: x\r\n";
	struct door_sniff s = { 0 };
	T_ASSERT(door_sniff_feed(&s, crlf, strlen(crlf)));
	T_ASSERT(door_sniff_id(&s, id, sizeof id));
	T_EQ_STR(id, "r9");
	door_sniff_free(&s);
	/* not kept, or another first event: no id */
	const char nostore[] = "data: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"store\":false}}\n\n";
	T_ASSERT(door_sniff_feed(&s, nostore, strlen(nostore)));
	T_ASSERT(!door_sniff_id(&s, id, sizeof id));
	door_sniff_free(&s);
	const char err[] = "event: error\ndata: {\"type\":\"error\",\"response\":{\"id\":\"r1\"}}\n\n";
	T_ASSERT(door_sniff_feed(&s, err, strlen(err)));
	T_ASSERT(!door_sniff_id(&s, id, sizeof id));
	door_sniff_free(&s);
	/* an event not whole yet: no id */
	T_ASSERT(!door_sniff_feed(&s, STREAM, 40));
	T_ASSERT(!door_sniff_id(&s, id, sizeof id));
	door_sniff_free(&s);
}

static void t_stream_first_event_too_large(void)
{
	size_t big = DOOR_SNIFF_MAX / 4;
	char *piece = malloc(big);
	T_ASSERT(piece);
	memset(piece, 'x', big);
	memcpy(piece, "data: {\"type\":\"response.created\",\"x\":\"", 39);
	struct door_sniff s = { 0 };
	bool done = false;
	for (int i = 0; i < 5 && !done; i++)
		done = door_sniff_feed(&s, piece, big);
	T_ASSERT(done && s.over);
	char id[DOOR_STORED_ID_MAX];
	T_ASSERT(!door_sniff_id(&s, id, sizeof id));
	door_sniff_free(&s);
	free(piece);
}

T_MAIN(T_CASE(t_put_get_forget), T_CASE(t_least_recently_used_goes), T_CASE(t_id_of_body),
    T_CASE(t_stream_first_event_at_every_split), T_CASE(t_stream_first_event_too_large))
