/*
 * policy_test.c: door_policy() from a table. Each row: the engines
 * of one device (queued, oldest wait, in flight, ready, fits), the
 * device (holder, held for, quantum, switch under way, its target and
 * the engine switched out), and what must come out: which engines take
 * requests ("01" per engine) and the engine to switch to (-1: none).
 */
#include "broker/door/door_int.h"
#include "tests/t.h"

struct row {
	const char *what;
	struct door_pe e[4];
	size_t n;
	struct door_pdev d;
	const char *flow;
	int switch_to;
};

/* e: queued, oldest_s, inflight, ready, fits */
static const struct row rows[] = {
	{ "nothing to do: the resident model flows",
	  { { 0, 0, 0, true, false }, { 0, 0, 0, false, false } }, 2,
	  { .holder = 0, .held_s = 1, .quantum_s = 5, .target = -1, .from = -1 }, "10", -1 },
	{ "both resident (they fit together): both flow, no switch",
	  { { 2, 0.1, 1, true, false }, { 3, 0.2, 1, true, false } }, 2,
	  { .holder = 0, .held_s = 9, .quantum_s = 5, .target = -1, .from = -1 }, "11", -1 },
	{ "a released model that fits is refilled at once, the holder keeps flowing",
	  { { 0, 0, 2, true, false }, { 1, 0.3, 0, false, true } }, 2,
	  { .holder = 0, .held_s = 1, .quantum_s = 5, .target = -1, .from = -1 }, "10", 1 },
	{ "the holder is busy within its quantum: the other waits",
	  { { 0, 0, 3, true, false }, { 4, 2.0, 0, false, false } }, 2,
	  { .holder = 0, .held_s = 1, .quantum_s = 5, .target = -1, .from = -1 }, "10", -1 },
	{ "the holder's quantum is spent while another waits: switch",
	  { { 0, 0, 3, true, false }, { 4, 2.0, 0, false, false } }, 2,
	  { .holder = 0, .held_s = 6, .quantum_s = 5, .target = -1, .from = -1 }, "10", 1 },
	{ "an idle holder gives way at once (keep-alive yields to need)",
	  { { 0, 0, 0, true, false }, { 1, 0.01, 0, false, false } }, 2,
	  { .holder = 0, .held_s = 0.1, .quantum_s = 5, .target = -1, .from = -1 }, "10", 1 },
	{ "no holder: the waiting model gets the device",
	  { { 0, 0, 0, false, false }, { 2, 0.5, 0, false, false } }, 2,
	  { .holder = -1, .quantum_s = 5, .target = -1, .from = -1 }, "00", 1 },
	{ "several wait: the one whose oldest request waited longest",
	  { { 0, 0, 1, true, false }, { 2, 0.5, 0, false, false }, { 1, 3.0, 0, false, false },
	    { 5, 1.0, 0, false, false } }, 4,
	  { .holder = 0, .held_s = 7, .quantum_s = 5, .target = -1, .from = -1 }, "1000", 2 },
	{ "during a switch the engine switched out takes nothing new, nor the target",
	  { { 3, 0.2, 2, true, false }, { 4, 2.0, 0, false, false } }, 2,
	  { .holder = 0, .held_s = 6, .quantum_s = 5, .switching = true, .target = 1, .from = 0 }, "00", -1 },
	{ "during a refill that evicts nobody the holder keeps flowing",
	  { { 0, 0, 2, true, false }, { 1, 0.3, 0, false, true } }, 2,
	  { .holder = 0, .held_s = 1, .quantum_s = 5, .switching = true, .target = 1, .from = -1 }, "10", -1 },
	{ "quantum 0: a waiting model switches in as soon as it waits",
	  { { 0, 0, 5, true, false }, { 1, 0.0, 0, false, false } }, 2,
	  { .holder = 0, .held_s = 0.001, .quantum_s = 0, .target = -1, .from = -1 }, "10", 1 },
	{ "the holder was released (keep-alive): a waiting model takes the device",
	  { { 0, 0, 0, false, false }, { 1, 0.1, 0, false, false } }, 2,
	  { .holder = 0, .held_s = 100, .quantum_s = 5, .target = -1, .from = -1 }, "00", 1 },
	{ "the released holder's own requests bring it back",
	  { { 2, 0.4, 0, false, false }, { 0, 0, 0, false, false } }, 2,
	  { .holder = 0, .held_s = 100, .quantum_s = 5, .target = -1, .from = -1 }, "00", 0 },
};

static void t_table(void)
{
	int bad = 0;
	for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
		const struct row *w = &rows[r];
		bool flow[4];
		int sw = -2;
		door_policy(w->e, w->n, &w->d, flow, &sw);
		char got[5] = { 0 };
		for (size_t i = 0; i < w->n; i++)
			got[i] = flow[i] ? '1' : '0';
		if (strcmp(got, w->flow) != 0 || sw != w->switch_to) {
			fprintf(stderr, "  %s: flow %s switch %d, want flow %s switch %d\n", w->what, got, sw, w->flow,
			    w->switch_to);
			bad++;
		}
	}
	T_EQ_INT(bad, 0);
}

/* Two models alternating from four clients: the device switches once per
 * batch, not once per request. A small simulation of the dispatch loop
 * (each request takes 1 s on its engine, a switch 0.5 s). */
static void t_batches_not_thrash(void)
{
	enum { CLIENTS = 4, PER = 5 };
	int next_model[CLIENTS], left[CLIENTS];
	double busy_until[CLIENTS];
	int state[CLIENTS]; /* 0 queued, 1 running */
	for (int c = 0; c < CLIENTS; c++) {
		next_model[c] = c % 2;
		left[c] = PER;
		busy_until[c] = 0;
		state[c] = 0;
	}
	struct door_pdev d = { .holder = -1, .quantum_s = 5, .target = -1, .from = -1 };
	double t = 0, holder_since = 0, switch_done = -1;
	int switches = 0, served = 0;
	bool ready[2] = { false, false };
	while (served < CLIENTS * PER && t < 1000) {
		/* requests that ended */
		for (int c = 0; c < CLIENTS; c++)
			if (state[c] == 1 && busy_until[c] <= t) {
				served++;
				left[c]--;
				next_model[c] ^= 1;
				state[c] = left[c] > 0 ? 0 : 2;
			}
		if (switch_done >= 0 && t >= switch_done) {
			ready[d.from >= 0 ? d.from : 1 - d.target] = false;
			ready[d.target] = true;
			if (d.from >= 0)
				switches++;
			d.holder = d.target;
			holder_since = t;
			d.switching = false;
			d.target = d.from = -1;
			switch_done = -1;
		}
		struct door_pe e[2] = { 0 };
		for (int m = 0; m < 2; m++) {
			e[m].ready = ready[m];
			for (int c = 0; c < CLIENTS; c++) {
				if (next_model[c] != m)
					continue;
				e[m].queued += state[c] == 0;
				e[m].inflight += state[c] == 1;
				if (state[c] == 0)
					e[m].oldest_s = 1; /* order does not matter with two */
			}
		}
		d.held_s = t - holder_since;
		bool flow[2];
		int sw;
		door_policy(e, 2, &d, flow, &sw);
		for (int c = 0; c < CLIENTS; c++)
			if (state[c] == 0 && flow[next_model[c]]) {
				state[c] = 1;
				busy_until[c] = t + 1;
			}
		if (d.switching && switch_done < 0 && (d.from < 0 || e[d.from].inflight == 0))
			switch_done = t + 0.5;
		if (sw >= 0 && !d.switching) {
			d.switching = true;
			d.target = sw;
			d.from = d.holder >= 0 && ready[d.holder] ? d.holder : -1;
		}
		t += 0.05;
	}
	T_EQ_INT(served, CLIENTS * PER);
	/* first come first served would switch about once per request (20) */
	T_ASSERT_MSG(switches <= 6, "%d switches for %d requests", switches, served);
	T_ASSERT_MSG(switches >= 2, "%d switches: both models must have been served in turn", switches);
}

T_MAIN(T_CASE(t_table), T_CASE(t_batches_not_thrash))
