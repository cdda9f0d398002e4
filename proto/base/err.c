/* err.c: the string tables of the error enum, and the error-text helper. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "proto/base/base.h"

struct err_entry {
	int code;
	const char *name;
	const char *msg;
};

static const struct err_entry err_table[] = {
#define BATON_ERR_ROW(e, n, name, msg) { n, name, msg },
	BATON_ERRORS(BATON_ERR_ROW)
#undef BATON_ERR_ROW
};

static const struct err_entry *err_find(int err)
{
	for (size_t i = 0; i < sizeof err_table / sizeof err_table[0]; i++)
		if (err_table[i].code == err)
			return &err_table[i];
	return NULL;
}

const char *baton_strerror(int err)
{
	const struct err_entry *e = err_find(err);
	return e ? e->msg : "unknown error code";
}

const char *baton_errname(int err)
{
	const struct err_entry *e = err_find(err);
	return e ? e->name : "unknown";
}

int baton_err_valid(int err)
{
	return err_find(err) != NULL;
}

#ifndef BATON_VERSION
#define BATON_VERSION "unknown"
#endif

const char *baton_version(void)
{
	return BATON_VERSION;
}

void baton_verrf(char *buf, size_t len, const char *fmt, va_list ap)
{
	if (!buf || !len)
		return;
	vsnprintf(buf, len, fmt, ap);
}

void baton_errf(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	baton_verrf(buf, len, fmt, ap);
	va_end(ap);
}

int baton_fail(char *buf, size_t len, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	baton_verrf(buf, len, fmt, ap);
	va_end(ap);
	return err;
}
