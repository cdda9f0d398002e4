/* fault.c: the fault-injecting backend decorator; see backend.h (fault_wrap). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"

enum { F_MAP, F_ALLOC, F_COPY, F_D2H, F_N };
static const char *const op_names[F_N] = { "map", "alloc", "copy", "d2h" };

struct rule {
	unsigned long nth, every; /* nth 0: count only */
};

static struct rule rules[F_N];
static _Atomic unsigned long calls[F_N];
static _Atomic unsigned long injected;
static int parsed, any_rule, parse_rc;
static char parse_err[160];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

#define MAX_DEVS 8
static struct {
	struct baton_dev *dev;
	const struct baton_backend *inner;
} devs[MAX_DEVS];

/* Parses BATON_FAULT once; entries for other layers (send) are skipped. */
static void parse_env(void)
{
	const char *v = getenv("BATON_FAULT");
	parsed = 1;
	if (!v || !*v)
		return;
	char buf[512];
	snprintf(buf, sizeof buf, "%s", v);
	char *save = NULL;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		char *colon = strchr(tok, ':');
		if (!colon) {
			snprintf(parse_err, sizeof parse_err, "BATON_FAULT: '%s' is not op:N", tok);
			parse_rc = BATON_EINVAL;
			return;
		}
		*colon = '\0';
		char *end;
		unsigned long nth = strtoul(colon + 1, &end, 10), every = 0;
		if (*end == '/')
			every = strtoul(end + 1, &end, 10);
		if (*end != '\0' || end == colon + 1) {
			snprintf(parse_err, sizeof parse_err, "BATON_FAULT: '%s' has no count N", tok);
			parse_rc = BATON_EINVAL;
			return;
		}
		int op = -1;
		for (int i = 0; i < F_N; i++)
			if (strcmp(tok, op_names[i]) == 0)
				op = i;
		if (op < 0) {
			if (strcmp(tok, "send") == 0)
				continue; /* proto/transport_msg.c's */
			snprintf(parse_err, sizeof parse_err,
			    "BATON_FAULT: unknown op '%s' (map, alloc, copy, d2h, send)", tok);
			parse_rc = BATON_EINVAL;
			return;
		}
		rules[op].nth = nth;
		rules[op].every = every;
		any_rule = 1;
	}
}

unsigned long fault_injected(void)
{
	return atomic_load(&injected);
}

/* Counts one call of `op`; nonzero when this one must fail. */
static int hit(int op, int code)
{
	unsigned long n = atomic_fetch_add(&calls[op], 1) + 1;
	const struct rule *r = &rules[op];
	if (r->nth == 0 || n < r->nth)
		return 0;
	if (n != r->nth && (r->every == 0 || (n - r->nth) % r->every != 0))
		return 0;
	atomic_fetch_add(&injected, 1);
	fprintf(stderr, "baton-fault: %s call %lu fails: %s\n", op_names[op], n,
	    baton_strerror(code));
	return code;
}

static const struct baton_backend *inner_of(struct baton_dev *dev)
{
	const struct baton_backend *be = NULL;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_DEVS; i++)
		if (devs[i].dev == dev)
			be = devs[i].inner;
	pthread_mutex_unlock(&mu);
	return be;
}

#define IN(dev) inner_of(dev)

static int f_open(int index, uint64_t cap, struct baton_dev **out, char *errbuf, size_t errlen)
{
	(void)index; (void)cap; (void)out;
	if (errbuf && errlen)
		snprintf(errbuf, errlen, "the fault backend only wraps an open device");
	return BATON_EUNSUPPORTED;
}

static void f_close(struct baton_dev *dev)
{
	const struct baton_backend *be = NULL;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_DEVS; i++)
		if (devs[i].dev == dev && dev) {
			be = devs[i].inner;
			devs[i].dev = NULL;
			devs[i].inner = NULL;
		}
	pthread_mutex_unlock(&mu);
	fprintf(stderr, "baton-fault: calls map=%lu alloc=%lu copy=%lu d2h=%lu injected=%lu\n",
	    atomic_load(&calls[F_MAP]), atomic_load(&calls[F_ALLOC]), atomic_load(&calls[F_COPY]),
	    atomic_load(&calls[F_D2H]), atomic_load(&injected));
	if (be)
		be->close(dev);
}

static int f_mem_info(struct baton_dev *dev, uint64_t *fr, uint64_t *tot)
{
	return IN(dev)->mem_info(dev, fr, tot);
}

static int f_uuid(struct baton_dev *dev, char *buf, size_t len)
{
	return IN(dev)->uuid(dev, buf, len);
}

static uint64_t f_granularity(struct baton_dev *dev)
{
	return IN(dev)->granularity(dev);
}

static int f_reserve(struct baton_dev *dev, uint64_t bytes, baton_dptr *base)
{
	return IN(dev)->reserve(dev, bytes, base);
}

static int f_unreserve(struct baton_dev *dev, baton_dptr base, uint64_t bytes)
{
	return IN(dev)->unreserve(dev, base, bytes);
}

static int f_map(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	int rc = hit(F_MAP, BATON_EDEVMEM);
	return rc ? rc : IN(dev)->map(dev, addr, bytes);
}

static int f_unmap(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	return IN(dev)->unmap(dev, addr, bytes);
}

static int f_peer_access(struct baton_dev *dev, struct baton_dev *peer)
{
	return IN(dev)->peer_access(dev, peer);
}

static int f_map_peer(struct baton_dev *dev, struct baton_dev *peer, baton_dptr addr,
    uint64_t bytes)
{
	int rc = hit(F_MAP, BATON_EDEVMEM); /* a peer segment is a map too */
	return rc ? rc : IN(dev)->map_peer(dev, peer, addr, bytes);
}

static int f_unmap_peer(struct baton_dev *dev, struct baton_dev *peer, baton_dptr addr,
    uint64_t bytes)
{
	return IN(dev)->unmap_peer(dev, peer, addr, bytes);
}

static int f_alloc(struct baton_dev *dev, uint64_t bytes, baton_dptr *out)
{
	int rc = hit(F_ALLOC, BATON_EDEVMEM);
	return rc ? rc : IN(dev)->alloc(dev, bytes, out);
}

static void f_free(struct baton_dev *dev, baton_dptr p)
{
	IN(dev)->free(dev, p);
}

static int f_host_register(struct baton_dev *dev, const void *p, uint64_t bytes)
{
	return backend_host_register(IN(dev), dev, p, bytes);
}

static int f_host_unregister(struct baton_dev *dev, const void *p, uint64_t bytes)
{
	return backend_host_unregister(IN(dev), dev, p, bytes);
}

static int f_copy_h2d(struct baton_dev *dev, const struct baton_copy *c, size_t n)
{
	int rc = hit(F_COPY, BATON_EDRIVER);
	return rc ? rc : IN(dev)->copy_h2d(dev, c, n);
}

static int f_copy_d2h(struct baton_dev *dev, void *dst, baton_dptr src, uint64_t bytes)
{
	int rc = hit(F_D2H, BATON_EIO);
	return rc ? rc : IN(dev)->copy_d2h(dev, dst, src, bytes);
}

static int f_copy_d2d(struct baton_dev *dev, baton_dptr dst, baton_dptr src, uint64_t bytes)
{
	int rc = hit(F_COPY, BATON_EDRIVER); /* a copy like copy_h2d */
	return rc ? rc : IN(dev)->copy_d2d(dev, dst, src, bytes);
}

static int f_sync(struct baton_dev *dev)
{
	return IN(dev)->sync(dev);
}

static int f_moe_route(struct baton_dev *dev, const struct baton_moe_layer *l, uint32_t *ids,
    float *w)
{
	return IN(dev)->moe_route(dev, l, ids, w);
}

static int f_moe_experts(struct baton_dev *dev, const struct baton_moe_layer *l,
    const baton_dptr *blobs, const float *w)
{
	return IN(dev)->moe_experts(dev, l, blobs, w);
}

/* The optional slots follow the wrapped backend's (NULL stays NULL): one
 * table per inner backend, built at the first wrap. */
static struct {
	const struct baton_backend *inner;
	struct baton_backend table;
} tables[MAX_DEVS];

static const struct baton_backend *table_for(const struct baton_backend *in)
{
	for (int i = 0; i < MAX_DEVS; i++) {
		if (tables[i].inner == in)
			return &tables[i].table;
		if (!tables[i].inner) {
			tables[i].inner = in;
			tables[i].table = (struct baton_backend){
				.name = in->name, /* the engine reports the device's own name */
				.open = f_open,
				.close = f_close,
				.mem_info = f_mem_info,
				.uuid = f_uuid,
				.granularity = f_granularity,
				.reserve = f_reserve,
				.unreserve = f_unreserve,
				.map = f_map,
				.unmap = f_unmap,
				.peer_access = in->peer_access ? f_peer_access : NULL,
				.map_peer = in->map_peer ? f_map_peer : NULL,
				.unmap_peer = in->unmap_peer ? f_unmap_peer : NULL,
				.alloc = f_alloc,
				.free = f_free,
				.host_register = in->host_register ? f_host_register : NULL,
				.host_unregister = in->host_unregister ? f_host_unregister : NULL,
				.copy_h2d = f_copy_h2d,
				.copy_d2h = f_copy_d2h,
				.copy_d2d = in->copy_d2d ? f_copy_d2d : NULL,
				.sync = f_sync,
				.moe_route = in->moe_route ? f_moe_route : NULL,
				.moe_experts = in->moe_experts ? f_moe_experts : NULL,
				.can_compute = in->can_compute,
				/* pure compute: passed through, no faults */
				.embed = in->embed,
				.rmsnorm = in->rmsnorm,
				.matmul = in->matmul,
				.matmuls = in->matmuls,
				.rope = in->rope,
				.qk_norm_rope = in->qk_norm_rope,
				.attention = in->attention,
				.attention_segs = in->attention_segs,
				.qk_attention_segs = in->qk_attention_segs,
				.rmsnorm_matmuls = in->rmsnorm_matmuls,
				.kv_store = in->kv_store,
				.swiglu = in->swiglu,
				.add = in->add,
				.route = in->route,
				.route_dev = in->route_dev,
				.moe_experts_dev = in->moe_experts_dev,
				.moe_dev_rows = in->moe_dev_rows,
				.router_route_dev = in->router_route_dev,
				.prepare = in->prepare,
			};
			return &tables[i].table;
		}
	}
	return NULL;
}

int fault_wrap(const struct baton_backend *inner, struct baton_dev *dev,
    const struct baton_backend **out, char *errbuf, size_t errlen)
{
	int rc = 0;
	*out = inner;
	pthread_mutex_lock(&mu);
	if (!parsed)
		parse_env();
	if (parse_rc) {
		rc = parse_rc;
		if (errbuf && errlen)
			snprintf(errbuf, errlen, "%s", parse_err);
	} else if (any_rule) {
		const struct baton_backend *t = table_for(inner);
		int slot = -1;
		for (int i = 0; i < MAX_DEVS && t; i++)
			if (!devs[i].dev) {
				slot = i;
				break;
			}
		if (slot < 0) {
			rc = BATON_ENOMEM;
			if (errbuf && errlen)
				snprintf(errbuf, errlen, "BATON_FAULT: more than %d devices", MAX_DEVS);
		} else {
			devs[slot].dev = dev;
			devs[slot].inner = inner;
			*out = t;
		}
	}
	pthread_mutex_unlock(&mu);
	return rc;
}
