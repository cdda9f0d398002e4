/*
 * toolcall.c: a chat answer's text split as the model's family writes it
 * (see openai.h, struct oai_split): the reasoning between <think> and
 * </think> (Qwen3, DeepSeek-R1 style), the content, and the tool calls
 * in the format the chat template teaches the model (Hermes/Qwen
 * <tool_call> JSON, Qwen3-Coder's XML-like calls, Mistral's
 * [TOOL_CALLS]). The text is fed as it comes: what can no longer be part
 * of a marker goes out at once, so a stream's content does not wait for
 * the end; a tool call goes out whole when its closing marker arrives.
 * A call that does not parse stays in the content, as vLLM leaves it.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/serve/openai.h"

int oai_buf_put(struct oai_buf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 64;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return -1;
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
	return 0;
}

/* Drops the first n bytes. */
static void drop(struct oai_buf *b, size_t n)
{
	memmove(b->p, b->p + n, b->n - n);
	b->n -= n;
	b->p[b->n] = '\0';
}

static int is_ws(char c)
{
	return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* The longest suffix of s[0..n) that is a proper prefix of marker. */
static size_t partial_suffix(const char *s, size_t n, const char *marker)
{
	size_t ml = strlen(marker);
	for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
		if (memcmp(s + n - k, marker, k) == 0)
			return k;
	return 0;
}

static const char *memstr(const char *s, size_t n, const char *m)
{
	return memmem(s, n, m, strlen(m));
}

void oai_caps_of(const char *tmpl, struct oai_caps *c)
{
	memset(c, 0, sizeof *c);
	if (!tmpl)
		return;
	if (strstr(tmpl, "<function=") && strstr(tmpl, "<parameter="))
		c->tools = OAI_TOOLS_QWEN3_CODER;
	else if (strstr(tmpl, "[TOOL_CALLS]")) {
		c->tools = OAI_TOOLS_MISTRAL;
		c->mistral_args = strstr(tmpl, "[ARGS]") != NULL;
	}
	else if (strstr(tmpl, "<tool_call>"))
		c->tools = OAI_TOOLS_HERMES;
	c->think = strstr(tmpl, "<think>") || strstr(tmpl, "</think>");
	c->has_enable_thinking = strstr(tmpl, "enable_thinking") != NULL;
	c->has_reasoning_effort = strstr(tmpl, "reasoning_effort") != NULL;
}

const char *oai_tool_format_name(enum oai_tool_format f)
{
	switch (f) {
	case OAI_TOOLS_HERMES: return "hermes";
	case OAI_TOOLS_QWEN3_CODER: return "qwen3_coder";
	case OAI_TOOLS_MISTRAL: return "mistral";
	case OAI_TOOLS_FORCED_NAMED: return "forced";
	case OAI_TOOLS_FORCED_ARRAY: return "required";
	default: return "none";
	}
}

void oai_split_init(struct oai_split *s, enum oai_tool_format fmt, int think, int parallel,
    const json_t *tools, uint64_t id_seed, oai_piece_fn fn, void *arg)
{
	memset(s, 0, sizeof *s);
	s->fmt = fmt;
	s->think = think;
	s->parallel = parallel;
	s->tools = tools;
	s->rng = id_seed ? id_seed : 0x9e3779b97f4a7c15ull;
	s->fn = fn;
	s->arg = arg;
}

void oai_split_free(struct oai_split *s)
{
	free(s->rhold.p);
	free(s->thold.p);
	free(s->ws.p);
	free(s->callws.p);
	memset(s, 0, sizeof *s);
}

static void emit(struct oai_split *s, enum oai_piece_kind k, const char *t, size_t n)
{
	if (n)
		s->fn(s->arg, k, t, n, NULL);
}

/* ---- tool calls ---- */

static void call_id(struct oai_split *s, char *id, size_t idlen)
{
	static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
	/* Mistral's templates want 9 alphanumerics; OpenAI's look like call_ + 24 */
	size_t at = 0, n = s->fmt == OAI_TOOLS_MISTRAL ? 9 : 24;
	if (s->fmt != OAI_TOOLS_MISTRAL)
		at = (size_t)snprintf(id, idlen, "call_");
	for (size_t i = 0; i < n && at + 1 < idlen; i++) {
		s->rng ^= s->rng << 13;
		s->rng ^= s->rng >> 7;
		s->rng ^= s->rng << 17;
		id[at++] = abc[(s->rng >> 11) % 62];
	}
	id[at] = '\0';
}

/* A call out: name and arguments (a JSON text). 0, or -1 when dropped. */
static void call_out(struct oai_split *s, const char *name, const char *args)
{
	if (s->n_calls > 0 && !s->parallel)
		return; /* parallel_tool_calls: false keeps the first */
	struct oai_tool_call c = { .index = s->n_calls, .name = name, .args = args };
	call_id(s, c.id, sizeof c.id);
	s->n_calls++;
	s->fn(s->arg, OAI_P_TOOL, NULL, 0, &c);
}

/* {"name", "arguments"} (or "parameters") as Hermes and Mistral write it. */
static int call_json(struct oai_split *s, json_t *o)
{
	json_t *name = json_object_get(o, "name"), *a = json_object_get(o, "arguments");
	if (!a)
		a = json_object_get(o, "parameters");
	if (!json_is_string(name) || json_string_length(name) == 0 || (a && !json_is_object(a) && !json_is_string(a)))
		return -1;
	char *args = !a ? strdup("{}") : json_is_string(a) ? strdup(json_string_value(a)) :
	    json_dumps(a, JSON_COMPACT);
	if (!args)
		return -1;
	call_out(s, json_string_value(name), args);
	free(args);
	return 0;
}

static int parse_hermes(struct oai_split *s, const char *body, size_t n)
{
	json_t *o = json_loadb(body, n, 0, NULL);
	int rc = json_is_object(o) ? call_json(s, o) : -1;
	json_decref(o);
	return rc;
}

/* The JSON schema type of a tool's parameter, or NULL. */
static const char *param_type(const struct oai_split *s, const char *fn, const char *param)
{
	size_t i;
	json_t *t;
	json_array_foreach((json_t *)s->tools, i, t) {
		json_t *f = json_object_get(t, "function");
		if (!json_is_string(json_object_get(f, "name")) || strcmp(json_string_value(json_object_get(f, "name")), fn))
			continue;
		json_t *ty = json_object_get(json_object_get(json_object_get(json_object_get(f, "parameters"),
		    "properties"), param), "type");
		return json_is_string(ty) ? json_string_value(ty) : NULL;
	}
	return NULL;
}

/* One newline each side is the format's, not the value's. */
static void trim1(const char **p, size_t *n)
{
	if (*n && (*p)[0] == '\n')
		(*p)++, (*n)--;
	if (*n && (*p)[*n - 1] == '\n')
		(*n)--;
}

/* <function=NAME><parameter=P>value</parameter>...</function>: values are
 * strings unless the tool's schema types the parameter otherwise (then
 * JSON when they parse as it, as vLLM's qwen3_coder parser does). */
static int parse_coder(struct oai_split *s, const char *body, size_t n)
{
	const char *f = memstr(body, n, "<function="), *end = body + n;
	if (!f)
		return -1;
	f += 10;
	const char *gt = memchr(f, '>', (size_t)(end - f));
	if (!gt || gt == f)
		return -1;
	char *name = strndup(f, (size_t)(gt - f));
	json_t *args = json_object();
	int rc = -1;
	if (!name || !args)
		goto out;
	const char *p = gt + 1;
	for (;;) {
		const char *q = memstr(p, (size_t)(end - p), "<parameter=");
		const char *fe = memstr(p, (size_t)(end - p), "</function>");
		if (!q || (fe && fe < q))
			break;
		q += 11;
		const char *qg = memchr(q, '>', (size_t)(end - q));
		if (!qg)
			goto out;
		const char *v = qg + 1, *ve = memstr(v, (size_t)(end - v), "</parameter>");
		if (!ve)
			goto out;
		char *pn = strndup(q, (size_t)(qg - q));
		size_t vn = (size_t)(ve - v);
		trim1(&v, &vn);
		const char *ty = pn ? param_type(s, name, pn) : NULL;
		json_t *val = NULL;
		if (ty && strcmp(ty, "string"))
			val = json_loadb(v, vn, JSON_DECODE_ANY, NULL);
		if (!val)
			val = json_stringn(v, vn);
		if (!pn || !val || json_object_set_new(args, pn, val)) {
			free(pn);
			goto out;
		}
		free(pn);
		p = ve + 12;
	}
	char *a = json_dumps(args, JSON_COMPACT);
	if (a) {
		call_out(s, name, a);
		free(a);
		rc = 0;
	}
out:
	free(name);
	json_decref(args);
	return rc;
}

/* After [TOOL_CALLS]: a JSON array of {"name", "arguments"} (v3), or
 * name[ARGS]{json} (v11+, possibly name[CALL_ID]id[ARGS]{...}), each call
 * after its own [TOOL_CALLS]. */
static int parse_mistral(struct oai_split *s, const char *body, size_t n)
{
	while (n && is_ws(*body))
		body++, n--;
	if (n && body[0] == '[') {
		json_error_t je;
		json_t *a = json_loadb(body, n, JSON_DISABLE_EOF_CHECK, &je);
		if (!json_is_array(a) || json_array_size(a) == 0) {
			json_decref(a);
			return -1;
		}
		size_t i;
		json_t *o;
		int before = s->n_calls;
		json_array_foreach(a, i, o)
			if (!json_is_object(o) || call_json(s, o)) {
				json_decref(a);
				return s->n_calls > before ? 0 : -1;
			}
		json_decref(a);
		return 0;
	}
	int any = 0;
	const char *end = body + n, *p = body;
	while (p < end) {
		const char *next = memstr(p, (size_t)(end - p), "[TOOL_CALLS]");
		const char *ce = next ? next : end;
		const char *ar = memstr(p, (size_t)(ce - p), "[ARGS]");
		if (!ar)
			return any ? 0 : -1;
		const char *ne = memstr(p, (size_t)(ar - p), "[CALL_ID]");
		if (!ne)
			ne = ar;
		while (p < ne && is_ws(*p))
			p++;
		char *name = strndup(p, (size_t)(ne - p));
		json_t *args = json_loadb(ar + 6, (size_t)(ce - ar - 6), JSON_DISABLE_EOF_CHECK, NULL);
		if (!name || !name[0] || !json_is_object(args)) {
			free(name);
			json_decref(args);
			return any ? 0 : -1;
		}
		char *a = json_dumps(args, JSON_COMPACT);
		json_decref(args);
		if (a)
			call_out(s, name, a);
		free(a);
		free(name);
		any = 1;
		p = next ? next + 12 : end;
	}
	return any ? 0 : -1;
}

/* The head of a Hermes call, {"name": "N", "arguments": {, as models
 * write it: 1 matched (name at name_at, the arguments' object at end),
 * 0 not yet known (more text may match), -1 another shape (a name with
 * escapes, arguments first or as a string: parsed whole at the end). */
static int hermes_prefix(const char *p, size_t n, size_t *name_at, size_t *name_len, size_t *end)
{
	static const char *const lits[] = { "{", "\"name\"", ":", "\"", NULL, "\"", ",", "\"arguments\"", ":", "{" };
	size_t i = 0;
	for (size_t k = 0; k < sizeof lits / sizeof lits[0]; k++) {
		if (k != 4 && k != 5) /* whitespace between the tokens (not inside the name's quotes) */
			while (i < n && is_ws(p[i]))
				i++;
		if (!lits[k]) { /* the name: no quote, no escape */
			*name_at = i;
			while (i < n && p[i] != '"' && p[i] != '\\')
				i++;
			if (i < n && p[i] == '\\')
				return -1;
			*name_len = i - *name_at;
			continue;
		}
		size_t l = strlen(lits[k]);
		size_t have = n - i < l ? n - i : l;
		if (memcmp(p + i, lits[k], have) != 0)
			return -1;
		if (have < l)
			return 0;
		if (k == 9) {
			*end = i; /* the arguments start with their own brace */
			return *name_len ? 1 : -1;
		}
		i += l;
	}
	return -1;
}

/* s starts with a proper prefix of m (more text may make it m). */
static int is_partial(const char *s, size_t n, const char *m)
{
	size_t ml = strlen(m);
	return n < ml && memcmp(s, m, n) == 0;
}

static int starts(const char *s, size_t n, const char *m)
{
	size_t ml = strlen(m);
	return n >= ml && memcmp(s, m, ml) == 0;
}

/* A streamed call begins: its id and name out (or, with
 * parallel_tool_calls false after the first, dropped: returns 0). */
static int stream_start(struct oai_split *s, const char *name, size_t n)
{
	if (s->n_calls > 0 && !s->parallel)
		return 0;
	snprintf(s->cname, sizeof s->cname, "%.*s", (int)n, name);
	struct oai_tool_call c = { .index = s->n_calls, .name = s->cname, .args = NULL };
	call_id(s, c.id, sizeof c.id);
	s->n_calls++;
	s->fn(s->arg, OAI_P_TOOL_START, NULL, 0, &c);
	return 1;
}

static void stream_args(struct oai_split *s, const char *t, size_t n)
{
	struct oai_tool_call c = { .index = s->n_calls - 1 };
	if (n)
		s->fn(s->arg, OAI_P_TOOL_ARGS, t, n, &c);
}

/* Qwen3-Coder's call as it comes: <function=NAME> starts it (pstate 4, or
 * 5 when dropped), each <parameter=P>v</parameter> goes out as a piece of
 * the arguments' JSON ({"P":v, then ,"Q":w; the value typed as
 * parse_coder types it), </function> closes the object (pstate 6: up to
 * </tool_call>). 1: go on, 0: wait for more text, -1: out of memory. */
static int coder_stream(struct oai_split *s, int final)
{
	struct oai_buf *h = &s->thold;
	size_t w = 0;
	while (w < h->n && is_ws(h->p[w]))
		w++;
	const char *p = h->p + w;
	size_t n = h->n - w;
	int live = s->pstate == 4;
	if (s->pstate == 6) {
		const char *m = memstr(h->p, h->n, "</tool_call>");
		if (!m && !final) {
			drop(h, h->n - partial_suffix(h->p, h->n, "</tool_call>"));
			return 0;
		}
		drop(h, m ? (size_t)(m - h->p) + 12 : h->n);
		s->tstate = 0;
		s->pstate = 0;
		return m ? 1 : 0;
	}
	if (starts(p, n, "<parameter=")) {
		const char *q = p + 11, *end = p + n;
		const char *qg = memchr(q, '>', (size_t)(end - q));
		const char *ve = qg ? memstr(qg + 1, (size_t)(end - qg - 1), "</parameter>") : NULL;
		if (!ve) {
			if (!final)
				return 0;
			goto close; /* cut short: what came is the call */
		}
		const char *v = qg + 1;
		size_t vn = (size_t)(ve - v);
		trim1(&v, &vn);
		char *pn = strndup(q, (size_t)(qg - q));
		const char *ty = pn ? param_type(s, s->cname, pn) : NULL;
		json_t *val = ty && strcmp(ty, "string") ? json_loadb(v, vn, JSON_DECODE_ANY, NULL) : NULL;
		if (!val)
			val = json_stringn(v, vn);
		json_t *key = pn ? json_string(pn) : NULL;
		char *ks = key ? json_dumps(key, JSON_ENCODE_ANY) : NULL;
		char *vs = val ? json_dumps(val, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
		struct oai_buf f = { 0 };
		int bad = !ks || !vs || oai_buf_put(&f, s->pemitted ? "," : "{", 1) || oai_buf_put(&f, ks, strlen(ks)) ||
		    oai_buf_put(&f, ":", 1) || oai_buf_put(&f, vs, strlen(vs));
		if (!bad && live)
			stream_args(s, f.p, f.n);
		free(f.p), free(ks), free(vs), free(pn);
		json_decref(key);
		json_decref(val);
		if (bad)
			return -1;
		s->pemitted++;
		drop(h, (size_t)(ve - h->p) + 12);
		return 1;
	}
	if ((is_partial(p, n, "<parameter=") || is_partial(p, n, "</function>")) && !final)
		return 0;
	if (n == 0 && !final)
		return 0;
	if (starts(p, n, "</function>"))
		drop(h, w + 11);
close:
	if (live)
		stream_args(s, s->pemitted ? "}" : "{}", s->pemitted ? 1 : 2);
	s->pstate = 6;
	return final && h->n == 0 ? 0 : 1;
}

/* Mistral's v11 calls as they come: NAME[ARGS] (or NAME[CALL_ID]ID[ARGS])
 * starts one (pstate 7, or 8 when dropped), its arguments stream as the
 * model writes them up to the next [TOOL_CALLS] or the end. The v3 form
 * (a JSON array) is parsed whole at the end (pstate 2). */
static int mistral_stream(struct oai_split *s, int final)
{
	struct oai_buf *h = &s->thold;
	if (s->pstate == 0) {
		size_t w = 0;
		while (w < h->n && is_ws(h->p[w]))
			w++;
		if (w < h->n && h->p[w] == '[' && !starts(h->p + w, h->n - w, "[TOOL_CALLS]")) {
			s->pstate = 2; /* v3: the array */
			return 1;
		}
		const char *ar = memstr(h->p, h->n, "[ARGS]");
		const char *nx = memstr(h->p, h->n, "[TOOL_CALLS]");
		if (!ar || (nx && nx < ar)) {
			if (final || nx)
				s->pstate = 2; /* not this shape: whole at the end (text when it does not parse) */
			return final || nx ? 1 : 0;
		}
		const char *ne = memstr(h->p, (size_t)(ar - h->p), "[CALL_ID]");
		if (!ne)
			ne = ar;
		if (ne == h->p + w || memchr(h->p + w, '[', (size_t)(ne - h->p - w))) {
			s->pstate = 2;
			return 1;
		}
		s->pstate = stream_start(s, h->p + w, (size_t)(ne - h->p - w)) ? 7 : 8;
		s->pemitted = 0;
		drop(h, (size_t)(ar - h->p) + 6);
		return 1;
	}
	const char *m = memstr(h->p, h->n, "[TOOL_CALLS]");
	size_t e = m ? (size_t)(m - h->p) : h->n;
	if (!m && !final)
		e -= partial_suffix(h->p, h->n, "[TOOL_CALLS]");
	while (e && is_ws(h->p[e - 1]))
		e--; /* trailing whitespace waits: it may end the arguments */
	if (s->pstate == 7)
		stream_args(s, h->p, e);
	drop(h, e);
	if (m) {
		drop(h, (size_t)(memstr(h->p, h->n, "[TOOL_CALLS]") - h->p) + 12);
		s->pstate = 0;
		return 1;
	}
	if (final)
		h->n = 0;
	return 0;
}

static const char *open_marker(enum oai_tool_format f)
{
	return f == OAI_TOOLS_MISTRAL ? "[TOOL_CALLS]" : "<tool_call>";
}

/* Content held as trailing whitespace goes out (more content follows). */
static void ws_flush(struct oai_split *s)
{
	emit(s, OAI_P_CONTENT, s->ws.p, s->ws.n);
	s->ws.n = 0;
}

/* Content out, its trailing whitespace held (dropped before a call). */
static int content_out(struct oai_split *s, const char *t, size_t n)
{
	size_t k = n;
	while (k && is_ws(t[k - 1]))
		k--;
	if (k) {
		ws_flush(s);
		emit(s, OAI_P_CONTENT, t, k);
	}
	return oai_buf_put(&s->ws, t + k, n - k);
}

/* A forced named call: the output is its arguments, streamed as they
 * come (the grammar's surrounding whitespace left out). */
static int forced_named(struct oai_split *s, const char *t, size_t n, int final)
{
	if (s->n_calls == 0) {
		while (n && is_ws(*t))
			t++, n--;
		if (!n)
			return 0;
		struct oai_tool_call c = { .index = 0, .name = s->forced_name ? s->forced_name : "" };
		call_id(s, c.id, sizeof c.id);
		s->n_calls = 1;
		s->fn(s->arg, OAI_P_TOOL_START, NULL, 0, &c);
	}
	size_t k = n;
	while (k && is_ws(t[k - 1]))
		k--;
	struct oai_tool_call c = { .index = 0 };
	if (k) {
		if (s->ws.n)
			s->fn(s->arg, OAI_P_TOOL_ARGS, s->ws.p, s->ws.n, &c);
		s->ws.n = 0;
		s->fn(s->arg, OAI_P_TOOL_ARGS, t, k, &c);
	}
	if (final)
		return 0;
	return oai_buf_put(&s->ws, t + k, n - k);
}

/* The tool stage: content in, content and calls out. */
static int tools_push(struct oai_split *s, const char *t, size_t n, int final)
{
	if (s->fmt == OAI_TOOLS_NONE)
		return content_out(s, t, n);
	if (s->fmt == OAI_TOOLS_FORCED_NAMED)
		return forced_named(s, t, n, final);
	if (s->fmt == OAI_TOOLS_FORCED_ARRAY) { /* the whole output: an array of calls, at the end */
		if (oai_buf_put(&s->thold, t, n))
			return -1;
		if (!final)
			return 0;
		json_t *a = json_loadb(s->thold.p, s->thold.n, 0, NULL);
		size_t i;
		json_t *o;
		int bad = !json_is_array(a) || json_array_size(a) == 0;
		json_array_foreach(a, i, o)
			if (!bad && (!json_is_object(o) || call_json(s, o)))
				bad = 1;
		json_decref(a);
		if (bad && s->n_calls == 0 && content_out(s, s->thold.p, s->thold.n)) /* cut short: text */
			return -1;
		s->thold.n = 0;
		return 0;
	}
	if (oai_buf_put(&s->thold, t, n))
		return -1;
	for (;;) {
		struct oai_buf *h = &s->thold;
		if (s->tstate == 0) {
			const char *om = open_marker(s->fmt);
			const char *m = memstr(h->p, h->n, om);
			if (m) {
				if (content_out(s, h->p, (size_t)(m - h->p)))
					return -1;
				/* the whitespace before a call is the format's: kept
				 * aside in case the call turns out to be text */
				s->callws.n = 0;
				if (oai_buf_put(&s->callws, s->ws.p, s->ws.n))
					return -1;
				s->ws.n = 0;
				drop(h, (size_t)(m - h->p) + strlen(om));
				s->tstate = s->fmt == OAI_TOOLS_MISTRAL ? 2 : 1;
				continue;
			}
			size_t keep = final ? 0 : partial_suffix(h->p, h->n, om);
			if (content_out(s, h->p, h->n - keep))
				return -1;
			drop(h, h->n - keep);
			return 0;
		}
		if (s->tstate == 1 && s->fmt == OAI_TOOLS_HERMES && s->pstate == 0) {
			/* {"name": "N", "arguments": { ... streams as it comes */
			size_t name_at = 0, name_len = 0, end = 0;
			int mr = hermes_prefix(h->p, h->n, &name_at, &name_len, &end);
			if (mr == 0 && !final)
				return 0;
			if (mr == 1) {
				s->pstate = 1;
				s->pemitted = 0;
				if (s->n_calls > 0 && !s->parallel) {
					s->pstate = 3; /* parallel_tool_calls: false: dropped */
				} else {
					char *name = strndup(h->p + name_at, name_len);
					if (!name)
						return -1;
					struct oai_tool_call c = { .index = s->n_calls, .name = name, .args = NULL };
					call_id(s, c.id, sizeof c.id);
					s->n_calls++;
					s->fn(s->arg, OAI_P_TOOL_START, NULL, 0, &c);
					free(name);
				}
				drop(h, end);
			} else {
				s->pstate = 2; /* another shape: parsed whole at its end */
			}
			continue;
		}
		if (s->tstate == 1 && (s->pstate == 1 || s->pstate == 3)) {
			const char *m = memstr(h->p, h->n, "</tool_call>");
			size_t e = m ? (size_t)(m - h->p) : h->n;
			if (!m && !final)
				e -= partial_suffix(h->p, h->n, "</tool_call>");
			/* the object's own closing brace is the format's, not the arguments' */
			while (e && is_ws(h->p[e - 1]))
				e--;
			if (e && h->p[e - 1] == '}')
				e--;
			while (e && is_ws(h->p[e - 1]))
				e--;
			if (e > s->pemitted && s->pstate == 1) {
				struct oai_tool_call c = { .index = s->n_calls - 1 };
				s->fn(s->arg, OAI_P_TOOL_ARGS, h->p + s->pemitted, e - s->pemitted, &c);
			}
			if (e > s->pemitted)
				s->pemitted = e;
			if (!m && !final)
				return 0;
			drop(h, m ? (size_t)(m - h->p) + 12 : h->n);
			s->tstate = 0;
			s->pstate = 0;
			if (!m)
				return 0;
			continue;
		}
		if (s->tstate == 1 && s->fmt == OAI_TOOLS_QWEN3_CODER && s->pstate == 0) {
			/* <function=NAME> begins a call that streams */
			size_t w = 0;
			while (w < h->n && is_ws(h->p[w]))
				w++;
			const char *p = h->p + w, *end = h->p + h->n;
			if (is_partial(p, h->n - w, "<function=") && !final)
				return 0;
			const char *gt = starts(p, h->n - w, "<function=") ? memchr(p + 10, '>', (size_t)(end - p - 10)) : NULL;
			if (!gt && starts(p, h->n - w, "<function=") && !final && !memchr(p + 10, '<', (size_t)(end - p - 10)))
				return 0; /* the name is still coming */
			if (!gt || gt == p + 10 || memchr(p + 10, '<', (size_t)(gt - p - 10))) {
				s->pstate = 2; /* another shape: whole at its end (text when it does not parse) */
				continue;
			}
			s->pstate = stream_start(s, p + 10, (size_t)(gt - p - 10)) ? 4 : 5;
			s->pemitted = 0;
			drop(h, (size_t)(gt - h->p) + 1);
			continue;
		}
		if (s->tstate == 1 && s->fmt == OAI_TOOLS_QWEN3_CODER && s->pstate >= 4) {
			int rc = coder_stream(s, final);
			if (rc < 0)
				return -1;
			if (rc == 0)
				return 0;
			continue;
		}
		if (s->tstate == 1) {
			const char *m = memstr(h->p, h->n, "</tool_call>");
			if (!m && !final)
				return 0;
			size_t bn = m ? (size_t)(m - h->p) : h->n;
			int rc = s->fmt == OAI_TOOLS_QWEN3_CODER ? parse_coder(s, h->p, bn) : parse_hermes(s, h->p, bn);
			if (rc) { /* not a call: it stays text */
				if (content_out(s, s->callws.p, s->callws.n) || content_out(s, "<tool_call>", 11) || content_out(s, h->p, bn) ||
				    (m && content_out(s, "</tool_call>", 12)))
					return -1;
			}
			drop(h, m ? bn + 12 : bn);
			s->tstate = 0;
			s->pstate = 0;
			if (!m)
				return 0;
			continue;
		}
		/* Mistral: everything after [TOOL_CALLS] is calls: the v11 form
		 * streams, the v3 array is parsed at the end */
		if (s->pstate != 2) {
			int rc = mistral_stream(s, final);
			if (rc == 0)
				return 0;
			continue;
		}
		if (!final)
			return 0;
		if (parse_mistral(s, h->p, h->n)) {
			if (content_out(s, s->callws.p, s->callws.n) || content_out(s, "[TOOL_CALLS]", 12) || content_out(s, h->p, h->n))
				return -1;
		}
		h->n = 0;
		return 0;
	}
}

/* ---- reasoning ---- */

/* Reasoning out, its trailing newlines held (dropped before </think>). */
static void reasoning_out(struct oai_split *s, const char *t, size_t n)
{
	if (s->think_lead) { /* the newlines after <think> are the format's */
		while (n && (*t == '\n'))
			t++, n--;
		if (n)
			s->think_lead = 0;
	}
	size_t k = n;
	while (k && t[k - 1] == '\n')
		k--;
	if (k) {
		emit(s, OAI_P_REASONING, s->nl, s->n_nl);
		s->n_nl = 0;
		emit(s, OAI_P_REASONING, t, k);
	}
	for (size_t i = k; i < n; i++)
		if (s->n_nl < sizeof s->nl)
			s->nl[s->n_nl++] = '\n';
}

static int split_push(struct oai_split *s, const char *t, size_t n, int final)
{
	if (!s->think)
		return tools_push(s, t, n, final);
	if (oai_buf_put(&s->rhold, t, n))
		return -1;
	struct oai_buf *h = &s->rhold;
	for (;;) {
		if (s->rstate == 0) { /* the start: <think>, or not */
			size_t w = 0;
			while (w < h->n && is_ws(h->p[w]))
				w++;
			size_t rest = h->n - w;
			if (rest >= 7 && memcmp(h->p + w, "<think>", 7) == 0) {
				drop(h, w + 7);
				s->rstate = 1;
				s->think_lead = 1;
				continue;
			}
			if (!final && memcmp(h->p + w, "<think>", rest < 7 ? rest : 7) == 0)
				return 0; /* may still be <think> */
			s->rstate = 3;
			continue;
		}
		if (s->rstate == 1) { /* thinking */
			const char *m = memstr(h->p, h->n, "</think>");
			if (m) {
				reasoning_out(s, h->p, (size_t)(m - h->p));
				s->n_nl = 0;
				drop(h, (size_t)(m - h->p) + 8);
				s->rstate = 2;
				continue;
			}
			size_t keep = final ? 0 : partial_suffix(h->p, h->n, "</think>");
			reasoning_out(s, h->p, h->n - keep);
			drop(h, h->n - keep);
			return 0;
		}
		if (s->rstate == 2) { /* after </think>: its blank lines are the format's */
			size_t w = 0;
			while (w < h->n && is_ws(h->p[w]))
				w++;
			drop(h, w);
			if (h->n == 0)
				return final ? tools_push(s, "", 0, 1) : 0;
			s->rstate = 3;
			continue;
		}
		int rc = tools_push(s, h->p, h->n, final);
		h->n = 0;
		return rc;
	}
}

void oai_split_thinking(struct oai_split *s)
{
	if (s->think && s->rstate == 0) {
		s->rstate = 1;
		s->think_lead = 1;
	}
}

int oai_split_push(struct oai_split *s, const char *text, size_t len)
{
	return split_push(s, text, len, 0);
}

int oai_split_finish(struct oai_split *s)
{
	int rc = split_push(s, "", 0, 1);
	if (rc == 0 && s->n_calls == 0)
		ws_flush(s); /* the answer's own trailing whitespace */
	s->ws.n = 0;
	return rc;
}
