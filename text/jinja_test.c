/*
 * jinja_test.c: the Jinja engine's own rules: what it refuses at load (with
 * the construct's name and line), the bounds that stop a render, the
 * template's raise_exception message, and a table of renders whose bytes
 * jinja2 gave (text/jinja_test.py checks the engine against jinja2 itself,
 * over the template corpus).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tests/t.h"
#include "text/text.h"

static int render(const char *tmpl, const char *ctx, char **out, char *err, size_t errlen)
{
	text_jinja *j = NULL;
	*out = NULL;
	int rc = text_jinja_load(&j, tmpl, strlen(tmpl), err, errlen);
	if (rc)
		return rc;
	rc = text_jinja_render(j, ctx, strlen(ctx), out, NULL, err, errlen);
	text_jinja_free(j);
	return rc;
}

/* Renders jinja2 gave for these (trim_blocks, lstrip_blocks). */
static void t_table(void)
{
	static const struct {
		const char *tmpl, *want;
	} cases[] = {
	    {"{{ 1 + 2 }}|{{ 7 // -2 }}|{{ 7 / 2 }}|{{ 1.0 }}|{{ 1e20 }}|{{ 0.1 + 0.2 }}", "3|-4|3.5|1.0|1e+20|0.30000000000000004"},
	    {"{% for m in messages %}{{ loop.index }}{{ m.role }}{% endfor %}", "1user2assistant"},
	    {"  {% if true %}\n  x\n  {% endif %}\ny", "  x\ny"},
	    {"a {%- if true -%} b {%- endif -%} c", "abc"},
	    {"{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", "6"},
	    {"{{ {'a': [1, 'x', none]} | tojson }}|{{ {'a': 1} | tojson(indent=2) }}", "{\"a\": [1, \"x\", null]}|{\n  \"a\": 1\n}"},
	    {"{{ 'Grüße'[1:3] }}|{{ 'a,b'.split(',') }}|{{ ' x '.strip() }}", "rü|['a', 'b']|x"},
	    {"{{ x is defined }}{{ x }}{{ x | default('d') }}", "Falsed"},
	    {"{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}", "1B23"},
	    {"{% for x in [1, 2, 3] if x != 2 %}{{ x }}{{ loop.length }}{% else %}no{% endfor %}", "1232"},
	    {"{% raw %}{{ x }}{% endraw %}", "{{ x }}"},
	    {"line\n", "line"},
	    {"a\r\nb", "a\nb"},
	};
	const char *ctx = "{\"messages\": [{\"role\": \"user\"}, {\"role\": \"assistant\"}]}";
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *out, err[256];
		int rc = render(cases[i].tmpl, ctx, &out, err, sizeof(err));
		T_ASSERT_MSG(rc == 0, "%s: %s", cases[i].tmpl, err);
		T_EQ_STR(out, cases[i].want);
		free(out);
	}
}

/* What the engine lacks is refused at load, naming it and its line. */
static void t_refused_at_load(void)
{
	static const struct {
		const char *tmpl, *want;
	} cases[] = {
	    {"{% include 'x.jinja' %}", "'include' statement"},
	    {"x\n{% extends 'base' %}", "line 2: the 'extends' statement"},
	    {"{% import 'm' as m %}", "'import' statement"},
	    {"{% call m %}x{% endcall %}", "a call block needs a call"},
	    {"{{ x | batch(2) }}", "the filter 'batch'"},
	    {"{{ x is escaped }}", "the test 'escaped'"},
	    {"\n\n{{ s.encode('utf-8') }}", "line 3: the method 'encode'"},
	    {"{{ joiner() }}", "the function 'joiner'"},
	    {"{% for x in y recursive %}{% endfor %}", "recursive for loops"},
	    {"{% break %}", "'break' outside a for loop"},
	    {"{% if x %}", "ends inside a block"},
	    {"{{ x ", "without its }}"},
	    {"{{ 'abc }}", "unterminated string"},
	    {"{{ f(*args) }}", "*args"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		text_jinja *j = (text_jinja *)1;
		char err[256] = "";
		int rc = text_jinja_load(&j, cases[i].tmpl, strlen(cases[i].tmpl), err, sizeof(err));
		T_ASSERT_MSG(rc == BATON_EINVAL && j == NULL, "%s: rc %d", cases[i].tmpl, rc);
		T_ASSERT_MSG(strstr(err, cases[i].want), "%s: got \"%s\", want \"%s\"", cases[i].tmpl, err,
		             cases[i].want);
	}
	/* nesting that would exhaust the stack */
	size_t n = 100000;
	char *deep = malloc(2 * n + 8);
	T_ASSERT(deep);
	strcpy(deep, "{{ ");
	memset(deep + 3, '(', n / 2);
	deep[3 + n / 2] = '1';
	memset(deep + 4 + n / 2, ')', n / 2);
	strcpy(deep + 4 + n, " }}");
	text_jinja *j = NULL;
	char err[256];
	T_EQ_ERR(text_jinja_load(&j, deep, strlen(deep), err, sizeof(err)), BATON_EINVAL);
	T_ASSERT(strstr(err, "nested too deep"));
	memset(deep + 3, '-', n);
	T_EQ_ERR(text_jinja_load(&j, deep, strlen(deep), err, sizeof(err)), BATON_EINVAL);
	memset(deep + 3, 'n', n);
	for (size_t k = 3; k + 4 < 3 + n; k += 4)
		memcpy(deep + k, "not ", 4);
	T_EQ_ERR(text_jinja_load(&j, deep, strlen(deep), err, sizeof(err)), BATON_EINVAL);
	free(deep);
}

/* Bounded work: loops that run too long, strings and output that grow too
 * big, and runaway recursion all stop with an error. */
static void t_bounds(void)
{
	static const struct {
		const char *tmpl, *want;
	} cases[] = {
	    {"{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "MiB"},
	    {"{% for i in range(1000000) %}{{ 'x' * 100 }}{% endfor %}", "output ran over"},
	    {"{{ 'x' * 100000000 }}", "MiB"},
	    {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nested deeper"},
	    {"{{ range(100000000) | length }}", "range()"},
	    {"{{ 9223372036854775807 + 1 }}", "64 bits"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *out, err[256] = "";
		int rc = render(cases[i].tmpl, "{}", &out, err, sizeof(err));
		T_ASSERT_MSG(rc != 0 && out == NULL, "%s rendered", cases[i].tmpl);
		T_ASSERT_MSG(strstr(err, cases[i].want), "%s: got \"%s\"", cases[i].tmpl, err);
	}
	/* a loop of 10^12 turns stops on the step bound or the memory bound */
	char *out, err[256] = "";
	T_ASSERT(render("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
	                "{}", &out, err, sizeof(err)) != 0);
	T_ASSERT_MSG(strstr(err, "steps") || strstr(err, "out of memory"), "got \"%s\"", err);
}

static void t_errors(void)
{
	char *out, err[256];
	T_EQ_ERR(render("x{{ raise_exception('Roles must alternate!') }}", "{}", &out, err, sizeof(err)),
	         BATON_EINVAL);
	T_EQ_STR(err, "Roles must alternate!");
	/* found by the fuzzer: an empty message (or one that starts with a NUL) still gives a reason */
	static const char nul_msg[] = "{{ raise_exception('\0x') }}";
	text_jinja *j;
	T_OK(text_jinja_load(&j, nul_msg, sizeof(nul_msg) - 1, err, sizeof(err)));
	T_EQ_ERR(text_jinja_render(j, "{}", 2, &out, NULL, err, sizeof(err)), BATON_EINVAL);
	T_ASSERT(strstr(err, "empty message"));
	text_jinja_free(j);
	T_EQ_ERR(render("{{ raise_exception('') }}", "{}", &out, err, sizeof(err)), BATON_EINVAL);
	T_ASSERT(strstr(err, "empty message"));
	T_EQ_ERR(render("\n{{ x.y }}", "{}", &out, err, sizeof(err)), BATON_EINVAL);
	T_EQ_STR(err, "template line 2: 'x' is undefined");
	T_EQ_ERR(render("{{ 1 + 'a' }}", "{}", &out, err, sizeof(err)), BATON_EINVAL);
	T_ASSERT(strstr(err, "unsupported operand"));
	T_EQ_ERR(render("{{ x }}", "[1]", &out, err, sizeof(err)), BATON_EINVAL);
	T_ASSERT(strstr(err, "not a JSON object"));
	/* jinja2 prints generators as an address: refused, not imitated */
	T_EQ_ERR(render("{{ [1] | map('string') }}", "{}", &out, err, sizeof(err)), BATON_EUNSUPPORTED);
	T_OK(render("{{ [1] | map('string') | list }}", "{}", &out, err, sizeof(err)));
	T_EQ_STR(out, "['1']");
	free(out);
}

T_MAIN(T_CASE(t_table), T_CASE(t_refused_at_load), T_CASE(t_bounds), T_CASE(t_errors))
