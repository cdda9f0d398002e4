/*
 * top.c: `baton top` (see top.h). Each frame is one STATUS call to the
 * broker, laid out like nvidia-smi's device list and ollama ps's UNTIL
 * column, and one GET /v1/models of its front door (the models, their
 * queues, tokens per second since the last frame), written in one write. On a terminal: the alternate screen,
 * no cursor, keys read without echo (Ctrl-C still signals); whatever
 * ends it (q, Ctrl-C, SIGTERM, SIGHUP, a failed write) goes through the
 * one restore at the end.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "broker/broker.h"
#include "broker/cli/cli.h"
#include "broker/cli/door_cmd.h"
#include "broker/cli/top.h"

static volatile sig_atomic_t stop_sig, resized;

static void on_stop(int sig)
{
	stop_sig = sig;
}

static void on_winch(int sig)
{
	(void)sig;
	resized = 1;
}

/* ---- a frame: lines, each cut to the width ---------------------------------------- */

struct frame {
	char *buf;
	size_t len, cap;
	size_t cols;
	bool tty;       /* "\033[K" at each line's end */
	bool oom;
};

static void addf(struct frame *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void addf(struct frame *f, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	size_t n = strlen(line);
	if (f->cols && n > f->cols)
		n = f->cols;
	size_t need = f->len + n + 8;
	if (need > f->cap) {
		size_t cap = f->cap ? f->cap * 2 : 4096;
		while (cap < need)
			cap *= 2;
		char *nb = realloc(f->buf, cap);
		if (!nb) {
			f->oom = true;
			return;
		}
		f->buf = nb;
		f->cap = cap;
	}
	memcpy(f->buf + f->len, line, n);
	f->len += n;
	if (f->tty) {
		memcpy(f->buf + f->len, "\033[K", 3);
		f->len += 3;
	}
	f->buf[f->len++] = '\n';
}

static const struct proto_gpu *gpu_of(const struct baton_msg *st, const char *uuid)
{
	for (uint32_t i = 0; i < st->gpus.n; i++)
		if (strcmp(st->gpus.v[i].uuid, uuid) == 0)
			return &st->gpus.v[i];
	return NULL;
}

/* ollama ps's UNTIL: when the idle timer releases it. */
static const char *until_of(const struct proto_engine_info *e, char *buf, size_t len)
{
	if (e->resident == 0)
		snprintf(buf, len, "-");
	else if (e->pinned || e->idle_release_ms == 0)
		snprintf(buf, len, "never");
	else if (e->idle_ms == 0)
		snprintf(buf, len, "busy");
	else if (e->idle_ms >= e->idle_release_ms)
		snprintf(buf, len, "now");
	else
		cli_fmt_idle(e->idle_release_ms - e->idle_ms, buf, len);
	return buf;
}

static void draw(struct frame *f, const struct top_opts *o, const struct baton_msg *st, int rc,
    const char *why)
{
	char now[32];
	time_t t = time(NULL);
	struct tm tm;
	localtime_r(&t, &tm);
	strftime(now, sizeof now, "%H:%M:%S", &tm);
	if (f->tty)
		addf(f, "baton top - %s - %s - every %.1fs (q quits)", now, o->broker, o->interval_ms / 1e3);
	else
		addf(f, "baton top - %s - %s", now, o->broker);
	addf(f, "%s", "");
	if (rc) {
		addf(f, "no answer from the broker: %s", why);
		return;
	}
	size_t wn = strlen("NAME");
	for (uint32_t i = 0; i < st->gpus.n; i++)
		if (st->gpus.v[i].name && strlen(st->gpus.v[i].name) > wn)
			wn = strlen(st->gpus.v[i].name);
	addf(f, "%3s  %-*s %21s %10s %10s %10s %7s  %s", "GPU", (int)wn, "NAME", "USED / TOTAL", "HELD", "FREE",
	    "LENT", "ENGINES", "UUID");
	for (uint32_t i = 0; i < st->gpus.n; i++) {
		const struct proto_gpu *g = &st->gpus.v[i];
		char u[32], tot[32], h[32], fr[32], l[32], ut[72];
		unsigned ne = 0;
		for (uint32_t k = 0; k < st->engines.n; k++)
			ne += strcmp(st->engines.v[k].gpu, g->uuid) == 0;
		snprintf(ut, sizeof ut, "%s / %s", cli_fmt_bytes(g->total > g->free_bytes ? g->total - g->free_bytes : 0,
		    u, sizeof u), cli_fmt_bytes(g->total, tot, sizeof tot));
		addf(f, "%3u  %-*s %21s %10s %10s %10s %7u  %s", g->index, (int)wn, g->name && *g->name ? g->name : "-",
		    ut, cli_fmt_bytes(g->held, h, sizeof h), cli_fmt_bytes(g->free_bytes, fr, sizeof fr),
		    cli_fmt_bytes(g->lent, l, sizeof l), ne, g->uuid);
	}
	if (st->gpus.n == 0)
		addf(f, "(no devices: no engine has registered)");
	addf(f, "%s", "");
	size_t we = strlen("ENGINE");
	for (uint32_t i = 0; i < st->engines.n; i++)
		if (strlen(st->engines.v[i].name) > we)
			we = strlen(st->engines.v[i].name);
	addf(f, "%-*s %3s %-15s %21s %8s %8s %12s %8s %7s %9s %8s", (int)we, "ENGINE", "GPU", "STATE",
	    "RESIDENT / CEILING", "IDLE", "UNTIL", "LAST REFILL", "REQS", "PREFIX", "KV HOST", "PID");
	for (uint32_t i = 0; i < st->engines.n; i++) {
		const struct proto_engine_info *e = &st->engines.v[i];
		const struct proto_gpu *g = gpu_of(st, e->gpu);
		char r[32], c[32], rc_[72], idle[32], until[32], fill[32], state[48], gi[16];
		snprintf(rc_, sizeof rc_, "%s / %s", cli_fmt_bytes(e->resident, r, sizeof r),
		    cli_fmt_bytes(e->ceiling, c, sizeof c));
		if (e->to_copy) /* a refill in progress: how far its copy is */
			snprintf(state, sizeof state, "%s %d%%", e->state,
			    (int)(100.0 * (double)(e->copied < e->to_copy ? e->copied : e->to_copy) / (double)e->to_copy));
		else if (strcmp(broker_entry_kind(e), "external") == 0) /* not Baton's (a lease says "leased") */
			snprintf(state, sizeof state, "%s (ext)", e->state);
		else
			snprintf(state, sizeof state, "%s%s", e->state, e->pinned ? " (pin)" : "");
		if (e->last_refill_gbps > 0)
			snprintf(fill, sizeof fill, "%.2f GB/s", e->last_refill_gbps);
		else
			snprintf(fill, sizeof fill, "-");
		if (g)
			snprintf(gi, sizeof gi, "%u", g->index);
		else
			snprintf(gi, sizeof gi, "?");
		/* the prefix cache: prompt tokens taken from it, and its KV in host memory while released */
		char hit[16], kvh[32];
		if (e->prefix_prompt)
			snprintf(hit, sizeof hit, "%.0f%%", 100.0 * (double)e->prefix_cached / (double)e->prefix_prompt);
		else
			snprintf(hit, sizeof hit, "-");
		if (e->kv_host_bytes)
			cli_fmt_bytes(e->kv_host_bytes, kvh, sizeof kvh);
		else
			snprintf(kvh, sizeof kvh, "-");
		addf(f, "%-*s %3s %-15s %21s %8s %8s %12s %8" PRIu64 " %7s %9s %8u", (int)we, e->name, gi, state, rc_,
		    cli_fmt_idle(e->idle_ms, idle, sizeof idle), until_of(e, until, sizeof until), fill, e->requests,
		    hit, kvh, e->pid);
	}
	if (st->engines.n == 0)
		addf(f, "(no engines)");
}

static bool write_all(const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(STDOUT_FILENO, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

/* The front door's models (GET /v1/models over HTTP: $BATON_HTTP or the
 * default address). Tokens per second come from the last frame's count. */
#define TOP_MODELS 64
static struct { char id[BROKER_NAME_MAX]; double t; long long gen; } last_gen[TOP_MODELS];
static size_t n_last;

static double tokens_per_s(const char *id, long long gen, double now)
{
	for (size_t i = 0; i < n_last; i++)
		if (strcmp(last_gen[i].id, id) == 0) {
			double r = now > last_gen[i].t && gen >= last_gen[i].gen ?
			    (double)(gen - last_gen[i].gen) / (now - last_gen[i].t) : 0;
			last_gen[i].t = now;
			last_gen[i].gen = gen;
			return r;
		}
	if (n_last < TOP_MODELS) {
		snprintf(last_gen[n_last].id, sizeof last_gen[n_last].id, "%s", id);
		last_gen[n_last].t = now;
		last_gen[n_last++].gen = gen;
	}
	return 0;
}

static void draw_models(struct frame *f, const struct top_opts *o)
{
	char addr[300], err[512];
	door_addr(o->http, addr, sizeof addr);
	int st = 0;
	char *body = NULL;
	int rc = door_http(addr, "GET", "/v1/models", NULL, NULL, o->timeout_ms, &st, &body, err, sizeof err);
	json_t *j = rc == 0 && st == 200 ? json_loads(body, 0, NULL) : NULL;
	json_t *data = json_object_get(j, "data");
	addf(f, "%s", "");
	if (!json_is_array(data)) {
		addf(f, "(front door at %s: %s)", addr, rc ? err : "no model list");
	} else {
		addf(f, "%-20s %-10s %-22s %9s %7s %7s %7s %8s %9s", "MODEL", "STATE", "ENGINES", "IN FLIGHT", "QUEUED",
		    "SERVED", "FAILED", "TOK/S", "TTFT");
		double now = baton_now_s();
		size_t i;
		json_t *m;
		json_array_foreach(data, i, m) {
			json_t *engs = json_object_get(m, "engines"), *req = json_object_get(m, "requests");
			json_t *sv = json_object_get(m, "serving"), *e;
			char names[96] = "";
			long long inflight = 0;
			size_t k;
			json_array_foreach(engs, k, e) {
				size_t at = strlen(names);
				snprintf(names + at, sizeof names - at, "%s%s", at ? "," : "",
				    json_string_value(json_object_get(e, "name")));
				inflight += json_integer_value(json_object_get(e, "in_flight"));
			}
			const char *id = json_string_value(json_object_get(m, "id"));
			long long gen = json_integer_value(json_object_get(sv, "generation_tokens"));
			long long tc = json_integer_value(json_object_get(sv, "ttft_count"));
			double ts = json_real_value(json_object_get(sv, "ttft_sum_s"));
			char ttft[32];
			if (tc > 0)
				snprintf(ttft, sizeof ttft, "%.0f ms", 1e3 * ts / (double)tc);
			else
				snprintf(ttft, sizeof ttft, "-");
			addf(f, "%-20s %-10s %-22s %9lld %7lld %7lld %7lld %8.1f %9s", id ? id : "?",
			    json_string_value(json_object_get(m, "state")), names[0] ? names : "-", inflight,
			    json_integer_value(json_object_get(m, "queued")), json_integer_value(json_object_get(req, "served")),
			    json_integer_value(json_object_get(req, "failed")), tokens_per_s(id ? id : "?", gen, now), ttft);
		}
		if (json_array_size(data) == 0)
			addf(f, "(no models at the front door)");
	}
	json_decref(j);
	free(body);
}

/* One frame into f (reset first). */
static void frame_make(struct frame *f, const struct top_opts *o, int *rc_out)
{
	f->len = 0;
	struct baton_msg req, st;
	struct proto_diag d;
	memset(&d, 0, sizeof d);
	proto_msg_init(&req, PROTO_OP_STATUS);
	int rc = proto_call(o->broker, &req, &st, o->timeout_ms, &d);
	char why[400];
	if (rc)
		snprintf(why, sizeof why, "%s%s%s", st.reply && st.msg ? st.msg : baton_strerror(rc),
		    d.text[0] && !st.reply ? ": " : "", !st.reply ? d.text : "");
	draw(f, o, &st, rc, why);
	if (rc == 0)
		draw_models(f, o);
	if (rc == 0 || st.reply)
		proto_msg_free(&st);
	*rc_out = rc;
}

int top_run(const struct top_opts *o)
{
	struct frame f = { 0 };
	bool live = !o->once && isatty(STDOUT_FILENO);
	int rc;
	if (!live) {
		frame_make(&f, o, &rc);
		bool ok = !f.oom && write_all(f.buf, f.len);
		free(f.buf);
		if (rc) {
			fprintf(stderr, "baton: top: no answer from the broker at %s\n", o->broker);
			return EXIT_FAILED;
		}
		return ok ? EXIT_DONE : EXIT_FAILED;
	}

	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop; /* no SA_RESTART: poll returns at once */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sa.sa_handler = on_winch;
	sigaction(SIGWINCH, &sa, NULL);
	struct termios saved, raw;
	bool have_saved = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
	bool keys = have_saved;
	if (keys) {
		raw = saved;
		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO); /* ISIG stays: Ctrl-C signals */
		raw.c_cc[VMIN] = 0;
		raw.c_cc[VTIME] = 0;
		tcsetattr(STDIN_FILENO, TCSANOW, &raw);
	}
	static const char enter[] = "\033[?1049h\033[?25l", leave[] = "\033[?25h\033[?1049l";
	bool ok = write_all(enter, sizeof enter - 1);
	f.tty = true;
	while (ok && !stop_sig) {
		struct winsize ws;
		f.cols = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 0;
		size_t rows = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 ? ws.ws_row : 0;
		frame_make(&f, o, &rc);
		if (f.oom)
			break;
		/* at most a screenful: the last line left without its newline */
		size_t n = 0, lines = 0;
		while (n < f.len && (!rows || lines < rows)) {
			if (f.buf[n] == '\n' && (!rows || ++lines == rows))
				break;
			n++;
		}
		ok = write_all("\033[H", 3) && write_all(f.buf, n) && write_all("\033[J", 3);
		double until = baton_now_s() + o->interval_ms / 1e3;
		while (ok && !stop_sig && !resized) {
			double left = (until - baton_now_s()) * 1e3;
			if (left <= 0)
				break;
			struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
			int pr = poll(&p, keys ? 1 : 0, (int)left + 1);
			if (pr > 0 && (p.revents & POLLIN)) {
				char c[16];
				ssize_t r = read(STDIN_FILENO, c, sizeof c);
				for (ssize_t k = 0; k < r; k++)
					if (c[k] == 'q' || c[k] == 'Q')
						stop_sig = -1;
				if (r == 0) /* the terminal went away */
					keys = false;
			} else if (pr > 0) {
				keys = false; /* POLLHUP, POLLERR: no keys from there any more */
			}
		}
		resized = 0;
	}
	write_all(leave, sizeof leave - 1);
	if (have_saved)
		tcsetattr(STDIN_FILENO, TCSANOW, &saved);
	free(f.buf);
	return ok ? EXIT_DONE : EXIT_FAILED;
}
