/*
 * park_test.c: parking's rules with a fake CUDA driver (park.h): the
 * order of the driver's calls, a refusal left running and unlocked with
 * the driver's reason, a resume never without a grant, and the policy's
 * choice among external engines that park (policy_decide with the view
 * the broker builds for them: all or nothing, never shrunk).
 */
#include <stdio.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/park.h"
#include "tests/t.h"

#define M (1024ull * 1024ull)

struct fake {
	int state;
	int fail_lock, fail_checkpoint, fail_restore, fail_state;
	char calls[256];
};

static void note(struct fake *f, const char *what)
{
	size_t l = strlen(f->calls);
	snprintf(f->calls + l, sizeof f->calls - l, "%s%s", l ? " " : "", what);
}

static int f_get_state(void *ctx, int pid, int *st)
{
	struct fake *f = ctx;
	(void)pid;
	note(f, "state");
	if (f->fail_state)
		return f->fail_state;
	*st = f->state;
	return 0;
}

static int f_lock(void *ctx, int pid, unsigned timeout_ms)
{
	struct fake *f = ctx;
	(void)pid;
	(void)timeout_ms;
	note(f, "lock");
	if (f->fail_lock)
		return f->fail_lock;
	f->state = PARK_LOCKED;
	return 0;
}

static int f_checkpoint(void *ctx, int pid)
{
	struct fake *f = ctx;
	(void)pid;
	note(f, "checkpoint");
	if (f->fail_checkpoint)
		return f->fail_checkpoint;
	f->state = PARK_CHECKPOINTED;
	return 0;
}

static int f_restore(void *ctx, int pid)
{
	struct fake *f = ctx;
	(void)pid;
	note(f, "restore");
	if (f->fail_restore)
		return f->fail_restore;
	f->state = PARK_LOCKED;
	return 0;
}

static int f_unlock(void *ctx, int pid)
{
	struct fake *f = ctx;
	(void)pid;
	note(f, "unlock");
	f->state = PARK_RUNNING;
	return 0;
}

static const char *f_reason(void *ctx, int rc)
{
	(void)ctx;
	return rc == 801 ? "operation not supported" : rc == 2 ? "out of memory" : "other";
}

static struct park_driver drv(struct fake *f)
{
	return (struct park_driver){ f_get_state, f_lock, f_checkpoint, f_restore, f_unlock, f_reason, f };
}

static void t_park_and_resume(void)
{
	struct fake f = { .state = PARK_RUNNING };
	struct park_driver d = drv(&f);
	char why[300];
	T_OK(park_process(&d, 42, 1000, why, sizeof why));
	T_EQ_STR(f.calls, "state lock checkpoint");
	T_EQ_INT(f.state, PARK_CHECKPOINTED);
	f.calls[0] = 0;
	T_OK(park_resume(&d, 42, 16 * M, 16 * M, why, sizeof why));
	T_EQ_STR(f.calls, "state restore unlock");
	T_EQ_INT(f.state, PARK_RUNNING);
}

static void t_refusals_leave_it_running(void)
{
	char why[300];
	/* a process the driver cannot checkpoint (several GPUs, IPC, managed
	 * memory...): unlocked, running, the driver's words in the reason */
	struct fake f = { .state = PARK_RUNNING, .fail_checkpoint = 801 };
	struct park_driver d = drv(&f);
	T_EQ_ERR(park_process(&d, 7, 1000, why, sizeof why), BATON_EDRIVER);
	T_EQ_STR(f.calls, "state lock checkpoint unlock");
	T_EQ_INT(f.state, PARK_RUNNING);
	T_ASSERT(strstr(why, "operation not supported (801)") && strstr(why, "left running"));
	/* a lock refused: nothing else is called */
	struct fake g = { .state = PARK_RUNNING, .fail_lock = 801 };
	d = drv(&g);
	T_EQ_ERR(park_process(&d, 7, 1000, why, sizeof why), BATON_EDRIVER);
	T_EQ_STR(g.calls, "state lock");
	/* not running (parked already, or failed): not touched */
	struct fake h = { .state = PARK_CHECKPOINTED };
	d = drv(&h);
	T_EQ_ERR(park_process(&d, 7, 1000, why, sizeof why), BATON_ESTATE);
	T_EQ_STR(h.calls, "state");
	T_ASSERT(strstr(why, "checkpointed, not running") != NULL);
	struct fake s = { .fail_state = 3 };
	d = drv(&s);
	T_EQ_ERR(park_process(&d, 7, 1000, why, sizeof why), BATON_EDRIVER);
}

static void t_never_resume_without_grant(void)
{
	char why[300];
	struct fake f = { .state = PARK_CHECKPOINTED };
	struct park_driver d = drv(&f);
	T_ASSERT(!park_may_resume(0, 16 * M));
	T_ASSERT(!park_may_resume(16 * M - 1, 16 * M));
	T_ASSERT(!park_may_resume(16 * M, 0)); /* nothing known to restore: not blindly */
	T_ASSERT(park_may_resume(16 * M, 16 * M));
	T_EQ_ERR(park_resume(&d, 9, 8 * M, 16 * M, why, sizeof why), BATON_EDEVMEM);
	T_EQ_STR(f.calls, ""); /* not one driver call */
	T_EQ_INT(f.state, PARK_CHECKPOINTED);
	T_ASSERT(strstr(why, "stays parked") != NULL);
	/* a restore that fails leaves it checkpointed, never unlocked half-way */
	f.fail_restore = 2;
	T_EQ_ERR(park_resume(&d, 9, 16 * M, 16 * M, why, sizeof why), BATON_EDRIVER);
	T_EQ_STR(f.calls, "state restore");
	T_ASSERT(strstr(why, "out of memory") && strstr(why, "stays checkpointed"));
	/* not parked: not restored */
	struct fake g = { .state = PARK_RUNNING };
	d = drv(&g);
	T_EQ_ERR(park_resume(&d, 9, 16 * M, 16 * M, why, sizeof why), BATON_ESTATE);
	T_EQ_STR(g.calls, "state");
}

/* External engines as schedule.c's policy_view shows them: never shrunk
 * (no_shrink), pinned when configured so, busy never known (the broker
 * does not see their requests), idle since their last hook. */
static void t_policy_parks_lowest_priority_idle(void)
{
	struct policy_engine pe[5] = {
		{ .name = "comfy", .held = 16 * M, .priority = 5, .idle_s = 100, .no_shrink = true },
		{ .name = "train", .held = 16 * M, .priority = 1, .idle_s = 10, .no_shrink = true },
		{ .name = "vllm", .held = 16 * M, .priority = 0, .idle_s = 50, .no_shrink = true, .pinned = true },
		{ .name = "llama", .held = 16 * M, .priority = 1, .idle_s = 20, .no_shrink = true, .in_flight = true },
		{ .name = "qwen", .held = 0, .priority = 3, .idle_s = 0 },
	};
	struct policy_plan plan;
	policy_decide(pe, 5, 4, 8 * M, &plan);
	T_EQ_INT(plan.n, 1);
	T_EQ_STR(pe[plan.act[0].engine].name, "train"); /* lowest priority that may go */
	T_EQ_INT(plan.act[0].kind, POLICY_RELEASE);      /* all of it: a park */
	T_EQ_INT(plan.act[0].bytes, 16 * M);
	/* more than one holds: the next lowest, never the pinned one */
	policy_decide(pe, 5, 4, 24 * M, &plan);
	T_EQ_INT(plan.n, 2);
	T_EQ_STR(pe[plan.act[1].engine].name, "comfy");
	policy_decide(pe, 5, 4, 40 * M, &plan);
	T_EQ_INT(plan.n, 0);
	T_EQ_INT(plan.blocked, POLICY_SHORT);
}

T_MAIN(T_CASE(t_park_and_resume), T_CASE(t_refusals_leave_it_running), T_CASE(t_never_resume_without_grant),
    T_CASE(t_policy_parks_lowest_priority_idle))
