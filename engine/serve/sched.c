/*
 * sched.c: continuous batching (see sched.h). One thread owns the model;
 * the lock guards the queue, the running table's membership and the
 * stats. A step is built and run without the lock, so submit and cancel
 * never wait behind a forward pass.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/model/model.h"
#include "engine/serve/sched.h"
#include "proto/base/base.h"

struct job {
	struct job *next;               /* the waiting queue, or the done list */
	uint64_t id;
	const struct baton_gen_request *req;
	struct sched_cb cb;
	struct baton_gen_seq *gs;       /* after generator_start (on the thread) */
	struct baton_seq *ks;           /* after admission */
	const uint32_t *prompt;         /* what prefill feeds: the request's prompt, or resume */
	uint32_t n_prompt, fed;         /* prompt tokens, those in the KV cache */
	uint32_t cached;                /* of the prompt, taken from the prefix cache (first lookup) */
	int looked;                     /* cached is set */
	/* Following (n > 1, or prompts that share a start, admitted while
	 * another reads it): job `lead` reads the start both share; this one
	 * waits, its sequence empty, until lead's KV holds positions
	 * [0, lead_to) (they are then in the prefix cache), lead decodes or
	 * leaves the running table, then takes them from the cache and reads
	 * only the rest. 0: not following. */
	uint64_t lead;
	uint32_t lead_to;
	uint32_t next_tok;              /* to decode next, once decoding */
	int decoding;
	int begun;                      /* generator_seq_begin and on_admit ran (first admission) */
	/* Preemption by recompute: the tokens sampled so far (the last is
	 * next_tok while decoding); a preempted job's prefill feeds its
	 * prompt and all of them but the last (resume), then decodes on from
	 * that last one (resuming) without sampling in between. */
	const uint32_t *orig;           /* the request's prompt (the generator's) */
	uint32_t n_orig;
	uint32_t *out, n_out, cap_out;
	uint32_t *resume;
	int resuming;
	atomic_int cancel;
	int rc;                         /* for the done list */
	char err[400];
	struct baton_gen_result res;
};

struct baton_sched {
	struct baton_generator *g;
	struct baton_model *m;
	struct sched_opts o;
	struct sched_hooks h;
	uint32_t vocab;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t th;
	int started, stopping;
	struct job *wait_head, *wait_tail;
	uint32_t n_wait;
	struct job **run;               /* max_seqs, in admission order */
	uint32_t n_run;
	uint64_t next_id;
	struct sched_stats st;
	float *logits;                  /* max_seqs * vocab */
	struct baton_step_item *items;  /* max_seqs */
	struct job **item_job;
	/* BATON_SCHED_TIMING=1: where the decode steps' time goes, on stderr
	 * every 32 of them (model_step, its waits for the device, head()'s
	 * share, the sampling after it) */
	/* BATON_SCHED_SAMPLERS=N (opt-in, N > 1): a step's sequences are
	 * picked (generator_seq_pick) on N threads, this one and N - 1 of the
	 * pool; their tokens taken in order here as before */
	uint32_t samplers;
	pthread_t *pool;
	uint32_t n_pool;
	pthread_mutex_t pk_mu;
	pthread_cond_t pk_go, pk_done;
	uint64_t pk_gen;
	uint32_t pk_active, pk_n;
	int pk_stop, pk_init;
	atomic_uint pk_next;
	uint32_t *pk_idx;   /* max_seqs: the items to pick */
	int *pick_on, *pick_rc; /* max_seqs: picked this step; its code */
	char *pick_err;     /* max_seqs x PICK_ERR */
	int timing;
	uint64_t tm_steps, tm_rows;
	double tm_model, tm_sample, tm_wait, tm_sync, tm_copy;
};

static void job_free(struct job *j, struct baton_model *m)
{
	model_seq_close(m, j->ks);
	generator_seq_free(j->gs);
	generator_result_free(&j->res);
	free(j->out);
	free(j->resume);
	free(j);
}

/* Calls on_done for a list of ended jobs and frees them (no lock held). */
static void deliver(struct baton_sched *s, struct job *list)
{
	while (list) {
		struct job *j = list;
		list = j->next;
		/* blocks go back before the client hears: a status after the
		 * answer sees them free, and the prefix cache's counts with
		 * them (a held block just let go of is evictable now) */
		model_seq_close(s->m, j->ks);
		j->ks = NULL;
		pthread_mutex_lock(&s->mu);
		s->st.kv_free = model_kv_free_blocks(s->m);
		model_prefix_stats(s->m, &s->st.prefix);
		pthread_mutex_unlock(&s->mu);
		if (!j->rc)
			j->res.n_cached = j->cached;
		j->cb.on_done(j->cb.arg, j->rc, j->err, j->rc ? NULL : &j->res);
		memset(&j->res, 0, sizeof j->res); /* the callee's now */
		job_free(j, s->m);
	}
}

static void end_job(struct job **list, struct job *j, int rc, const char *err)
{
	j->rc = rc;
	if (rc)
		snprintf(j->err, sizeof j->err, "%s", err ? err : baton_strerror(rc));
	j->next = *list;
	*list = j;
}

/* The running job j ended (answer or error): out of the table. Lock held. */
static void unrun(struct baton_sched *s, struct job *j)
{
	for (uint32_t i = 0; i < s->n_run; i++)
		if (s->run[i] == j) {
			memmove(s->run + i, s->run + i + 1, (s->n_run - i - 1) * sizeof *s->run);
			s->n_run--;
			return;
		}
}

/* Blocks the running jobs may still take: each up to its prompt plus
 * max_tokens - 1 positions (the last sampled token is never fed). */
static uint32_t want_blocks(struct baton_sched *s, const struct job *j, const struct baton_seq *ks)
{
	uint32_t total = j->n_prompt + generator_seq_max_tokens(j->gs) - 1;
	if (!ks) /* not open yet: from nothing */
		return (total + BATON_KV_BLOCK - 1) / BATON_KV_BLOCK;
	uint32_t pos = model_seq_pos(ks);
	return total > pos ? model_seq_blocks_needed(s->m, ks, total - pos) : 0;
}

/* Blocks a job takes to read the rest of its prompt and decode one token:
 * what admission holds room for (issue 28: reserving prompt + max_tokens
 * let one long request keep the pool from everyone; blocks are now taken
 * as tokens appear, and a pool that runs out preempts, see step). */
static uint32_t near_blocks(struct baton_sched *s, const struct job *j)
{
	if (!j->ks)
		return (j->n_prompt + 1 + BATON_KV_BLOCK - 1) / BATON_KV_BLOCK;
	uint32_t more = j->decoding ? 1 : j->n_prompt - j->fed + 1;
	return model_seq_blocks_needed(s->m, j->ks, more);
}

/* Positions of whole blocks j may take from another running job r's
 * prompt, r reading it still: the blocks both prompts hold alike, never
 * j's last token (model_prefix_peek's rule). */
static uint32_t shared_blocks(const struct job *j, const struct job *r)
{
	uint32_t n = j->n_prompt ? j->n_prompt - 1 : 0, c = 0;
	if (n > r->n_prompt)
		n = r->n_prompt;
	while (c < n && j->prompt[c] == r->prompt[c])
		c++;
	return c / BATON_KV_BLOCK * BATON_KV_BLOCK;
}

/* j (just admitted, its sequence empty) follows the running job that is
 * reading the longest start of j's prompt past what the cache holds now
 * (hit), rather than read that start again beside it: 1 if it does. Only
 * when that start is at least half of what j would read (n > 1's copies:
 * all but the last block; a short system prompt before a longer message
 * is read beside it, in the same steps, not a step later) and with the
 * prefix cache on (it is how the blocks pass). Lock held. */
static int pick_lead(struct baton_sched *s, struct job *j, uint32_t hit)
{
	if (!s->st.prefix.enabled)
		return 0;
	struct job *best = NULL;
	uint32_t to = hit;
	for (uint32_t i = 0; i < s->n_run; i++) {
		struct job *r = s->run[i];
		if (r == j || r->decoding || r->lead)
			continue;
		uint32_t c = shared_blocks(j, r);
		if (c > to && c > r->fed) {
			best = r;
			to = c;
		}
	}
	if (!best || 2 * (uint64_t)(to - hit) < (uint64_t)(j->n_prompt - hit))
		return 0;
	j->lead = best->id;
	j->lead_to = to;
	s->st.followed++;
	return 1;
}

/* j takes the longest cached start of its prompt (its sequence empty):
 * the positions it need not read. Lock held. */
static void take_prefix(struct baton_sched *s, struct job *j)
{
	j->fed = model_seq_prefix(s->m, j->ks, j->prompt, j->n_prompt);
	if (!j->looked)
		j->cached = j->fed;
	j->looked = 1;
	s->st.cached_tokens += j->fed;
}

/* Followers whose lead has read what they wait for (or decodes, or left
 * the running table: ended, cancelled, preempted) take it from the cache
 * now. Lock held. */
static void follow(struct baton_sched *s)
{
	for (uint32_t i = 0; i < s->n_run; i++) {
		struct job *j = s->run[i];
		if (!j->lead)
			continue;
		const struct job *r = NULL;
		for (uint32_t k = 0; k < s->n_run && !r; k++)
			if (s->run[k]->id == j->lead)
				r = s->run[k];
		if (r && !r->decoding && r->fed < j->lead_to)
			continue;
		j->lead = 0;
		take_prefix(s, j);
	}
}

/* Admits waiting jobs while fewer than max_seqs run and the pool holds
 * the prompt of the next one besides what the running need next, with a
 * block of room for each running sequence (so a job admitted is not
 * preempted at once). First come first served: the head waits for
 * blocks, nobody passes it; a preempted job goes back to the head. Lock
 * held; drops it around generator_start (the tokenizer's work). */
static void admit(struct baton_sched *s, struct job **done, struct job **admitted)
{
	uint32_t outstanding = 0;
	for (uint32_t i = 0; i < s->n_run; i++)
		outstanding += near_blocks(s, s->run[i]);
	while (s->wait_head && s->n_run < s->o.max_seqs) {
		struct job *j = s->wait_head;
		if (!j->gs) {
			pthread_mutex_unlock(&s->mu);
			char err[400] = "";
			int rc = generator_start(s->g, j->req, &j->gs, err, sizeof err);
			pthread_mutex_lock(&s->mu);
			if (rc) {
				s->wait_head = j->next;
				if (!s->wait_head)
					s->wait_tail = NULL;
				s->n_wait--;
				end_job(done, j, rc, err);
				continue;
			}
			j->prompt = generator_seq_prompt(j->gs, &j->n_prompt);
			j->orig = j->prompt;
			j->n_orig = j->n_prompt;
		}
		/* a request that could not run alone in the whole pool is refused:
		 * so the oldest running sequence can always go on */
		uint32_t need = j->begun ? 0 : want_blocks(s, j, NULL), total = model_kv_blocks_total(s->m);
		uint32_t free_b = model_kv_free_blocks(s->m);
		if (need > total) {
			s->wait_head = j->next;
			if (!s->wait_head)
				s->wait_tail = NULL;
			s->n_wait--;
			char err[200];
			snprintf(err, sizeof err, "the request may need %u KV blocks (prompt %u + max_tokens %u "
			    "tokens); this engine's pool has %u (--kv-blocks)", need, j->n_prompt,
			    generator_seq_max_tokens(j->gs), total);
			end_job(done, j, BATON_ERANGE, err);
			continue;
		}
		/* the prefix cache holds the start of its prompt: only the rest
		 * is read (and taking those blocks makes them unevictable) */
		uint32_t unheld = 0, hit = model_prefix_peek(s->m, j->prompt, j->n_prompt, &unheld);
		need = near_blocks(s, j) - hit / BATON_KV_BLOCK;
		if (need > total)
			need = total; /* a prompt that fills the pool, max_tokens 1: the last token is never fed */
		if (outstanding + need + s->n_run + unheld > free_b)
			break; /* waits for blocks */
		struct baton_seq *ks;
		int rc = model_seq_open(s->m, &ks);
		if (rc)
			break; /* the model says no now: try at the next step */
		s->wait_head = j->next;
		if (!s->wait_head)
			s->wait_tail = NULL;
		s->n_wait--;
		j->ks = ks;
		j->fed = 0;
		s->st.prompt_tokens += j->n_prompt;
		if (!pick_lead(s, j, hit))
			take_prefix(s, j);
		j->next = *admitted;
		*admitted = j;
		s->run[s->n_run++] = j;
		outstanding += need;
		if (!j->begun)
			s->st.admitted++; /* a preempted one comes back uncounted */
	}
}

/* The running job j gives its blocks back and goes to the head of the
 * queue, to be read again from its tokens when it is admitted next
 * (recompute: vLLM's default preemption). Its generator (sampler, text
 * sent) is kept as it is. Lock held. */
static int preempt(struct baton_sched *s, struct job *j)
{
	uint32_t n = j->n_orig + (j->decoding && j->n_out ? j->n_out - 1 : 0);
	uint32_t *r = malloc((size_t)n * sizeof *r);
	if (!r)
		return BATON_ENOMEM;
	memcpy(r, j->orig, (size_t)j->n_orig * sizeof *r);
	if (j->decoding && j->n_out) {
		memcpy(r + j->n_orig, j->out, (size_t)(j->n_out - 1) * sizeof *r);
		j->resuming = 1; /* then decodes on from out[n_out - 1] */
	} else {
		j->resuming = 0; /* preempted in its prefill: it samples after it as before */
	}
	unrun(s, j);
	model_seq_close(s->m, j->ks);
	j->ks = NULL;
	free(j->resume);
	j->resume = r;
	j->prompt = r;
	j->n_prompt = n;
	j->fed = 0;
	j->decoding = 0;
	j->lead = 0;
	j->next = s->wait_head;
	s->wait_head = j;
	if (!s->wait_tail)
		s->wait_tail = j;
	s->n_wait++;
	s->st.preempted++;
	return 0;
}

/* Blocks the step of the items planned takes from the pool. */
static uint32_t step_blocks(struct baton_sched *s, uint32_t n)
{
	uint32_t need = 0;
	for (uint32_t i = 0; i < n; i++)
		need += model_seq_blocks_needed(s->m, s->items[i].seq, s->items[i].n);
	return need;
}

/* The step's items: one token of each decoding job, then the next chunks
 * of the prompts being read. The chunks fill what the decoding rows leave
 * of s->o.chunk (the model's rows a pass), so that a step is one pass, not
 * a full one and a small one (a pass reads every dense weight and its
 * experts again, and a few rows take the small passes' kernels); at least
 * half of it, so prompts go on however many sequences decode. */
static uint32_t plan(struct baton_sched *s)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < s->n_run; i++) {
		struct job *j = s->run[i];
		if (!j->decoding)
			continue;
		s->items[n] = (struct baton_step_item){ .seq = j->ks, .tokens = &j->next_tok, .n = 1 };
		s->item_job[n++] = j;
	}
	uint32_t budget = s->o.chunk >= 2 * n ? s->o.chunk - n : s->o.chunk / 2;
	for (uint32_t i = 0; i < s->n_run && budget; i++) {
		struct job *j = s->run[i];
		if (j->decoding || j->lead)
			continue; /* a follower waits for its lead's blocks */
		uint32_t k = j->n_prompt - j->fed;
		if (k > budget)
			k = budget;
		budget -= k;
		s->items[n] = (struct baton_step_item){ .seq = j->ks, .tokens = j->prompt + j->fed, .n = k };
		s->item_job[n++] = j;
	}
	return n;
}

/* The youngest running job but the oldest that holds or reads something
 * (a follower holds no block: preempting it frees none), or NULL. */
static struct job *victim(struct baton_sched *s)
{
	for (uint32_t i = s->n_run; i-- > 1;)
		if (!s->run[i]->lead)
			return s->run[i];
	return NULL;
}

#define PICK_ERR 400

static int pool_open(struct baton_sched *s);
static void pool_close(struct baton_sched *s);

/* Picks items pk_idx[k] until none is left (this thread or the pool's). */
static void run_picks(struct baton_sched *s)
{
	uint32_t k;
	while ((k = atomic_fetch_add(&s->pk_next, 1)) < s->pk_n) {
		const uint32_t i = s->pk_idx[k];
		s->pick_rc[i] = generator_seq_pick(s->item_job[i]->gs, s->logits + (size_t)i * s->vocab,
		    s->pick_err + (size_t)i * PICK_ERR, PICK_ERR);
	}
}

static void *pick_loop(void *arg)
{
	struct baton_sched *s = arg;
	uint64_t seen = 0;
	pthread_mutex_lock(&s->pk_mu);
	for (;;) {
		while (!s->pk_stop && s->pk_gen == seen)
			pthread_cond_wait(&s->pk_go, &s->pk_mu);
		if (s->pk_stop)
			break;
		seen = s->pk_gen;
		pthread_mutex_unlock(&s->pk_mu);
		run_picks(s);
		pthread_mutex_lock(&s->pk_mu);
		if (--s->pk_active == 0)
			pthread_cond_signal(&s->pk_done);
	}
	pthread_mutex_unlock(&s->pk_mu);
	return NULL;
}

/* Whether item i of a step that ran samples a token (the loop of step()
 * below: a decoding job, or a prompt read to its end that is not
 * resuming), without changing anything. */
static int item_samples(const struct baton_sched *s, uint32_t i)
{
	const struct job *j = s->item_job[i];
	if (j->decoding)
		return 1;
	return j->fed + s->items[i].n >= j->n_prompt && !j->resuming;
}

/* With a pool: every item that samples, picked at once on the pool and
 * this thread; step()'s loop takes the tokens. */
static void pick_all(struct baton_sched *s, uint32_t n)
{
	uint32_t m = 0;
	for (uint32_t i = 0; i < n; i++) {
		s->pick_on[i] = 0;
		if (item_samples(s, i))
			s->pk_idx[m++] = i;
	}
	if (m < 2)
		return; /* nothing to share: generator_seq_next as without a pool */
	s->pk_n = m;
	atomic_store(&s->pk_next, 0);
	pthread_mutex_lock(&s->pk_mu);
	s->pk_active = s->n_pool;
	s->pk_gen++;
	pthread_cond_broadcast(&s->pk_go);
	pthread_mutex_unlock(&s->pk_mu);
	run_picks(s);
	pthread_mutex_lock(&s->pk_mu);
	while (s->pk_active)
		pthread_cond_wait(&s->pk_done, &s->pk_mu);
	pthread_mutex_unlock(&s->pk_mu);
	for (uint32_t k = 0; k < m; k++)
		s->pick_on[s->pk_idx[k]] = 1;
}

/* A decode step's figures (BATON_SCHED_TIMING=1), summed; printed every
 * 32 such steps. */
static void timing_note(struct baton_sched *s, uint32_t n, double model_s, double sample_s,
    double wait0, double sync0, double copy0)
{
	double sync1, copy1;
	model_head_times(s->m, &sync1, &copy1);
	s->tm_steps++;
	s->tm_rows += n;
	s->tm_model += model_s;
	s->tm_sample += sample_s;
	s->tm_wait += model_wait_seconds(s->m) - wait0;
	s->tm_sync += sync1 - sync0;
	s->tm_copy += copy1 - copy0;
	if (s->tm_steps % 32)
		return;
	const double ns = (double)s->tm_steps, wait = s->tm_wait, sync_s = s->tm_sync,
	    copy_s = s->tm_copy;
	fprintf(stderr, "sched timing: %llu decode steps, %.1f items a step; a step %.3f ms: model_step "
	    "%.3f ms (every wait for the device %.3f, of it the head's %.3f; logits copy %.3f), "
	    "sampling %.3f ms\n",
	    (unsigned long long)s->tm_steps, (double)s->tm_rows / ns,
	    (s->tm_model + s->tm_sample) * 1e3 / ns, s->tm_model * 1e3 / ns, wait * 1e3 / ns,
	    sync_s * 1e3 / ns, copy_s * 1e3 / ns, s->tm_sample * 1e3 / ns);
}

/* A step that read prompt tokens (BATON_SCHED_TIMING=1): its items, rows
 * and times, one line each (there are few of them, and each differs). */
static void prompt_note(struct baton_sched *s, uint32_t n, double model_s, double sample_s,
    double wait0)
{
	uint64_t rows = 0;
	uint32_t prompts = 0;
	for (uint32_t i = 0; i < n; i++) {
		rows += s->items[i].n;
		prompts += s->items[i].n > 1;
	}
	fprintf(stderr, "sched timing: a step of %u items (%u of them prompt pieces), %llu rows: model_step "
	    "%.3f ms (every wait for the device %.3f), sampling %.3f ms\n", n, prompts,
	    (unsigned long long)rows, model_s * 1e3, (model_wait_seconds(s->m) - wait0) * 1e3,
	    sample_s * 1e3);
}

/* One forward pass over every running job; ends those that finished. No
 * lock held; the running table is the thread's to read (and its
 * membership changes under the lock). When the pool cannot hold the step,
 * the youngest running jobs are preempted until it can (followers
 * passed over); the oldest is never (it fits the pool alone: admit
 * refuses any other). */
static void step(struct baton_sched *s, struct job **done)
{
	pthread_mutex_lock(&s->mu);
	follow(s);
	pthread_mutex_unlock(&s->mu);
	uint32_t n = plan(s);
	struct job *v;
	while (n && (v = victim(s)) && step_blocks(s, n) > model_kv_free_blocks(s->m)) {
		pthread_mutex_lock(&s->mu);
		int rc = preempt(s, v);
		pthread_mutex_unlock(&s->mu);
		if (rc)
			break; /* no memory to keep its tokens: the step fails ENOSPC for all */
		n = plan(s);
	}
	if (n == 0)
		return;
	int decode_only = 1; /* BATON_SCHED_TIMING counts the steps of one token an item */
	for (uint32_t i = 0; i < n; i++)
		decode_only &= s->items[i].n == 1;
	const double wait0 = s->timing ? model_wait_seconds(s->m) : 0;
	double sync0 = 0, copy0 = 0;
	if (s->timing)
		model_head_times(s->m, &sync0, &copy0);
	const double tm0 = s->timing ? baton_now_s() : 0;
	int prc = model_step(s->m, s->items, n, s->logits);
	const double tm1 = s->timing ? baton_now_s() : 0;
	pthread_mutex_lock(&s->mu);
	s->st.steps++;
	s->st.passes = model_passes(s->m);
	for (uint32_t i = 0; i < n && !prc; i++)
		if (!s->item_job[i]->decoding)
			s->st.read_tokens += s->items[i].n;
	pthread_mutex_unlock(&s->mu);
	if (s->n_pool && !prc)
		pick_all(s, n);
	for (uint32_t i = 0; i < n; i++) {
		struct job *j = s->item_job[i];
		char err[400] = "";
		int rc = prc;
		if (rc) {
			snprintf(err, sizeof err, "the forward pass failed: %s", baton_strerror(rc));
			goto fail;
		}
		if (!j->decoding) {
			j->fed += s->items[i].n;
			if (j->fed < j->n_prompt)
				continue; /* more of its prompt in the next step */
			j->decoding = 1;
			if (j->resuming) {
				/* read again after a preemption: decode on from the token
				 * it had sampled (these logits were sampled before) */
				j->resuming = 0;
				j->next_tok = j->out[j->n_out - 1];
				continue;
			}
		}
		uint32_t t;
		if (s->n_pool && !prc && s->pick_on[i]) { /* picked on the pool: take it */
			if ((rc = s->pick_rc[i]) != 0)
				snprintf(err, sizeof err, "%s", s->pick_err + (size_t)i * PICK_ERR);
			else
				rc = generator_seq_take(j->gs, &t, err, sizeof err);
		} else {
			rc = generator_seq_next(j->gs, s->logits + (size_t)i * s->vocab, &t, err, sizeof err);
		}
		if (rc)
			goto fail;
		if (j->cb.on_token)
			j->cb.on_token(j->cb.arg);
		if (!generator_seq_finished(j->gs)) {
			if (j->n_out == j->cap_out) {
				uint32_t cap = j->cap_out ? 2 * j->cap_out : 64;
				uint32_t *o = realloc(j->out, (size_t)cap * sizeof *o);
				if (!o) {
					rc = BATON_ENOMEM;
					snprintf(err, sizeof err, "out of memory");
					goto fail;
				}
				j->out = o;
				j->cap_out = cap;
			}
			j->out[j->n_out++] = t;
			j->next_tok = t;
			continue;
		}
		rc = generator_seq_result(j->gs, &j->res, err, sizeof err);
		pthread_mutex_lock(&s->mu);
		unrun(s, j);
		s->st.finished++;
		if (rc == 0 && strcmp(j->res.finish, "cancelled") == 0)
			s->st.cancelled++; /* on_text said stop (a stream's client left) */
		pthread_mutex_unlock(&s->mu);
		end_job(done, j, rc, err);
		continue;
fail:
		pthread_mutex_lock(&s->mu);
		unrun(s, j);
		pthread_mutex_unlock(&s->mu);
		end_job(done, j, rc, err);
	}
	if (s->timing && decode_only)
		timing_note(s, n, tm1 - tm0, baton_now_s() - tm1, wait0, sync0, copy0);
	else if (s->timing) /* a step that reads prompts: each one on its own line */
		prompt_note(s, n, tm1 - tm0, baton_now_s() - tm1, wait0);
}

/* Running jobs the client left: ended as "cancelled" now. Lock held. */
static void reap_cancelled(struct baton_sched *s, struct job **done)
{
	for (uint32_t i = 0; i < s->n_run;) {
		struct job *j = s->run[i];
		if (!atomic_load(&j->cancel)) {
			i++;
			continue;
		}
		generator_seq_cancel(j->gs);
		char err[400] = "";
		int rc = generator_seq_result(j->gs, &j->res, err, sizeof err);
		unrun(s, j);
		s->st.cancelled++;
		end_job(done, j, rc, err);
	}
	struct job **pp = &s->wait_head, *last = NULL;
	while (*pp) {
		struct job *j = *pp;
		if (atomic_load(&j->cancel)) {
			*pp = j->next;
			s->n_wait--;
			s->st.cancelled++;
			if (j->begun) {
				/* preempted: its answer began, it ends as a running one does */
				generator_seq_cancel(j->gs);
				char err[400] = "";
				int rc = generator_seq_result(j->gs, &j->res, err, sizeof err);
				end_job(done, j, rc, err);
				continue;
			}
			end_job(done, j, BATON_ECLOSED, "cancelled: the client went away");
		} else {
			last = j;
			pp = &j->next;
		}
	}
	s->wait_tail = last;
}

/* Sleeps 10 ms or until kicked: requests wait for blocks or for
 * may_admit. Lock held. */
static void nap(struct baton_sched *s)
{
	baton_cond_wait_for(&s->cv, &s->mu, 0.010);
}

static void *loop(void *arg)
{
	struct baton_sched *s = arg;
	pthread_mutex_lock(&s->mu);
	while (!s->stopping) {
		struct job *done = NULL, *admitted = NULL;
		reap_cancelled(s, &done);
		if (done) {
			pthread_mutex_unlock(&s->mu);
			deliver(s, done);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (s->n_run == 0 && s->n_wait == 0) {
			if (s->st.held) {
				s->st.held = 0;
				pthread_mutex_unlock(&s->mu);
				if (s->h.end)
					s->h.end(s->h.arg);
				pthread_mutex_lock(&s->mu);
			} else {
				pthread_cond_wait(&s->cv, &s->mu);
			}
			continue;
		}
		if (!s->st.held) {
			/* requests wait and the engine is not ours: take it (a
			 * failed begin took nothing: they all fail with it) */
			pthread_mutex_unlock(&s->mu);
			char err[512] = "";
			int rc = s->h.begin ? s->h.begin(s->h.arg, err, sizeof err) : 0;
			pthread_mutex_lock(&s->mu);
			if (rc) {
				while (s->wait_head) {
					struct job *j = s->wait_head;
					s->wait_head = j->next;
					end_job(&done, j, rc, err);
				}
				s->wait_tail = NULL;
				s->n_wait = 0;
				pthread_mutex_unlock(&s->mu);
				deliver(s, done);
				pthread_mutex_lock(&s->mu);
				continue;
			}
			s->st.held = 1;
		}
		pthread_mutex_unlock(&s->mu);
		int may = !s->h.may_admit || s->h.may_admit(s->h.arg);
		pthread_mutex_lock(&s->mu);
		/* begin and may_admit ran unlocked: a request cancelled meanwhile
		 * ends here, never admitted (it was admitted and run before) */
		reap_cancelled(s, &done);
		if (may)
			admit(s, &done, &admitted);
		if (s->n_run == 0) {
			/* nothing runs: hand the engine back (a broker command may
			 * wait for it); begin() takes it again */
			s->st.held = 0;
			pthread_mutex_unlock(&s->mu);
			if (s->h.end)
				s->h.end(s->h.arg);
			deliver(s, done);
			pthread_mutex_lock(&s->mu);
			if (s->n_wait && !s->stopping)
				nap(s);
			continue;
		}
		pthread_mutex_unlock(&s->mu);
		for (struct job *j = admitted; j; j = j->next) {
			if (j->begun)
				continue; /* back after a preemption */
			j->begun = 1;
			generator_seq_begin(j->gs);
			if (j->cb.on_admit)
				j->cb.on_admit(j->cb.arg);
		}
		deliver(s, done);
		done = NULL;
		step(s, &done);
		/* the last sequence ended and none waits: the engine goes back
		 * before the answers go out, so an answer means the engine takes
		 * the next operation (a control command sent on it is not busy) */
		pthread_mutex_lock(&s->mu);
		bool idle = s->n_run == 0 && s->n_wait == 0 && s->st.held;
		if (idle)
			s->st.held = 0;
		pthread_mutex_unlock(&s->mu);
		if (idle && s->h.end)
			s->h.end(s->h.arg);
		deliver(s, done);
		pthread_mutex_lock(&s->mu);
		s->st.kv_free = model_kv_free_blocks(s->m);
		s->st.kv_total = model_kv_blocks_total(s->m);
		model_prefix_stats(s->m, &s->st.prefix);
	}
	/* closing: everyone hears */
	struct job *done = NULL;
	while (s->n_run) {
		struct job *j = s->run[--s->n_run];
		end_job(&done, j, BATON_ECLOSED, "the engine is shutting down");
	}
	while (s->wait_head) {
		struct job *j = s->wait_head;
		s->wait_head = j->next;
		end_job(&done, j, BATON_ECLOSED, "the engine is shutting down");
	}
	s->wait_tail = NULL;
	s->n_wait = 0;
	int held = s->st.held;
	s->st.held = 0;
	pthread_mutex_unlock(&s->mu);
	deliver(s, done);
	if (held && s->h.end)
		s->h.end(s->h.arg);
	return NULL;
}

int sched_open(struct baton_generator *g, const struct sched_opts *o, const struct sched_hooks *h,
    struct baton_sched **out)
{
	*out = NULL;
	struct baton_sched *s = calloc(1, sizeof *s);
	if (!s)
		return BATON_ENOMEM;
	s->g = g;
	s->m = generator_model(g);
	if (o)
		s->o = *o;
	if (h)
		s->h = *h;
	if (!s->o.max_seqs)
		s->o.max_seqs = BATON_SCHED_DEFAULT_MAX_SEQS;
	if (!s->o.max_queue)
		s->o.max_queue = BATON_SCHED_DEFAULT_MAX_QUEUE;
	if (!s->o.chunk)
		s->o.chunk = BATON_SCHED_DEFAULT_CHUNK;
	if (model_max_batch(s->m) && s->o.chunk > model_max_batch(s->m))
		s->o.chunk = model_max_batch(s->m); /* more would split every step */
	s->vocab = model_config(s->m)->vocab;
	s->next_id = 1;
	const char *tm = getenv("BATON_SCHED_TIMING");
	s->timing = tm && strcmp(tm, "1") == 0;
	pthread_mutex_init(&s->mu, NULL);
	baton_cond_init(&s->cv);
	s->st.kv_free = model_kv_free_blocks(s->m);
	s->st.kv_total = model_kv_blocks_total(s->m);
	model_prefix_stats(s->m, &s->st.prefix);
	s->run = calloc(s->o.max_seqs, sizeof *s->run);
	s->items = calloc(s->o.max_seqs, sizeof *s->items);
	s->item_job = calloc(s->o.max_seqs, sizeof *s->item_job);
	s->logits = model_logits_alloc(s->m, (uint64_t)s->o.max_seqs * s->vocab * sizeof(float));
	if (!s->run || !s->items || !s->item_job || !s->logits || pool_open(s) != 0 ||
	    pthread_create(&s->th, NULL, loop, s) != 0) {
		sched_close(s);
		return BATON_ENOMEM;
	}
	s->started = 1;
	*out = s;
	return 0;
}

/* BATON_SCHED_SAMPLERS=N (2 to 64): the pool of N - 1 picking threads
 * (pick_all); unset or 1: none, every token sampled by generator_seq_next
 * on the scheduler's thread as before. */
static int pool_open(struct baton_sched *s)
{
	const char *e = getenv("BATON_SCHED_SAMPLERS");
	const long n = e ? strtol(e, NULL, 10) : 1;
	s->samplers = n > 1 && n <= 64 ? (uint32_t)n : 1;
	if (s->samplers < 2)
		return 0;
	const size_t ms = s->o.max_seqs;
	s->pk_idx = calloc(ms, sizeof *s->pk_idx);
	s->pick_on = calloc(ms, sizeof *s->pick_on);
	s->pick_rc = calloc(ms, sizeof *s->pick_rc);
	s->pick_err = calloc(ms, PICK_ERR);
	s->pool = calloc(s->samplers - 1, sizeof *s->pool);
	if (!s->pk_idx || !s->pick_on || !s->pick_rc || !s->pick_err || !s->pool)
		return BATON_ENOMEM;
	pthread_mutex_init(&s->pk_mu, NULL);
	baton_cond_init(&s->pk_go);
	baton_cond_init(&s->pk_done);
	s->pk_init = 1;
	for (uint32_t i = 0; i + 1 < s->samplers; i++) {
		if (pthread_create(&s->pool[i], NULL, pick_loop, s) != 0)
			break; /* fewer threads: still correct */
		s->n_pool++;
	}
	return 0;
}

static void pool_close(struct baton_sched *s)
{
	if (s->pk_init) {
		pthread_mutex_lock(&s->pk_mu);
		s->pk_stop = 1;
		pthread_cond_broadcast(&s->pk_go);
		pthread_mutex_unlock(&s->pk_mu);
		for (uint32_t i = 0; i < s->n_pool; i++)
			pthread_join(s->pool[i], NULL);
		pthread_mutex_destroy(&s->pk_mu);
		pthread_cond_destroy(&s->pk_go);
		pthread_cond_destroy(&s->pk_done);
		s->pk_init = 0;
		s->n_pool = 0;
	}
	free(s->pool);
	free(s->pk_idx);
	free(s->pick_on);
	free(s->pick_rc);
	free(s->pick_err);
	s->pool = NULL;
	s->pk_idx = NULL;
	s->pick_on = s->pick_rc = NULL;
	s->pick_err = NULL;
}

void sched_stop(struct baton_sched *s)
{
	if (!s || !s->started)
		return;
	pthread_mutex_lock(&s->mu);
	s->stopping = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->th, NULL);
	s->started = 0;
}

void sched_close(struct baton_sched *s)
{
	if (!s)
		return;
	sched_stop(s);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s->run);
	free(s->items);
	free(s->item_job);
	pool_close(s); /* the loop has stopped: no pick in flight */
	model_logits_free(s->m, s->logits);
	free(s);
}

int sched_submit(struct baton_sched *s, const struct baton_gen_request *req,
    const struct sched_cb *cb, uint64_t *id)
{
	struct job *j = calloc(1, sizeof *j);
	if (!j)
		return BATON_ENOMEM;
	j->req = req;
	j->cb = *cb;
	pthread_mutex_lock(&s->mu);
	if (s->stopping || s->n_wait >= s->o.max_queue) {
		int rc = s->stopping ? BATON_ECLOSED : BATON_EBUSY;
		if (!s->stopping)
			s->st.refused_busy++;
		pthread_mutex_unlock(&s->mu);
		free(j);
		return rc;
	}
	j->id = id && *id ? *id : s->next_id++;
	if (id)
		*id = j->id;
	if (s->wait_tail)
		s->wait_tail->next = j;
	else
		s->wait_head = j;
	s->wait_tail = j;
	s->n_wait++;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

int sched_submit_many(struct baton_sched *s, const struct baton_gen_request *const *reqs,
    const struct sched_cb *cbs, const uint64_t *ids, size_t n)
{
	struct job **js = calloc(n ? n : 1, sizeof *js);
	if (!js)
		return BATON_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		js[i] = calloc(1, sizeof *js[i]);
		if (!js[i]) {
			for (size_t k = 0; k < i; k++)
				free(js[k]);
			free(js);
			return BATON_ENOMEM;
		}
		js[i]->req = reqs[i];
		js[i]->cb = cbs[i];
		js[i]->id = ids[i];
	}
	pthread_mutex_lock(&s->mu);
	if (s->stopping || s->n_wait + n > s->o.max_queue) {
		int rc = s->stopping ? BATON_ECLOSED : BATON_EBUSY;
		if (!s->stopping)
			s->st.refused_busy += n;
		pthread_mutex_unlock(&s->mu);
		for (size_t i = 0; i < n; i++)
			free(js[i]);
		free(js);
		return rc;
	}
	for (size_t i = 0; i < n; i++) {
		if (s->wait_tail)
			s->wait_tail->next = js[i];
		else
			s->wait_head = js[i];
		s->wait_tail = js[i];
		s->n_wait++;
	}
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	free(js);
	return 0;
}

void sched_cancel(struct baton_sched *s, uint64_t id)
{
	pthread_mutex_lock(&s->mu);
	for (uint32_t i = 0; i < s->n_run; i++)
		if (s->run[i]->id == id)
			atomic_store(&s->run[i]->cancel, 1);
	for (struct job *j = s->wait_head; j; j = j->next)
		if (j->id == id)
			atomic_store(&j->cancel, 1);
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

uint64_t sched_new_ids(struct baton_sched *s, uint32_t n)
{
	pthread_mutex_lock(&s->mu);
	uint64_t id = s->next_id;
	s->next_id += n;
	pthread_mutex_unlock(&s->mu);
	return id;
}

uint64_t sched_new_id(struct baton_sched *s)
{
	pthread_mutex_lock(&s->mu);
	uint64_t id = s->next_id++;
	pthread_mutex_unlock(&s->mu);
	return id;
}

void sched_stats(struct baton_sched *s, struct sched_stats *st)
{
	pthread_mutex_lock(&s->mu);
	*st = s->st;
	st->running = s->n_run;
	st->waiting = s->n_wait;
	pthread_mutex_unlock(&s->mu);
}

void sched_note_model(struct baton_sched *s)
{
	pthread_mutex_lock(&s->mu);
	model_prefix_stats(s->m, &s->st.prefix);
	s->st.kv_free = model_kv_free_blocks(s->m);
	pthread_mutex_unlock(&s->mu);
}

void sched_kick(struct baton_sched *s)
{
	pthread_mutex_lock(&s->mu);
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}
