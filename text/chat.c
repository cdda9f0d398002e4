/*
 * chat.c: chat templates, rendered by the Jinja engine (jinja_*.c) with the
 * variables transformers' apply_chat_template passes: messages (with their
 * tool_calls, tool_call_id and name), tools (None when not given),
 * documents (None), add_generation_prompt, bos_token, eos_token,
 * enable_thinking when the request gives it, and chat_template_kwargs.
 * One path renders every template; one the engine refuses at load is
 * refused here, never guessed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/text_int.h"

const char *text_chat_family(const char *tmpl)
{
	if (!tmpl)
		return NULL;
	text_jinja *j = NULL;
	char err[8];
	if (text_jinja_load(&j, tmpl, strlen(tmpl), err, sizeof(err)))
		return NULL;
	text_jinja_free(j);
	return "jinja";
}

/* The render context as JSON text (malloc'ed), or NULL without memory. */
static char *context(const struct text_msg *msgs, size_t n, const struct text_chat_opts *o)
{
	json_t *c = json_object(), *m = json_array();
	if (!c || !m) {
		json_decref(c);
		json_decref(m);
		return NULL;
	}
	int rc = json_object_set_new(c, "messages", m);
	for (size_t i = 0; i < n && !rc; i++) {
		json_t *x = json_object();
		rc = !x || json_array_append_new(m, x) ||
		     json_object_set_new(x, "role", json_string(msgs[i].role)) ||
		     json_object_set_new(x, "content", json_string(msgs[i].content));
		if (!rc && msgs[i].reasoning_content)
			rc = json_object_set_new(x, "reasoning_content", json_string(msgs[i].reasoning_content));
		if (!rc && msgs[i].tool_calls) {
			json_t *tc = json_loads(msgs[i].tool_calls, JSON_DECODE_ANY, NULL);
			rc = !json_is_array(tc) || json_object_set_new(x, "tool_calls", tc);
			if (rc && !json_is_array(tc))
				json_decref(tc);
		}
		if (!rc && msgs[i].tool_call_id)
			rc = json_object_set_new(x, "tool_call_id", json_string(msgs[i].tool_call_id));
		if (!rc && msgs[i].name)
			rc = json_object_set_new(x, "name", json_string(msgs[i].name));
	}
	json_t *tools = o->tools ? json_loads(o->tools, JSON_DECODE_ANY, NULL) : json_null();
	if (!rc && !json_is_array(tools) && !json_is_null(tools)) {
		json_decref(tools);
		tools = NULL;
	}
	if (rc) {
		json_decref(tools);
		tools = NULL;
	}
	rc = rc || !tools || json_object_set_new(c, "tools", tools) ||
	     json_object_set_new(c, "documents", json_null()) ||
	     json_object_set_new(c, "add_generation_prompt", json_boolean(o->add_generation_prompt)) ||
	     json_object_set_new(c, "bos_token", json_string(o->bos_token ? o->bos_token : "")) ||
	     json_object_set_new(c, "eos_token", json_string(o->eos_token ? o->eos_token : ""));
	if (!rc && o->enable_thinking >= 0)
		rc = json_object_set_new(c, "enable_thinking", json_boolean(o->enable_thinking));
	if (!rc && o->kwargs) {
		json_t *kw = json_loads(o->kwargs, JSON_DECODE_ANY, NULL);
		const char *key;
		json_t *v;
		rc = !json_is_object(kw);
		if (!rc)
			json_object_foreach(kw, key, v)
				if (!json_object_get(c, key) && json_object_set(c, key, v))
					rc = 1;
		json_decref(kw);
	}
	char *s = rc ? NULL : json_dumps(c, JSON_COMPACT);
	json_decref(c);
	return s;
}

/* The messages checked: each with a role and content, all valid UTF-8. */
static int check_msgs(const struct text_msg *msgs, size_t n, char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++)
		if (!msgs[i].role || !msgs[i].content)
			return text_errf(err, errlen, BATON_EINVAL, "message %zu has no %s", i,
			                 msgs[i].role ? "content" : "role");
	for (size_t i = 0; i < n; i++)
		if (!tx_utf8_valid(msgs[i].role, strlen(msgs[i].role)) ||
		    !tx_utf8_valid(msgs[i].content, strlen(msgs[i].content)) ||
		    (msgs[i].reasoning_content &&
		     !tx_utf8_valid(msgs[i].reasoning_content, strlen(msgs[i].reasoning_content))))
			return text_errf(err, errlen, BATON_EINVAL, "message %zu is not valid UTF-8", i);
	return 0;
}

static int load(const char *tmpl, text_jinja **j, char *err, size_t errlen)
{
	if (!tmpl)
		return text_errf(err, errlen, BATON_EUNSUPPORTED, "the model has no chat template");
	char why[400];
	int rc = text_jinja_load(j, tmpl, strlen(tmpl), why, sizeof(why));
	if (rc)
		return text_errf(err, errlen, rc == BATON_ENOMEM ? rc : BATON_EUNSUPPORTED,
		                 "the chat template cannot be rendered: %s", why);
	return 0;
}

static int render(const text_jinja *j, const struct text_msg *msgs, size_t n,
                  const struct text_chat_opts *opts, char **out, char *err, size_t errlen)
{
	char *ctx = context(msgs, n, opts);
	if (!ctx)
		return text_errf(err, errlen, BATON_ENOMEM, "out of memory");
	int rc = text_jinja_render(j, ctx, strlen(ctx), out, NULL, err, errlen);
	free(ctx);
	return rc;
}

int text_chat_render(const char *tmpl, const struct text_msg *msgs, size_t n,
                     const struct text_chat_opts *opts, char **out, char *err, size_t errlen)
{
	*out = NULL;
	text_jinja *j = NULL;
	int rc;
	if (!tmpl)
		return load(tmpl, &j, err, errlen);
	if ((rc = check_msgs(msgs, n, err, errlen)) != 0 || (rc = load(tmpl, &j, err, errlen)) != 0)
		return rc;
	rc = render(j, msgs, n, opts, out, err, errlen);
	text_jinja_free(j);
	return rc;
}

int text_chat_apply(const text_tok *t, const struct text_msg *msgs, size_t n,
                    bool add_generation_prompt, int enable_thinking, char **out, char *err,
                    size_t errlen)
{
	struct text_chat_opts o = {
	    .bos_token = text_token_text(t, text_bos(t)),
	    .eos_token = text_token_text(t, text_eos(t)),
	    .add_generation_prompt = add_generation_prompt,
	    .enable_thinking = enable_thinking,
	};
	*out = NULL;
	text_jinja *j = NULL;
	if (!text_chat_template(t))
		return load(NULL, &j, err, errlen);
	int rc = check_msgs(msgs, n, err, errlen);
	if (rc)
		return rc;
	/* parsed on the first request and kept with the tokenizer: every
	 * request after renders without parsing (two threads that race both
	 * parse; one keeps its copy, the other frees its own) */
	text_tok *tt = (text_tok *)t;
	j = atomic_load(&tt->chat_jinja);
	if (!j) {
		if ((rc = load(text_chat_template(t), &j, err, errlen)) != 0)
			return rc;
		text_jinja *none = NULL;
		if (!atomic_compare_exchange_strong(&tt->chat_jinja, &none, j)) {
			text_jinja_free(j);
			j = none;
		}
	}
	return render(j, msgs, n, &o, out, err, errlen);
}
