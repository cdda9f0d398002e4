/*
 * policy_test.c: policy_decide() from tables. Each row: the engines of one
 * device (name held floor priority idle busy flags), who asks, how much,
 * and the exact plan expected ("a:release b:shrink=4" in order), or the
 * reason nothing is taken.
 */
#include "broker/broker.h"
#include "tests/t.h"

#define M (1024ull * 1024ull)

enum {
	PIN = 1, DEAD = 2, FLIGHT = 4, GRANT = 8, NOSHRINK = 16, BUSY = 32,
};

struct erow {
	const char *name;
	uint64_t held_mib, floor_mib;
	int32_t prio;
	double idle_s;
	int flags;
};

struct row {
	const char *what;
	struct erow e[8];
	const char *requester;  /* NULL: an operator */
	uint64_t need_mib;
	const char *want;       /* the plan, or "" for none */
	enum policy_block blocked;
};

static const struct row rows[] = {
	{ "lowest priority goes first",
	  { { "a", 24, 4, 5, 10, 0 }, { "b", 24, 4, 1, 1, 0 }, { "c", 0, 4, 0, 0, 0 } },
	  "c", 24, "b:release", POLICY_OK },
	{ "same priority: longest idle first",
	  { { "a", 24, 4, 1, 3, 0 }, { "b", 24, 4, 1, 9, 0 }, { "c", 0, 4, 0, 0, 0 } },
	  "c", 24, "b:release", POLICY_OK },
	{ "same priority and idle: by name",
	  { { "b", 24, 4, 1, 3, 0 }, { "a", 24, 4, 1, 3, 0 }, { "c", 0, 4, 0, 0, 0 } },
	  "c", 24, "a:release", POLICY_OK },
	{ "a shrink is enough",
	  { { "a", 24, 4, 1, 3, 0 }, { "c", 0, 4, 0, 0, 0 } },
	  "c", 8, "a:shrink=8", POLICY_OK },
	{ "a shrink would go below the floor: release",
	  { { "a", 24, 20, 1, 3, 0 }, { "c", 0, 4, 0, 0, 0 } },
	  "c", 8, "a:release", POLICY_OK },
	{ "not elastic: release instead of shrink",
	  { { "a", 24, 4, 1, 3, NOSHRINK }, { "c", 0, 4, 0, 0, 0 } },
	  "c", 8, "a:release", POLICY_OK },
	{ "needs all it holds: release, not a shrink to zero",
	  { { "a", 24, 0, 1, 3, 0 }, { "c", 0, 4, 0, 0, 0 } },
	  "c", 24, "a:release", POLICY_OK },
	{ "two victims: the first released, the second shrunk",
	  { { "a", 16, 4, 1, 3, 0 }, { "b", 16, 4, 2, 3, 0 }, { "c", 0, 4, 9, 0, 0 } },
	  "c", 24, "a:release b:shrink=8", POLICY_OK },
	{ "pinned engines are never taken",
	  { { "a", 24, 4, 0, 99, PIN }, { "b", 24, 4, 5, 1, 0 }, { "c", 0, 4, 9, 0, 0 } },
	  "c", 24, "b:release", POLICY_OK },
	{ "only pinned: nothing",
	  { { "a", 24, 4, 0, 99, PIN }, { "c", 0, 4, 9, 0, 0 } },
	  "c", 24, "", POLICY_NOTHING },
	{ "idle before busy, whatever the priority",
	  { { "a", 24, 4, 0, 0, BUSY }, { "b", 24, 4, 5, 1, 0 }, { "c", 0, 4, 9, 0, 0 } },
	  "c", 24, "b:release", POLICY_OK },
	{ "busy of no higher priority: asked (it gives way between requests)",
	  { { "a", 24, 4, 3, 0, BUSY }, { "c", 0, 4, 3, 0, 0 } },
	  "c", 24, "a:release", POLICY_OK },
	{ "busy of higher priority: never",
	  { { "a", 24, 4, 5, 0, BUSY }, { "c", 0, 4, 3, 0, 0 } },
	  "c", 24, "", POLICY_NOTHING },
	{ "a command in flight: skipped",
	  { { "a", 24, 4, 1, 5, FLIGHT }, { "b", 24, 4, 2, 5, 0 }, { "c", 0, 4, 3, 0, 0 } },
	  "c", 24, "b:release", POLICY_OK },
	{ "an unused grant is not taken back",
	  { { "a", 24, 4, 1, 5, GRANT }, { "c", 0, 4, 3, 0, 0 } },
	  "c", 24, "", POLICY_NOTHING },
	{ "dead engines hold nothing",
	  { { "a", 24, 4, 1, 5, DEAD }, { "c", 0, 4, 3, 0, 0 } },
	  "c", 24, "", POLICY_NOTHING },
	{ "never the requester itself",
	  { { "c", 12, 4, 1, 5, 0 }, { "a", 24, 4, 9, 5, 0 } },
	  "c", 12, "a:shrink=12", POLICY_OK },
	{ "not enough in all candidates: take nothing",
	  { { "a", 8, 4, 1, 5, 0 }, { "b", 8, 4, 1, 5, PIN }, { "c", 0, 4, 3, 0, 0 } },
	  "c", 24, "", POLICY_SHORT },
	{ "an operator's refill (no requester): busy engines asked too",
	  { { "a", 24, 4, 100, 0, BUSY }, { "b", 0, 4, 0, 0, 0 } },
	  NULL, 24, "a:release", POLICY_OK },
	{ "nothing needed: empty plan",
	  { { "a", 24, 4, 1, 5, 0 }, { "c", 0, 4, 3, 0, 0 } },
	  "c", 0, "", POLICY_OK },
};

static void plan_text(const struct policy_engine *pe, const struct policy_plan *p, char *buf, size_t len)
{
	size_t off = 0;
	buf[0] = 0;
	for (size_t i = 0; i < p->n; i++) {
		const struct policy_action *a = &p->act[i];
		if (a->kind == POLICY_SHRINK)
			off += (size_t)snprintf(buf + off, len - off, "%s%s:shrink=%llu", i ? " " : "",
			    pe[a->engine].name, (unsigned long long)(a->bytes / M));
		else
			off += (size_t)snprintf(buf + off, len - off, "%s%s:release", i ? " " : "",
			    pe[a->engine].name);
	}
}

static void t_table(void)
{
	for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
		const struct row *row = &rows[r];
		struct policy_engine pe[8];
		size_t n = 0, req = (size_t)-1;
		for (; n < 8 && row->e[n].name; n++) {
			const struct erow *x = &row->e[n];
			pe[n] = (struct policy_engine){
				.name = x->name, .held = x->held_mib * M, .floor = x->floor_mib * M,
				.priority = x->prio, .idle_s = x->idle_s, .busy = x->flags & BUSY,
				.pinned = x->flags & PIN, .dead = x->flags & DEAD, .in_flight = x->flags & FLIGHT,
				.granted = x->flags & GRANT, .no_shrink = x->flags & NOSHRINK,
			};
			if (row->requester && strcmp(row->requester, x->name) == 0)
				req = n;
		}
		struct policy_plan plan;
		policy_decide(pe, n, req, row->need_mib * M, &plan);
		char got[256];
		plan_text(pe, &plan, got, sizeof got);
		T_ASSERT_MSG(strcmp(got, row->want) == 0, "%s: plan \"%s\", want \"%s\"", row->what, got,
		    row->want);
		T_ASSERT_MSG(plan.blocked == row->blocked, "%s: blocked %d, want %d", row->what,
		    (int)plan.blocked, (int)row->blocked);
		if (plan.n) {
			T_ASSERT_MSG(plan.freed >= row->need_mib * M, "%s: frees %llu < need", row->what,
			    (unsigned long long)plan.freed);
		}
	}
}

/* The order alone, and the reasons counted for the error text. */
static void t_order_and_reasons(void)
{
	struct policy_engine pe[] = {
		{ .name = "x", .held = 8 * M, .priority = 2, .idle_s = 1 },
		{ .name = "y", .held = 8 * M, .priority = 1, .idle_s = 1, .busy = true },
		{ .name = "z", .held = 8 * M, .priority = 1, .idle_s = 7 },
		{ .name = "p", .held = 8 * M, .pinned = true },
		{ .name = "f", .held = 8 * M, .in_flight = true },
		{ .name = "r", .held = 0, .priority = 5 },
	};
	size_t idx[8];
	size_t k = policy_order(pe, 6, 5, idx);
	T_EQ_INT(k, 3);
	T_EQ_STR(pe[idx[0]].name, "z");
	T_EQ_STR(pe[idx[1]].name, "x");
	T_EQ_STR(pe[idx[2]].name, "y");
	struct policy_plan plan;
	policy_decide(pe, 6, 5, 100 * M, &plan);
	T_EQ_INT(plan.n, 0);
	T_EQ_INT(plan.blocked, POLICY_SHORT);
	T_EQ_INT(plan.skipped_pinned, 1);
	T_EQ_INT(plan.skipped_in_flight, 1);
	/* The busy engine of priority 1 is skipped for a requester of priority 0. */
	pe[5].priority = 0;
	policy_decide(pe, 6, 5, 100 * M, &plan);
	T_EQ_INT(plan.skipped_busy, 1);
	/* One that is refilling (or holds a grant) is counted as such. */
	pe[4].in_flight = false;
	pe[4].refilling = true;
	policy_decide(pe, 6, 5, 100 * M, &plan);
	T_EQ_INT(plan.skipped_in_flight, 0);
	T_EQ_INT(plan.skipped_refilling, 1);
	pe[4].refilling = false;
	pe[4].granted = true;
	policy_decide(pe, 6, 5, 100 * M, &plan);
	T_EQ_INT(plan.skipped_refilling, 1);
}

T_MAIN(T_CASE(t_table), T_CASE(t_order_and_reasons))
