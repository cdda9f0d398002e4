/*
 * chat.c: chat templates rendered by built-in renderers, one per family.
 *
 * Why built-in renderers and not a Jinja interpreter: the four families
 * need a handful of templates whose whole behaviour fits in a page of C
 * each, and each renderer is checked against transformers'
 * apply_chat_template on the real template text (chat.jsonl of each
 * family under text/fixtures).
 * A template is recognised by its exact text (chat_known.c), so a renderer
 * never runs for a template it was not checked against; anything else is
 * refused. Tools and tool_calls are not rendered: the API takes neither.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_int.h"
#include "text/text_int.h"

/* The template without trailing newlines (with trim_blocks they render
 * nothing) and with CR LF as LF. */
static const struct chat_known *recognise(const char *tmpl)
{
	if (!tmpl)
		return NULL;
	size_t n = strlen(tmpl);
	struct tbuf b = {0};
	for (size_t i = 0; i < n; i++)
		if (!(tmpl[i] == '\r' && tmpl[i + 1] == '\n') && tx_tbuf_putc(&b, tmpl[i]))
			goto out;
	while (b.n && (b.p[b.n - 1] == '\n' || b.p[b.n - 1] == '\r'))
		b.p[--b.n] = 0;
	for (size_t i = 0; b.p && i < tx_chat_n_known; i++)
		if (!strcmp(b.p, tx_chat_known[i].text)) {
			tx_tbuf_free(&b);
			return &tx_chat_known[i];
		}
out:
	tx_tbuf_free(&b);
	return NULL;
}

const char *text_chat_family(const char *tmpl)
{
	const struct chat_known *k = recognise(tmpl);
	return k ? k->variant : NULL;
}

static int put(struct tbuf *b, const char *s)
{
	return tx_tbuf_put(b, s ? s : "", s ? strlen(s) : 0);
}

static bool is(const struct text_msg *m, const char *role)
{
	return m->role && !strcmp(m->role, role);
}

static int chatml_qwen2(const struct text_msg *m, size_t n, const struct text_chat_opts *o,
                        const char *dflt_system, struct tbuf *b)
{
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		if (i == 0 && !is(&m[0], "system"))
			rc |= put(b, "<|im_start|>system\n") | put(b, dflt_system) | put(b, "<|im_end|>\n");
		rc |= put(b, "<|im_start|>") | put(b, m[i].role) | put(b, "\n") | put(b, m[i].content) |
		      put(b, "<|im_end|>\n");
	}
	if (o->add_generation_prompt)
		rc |= put(b, "<|im_start|>assistant\n");
	return rc ? BATON_ENOMEM : 0;
}

/* Python's str.strip/lstrip/rstrip of '\n' on [*s, *s + *n). */
static void lstrip_nl(const char **s, size_t *n)
{
	while (*n && **s == '\n') {
		(*s)++;
		(*n)--;
	}
}

static void rstrip_nl(const char *s, size_t *n)
{
	(void)s;
	while (*n && s[*n - 1] == '\n')
		(*n)--;
}

static const char *find_last(const char *s, size_t n, const char *pat)
{
	size_t pn = strlen(pat);
	for (size_t i = n >= pn ? n - pn + 1 : 0; i-- > 0;)
		if (!memcmp(s + i, pat, pn))
			return s + i;
	return NULL;
}

static bool starts(const char *s, const char *p)
{
	return !strncmp(s, p, strlen(p));
}

static bool ends(const char *s, const char *p)
{
	size_t a = strlen(s), b = strlen(p);
	return a >= b && !memcmp(s + a - b, p, b);
}

static int qwen3(const struct text_msg *m, size_t n, const struct text_chat_opts *o,
                 struct tbuf *b, char *err, size_t errlen)
{
	int rc = 0;
	if (n == 0)
		return text_errf(err, errlen, BATON_EINVAL, "the Qwen3 template needs at least one message");
	if (is(&m[0], "system"))
		rc |= put(b, "<|im_start|>system\n") | put(b, m[0].content) | put(b, "<|im_end|>\n");
	/* the last user turn that is not a tool response */
	size_t last_query = n - 1;
	for (size_t k = n; k-- > 0;)
		if (is(&m[k], "user") &&
		    !(starts(m[k].content, "<tool_response>") && ends(m[k].content, "</tool_response>"))) {
			last_query = k;
			break;
		}
	for (size_t i = 0; i < n; i++) {
		const struct text_msg *x = &m[i];
		if (is(x, "user") || (is(x, "system") && i != 0)) {
			rc |= put(b, "<|im_start|>") | put(b, x->role) | put(b, "\n") | put(b, x->content) |
			      put(b, "<|im_end|>\n");
		} else if (is(x, "assistant")) {
			const char *c = x->content, *r = "";
			size_t cn = strlen(c), rn = 0;
			if (x->reasoning_content) {
				r = x->reasoning_content;
				rn = strlen(r);
			} else {
				const char *end = strstr(c, "</think>");
				if (end) {
					/* content: after the last </think>, \n stripped on the left;
					 * reasoning: before the first </think>, \n stripped on the
					 * right, after its last <think>, \n stripped on the left */
					const char *last = find_last(c, cn, "</think>");
					r = c;
					rn = (size_t)(end - c);
					rstrip_nl(r, &rn);
					const char *open = find_last(r, rn, "<think>");
					if (open) {
						rn -= (size_t)(open + 7 - r);
						r = open + 7;
					}
					lstrip_nl(&r, &rn);
					cn -= (size_t)(last + 8 - c);
					c = last + 8;
					lstrip_nl(&c, &cn);
				}
			}
			rc |= put(b, "<|im_start|>assistant\n");
			if (i > last_query && (i == n - 1 || rn > 0)) {
				const char *rs = r;
				size_t rsn = rn;
				lstrip_nl(&rs, &rsn);
				rstrip_nl(rs, &rsn);
				lstrip_nl(&c, &cn);
				rc |= put(b, "<think>\n") | tx_tbuf_put(b, rs, rsn) | put(b, "\n</think>\n\n");
			}
			rc |= tx_tbuf_put(b, c, cn) | put(b, "<|im_end|>\n");
		} else if (is(x, "tool")) {
			if (i == 0 || !is(&m[i - 1], "tool"))
				rc |= put(b, "<|im_start|>user");
			rc |= put(b, "\n<tool_response>\n") | put(b, x->content) | put(b, "\n</tool_response>");
			if (i == n - 1 || !is(&m[i + 1], "tool"))
				rc |= put(b, "<|im_end|>\n");
		}
	}
	if (o->add_generation_prompt) {
		rc |= put(b, "<|im_start|>assistant\n");
		if (o->enable_thinking == 0)
			rc |= put(b, "<think>\n\n</think>\n\n");
	}
	return rc ? BATON_ENOMEM : 0;
}

static int mixtral(const struct text_msg *m, size_t n, const struct text_chat_opts *o,
                   struct tbuf *b, char *err, size_t errlen)
{
	int rc = 0;
	if (n == 0)
		return text_errf(err, errlen, BATON_EINVAL, "the Mixtral template needs at least one message");
	const char *system = NULL;
	if (is(&m[0], "system")) {
		system = m[0].content;
		m++;
		n--;
	}
	rc |= put(b, o->bos_token);
	for (size_t i = 0; i < n; i++) {
		if (is(&m[i], "user") != (i % 2 == 0))
			return text_errf(err, errlen, BATON_EINVAL,
			                 "After the optional system message, conversation roles must "
			                 "alternate user/assistant/user/assistant/...");
		if (is(&m[i], "user")) {
			rc |= put(b, " [INST] ");
			if (i == 0 && system)
				rc |= put(b, system) | put(b, "\n\n");
			rc |= put(b, m[i].content) | put(b, " [/INST]");
		} else if (is(&m[i], "assistant")) {
			rc |= put(b, " ") | put(b, m[i].content) | put(b, o->eos_token);
		} else
			return text_errf(err, errlen, BATON_EINVAL,
			                 "Only user and assistant roles are supported, with the exception of "
			                 "an initial optional system message!");
	}
	return rc ? BATON_ENOMEM : 0;
}

static int mixtral_v01(const struct text_msg *m, size_t n, const struct text_chat_opts *o,
                       struct tbuf *b, char *err, size_t errlen)
{
	int rc = put(b, o->bos_token);
	for (size_t i = 0; i < n; i++) {
		if (is(&m[i], "user") != (i % 2 == 0))
			return text_errf(err, errlen, BATON_EINVAL,
			                 "Conversation roles must alternate user/assistant/user/assistant/...");
		if (is(&m[i], "user"))
			rc |= put(b, "[INST] ") | put(b, m[i].content) | put(b, " [/INST]");
		else if (is(&m[i], "assistant"))
			rc |= put(b, m[i].content) | put(b, o->eos_token);
		else
			return text_errf(err, errlen, BATON_EINVAL, "Only user and assistant roles are supported!");
	}
	return rc ? BATON_ENOMEM : 0;
}

static int olmoe(const struct text_msg *m, size_t n, const struct text_chat_opts *o,
                 struct tbuf *b)
{
	int rc = put(b, o->bos_token);
	for (size_t i = 0; i < n; i++) {
		bool last = i == n - 1;
		if (is(&m[i], "system"))
			rc |= put(b, "<|system|>\n") | put(b, m[i].content) | put(b, "\n");
		else if (is(&m[i], "user"))
			rc |= put(b, "<|user|>\n") | put(b, m[i].content) | put(b, "\n");
		else if (is(&m[i], "assistant"))
			rc |= put(b, "<|assistant|>\n") | put(b, m[i].content) | put(b, o->eos_token) |
			      put(b, last ? "" : "\n");
		if (last && o->add_generation_prompt)
			rc |= put(b, "<|assistant|>\n");
	}
	return rc ? BATON_ENOMEM : 0;
}

int text_chat_render(const char *tmpl, const struct text_msg *msgs, size_t n,
                     const struct text_chat_opts *opts, char **out, char *err, size_t errlen)
{
	*out = NULL;
	const struct chat_known *k = recognise(tmpl);
	if (!k)
		return text_errf(err, errlen, BATON_EUNSUPPORTED,
		                 tmpl ? "unknown chat template: it is none of the templates Baton renders "
		                        "(Qwen3, Qwen2-MoE, Qwen1.5-MoE, Mixtral-8x7B-Instruct, OLMoE-Instruct)"
		                      : "the model has no chat template");
	for (size_t i = 0; i < n; i++)
		if (!msgs[i].role || !msgs[i].content)
			return text_errf(err, errlen, BATON_EINVAL, "message %zu has no %s", i,
			                 msgs[i].role ? "content" : "role");
	struct text_chat_opts o = *opts;
	if (!o.bos_token)
		o.bos_token = "";
	if (!o.eos_token)
		o.eos_token = "";
	struct tbuf b = {0};
	int rc;
	if (!strcmp(k->family, "qwen3"))
		rc = qwen3(msgs, n, &o, &b, err, errlen);
	else if (!strcmp(k->family, "qwen2"))
		rc = chatml_qwen2(msgs, n, &o,
		                  !strcmp(k->variant, "qwen2-moe") ? "You are a helpful assistant."
		                                                   : "You are a helpful assistant",
		                  &b);
	else if (!strcmp(k->family, "mixtral"))
		rc = mixtral(msgs, n, &o, &b, err, errlen);
	else if (!strcmp(k->family, "mixtral-v0.1"))
		rc = mixtral_v01(msgs, n, &o, &b, err, errlen);
	else
		rc = olmoe(msgs, n, &o, &b);
	if (!rc && !b.p)
		rc = tx_tbuf_put(&b, "", 0);
	if (rc) {
		tx_tbuf_free(&b);
		if (rc == BATON_ENOMEM)
			return text_errf(err, errlen, rc, "out of memory");
		return rc;
	}
	*out = b.p;
	return 0;
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
	return text_chat_render(text_chat_template(t), msgs, n, &o, out, err, errlen);
}
