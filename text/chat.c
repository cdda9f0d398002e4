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

/* Which of the tokenizer's templates renders a request: of a list of
 * named templates, "tool_use" when the request has tools (tools is not
 * None, an empty list included) and the list has one, else the default
 * (transformers' rule in apply_chat_template). */
static const char *pick(const text_tok *t, const char *tools)
{
	const char *tu = tools ? text_chat_template_named(t, "tool_use") : NULL;
	return tu ? tu : text_chat_template(t);
}

/* The template picked, parsed on the first request and kept with the
 * tokenizer: every request after renders without parsing (two threads
 * that race both parse; one keeps its copy, the other frees its own). */
static int tok_jinja(const text_tok *t, const char *tools, text_jinja **out, char *err,
                     size_t errlen)
{
	text_tok *tt = (text_tok *)t;
	const char *tmpl = pick(t, tools);
	_Atomic(text_jinja *) *slot = tmpl && tmpl != text_chat_template(t) ? &tt->tool_jinja
	                                                                     : &tt->chat_jinja;
	text_jinja *j = atomic_load(slot);
	if (!j) {
		int rc = load(tmpl, &j, err, errlen);
		if (rc)
			return rc;
		text_jinja *none = NULL;
		if (!atomic_compare_exchange_strong(slot, &none, j)) {
			text_jinja_free(j);
			j = none;
		}
	}
	*out = j;
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
	if ((rc = tok_jinja(t, NULL, &j, err, errlen)) != 0)
		return rc;
	return render(j, msgs, n, &o, out, err, errlen);
}

/* ---- content is text (issue 28) ----------------------------------------------
 * A rendered chat is encoded with the special tokens matched: the template
 * writes them as text (<|im_start|>). A message whose content carried that
 * text became control tokens and forged turns (9 where the template makes
 * 3). So each special token's text in a message's content (and
 * reasoning_content) gets a mark before it, U+FDD0, a noncharacter no
 * template writes; after rendering the marks are taken out and their
 * offsets given to the encoder, which takes the text there as text. A
 * U+FDD0 the client sent becomes U+FFFD, so no client places a mark. */

#define MARK "\xEF\xB7\x90"   /* U+FDD0 */
#define MARK_LEN 3
#define REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD */

/* s with MARK before every special token's text; NULL without memory. */
static char *mark(const text_tok *t, const char *s)
{
	struct tbuf b = {0};
	size_t n = strlen(s);
	int rc = 0;
	bool first[256] = {false}; /* the first bytes of the special tokens */
	for (size_t k = 0; k < t->n_added; k++)
		if (t->added[k].special && t->added[k].n)
			first[(unsigned char)t->added[k].s[0]] = true;
	for (size_t i = 0; i < n && !rc;) {
		if (n - i >= MARK_LEN && memcmp(s + i, MARK, MARK_LEN) == 0) {
			rc = tx_tbuf_put(&b, REPLACEMENT, 3);
			i += MARK_LEN;
			continue;
		}
		size_t best = 0;
		for (size_t k = 0; first[(unsigned char)s[i]] && k < t->n_added; k++) {
			const struct added_tok *a = &t->added[k];
			if (a->special && a->n > best && a->n <= n - i && memcmp(s + i, a->s, a->n) == 0)
				best = a->n;
		}
		if (best) {
			rc = tx_tbuf_put(&b, MARK, MARK_LEN);
			if (!rc)
				rc = tx_tbuf_put(&b, s + i, best);
			i += best;
		} else {
			rc = tx_tbuf_putc(&b, s[i]);
			i++;
		}
	}
	if (!rc)
		rc = tx_tbuf_putc(&b, 0);
	if (rc) {
		tx_tbuf_free(&b);
		return NULL;
	}
	return b.p;
}

/* The last tail_len - 1 bytes of s into tail (when asked for). */
static void tail_of(const char *s, size_t len, char *tail, size_t tail_len)
{
	if (!tail || !tail_len)
		return;
	size_t k = len < tail_len - 1 ? len : tail_len - 1;
	memcpy(tail, s + len - k, k);
	tail[k] = 0;
}

int text_chat_encode(const text_tok *t, const struct text_msg *msgs, size_t n, bool add_generation_prompt,
                     int enable_thinking, unsigned flags, int32_t **ids, size_t *nids, char *err,
                     size_t errlen)
{
	struct text_chat_opts o = {
	    .add_generation_prompt = add_generation_prompt,
	    .enable_thinking = enable_thinking,
	};
	return text_chat_encode_opts(t, msgs, n, &o, flags, ids, nids, NULL, 0, err, errlen);
}

int text_chat_encode_opts(const text_tok *t, const struct text_msg *msgs, size_t n,
                          const struct text_chat_opts *opts, unsigned flags, int32_t **ids, size_t *nids,
                          char *tail, size_t tail_len, char *err, size_t errlen)
{
	*ids = NULL;
	*nids = 0;
	if (tail && tail_len)
		tail[0] = 0;
	text_jinja *j = NULL;
	if (!pick(t, opts->tools))
		return load(NULL, &j, err, errlen);
	int rc = check_msgs(msgs, n, err, errlen);
	if (rc || (rc = tok_jinja(t, opts->tools, &j, err, errlen)) != 0)
		return rc;
	struct text_chat_opts o = *opts;
	o.bos_token = text_token_text(t, text_bos(t));
	o.eos_token = text_token_text(t, text_eos(t));
	char *out = NULL;
	if (flags & TEXT_CONTENT_SPECIAL) {
		/* the old way, asked for: content's special texts are tokens */
		if ((rc = render(j, msgs, n, &o, &out, err, errlen)) == 0) {
			tail_of(out, strlen(out), tail, tail_len);
			rc = text_encode(t, out, strlen(out), 0, ids, nids, err, errlen);
		}
		free(out);
		return rc;
	}
	struct text_msg *mm = calloc(n ? n : 1, sizeof *mm);
	char **keep = calloc(2 * (n ? n : 1), sizeof *keep);
	rc = mm && keep ? 0 : BATON_ENOMEM;
	for (size_t i = 0; i < n && !rc; i++) {
		mm[i] = msgs[i];
		if (!(keep[2 * i] = mark(t, msgs[i].content)))
			rc = BATON_ENOMEM;
		mm[i].content = keep[2 * i];
		if (!rc && msgs[i].reasoning_content &&
		    !(keep[2 * i + 1] = mark(t, msgs[i].reasoning_content)))
			rc = BATON_ENOMEM;
		if (msgs[i].reasoning_content)
			mm[i].reasoning_content = keep[2 * i + 1];
	}
	if (!rc)
		rc = render(j, mm, n, &o, &out, err, errlen);
	else
		text_errf(err, errlen, rc, "out of memory");
	for (size_t i = 0; keep && i < 2 * n; i++)
		free(keep[i]);
	free(keep);
	free(mm);
	if (rc)
		return rc;
	/* the marks out, their offsets kept */
	size_t len = strlen(out), w = 0, n_at = 0, cap_at = 0;
	size_t *at = NULL;
	for (size_t r = 0; r < len;) {
		if (len - r >= MARK_LEN && memcmp(out + r, MARK, MARK_LEN) == 0) {
			if (n_at == cap_at) {
				size_t c = cap_at ? 2 * cap_at : 16;
				size_t *p = realloc(at, c * sizeof *p);
				if (!p) {
					free(at);
					free(out);
					return text_errf(err, errlen, BATON_ENOMEM, "out of memory");
				}
				at = p;
				cap_at = c;
			}
			at[n_at++] = w;
			r += MARK_LEN;
			continue;
		}
		out[w++] = out[r++];
	}
	out[w] = 0;
	tail_of(out, w, tail, tail_len);
	rc = tx_encode_plain_at(t, out, w, 0, at, n_at, ids, nids, err, errlen);
	free(at);
	free(out);
	return rc;
}
