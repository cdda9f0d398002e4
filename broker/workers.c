/*
 * workers.c: commands to engines (release, refill, vram, peer, status)
 * run on a small pool of threads with proto_client_call on the engine's
 * control socket; each result comes back through the inbox. The
 * connections are refcounted: the registry drops its reference when an
 * engine goes, a worker keeps its own for the call in flight.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker_int.h"

struct conn *br_conn_open(const char *url)
{
	struct conn *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	struct proto_opts o = { .resend_ms = -1 };
	if (proto_client_open(&c->cli, url, &o) != 0) {
		free(c);
		return NULL;
	}
	atomic_init(&c->refs, 1);
	return c;
}

static struct conn *conn_get(struct conn *c)
{
	if (c)
		atomic_fetch_add(&c->refs, 1);
	return c;
}

void br_conn_put(struct conn *c)
{
	if (c && atomic_fetch_sub(&c->refs, 1) == 1) {
		proto_client_close(c->cli);
		free(c);
	}
}

static void *worker(void *arg)
{
	struct broker *b = arg;
	for (;;) {
		pthread_mutex_lock(&b->jmu);
		while (!b->jhead && !b->jstop)
			pthread_cond_wait(&b->jcv, &b->jmu);
		struct job *j = b->jhead;
		if (!j) {
			pthread_mutex_unlock(&b->jmu);
			break;
		}
		b->jhead = j->next;
		if (!b->jhead)
			b->jtail = NULL;
		pthread_mutex_unlock(&b->jmu);

		struct item *it = calloc(1, sizeof *it);
		struct baton_msg req;
		struct proto_diag d;
		proto_msg_init(&req, j->op);
		if (j->op != PROTO_OP_STATUS) { /* an engine's STATUS takes no fields */
			req.name = j->name;
			proto_set(&req, PF_NAME);
			req.epoch = j->epoch;
			proto_set(&req, PF_EPOCH);
		}
		if (j->op == PROTO_OP_VRAM)
			req.reserve_mib = j->reserve_mib;
		if (j->op == PROTO_OP_REFILL && j->reserve_mib) { /* a partial grant (schedule.c) */
			req.reserve_mib = j->reserve_mib;
			proto_set(&req, PF_RESERVE_MIB);
		}
		if (j->op == PROTO_OP_PEER) {
			req.peer_mib = j->peer_mib;
			req.peer_gpu = j->peer_gpu;
			proto_set(&req, PF_PEER_GPU);
		}
		double t0 = baton_now_s();
		struct baton_msg rep;
		int rc = proto_client_call(j->conn->cli, &req, &rep, j->timeout_ms, &d);
		if (!it) {
			proto_msg_free(&rep);
			br_conn_put(j->conn);
			free(j);
			continue;
		}
		it->kind = IT_DONE;
		it->job_id = j->id;
		it->rc = rc;
		it->rep = rep;
		it->ms = (baton_now_s() - t0) * 1e3;
		snprintf(it->err, sizeof it->err, "%s", rc ? d.text : "");
		br_conn_put(j->conn);
		free(j);
		br_post(b, it);
	}
	return NULL;
}

int br_queue_job(struct broker *b, struct eng *e, enum proto_op op, uint64_t reserve_mib,
    uint64_t *job_id)
{
	struct job *j = calloc(1, sizeof *j);
	if (!j || !e->conn) {
		free(j);
		return BATON_ENOMEM;
	}
	j->id = ++b->job_seq;
	j->conn = conn_get(e->conn);
	j->op = op;
	snprintf(j->name, sizeof j->name, "%s", e->name);
	j->reserve_mib = reserve_mib;
	if (op == PROTO_OP_PEER) {
		j->peer_mib = reserve_mib;
		snprintf(j->peer_gpu, sizeof j->peer_gpu, "%s", b->gpus[e->peer_gpu].uuid);
	}
	j->timeout_ms = b->cfg.command_timeout_ms;
	if (op == PROTO_OP_REFILL || (op == PROTO_OP_VRAM && reserve_mib == PROTO_RESERVE_FULL)) {
		/* copies that may outlast the command timeout: the decision
		 * thread times them out when their progress stalls instead
		 * (br_housekeeping), and cuts the connection to end this call */
		j->timeout_ms = (int)(LONG_CMD_S * 1e3);
	}
	if (op != PROTO_OP_STATUS)
		e->job_long = j->timeout_ms > b->cfg.command_timeout_ms;
	if (op == PROTO_OP_STATUS) {
		/* a probe: beside the command in flight, not one itself */
		j->timeout_ms = (int)(PROBE_S * 1e3);
		e->probing = true;
		e->probe_at = baton_now_s();
	} else {
		j->epoch = ++b->epoch;
		e->in_flight = true;
		e->job_id = j->id;
		e->job_t0 = baton_now_s();
		e->progress_at = e->progress_pub_at = 0;
		e->copied = e->to_copy = 0;
	}
	*job_id = j->id;
	pthread_mutex_lock(&b->jmu);
	if (b->jtail)
		b->jtail->next = j;
	else
		b->jhead = j;
	b->jtail = j;
	pthread_cond_signal(&b->jcv);
	pthread_mutex_unlock(&b->jmu);
	return 0;
}

int br_workers_start(struct broker *b)
{
	for (int i = 0; i < WORKERS; i++) {
		if (pthread_create(&b->work_th[i], NULL, worker, b) != 0)
			return BATON_ENOMEM;
		b->n_work++;
	}
	return 0;
}

void br_workers_stop(struct broker *b)
{
	pthread_mutex_lock(&b->jmu);
	b->jstop = true;
	pthread_cond_broadcast(&b->jcv);
	pthread_mutex_unlock(&b->jmu);
	for (int i = 0; i < b->n_work; i++)
		pthread_join(b->work_th[i], NULL);
	b->n_work = 0;
	for (struct job *j = b->jhead, *nx; j; j = nx) {
		nx = j->next;
		br_conn_put(j->conn);
		free(j);
	}
	b->jhead = b->jtail = NULL;
}
