/*
 * usage_test.c: the engine's usage report at the door (usage.c): the
 * header's text parsed, a whole reply's "usage", and the stream's comment
 * line taken out whatever the reads cut it into (every split of a stream
 * and byte by byte), the stream otherwise passed on byte for byte; other
 * comment lines, and one too long to be the report, passed on as they are.
 */
#include <stdlib.h>
#include <string.h>

#include "broker/door/door_int.h"
#include "tests/t.h"

static const char STREAM[] =
	"data: {\"choices\":[{\"delta\":{\"content\":\"In: the\"}}]}\n\n"
	": keep-alive\n\n"
	"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
	": baton-usage prompt_tokens=15 completion_tokens=16 ttft_s=0.006123 finish=length\n"
	"data: [DONE]\n\n";

static const char WANT[] =
	"data: {\"choices\":[{\"delta\":{\"content\":\"In: the\"}}]}\n\n"
	": keep-alive\n\n"
	"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n"
	"data: [DONE]\n\n";

/* The stream in pieces of `step` bytes (0: cut at `at` once). */
static void pass(size_t at, size_t step, char *out, size_t *on, struct door_usage *u)
{
	struct door_strip s = { 0 };
	size_t n = strlen(STREAM), i = 0;
	*on = 0;
	while (i < n) {
		size_t k = step ? step : (i == 0 && at ? at : n - i);
		if (k > n - i)
			k = n - i;
		char buf[sizeof STREAM + 256];
		size_t o = door_strip_usage(&s, STREAM + i, k, buf, u);
		memcpy(out + *on, buf, o);
		*on += o;
		i += k;
	}
	T_ASSERT(!s.held);
	out[*on] = 0;
}

static void t_stream_report_taken_out_at_every_split(void)
{
	char out[sizeof STREAM + 16];
	size_t on;
	for (size_t at = 0; at < strlen(STREAM); at++) {
		struct door_usage u = { 0 };
		pass(at, 0, out, &on, &u);
		T_EQ_STR(out, WANT);
		T_ASSERT(u.have && u.prompt == 15 && u.completion == 16 && u.ttft_s > 0.006 && u.ttft_s < 0.0062);
		T_EQ_STR(u.finish, "length");
	}
	struct door_usage u = { 0 };
	pass(0, 1, out, &on, &u);
	T_EQ_STR(out, WANT);
	T_ASSERT(u.have && u.completion == 16);
}

static void t_other_lines_pass(void)
{
	/* a long comment line is not the report: passed on whole */
	char in[600], out[1200];
	memset(in, 'x', sizeof in);
	in[0] = ':';
	in[sizeof in - 2] = '\n';
	in[sizeof in - 1] = '\n';
	struct door_strip s = { 0 };
	struct door_usage u = { 0 };
	size_t o = 0;
	for (size_t i = 0; i < sizeof in; i += 100)
		o += door_strip_usage(&s, in + i, sizeof in - i < 100 ? sizeof in - i : 100, out + o, &u);
	T_EQ_INT(o, sizeof in);
	T_ASSERT(memcmp(in, out, sizeof in) == 0 && !u.have);
	/* a report that does not parse is taken out all the same, and counts nothing */
	const char bad[] = ": baton-usage nonsense\ndata: [DONE]\n\n";
	struct door_strip s2 = { 0 };
	o = door_strip_usage(&s2, bad, strlen(bad), out, &u);
	out[o] = 0;
	T_EQ_STR(out, "data: [DONE]\n\n");
	T_ASSERT(!u.have);
}

static void t_header_and_body(void)
{
	struct door_usage u = { 0 };
	door_usage_parse("prompt_tokens=3 completion_tokens=4 ttft_s=0.5 finish=stop", &u);
	T_ASSERT(u.have && u.prompt == 3 && u.completion == 4 && u.ttft_s == 0.5);
	T_EQ_STR(u.finish, "stop");
	struct door_usage v = { 0 };
	door_usage_parse("prompt_tokens=3", &v);
	T_ASSERT(!v.have);
	const char body[] = "{\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":9,\"total_tokens\":16}}";
	struct door_usage w = { 0 };
	door_usage_of_body(body, strlen(body), &w);
	T_ASSERT(w.have && w.prompt == 7 && w.completion == 9);
	struct door_usage x = { 0 };
	door_usage_of_body("not json", 8, &x);
	T_ASSERT(!x.have);
}

T_MAIN(T_CASE(t_stream_report_taken_out_at_every_split), T_CASE(t_other_lines_pass), T_CASE(t_header_and_body))
