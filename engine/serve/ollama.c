/*
 * ollama.c: Ollama's API on the engine's --http address (face.h;
 * docs/reference/ollama-anthropic.md): GET /api/version, /api/tags,
 * /api/ps, POST /api/show, /api/chat and /api/generate. A chat or
 * generate is translated into an OpenAI body (options, format, tools,
 * think), run as the OpenAI API runs one, and answered in Ollama's shapes:
 * one object, or NDJSON lines as the text comes (stream defaults to
 * true, as Ollama's does). keep_alive goes to the engine's idle release.
 * Errors are Ollama's {"error": "..."} with its status codes.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/face.h"
#include "proto/base/base.h"

struct ostate {
	int generate;            /* /api/generate (else /api/chat) */
	int load_only;           /* no messages / empty prompt: "done_reason": "load" */
	/* a streamed tool call gathered until it is whole (Ollama sends calls whole) */
	int pending;
	struct oai_tool_call call;
	char call_name[256];
	struct oai_buf args;
	int n_calls;
};

static void reply_err(struct baton_http_req *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reply_err(struct baton_http_req *r, int status, const char *fmt, ...)
{
	char m[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	json_t *j = json_pack("{s:s}", "error", m);
	char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	static const char *const retry[] = { "Retry-After: 1", NULL };
	if (body)
		http_reply(r, status, "application/json", body, strlen(body), http_retry_after(status) ? retry : NULL);
	else
		http_reply(r, 500, "text/plain", "out of memory\n", 14, NULL);
	free(body);
}

/* "m" or "m:latest" names the served model (Ollama adds :latest). */
static int is_served(struct oai_server *s, const char *name)
{
	const char *m = oai_server_model(s);
	size_t n = strlen(m);
	return strcmp(name, m) == 0 || (strncmp(name, m, n) == 0 && strcmp(name + n, ":latest") == 0);
}

static json_t *facts(struct oai_server *s)
{
	json_t *f = json_object();
	const struct oai_server_opts *o = oai_server_opts(s);
	if (o->model_facts)
		o->model_facts(o->health_arg, f);
	return f;
}

static json_t *details(json_t *f)
{
	const char *fam = json_string_value(json_object_get(f, "family"));
	return json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format", "baton-arena", "family",
	    fam ? fam : "", "families", fam ? fam : "", "parameter_size",
	    json_string_value(json_object_get(f, "parameter_size")) ? json_string_value(json_object_get(f,
	    "parameter_size")) : "", "quantization_level", json_string_value(json_object_get(f,
	    "quantization_level")) ? json_string_value(json_object_get(f, "quantization_level")) : "");
}

/* GET /api/tags and /api/ps: the one model. */
static void list(struct oai_server *s, struct baton_http_req *r, int ps)
{
	json_t *f = facts(s);
	const char *m = oai_server_model(s);
	char dg[65], when[64];
	http_name_digest(m, dg);
	json_t *x = json_pack("{s:s, s:s, s:I, s:s, s:o}", "name", m, "model", m, "size",
	    (json_int_t)json_integer_value(json_object_get(f, "size")), "digest", dg, "details", details(f));
	if (ps) {
		double exp = json_number_value(json_object_get(f, "expires_in_s"));
		if (json_object_get(f, "expires_in_s") && exp >= 0)
			face_time(face_now_ns() + (int64_t)(exp * 1e9), when, sizeof when);
		else /* never (or the broker's to say) */
			snprintf(when, sizeof when, "2262-04-11T23:47:16.854775807Z");
		json_object_set_new(x, "expires_at", json_string(when));
		json_object_set_new(x, "size_vram", json_integer(json_integer_value(json_object_get(f, "size_vram"))));
		json_object_set_new(x, "context_length", json_integer(json_integer_value(json_object_get(f,
		    "context_length"))));
	} else {
		face_time(json_integer_value(json_object_get(f, "modified_ns")), when, sizeof when);
		json_object_set_new(x, "modified_at", json_string(when));
	}
	json_decref(f);
	http_reply_json(r, 200, json_pack("{s:[o]}", "models", x));
}

static json_t *parse_body(struct baton_http_req *r)
{
	size_t len = 0;
	const char *body = http_req_body(r, &len);
	json_error_t je;
	json_t *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		reply_err(r, 400, "the body is not JSON: %s", je.text);
		return NULL;
	}
	if (!json_is_object(root)) {
		reply_err(r, 400, "the body must be a JSON object");
		json_decref(root);
		return NULL;
	}
	return root;
}

/* "model": required, and the served one (else 404 as Ollama's "not found"). */
static int check_model(struct oai_server *s, struct baton_http_req *r, json_t *root)
{
	json_t *m = json_object_get(root, "model");
	if (!m || json_is_null(m) || (json_is_string(m) && !json_string_length(m)))
		m = json_object_get(root, "name"); /* the old name of the field */
	if (!json_is_string(m) || !json_string_length(m)) {
		reply_err(r, 400, "model is required");
		return -1;
	}
	if (!is_served(s, json_string_value(m))) {
		reply_err(r, 404, "model '%.200s' not found: this engine serves '%s'", json_string_value(m),
		    oai_server_model(s));
		return -1;
	}
	return 0;
}

/* POST /api/show. */
static void show(struct oai_server *s, struct baton_http_req *r)
{
	json_t *root = parse_body(r);
	if (!root)
		return;
	if (check_model(s, r, root)) {
		json_decref(root);
		return;
	}
	json_decref(root);
	json_t *f = facts(s);
	const struct oai_server_opts *o = oai_server_opts(s);
	const struct oai_caps *c = oai_server_caps(s);
	const char *fam = json_string_value(json_object_get(f, "family"));
	json_t *caps = json_pack("[s]", "completion");
	if (c->tools != OAI_TOOLS_NONE)
		json_array_append_new(caps, json_string("tools"));
	if (c->think)
		json_array_append_new(caps, json_string("thinking"));
	json_t *info = json_object();
	char key[128];
	snprintf(key, sizeof key, "%s.context_length", fam && fam[0] ? fam : "general");
	json_object_set_new(info, "general.architecture", json_string(fam ? fam : ""));
	json_object_set_new(info, key, json_integer((json_int_t)o->max_model_len));
	char when[64];
	face_time(json_integer_value(json_object_get(f, "modified_ns")), when, sizeof when);
	http_reply_json(r, 200, json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:s}", "license", "", "modelfile", "",
	    "parameters", "", "template", o->chat_template ? o->chat_template : "", "details", details(f),
	    "model_info", info, "capabilities", caps, "modified_at", when));
	json_decref(f);
}

/* ---- keep_alive: a number of seconds, or a Go duration ("5m", "1h30m",
 * "0"); negative: forever ---- */

static int parse_duration(const char *s, double *out)
{
	const char *p = s;
	double sign = 1, total = 0;
	if (*p == '-' || *p == '+')
		sign = *p++ == '-' ? -1 : 1;
	if (!*p)
		return -1;
	char *end;
	double whole = strtod(p, &end);
	if (end != p && !*end && isfinite(whole)) { /* a bare number: seconds */
		*out = sign * whole;
		return 0;
	}
	while (*p) {
		if (!isdigit((unsigned char)*p) && *p != '.')
			return -1;
		double v = strtod(p, &end);
		if (end == p || !isfinite(v))
			return -1;
		p = end;
		static const struct { const char *u; double s; } units[] = {
			{ "ns", 1e-9 }, { "us", 1e-6 }, { "\xc2\xb5s", 1e-6 }, { "ms", 1e-3 }, { "s", 1 }, { "m", 60 },
			{ "h", 3600 },
		};
		size_t best = 0, k = SIZE_MAX;
		for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
			size_t n = strlen(units[i].u);
			if (strncmp(p, units[i].u, n) == 0 && n > best) {
				best = n;
				k = i;
			}
		}
		if (k == SIZE_MAX)
			return -1;
		total += v * units[k].s;
		p += best;
	}
	*out = sign * total;
	return 0;
}

/* 0 (with *has and *secs), or -1 having answered 400. */
static int keep_alive_of(struct baton_http_req *r, json_t *root, int *has, double *secs)
{
	json_t *k = json_object_get(root, "keep_alive");
	*has = 0;
	if (!k || json_is_null(k))
		return 0;
	if (json_is_number(k) && isfinite(json_number_value(k))) {
		*secs = json_number_value(k);
	} else if (!json_is_string(k) || parse_duration(json_string_value(k), secs) != 0) {
		reply_err(r, 400, "keep_alive: want seconds or a duration (\"5m\", \"1h\", \"0\", \"-1\"), got %.100s",
		    json_is_string(k) ? json_string_value(k) : "another type");
		return -1;
	}
	*has = 1;
	return 0;
}

/* ---- options and format into the OpenAI body ---- */

static int set_options(struct baton_http_req *r, json_t *root, json_t *b)
{
	json_t *o = json_object_get(root, "options"), *v;
	const char *k;
	if (!o || json_is_null(o))
		return 0;
	if (!json_is_object(o)) {
		reply_err(r, 400, "options: want an object");
		return -1;
	}
	/* Ollama's option -> OpenAI's field (numbers) */
	static const struct { const char *ollama, *openai; int integer; } num[] = {
		{ "temperature", "temperature", 0 }, { "top_p", "top_p", 0 }, { "top_k", "top_k", 1 },
		{ "min_p", "min_p", 0 }, { "seed", "seed", 1 }, { "repeat_penalty", "repetition_penalty", 0 },
		{ "presence_penalty", "presence_penalty", 0 }, { "frequency_penalty", "frequency_penalty", 0 },
	};
	json_object_foreach(o, k, v) {
		size_t i;
		for (i = 0; i < sizeof num / sizeof num[0]; i++)
			if (strcmp(k, num[i].ollama) == 0)
				break;
		if (i < sizeof num / sizeof num[0]) {
			if (json_is_null(v))
				continue;
			if (!json_is_number(v) || (num[i].integer && !json_is_integer(v))) {
				reply_err(r, 400, "option \"%s\": want %s", k, num[i].integer ? "an integer" : "a number");
				return -1;
			}
			json_object_set(b, num[i].openai, v);
		} else if (strcmp(k, "num_predict") == 0) {
			if (json_is_null(v))
				continue;
			if (!json_is_integer(v)) {
				reply_err(r, 400, "option \"num_predict\": want an integer (-1: no limit)");
				return -1;
			}
			if (json_integer_value(v) > 0)
				json_object_set(b, "max_tokens", v);
			else if (json_integer_value(v) == 0)
				json_object_set_new(b, "max_tokens", json_integer(1)); /* Ollama's 0 still answers once */
		} else if (strcmp(k, "stop") == 0) {
			if (json_is_null(v))
				continue;
			size_t j;
			json_t *x;
			int ok = json_is_string(v) || json_is_array(v);
			json_array_foreach(v, j, x) ok &= json_is_string(x);
			if (!ok) {
				reply_err(r, 400, "option \"stop\": want a list of strings");
				return -1;
			}
			json_object_set(b, "stop", v);
		}
		/* the others (num_ctx, num_gpu, num_thread, mirostat, ...) are the
		 * engine's own settings here, or samplers it has not: ignored, as
		 * Ollama ignores an option it does not know */
	}
	return 0;
}

static int set_format(struct baton_http_req *r, json_t *root, json_t *b)
{
	json_t *f = json_object_get(root, "format");
	if (!f || json_is_null(f) || (json_is_string(f) && !json_string_length(f)))
		return 0;
	if (json_is_string(f) && strcmp(json_string_value(f), "json") == 0) {
		json_object_set_new(b, "response_format", json_pack("{s:s}", "type", "json_object"));
		return 0;
	}
	if (json_is_object(f)) {
		json_object_set_new(b, "response_format", json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema",
		    "json_schema", "name", "format", "schema", f));
		return 0;
	}
	reply_err(r, 400, "format: want \"json\" or a JSON schema (an object)");
	return -1;
}

static int set_think(struct baton_http_req *r, json_t *root, json_t *b)
{
	json_t *t = json_object_get(root, "think");
	if (!t || json_is_null(t))
		return 0;
	if (json_is_boolean(t)) {
		json_object_set_new(b, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", json_is_true(t)));
		return 0;
	}
	const char *v = json_string_value(t);
	if (v && (strcmp(v, "low") == 0 || strcmp(v, "medium") == 0 || strcmp(v, "high") == 0)) {
		json_object_set_new(b, "reasoning_effort", json_string(v));
		return 0;
	}
	reply_err(r, 400, "think: want true, false, \"low\", \"medium\" or \"high\"");
	return -1;
}

/* Ollama's messages into OpenAI's: tool_calls' arguments as JSON text,
 * ids made for the calls and their tool messages (Ollama's have none). */
static json_t *messages_of(struct baton_http_req *r, json_t *msgs)
{
	json_t *out = json_array(), *m;
	size_t i, n_ids = 0, next_tool = 0;
	char ids[64][48];
	json_array_foreach(msgs, i, m) {
		json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
		json_t *images = json_object_get(m, "images"), *tc = json_object_get(m, "tool_calls");
		json_t *thinking = json_object_get(m, "thinking"), *tname = json_object_get(m, "tool_name");
		const char *ro = json_string_value(role);
		if (!json_is_object(m) || !ro) {
			reply_err(r, 400, "messages[%zu]: want an object with a role", i);
			goto fail;
		}
		if (strcmp(ro, "system") && strcmp(ro, "user") && strcmp(ro, "assistant") && strcmp(ro, "tool")) {
			reply_err(r, 400, "messages[%zu].role: want system, user, assistant or tool, got '%.40s'", i, ro);
			goto fail;
		}
		if (content && !json_is_null(content) && !json_is_string(content)) {
			reply_err(r, 400, "messages[%zu].content: want a string", i);
			goto fail;
		}
		if (images && !json_is_null(images) && !(json_is_array(images) && json_array_size(images) == 0)) {
			reply_err(r, 400, "messages[%zu].images: this model takes no images", i);
			goto fail;
		}
		if ((thinking && !json_is_null(thinking) && !json_is_string(thinking)) ||
		    (tname && !json_is_null(tname) && !json_is_string(tname))) {
			reply_err(r, 400, "messages[%zu].%s: want a string", i, thinking && !json_is_string(thinking) ?
			    "thinking" : "tool_name");
			goto fail;
		}
		json_t *x = json_pack("{s:s, s:s}", "role", ro, "content", json_is_string(content) ?
		    json_string_value(content) : "");
		if (json_is_string(thinking) && strcmp(ro, "assistant") == 0)
			json_object_set(x, "reasoning_content", thinking);
		if (tc && !json_is_null(tc)) {
			size_t k;
			json_t *c, *calls = json_array();
			if (!json_is_array(tc) || strcmp(ro, "assistant") != 0) {
				json_decref(calls);
				json_decref(x);
				reply_err(r, 400, "messages[%zu].tool_calls: want a list, in an assistant message", i);
				goto fail;
			}
			n_ids = next_tool = 0;
			json_array_foreach(tc, k, c) {
				json_t *fn = json_object_get(c, "function"), *name = json_object_get(fn, "name");
				json_t *args = json_object_get(fn, "arguments");
				if (!json_is_string(name) || (args && !json_is_object(args) && !json_is_null(args))) {
					json_decref(calls);
					json_decref(x);
					reply_err(r, 400, "messages[%zu].tool_calls[%zu]: want {\"function\": {\"name\", "
					    "\"arguments\": an object}}", i, k);
					goto fail;
				}
				char *a = json_is_object(args) ? json_dumps(args, JSON_COMPACT) : strdup("{}");
				char id[48];
				snprintf(id, sizeof id, "call_%zu_%zu", i, k);
				if (n_ids < 64)
					memcpy(ids[n_ids++], id, sizeof id);
				json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
				    "function", "name", name, "arguments", a ? a : "{}"));
				free(a);
			}
			json_object_set_new(x, "tool_calls", calls);
		}
		if (strcmp(ro, "tool") == 0) {
			char id[48];
			if (next_tool < n_ids)
				memcpy(id, ids[next_tool++], sizeof id);
			else
				snprintf(id, sizeof id, "call_tool_%zu", i);
			json_object_set_new(x, "tool_call_id", json_string(id));
			if (json_is_string(tname))
				json_object_set(x, "name", tname);
		}
		json_array_append_new(out, x);
	}
	return out;
fail:
	json_decref(out);
	return NULL;
}

/* ---- the answer ---- */

static double ns_of(double s)
{
	return s > 0 ? s * 1e9 : 0;
}

/* An answer's object: chat's "message" or generate's "response". */
static json_t *base_obj(struct face_req *f, int done)
{
	char when[64];
	face_time(face_now_ns(), when, sizeof when);
	return json_pack("{s:s, s:s, s:b}", "model", oai_server_model(f->h.srv), "created_at", when, "done", done);
}

static json_t *call_json(const struct oai_tool_call *c, const char *args, int index)
{
	json_t *a = json_loads(args && args[0] ? args : "{}", 0, NULL);
	if (!a)
		a = json_string(args);
	return json_pack("{s:s, s:{s:i, s:s, s:o}}", "id", c->id, "function", "index", index, "name", c->name,
	    "arguments", a);
}

static int write_line(struct face_req *f, json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	int rc = BATON_ENOMEM;
	if (s) {
		size_t n = strlen(s);
		s[n] = '\n'; /* the NUL becomes the line's end */
		rc = http_stream_write(f->h.st, s, n + 1);
	}
	free(s);
	if (rc)
		f->h.write_failed = 1;
	return rc;
}

static void o_admit(struct face_req *f)
{
	if (f->stream && !f->h.st)
		f->h.st = http_stream_open(f->h.r, 200, "application/x-ndjson", NULL);
	if (f->stream && !f->h.st)
		f->h.write_failed = 1;
}

/* One streamed piece: a line with the text or thinking, or a whole call. */
static void emit(struct face_req *f, const char *field, const char *t, size_t n, json_t *calls)
{
	struct ostate *o = f->arg;
	json_t *j = base_obj(f, 0);
	if (o->generate) {
		json_object_set_new(j, "response", json_stringn(field[0] == 'c' ? t : "", field[0] == 'c' ? n : 0));
		if (field[0] == 't')
			json_object_set_new(j, "thinking", json_stringn(t, n));
	} else {
		json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", field[0] == 'c' ? t : "",
		    field[0] == 'c' ? n : 0);
		if (field[0] == 't')
			json_object_set_new(m, "thinking", json_stringn(t, n));
		if (calls)
			json_object_set_new(m, "tool_calls", calls);
		json_object_set_new(j, "message", m);
	}
	write_line(f, j);
}

static void flush_call(struct face_req *f)
{
	struct ostate *o = f->arg;
	if (!o->pending)
		return;
	o->pending = 0;
	emit(f, "x", "", 0, json_pack("[o]", call_json(&o->call, o->args.p, o->n_calls++)));
	o->args.n = 0;
	if (o->args.p)
		o->args.p[0] = 0;
}

static void o_piece(struct face_req *f, enum oai_piece_kind k, const char *t, size_t n, const struct oai_tool_call *c)
{
	struct ostate *o = f->arg;
	if (!f->h.st)
		return;
	if (k == OAI_P_TOOL_ARGS) {
		if (o->pending && oai_buf_put(&o->args, t, n))
			f->h.write_failed = 1;
		return;
	}
	flush_call(f);
	if (k == OAI_P_TOOL_START) {
		o->pending = 1;
		o->call = *c;
		snprintf(o->call_name, sizeof o->call_name, "%s", c->name);
		o->call.name = o->call_name;
		o->call.args = NULL;
	} else if (k == OAI_P_TOOL) {
		emit(f, "x", "", 0, json_pack("[o]", call_json(c, c->args, o->n_calls++)));
	} else if (n) {
		emit(f, k == OAI_P_REASONING ? "thinking" : "content", t, n, NULL);
	}
}

static void add_stats(json_t *j, struct face_req *f, const struct baton_gen_result *res)
{
	struct ostate *o = f->arg;
	const char *reason = o->load_only ? "load" : strcmp(res->finish, "length") == 0 ? "length" : "stop";
	json_object_set_new(j, "done_reason", json_string(reason));
	json_object_set_new(j, "total_duration", json_integer((json_int_t)ns_of(baton_now_s() - f->t0)));
	json_object_set_new(j, "load_duration", json_integer(0));
	if (o->load_only)
		return;
	json_object_set_new(j, "prompt_eval_count", json_integer(res->n_prompt));
	json_object_set_new(j, "prompt_eval_duration", json_integer((json_int_t)ns_of(res->prefill_s)));
	json_object_set_new(j, "eval_count", json_integer(res->n_tokens));
	json_object_set_new(j, "eval_duration", json_integer((json_int_t)ns_of(res->decode_s)));
}

static void o_done(struct face_req *f, int rc, const char *err, const struct baton_gen_result *res)
{
	struct ostate *o = f->arg;
	if (f->stream && (f->h.st || rc == 0)) {
		o_admit(f);
		if (!f->h.st)
			goto out;
		if (rc == 0 && strcmp(res->finish, "cancelled") != 0) {
			flush_call(f);
			json_t *j = base_obj(f, 1);
			if (o->generate)
				json_object_set_new(j, "response", json_string(""));
			else
				json_object_set_new(j, "message", json_pack("{s:s, s:s}", "role", "assistant", "content", ""));
			add_stats(j, f, res);
			write_line(f, j);
			face_usage_comment(f, res);
		} else if (rc) {
			write_line(f, json_pack("{s:s}", "error", err ? err : "failed"));
		}
		http_stream_close(f->h.st);
		goto out;
	}
	if (rc) {
		int status = http_status_of(rc);
		reply_err(f->h.r, status, "%s", err ? err : "failed");
		goto out;
	}
	json_t *j = base_obj(f, 1);
	if (o->generate) {
		json_object_set_new(j, "response", json_stringn(f->h.content.p ? f->h.content.p : "", f->h.content.n));
		if (f->h.reasoning.n)
			json_object_set_new(j, "thinking", json_stringn(f->h.reasoning.p, f->h.reasoning.n));
	} else {
		json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", f->h.content.p ? f->h.content.p : "",
		    f->h.content.n);
		if (f->h.reasoning.n)
			json_object_set_new(m, "thinking", json_stringn(f->h.reasoning.p, f->h.reasoning.n));
		if (json_array_size(f->h.calls)) {
			json_t *calls = json_array(), *c;
			size_t i;
			json_array_foreach(f->h.calls, i, c) {
				struct oai_tool_call tc = { .index = (int)i };
				snprintf(tc.id, sizeof tc.id, "%s", json_string_value(json_object_get(c, "id")));
				tc.name = json_string_value(json_object_get(c, "name"));
				json_array_append_new(calls, call_json(&tc, json_string_value(json_object_get(c, "arguments")),
				    (int)i));
			}
			json_object_set_new(m, "tool_calls", calls);
		}
		json_object_set_new(j, "message", m);
	}
	add_stats(j, f, res);
	face_reply_whole(f, res, j);
out:
	free(o->args.p);
	o->args.p = NULL;
}

static const struct face_ops ollama_ops = { .admit = o_admit, .piece = o_piece, .done = o_done };

/* POST /api/chat and /api/generate. */
static void run(struct oai_server *s, struct baton_http_req *r, int generate)
{
	json_t *root = parse_body(r), *b = NULL;
	if (!root)
		return;
	if (check_model(s, r, root))
		goto out;
	json_t *st = json_object_get(root, "stream");
	if (st && !json_is_null(st) && !json_is_boolean(st)) {
		reply_err(r, 400, "stream: want true or false");
		goto out;
	}
	int stream = !st || json_is_null(st) || json_is_true(st); /* Ollama streams unless told not to */
	int has_ka = 0, load_only = 0;
	double ka = 0;
	if (keep_alive_of(r, root, &has_ka, &ka))
		goto out;
	b = json_object();
	enum oai_kind kind = OAI_CHAT;
	if (generate) {
		json_t *prompt = json_object_get(root, "prompt"), *system = json_object_get(root, "system");
		json_t *raw = json_object_get(root, "raw"), *ctx = json_object_get(root, "context");
		json_t *images = json_object_get(root, "images"), *suffix = json_object_get(root, "suffix");
		json_t *tmpl = json_object_get(root, "template");
		if ((prompt && !json_is_null(prompt) && !json_is_string(prompt)) ||
		    (system && !json_is_null(system) && !json_is_string(system))) {
			reply_err(r, 400, "%s: want a string", prompt && !json_is_string(prompt) ? "prompt" : "system");
			goto out;
		}
		if (raw && !json_is_null(raw) && !json_is_boolean(raw)) {
			reply_err(r, 400, "raw: want true or false");
			goto out;
		}
		if (ctx && !json_is_null(ctx) && !(json_is_array(ctx) && json_array_size(ctx) == 0)) {
			reply_err(r, 400, "context: continuing from an earlier answer's token ids is not supported; send "
			    "the whole prompt (or use /api/chat)");
			goto out;
		}
		if (images && !json_is_null(images) && !(json_is_array(images) && json_array_size(images) == 0)) {
			reply_err(r, 400, "images: this model takes no images");
			goto out;
		}
		if ((suffix && json_string_length(suffix)) || (suffix && !json_is_null(suffix) && !json_is_string(suffix))) {
			reply_err(r, 400, "suffix: fill-in-the-middle is not supported by this engine");
			goto out;
		}
		if ((tmpl && json_string_length(tmpl)) || (tmpl && !json_is_null(tmpl) && !json_is_string(tmpl))) {
			reply_err(r, 400, "template: this engine renders the model's own chat template; send raw: true "
			    "with a prompt you formatted");
			goto out;
		}
		load_only = !json_string_length(prompt);
		if (json_is_true(raw)) {
			kind = OAI_COMPLETION;
			json_object_set_new(b, "prompt", json_string(load_only ? " " : json_string_value(prompt)));
		} else {
			json_t *msgs = json_array();
			if (json_string_length(system))
				json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", system));
			json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", load_only ? "" :
			    json_string_value(prompt)));
			json_object_set_new(b, "messages", msgs);
		}
	} else {
		json_t *msgs = json_object_get(root, "messages"), *tools = json_object_get(root, "tools");
		if (msgs && !json_is_null(msgs) && !json_is_array(msgs)) {
			reply_err(r, 400, "messages: want a list");
			goto out;
		}
		load_only = json_array_size(msgs) == 0;
		json_t *om = load_only ? json_pack("[{s:s, s:s}]", "role", "user", "content", "") : messages_of(r, msgs);
		if (!om)
			goto out;
		json_object_set_new(b, "messages", om);
		if (tools && !json_is_null(tools)) {
			if (!json_is_array(tools)) {
				reply_err(r, 400, "tools: want a list of {\"type\": \"function\", \"function\": {...}}");
				goto out;
			}
			json_object_set(b, "tools", tools);
		}
	}
	if (set_options(r, root, b) || set_format(r, root, b) || (kind == OAI_CHAT && set_think(r, root, b)))
		goto out;
	if (load_only) /* nothing to say: the model is loaded (Ollama's answer to an empty request) */
		json_object_set_new(b, "max_tokens", json_integer(1));
	json_object_set_new(b, "model", json_string(oai_server_model(s)));
	struct ostate *o = calloc(1, sizeof *o);
	if (!o) {
		reply_err(r, 500, "out of memory");
		goto out;
	}
	o->generate = generate;
	o->load_only = load_only;
	if (has_ka) {
		const struct oai_server_opts *so = oai_server_opts(s);
		if (so->keep_alive)
			so->keep_alive(so->health_arg, ka);
	}
	struct oai_error e;
	json_t *body = b;
	b = NULL;
	if (face_submit(s, r, kind, body, stream, &ollama_ops, o, &e) != 0) {
		/* the OpenAI field it was checked as, named as this request named it */
		static const char *const names[][2] = { { "max_tokens", "options.num_predict" },
			{ "repetition_penalty", "options.repeat_penalty" }, { "temperature", "options.temperature" },
			{ "top_p", "options.top_p" }, { "top_k", "options.top_k" }, { "min_p", "options.min_p" },
			{ "seed", "options.seed" }, { "stop", "options.stop" }, { "presence_penalty",
			"options.presence_penalty" }, { "frequency_penalty", "options.frequency_penalty" },
			{ "response_format", "format" }, { "chat_template_kwargs", "think" }, { "reasoning_effort", "think" } };
		const char *as = NULL;
		for (size_t i = 0; i < sizeof names / sizeof names[0] && !as; i++)
			if (strncmp(e.param, names[i][0], strlen(names[i][0])) == 0)
				as = names[i][1];
		if (as)
			reply_err(r, e.status, "%s: %s", as, e.message);
		else
			reply_err(r, e.status, "%s", e.message);
	}
out:
	json_decref(b);
	json_decref(root);
}

#define ERR_POST "{\"error\":\"method not allowed: want POST\"}"
#define ERR_GET "{\"error\":\"method not allowed: want GET\"}"

int ollama_route(struct oai_server *s, struct baton_http_req *r, const char *method, const char *path)
{
	int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0, post = strcmp(method, "POST") == 0;
	if (strcmp(path, "/") == 0 && get) { /* what tools probe an Ollama server with */
		http_reply(r, 200, "text/plain; charset=utf-8", "Ollama is running", 17, NULL);
		return 1;
	}
	if (strncmp(path, "/api/", 5) != 0)
		return 0;
	const char *p = path + 5;
	static const char *const posts[] = { "chat", "generate", "show", NULL };
	static const char *const gets[] = { "version", "tags", "ps", NULL };
	for (size_t i = 0; posts[i]; i++)
		if (strcmp(p, posts[i]) == 0 && !post) {
			static const char *const allow[] = { "Allow: POST", NULL };
			http_reply(r, 405, "application/json", ERR_POST, strlen(ERR_POST), allow);
			return 1;
		}
	for (size_t i = 0; gets[i]; i++)
		if (strcmp(p, gets[i]) == 0 && !get) {
			static const char *const allow[] = { "Allow: GET", NULL };
			http_reply(r, 405, "application/json", ERR_GET, strlen(ERR_GET), allow);
			return 1;
		}
	if (strcmp(p, "version") == 0)
		http_reply_json(r, 200, json_pack("{s:s}", "version", HTTP_OLLAMA_VERSION));
	else if (strcmp(p, "tags") == 0 || strcmp(p, "ps") == 0)
		list(s, r, p[0] == 'p');
	else if (strcmp(p, "show") == 0)
		show(s, r);
	else if (strcmp(p, "chat") == 0 || strcmp(p, "generate") == 0)
		run(s, r, p[0] == 'g');
	else
		reply_err(r, 404, "%s is not served here: this engine serves Ollama's chat, generate, tags, ps, show "
		    "and version (it pulls, copies and deletes no models)", path);
	return 1;
}
