/*
 * sample.c: deterministic messages with every field of an op's table, for
 * the tests, baton-proto-tool and the fuzzer's seeds. Values are chosen to
 * exercise the encodings: 64-bit integers above 2^32, negative i32, UTF-8,
 * non-integral floats.
 */
#include <stdio.h>
#include <string.h>

#include "proto/proto_int.h"

static const char *const sample_str[PF_COUNT] = {
#define SSTR(e, k, t, member, lim) [PF_##e] = "sample " k " \xc3\xa9\xe2\x82\xac",
	PROTO_FIELDS(SSTR)
#undef SSTR
};

static const float sample_f32[8] = { 0.0f, 1.0f, -1.5f, 3.25f, 1e-3f, -7.0f, 65504.0f, 0.5f };

static const struct proto_gpu sample_gpus[2] = {
	{ "GPU-00000000-1111-2222-3333-444444444444", UINT64_C(150) << 30,
	  UINT64_C(100) << 30, UINT64_C(1) << 30, UINT64_C(40) << 30, UINT64_C(8) << 30,
	  0, "NVIDIA H200", UINT64_C(3) << 30 },
	{ "GPU-55555555-6666-7777-8888-999999999999", UINT64_C(80) << 30,
	  UINT64_C(80) << 30, 0, 0, 0, 1, "NVIDIA H100 80GB HBM3", 0 },
};

static const struct proto_engine_info sample_engines[2] = {
	{ "qwen", 4242, "GPU-00000000-1111-2222-3333-444444444444", "qwen3-moe", "ready",
	  UINT64_C(30) << 30, UINT64_C(2) << 30, UINT64_C(60) << 30, 10, true, 1500, 24.5,
	  "GPU-55555555-6666-7777-8888-999999999999", UINT64_C(8) << 30, 123456, "ipc:///run/baton/engine-qwen.sock",
	  UINT64_C(3) << 30, UINT64_C(8) << 30, 300000, "http://127.0.0.1:8000", UINT64_C(3) << 30, 40960, 32768, 7, UINT64_C(1) << 30, 12, 64 },
	{ "mixtral", 4343, "GPU-00000000-1111-2222-3333-444444444444", "mixtral", "released",
	  0, 0, UINT64_C(40) << 30, -3, false, 98765, 0.0, "", 0, 0, "tcp://127.0.0.1:9001", 0, 0, 0, "", 0, 0, 0, 0, 0, 0, 0 },
};

static void fill(struct baton_msg *m, const struct proto__fdef *f)
{
	void *dst = (char *)m + f->off;
	uint64_t k = (uint64_t)f->bit;
	switch (f->type) {
	case PT_BOOL: *(bool *)dst = true; break;
	case PT_U32: *(uint32_t *)dst = 1000u + (uint32_t)k; break;
	case PT_U64: *(uint64_t *)dst = (UINT64_C(1) << 40) + k * 977; break;
	case PT_RESERVE: *(uint64_t *)dst = 512; break;
	case PT_I32: *(int32_t *)dst = -5 - (int32_t)k; break;
	case PT_F64: *(double *)dst = 1.25 + (double)k / 8; break;
	case PT_STR: *(const char **)dst = sample_str[k]; break;
	case PT_BIN: {
		struct proto_bin *b = dst;
		b->data = sample_f32;
		b->len = sizeof sample_f32;
		break;
	}
	case PT_GPUS: {
		struct proto_gpus *a = dst;
		a->v = sample_gpus;
		a->n = 2;
		break;
	}
	case PT_ENGINES: {
		struct proto_engines *a = dst;
		a->v = sample_engines;
		a->n = 2;
		break;
	}
	}
}

void proto__sample(struct baton_msg *m, enum proto_op op, int kind)
{
	memset(m, 0, sizeof *m);
	m->op = op;
	m->id = UINT64_C(0x1000000000) + (uint64_t)op;
	if (kind == 2) {
		m->reply = true;
		m->ok = false;
		m->err = BATON_EBUSY;
		m->msg = "sample error: engine is busy \xe2\x80\x94 try again";
		return;
	}
	m->reply = kind == 1 && op != PROTO_OP_EVENT;
	m->ok = m->reply;
	const struct proto__table *t = proto__table(op, m->reply);
	for (size_t j = 0; t && j < t->n; j++) {
		fill(m, t->rows[j].f);
		proto_set(m, (enum proto_field)t->rows[j].f->bit);
	}
}

static bool value_equal(const struct proto__fdef *f, const void *a, const void *b,
    const char *path, char *why, size_t whylen);

static bool items_equal(const struct proto__item *it, const char *a, const char *b,
    uint32_t n, const char *path, char *why, size_t whylen)
{
	for (uint32_t i = 0; i < n; i++)
		for (size_t j = 0; j < it->n; j++) {
			char sub[96];
			snprintf(sub, sizeof sub, "%s[%u].%s", path, i, it->fields[j].key);
			if (!value_equal(&it->fields[j], a + (size_t)i * it->size,
			    b + (size_t)i * it->size, sub, why, whylen))
				return false;
		}
	return true;
}

static bool value_equal(const struct proto__fdef *f, const void *abase, const void *bbase,
    const char *path, char *why, size_t whylen)
{
	const char *a = (const char *)abase + f->off, *b = (const char *)bbase + f->off;
	bool eq = true;
	switch (f->type) {
	case PT_BOOL: eq = *(const bool *)a == *(const bool *)b; break;
	case PT_U32: eq = *(const uint32_t *)a == *(const uint32_t *)b; break;
	case PT_U64:
	case PT_RESERVE: eq = *(const uint64_t *)a == *(const uint64_t *)b; break;
	case PT_I32: eq = *(const int32_t *)a == *(const int32_t *)b; break;
	case PT_F64: eq = memcmp(a, b, sizeof(double)) == 0; break;
	case PT_STR: {
		const char *x = *(const char *const *)a, *y = *(const char *const *)b;
		eq = (!x && !y) || (x && y && strcmp(x, y) == 0);
		break;
	}
	case PT_BIN: {
		const struct proto_bin *x = (const void *)a, *y = (const void *)b;
		eq = x->len == y->len && (x->len == 0 || memcmp(x->data, y->data, x->len) == 0);
		break;
	}
	case PT_GPUS:
	case PT_ENGINES: {
		const struct proto_gpus *x = (const void *)a, *y = (const void *)b;
		if (x->n != y->n) {
			eq = false;
			break;
		}
		return items_equal(proto__item_of(f->type), (const char *)x->v,
		    (const char *)y->v, x->n, path, why, whylen);
	}
	}
	if (!eq && why)
		snprintf(why, whylen, "field '%s' differs", path);
	return eq;
}

bool proto__msg_equal(const struct baton_msg *a, const struct baton_msg *b,
    char *why, size_t whylen)
{
	if (a->op != b->op || a->id != b->id || a->reply != b->reply || a->ok != b->ok ||
	    a->err != b->err) {
		if (why)
			snprintf(why, whylen, "envelope differs (op %d/%d id %llu/%llu)",
			    (int)a->op, (int)b->op, (unsigned long long)a->id,
			    (unsigned long long)b->id);
		return false;
	}
	if (a->reply && !a->ok) {
		const char *x = a->msg ? a->msg : "", *y = b->msg ? b->msg : "";
		if (strcmp(x, y) != 0) {
			if (why)
				snprintf(why, whylen, "msg differs");
			return false;
		}
	}
	if (memcmp(a->has, b->has, sizeof a->has) != 0) {
		if (why)
			snprintf(why, whylen, "presence bits differ");
		return false;
	}
	for (int f = 0; f < PF_COUNT; f++)
		if (proto_has(a, (enum proto_field)f) &&
		    !value_equal(&proto__fields[f], a, b, proto__fields[f].key, why, whylen))
			return false;
	return true;
}
