/*
 * sched.h: continuous batching. A scheduler thread owns a generator's
 * model (its forward passes) and runs every request in flight in the same
 * steps: each step it admits waiting requests while the KV pool has the
 * blocks they need (their prompt joins the step, in chunks), decodes every
 * running sequence with one model_step, samples each (the generator, engine/model/model.h), passes
 * on the text that became final, and ends finished sequences at once (their
 * blocks go back to the pool).
 *
 * Admission holds room for a request's prompt and its first token only
 * (plus a block for each running sequence); blocks are taken as tokens
 * appear. When a step would need more blocks than are free, the youngest
 * running sequences are preempted until it fits: their blocks go back,
 * and they return to the head of the queue to be read again from their
 * prompt and the tokens they had sampled (recompute), then decode on with
 * the same sampler, so their answer goes on where it was. The oldest is
 * never preempted, and a request that could not run alone in the whole
 * pool (prompt + max_tokens, capped by the context) is refused
 * (BATON_ERANGE), so the oldest always finishes. (Reserving prompt +
 * max_tokens at admission, as before, let one request without max_tokens
 * keep the pool from everyone: issue 28.) Requests wait in a bounded FIFO
 * queue: sched_submit answers BATON_EBUSY when it is full.
 *
 * The engine's owner (work.c) brackets the work with hooks: begin() runs
 * on the scheduler thread before its first step after being idle (the
 * engine is taken and its memory made whole, asking the broker), end()
 * after the last sequence ended with nothing admitted. While may_admit()
 * says no (a broker command waits), nothing new is admitted: the running
 * sequences finish, end() lets the command in, and begin() comes again.
 *
 * Admission takes the longest cached prefix of a prompt first
 * (model_seq_prefix: whole blocks, never the last token) and reads only
 * the rest; the answer is the same (docs/internals/prefix-cache.md). A
 * request admitted while another running one reads a longer start of the
 * same prompt (n > 1's choices, or a shared system prompt arriving
 * together) waits for that read and then takes those blocks from the
 * cache, so the start is computed once, not once per request.
 *
 * Each request's answer equals generator_run's for the same request and
 * seed: its sampler is its own and its logits do not depend on the others
 * in the step (engine/model/model.h).
 *
 * Thread-safe: submit, cancel and stats from any thread. Callbacks run on
 * the scheduler thread, without the scheduler's lock held; they must not
 * block long (an HTTP stream write buffers) and must not call sched_close.
 *
 * Internal to engine/serve/ (its door is serve.h).
 */
#ifndef BATON_ENGINE_SCHED_H
#define BATON_ENGINE_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"

#define BATON_SCHED_DEFAULT_MAX_SEQS  16u
#define BATON_SCHED_DEFAULT_MAX_QUEUE 64u
#define BATON_SCHED_DEFAULT_CHUNK     512u

struct sched_opts {
	uint32_t max_seqs;   /* sequences running at once; 0: default */
	uint32_t max_queue;  /* requests waiting; 0: default */
	uint32_t chunk;      /* tokens per step, decoding rows and prompt chunks; 0: default
	                      * (at most the model's max_batch) */
};

struct sched_hooks {
	/* 0: go on; else every waiting request fails with it and err. */
	int (*begin)(void *arg, char *err, size_t errlen);
	void (*end)(void *arg);
	/* 0: admit nothing now. NULL: always. */
	int (*may_admit)(void *arg);
	void *arg;
};

/* What a request hears, on the scheduler thread. on_text as the generator's
 * (nonzero: cancel). on_done exactly once: rc 0 with the answer (res is
 * the callee's to free with generator_result_free), else the error with a
 * sentence in err (a bad request: BATON_EINVAL/ERANGE; BATON_ECLOSED
 * when cancelled while waiting or at sched_close). */
struct sched_cb {
	int (*on_text)(void *arg, const char *text, size_t len);
	void (*on_admit)(void *arg);  /* its prefill starts; may be NULL */
	void (*on_token)(void *arg);  /* a token was sampled for it (the serving metrics); may be NULL */
	void (*on_done)(void *arg, int rc, const char *err, struct baton_gen_result *res);
	void *arg;
};

struct sched_stats {
	uint32_t running, waiting;
	uint32_t kv_free, kv_total;  /* KV pool blocks, as of the last step */
	uint64_t steps, admitted;
	uint64_t passes;             /* the model's forward passes (a step is one unless it is larger than a pass) */
	uint64_t finished;           /* answered (cancelled ones included) */
	uint64_t cancelled;          /* by sched_cancel or on_text, waiting or running */
	uint64_t refused_busy;       /* submits answered EBUSY */
	uint64_t preempted;          /* running jobs put back to be read again (the pool ran out) */
	uint64_t prompt_tokens;      /* prompt tokens admitted (a preempted job's again) */
	uint64_t cached_tokens;      /* of them, taken from the prefix cache instead of read */
	uint64_t read_tokens;        /* prompt tokens read by forward passes (prefill) */
	uint64_t followed;           /* jobs that waited for another's read of their prompt's start */
	struct baton_prefix_stats prefix; /* the model's, as of the last step */
	int held;                    /* between begin() and end() */
};

struct baton_sched;

/* Starts the thread. g must outlive the scheduler. */
int sched_open(struct baton_generator *g, const struct sched_opts *o, const struct sched_hooks *h,
    struct baton_sched **out);
/* Ends every request (on_done BATON_ECLOSED, sequences closed) and joins
 * the thread; submit answers BATON_ECLOSED from then on. Idempotent. */
void sched_stop(struct baton_sched *s);
/* sched_stop, then frees. NULL ok. */
void sched_close(struct baton_sched *s);

/* Queues a request (req, its strings and cb.arg must live until on_done).
 * *id names it for sched_cancel: taken from sched_new_id when nonzero on
 * entry (so a cancel hook can be set up before the request may end),
 * else a new one is written there (id may be NULL). BATON_EBUSY when the queue is full,
 * BATON_ECLOSED when closing: on_done is not called then. */
int sched_submit(struct baton_sched *s, const struct baton_gen_request *req,
    const struct sched_cb *cb, uint64_t *id);
/* Queues n requests at once, all or none (ids[i] nonzero each, from
 * sched_new_ids): the scheduler sees them in the same step, so copies of
 * one prompt (n > 1) are admitted together and the ones after the first
 * follow its read of their shared start. BATON_EBUSY when the queue has no
 * room for all n, BATON_ECLOSED when closing: no on_done is called then. */
int sched_submit_many(struct baton_sched *s, const struct baton_gen_request *const *reqs,
    const struct sched_cb *cbs, const uint64_t *ids, size_t n);
/* The client went away: a waiting request ends at once (on_done
 * BATON_ECLOSED), a running one at the next step (its sequence closed,
 * its blocks free, on_done with finish "cancelled"). Unknown ids (already
 * done) are ignored. */
void sched_cancel(struct baton_sched *s, uint64_t id);
/* An id for sched_submit, never used before. */
uint64_t sched_new_id(struct baton_sched *s);
/* The first of n consecutive ones (a batch's requests). */
uint64_t sched_new_ids(struct baton_sched *s, uint32_t n);
void sched_stats(struct baton_sched *s, struct sched_stats *st);
/* The model changed outside a step (a release or refill by the engine's
 * owner, while the scheduler holds nothing): the stats read it again. */
void sched_note_model(struct baton_sched *s);
/* Wakes the thread (may_admit may say yes now). */
void sched_kick(struct baton_sched *s);

#endif
