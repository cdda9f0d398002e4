/*
 * build.c: writing an arena from a plan and publishing it (arena_build;
 * the planners fill the plan through plan.c, create.c calls this).
 *
 *   1. lay out the entries (experts layer-major, expert-minor, each blob
 *      aligned to BATON_ARENA_ALIGN; then every router and norm);
 *   2. take an exclusive flock on PATH.lock (a second creator waits here);
 *      remove temporary files of creators that died; if a valid arena of the
 *      same source is now at PATH, use it;
 *   3. create PATH.tmp.<pid>, size it, map it and fill every blob from
 *      several threads, each checksumming the blobs it wrote;
 *   4. write the table and the header (unsealed), flush them (except on
 *      tmpfs, where there is nothing to flush), then write the seal
 *      (sealed flag, generation, header checksum), flush again;
 *   5. rename the file to PATH (atomic), release the lock.
 *
 * A creator killed before 5 leaves at most a PATH.tmp.<pid> that is either
 * unsealed (refused by arena_open) or, killed between seal and rename,
 * complete; the next creator removes it in step 2.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/magic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "arena/arena_int.h"

static uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- layout ---------------------------------------------------------------- */

static int set_part(struct arena_file_entry *e, int i, uint32_t dtype, uint32_t rows,
    uint32_t cols, uint64_t off, const char *what, char *errbuf, size_t errlen)
{
	uint64_t rb = baton_dtype_row_bytes((int)dtype, cols);
	if (rb == 0) {
		const char *dn = baton_dtype_name((int)dtype);
		if (!dn)
			return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "layer %" PRIu32 " %s: unknown dtype %" PRIu32, e->layer, what, dtype);
		return arena_errf(errbuf, errlen, BATON_EINVAL,
		    "layer %" PRIu32 " %s: %" PRIu32 " columns are not a multiple of %s's %" PRIu32
		    "-element blocks", e->layer, what, cols, dn, arena_dtype_block((int)dtype));
	}
	e->part[i] = (struct arena_file_part){
		.dtype = dtype, .rows = rows, .cols = cols, .offset = off, .bytes = rb * rows,
	};
	return 0;
}

static int name_ok(const char *n)
{
	size_t len = strlen(n);
	if (len == 0 || len > ARENA_MAX_NAME)
		return 0;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)n[i] < 0x21 || (unsigned char)n[i] > 0x7e)
			return 0;
	return 1;
}

static int named_cmp(const void *a, const void *b)
{
	const struct arena_named *x = *(const struct arena_named *const *)a;
	const struct arena_named *y = *(const struct arena_named *const *)b;
	int bx = x->role == BATON_ROLE_BLOB, by = y->role == BATON_ROLE_BLOB;
	if (bx != by)
		return bx - by;
	return strcmp(x->name, y->name);
}

/* The named list: valid names, no name twice, a router and a norm for every
 * layer or for none; sets *flags' ROUTER and NORM bits. */
static int check_named(const struct arena_plan *p, uint32_t *flags, char *errbuf, size_t errlen)
{
	uint64_t routers = 0, norms = 0, blobs = 0;
	int rc = 0;
	const struct arena_named **v = malloc((p->n_named ? p->n_named : 1) * sizeof *v);
	if (!v)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	for (uint64_t i = 0; i < p->n_named; i++) {
		const struct arena_named *n = &p->named[i];
		v[i] = n;
		if (!name_ok(n->name)) {
			rc = arena_errf(errbuf, errlen, BATON_EINVAL,
			    "name \"%.80s\" is empty, longer than %u bytes or not printable ASCII",
			    n->name, ARENA_MAX_NAME);
			goto out;
		}
		if ((n->role == BATON_ROLE_ROUTER || n->role == BATON_ROLE_NORM) &&
		    n->layer >= p->shape.layers) {
			rc = arena_errf(errbuf, errlen, BATON_EINVAL, "%s: layer %" PRIu32
			    " past the %" PRIu32 " layers", n->name, n->layer, p->shape.layers);
			goto out;
		}
		routers += n->role == BATON_ROLE_ROUTER;
		norms += n->role == BATON_ROLE_NORM;
		blobs += n->role == BATON_ROLE_BLOB;
		if (n->role == BATON_ROLE_BLOB && (n->bytes == 0 || n->bytes > ARENA_MAX_BLOB)) {
			rc = arena_errf(errbuf, errlen, BATON_ETOOBIG, "metadata %s: %" PRIu64
			    " bytes, not in 1..%u", n->name, n->bytes, ARENA_MAX_BLOB);
			goto out;
		}
	}
	if ((routers && routers != p->shape.layers) || (norms && norms != p->shape.layers)) {
		rc = arena_errf(errbuf, errlen, BATON_EINVAL,
		    "%" PRIu64 " routers and %" PRIu64 " norms for %" PRIu32 " layers",
		    routers, norms, p->shape.layers);
		goto out;
	}
	if (blobs > ARENA_MAX_BLOBS || p->n_named - blobs - routers - norms > ARENA_MAX_NAMED) {
		rc = arena_errf(errbuf, errlen, BATON_ECOUNT, "too many tensors or metadata blobs");
		goto out;
	}
	qsort(v, p->n_named, sizeof *v, named_cmp);
	for (uint64_t i = 1; i < p->n_named; i++)
		if (named_cmp(&v[i - 1], &v[i]) == 0) {
			rc = arena_errf(errbuf, errlen, BATON_EINVAL, "%s appears twice", v[i]->name);
			goto out;
		}
	*flags = (*flags & ~(uint32_t)(ARENA_F_ROUTER | ARENA_F_NORM)) |
	    (routers ? ARENA_F_ROUTER : 0) | (norms ? ARENA_F_NORM : 0);
out:
	free(v);
	return rc;
}

static int layout(const struct arena_plan *p, struct arena_file_header *h,
    struct arena_file_entry **out, char **names_out, char *errbuf, size_t errlen)
{
	const struct baton_arena_shape *s = &p->shape;
	uint64_t nexp = (uint64_t)s->layers * s->experts;
	uint64_t n = nexp + p->n_named;
	uint64_t names_bytes = 0;
	for (uint64_t i = 0; i < p->n_named; i++)
		names_bytes += strlen(p->named[i].name);
	if (names_bytes > ARENA_MAX_NAMES)
		return arena_errf(errbuf, errlen, BATON_ETOOBIG, "names take more than %u bytes",
		    ARENA_MAX_NAMES);
	struct arena_file_entry *ents = calloc(n, sizeof *ents);
	char *names = malloc(names_bytes ? names_bytes : 1);
	int rc;
	if (!ents || !names) {
		free(ents);
		free(names);
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "no memory for %" PRIu64 " entries", n);
	}
	uint64_t k = 0;
	for (uint32_t l = 0; l < s->layers; l++) {
		const uint32_t *dt = &p->layer_dt[(uint64_t)l * ARENA_DT_N];
		for (uint32_t x = 0; x < s->experts; x++) {
			struct arena_file_entry *e = &ents[k++];
			e->layer = l;
			e->expert = x;
			e->role = BATON_ROLE_EXPERT;
			e->n_parts = 3;
			if ((rc = set_part(e, 0, dt[ARENA_DT_GATE], s->d_ff, s->d_model, 0, "gate",
				 errbuf, errlen)))
				goto fail;
			uint64_t up = arena_align_up(e->part[0].bytes, ARENA_PART_ALIGN);
			if ((rc = set_part(e, 1, dt[ARENA_DT_UP], s->d_ff, s->d_model, up, "up",
				 errbuf, errlen)))
				goto fail;
			uint64_t down = arena_align_up(up + e->part[1].bytes, ARENA_PART_ALIGN);
			if ((rc = set_part(e, 2, dt[ARENA_DT_DOWN], s->d_model, s->d_ff, down, "down",
				 errbuf, errlen)))
				goto fail;
			e->bytes = down + e->part[2].bytes;
		}
	}
	uint64_t noff = 0;
	for (uint64_t i = 0; i < p->n_named; i++) {
		const struct arena_named *nm = &p->named[i];
		struct arena_file_entry *e = &ents[k++];
		size_t len = strlen(nm->name);
		memcpy(names + noff, nm->name, len);
		e->name_off = (uint32_t)noff;
		e->name_len = (uint32_t)len;
		noff += len;
		e->role = nm->role;
		e->layer = nm->role == BATON_ROLE_ROUTER || nm->role == BATON_ROLE_NORM ? nm->layer : 0;
		if (nm->role == BATON_ROLE_BLOB) {
			e->n_parts = 0;
			e->bytes = nm->bytes;
			h->n_blobs++;
			continue;
		}
		if (nm->role == BATON_ROLE_DENSE)
			h->n_dense++;
		if (nm->rows == 0 || nm->rows > ARENA_MAX_DENSE_ROWS || nm->cols == 0 ||
		    nm->cols >= ARENA_MAX_DIM) {
			rc = arena_errf(errbuf, errlen, BATON_ECOUNT,
			    "%s: shape %" PRIu32 "x%" PRIu32 " out of range", nm->name, nm->rows, nm->cols);
			goto fail;
		}
		e->n_parts = 1;
		if ((rc = set_part(e, 0, nm->dtype, nm->rows, nm->cols, 0, nm->name, errbuf, errlen)))
			goto fail;
		e->bytes = e->part[0].bytes;
	}

	uint64_t table_end = ARENA_HEADER_BYTES + n * ARENA_ENTRY_BYTES;
	h->names_offset = table_end;
	h->names_bytes = names_bytes;
	uint64_t off = arena_align_up(table_end + names_bytes, BATON_ARENA_ALIGN), max = 0;
	h->data_offset = off;
	for (uint64_t i = 0; i < n; i++) {
		ents[i].offset = off;
		if (__builtin_add_overflow(off, arena_align_up(ents[i].bytes, BATON_ARENA_ALIGN), &off) ||
		    off > (UINT64_C(1) << 52)) {
			rc = arena_errf(errbuf, errlen, BATON_ETOOBIG, "the arena would be too large");
			goto fail;
		}
		if (ents[i].role == BATON_ROLE_EXPERT && ents[i].bytes > max)
			max = ents[i].bytes;
	}
	h->file_bytes = off;
	h->table_offset = ARENA_HEADER_BYTES;
	h->n_entries = n;
	h->max_expert_bytes = max;
	*out = ents;
	*names_out = names;
	return 0;
fail:
	free(ents);
	free(names);
	return rc;
}

/* ---- files ----------------------------------------------------------------- */

/* Makes the missing parts of `dir`, each 0750 (the service group reads
 * arenas; others do not). */
static int mkdir_p(const char *dir, char *errbuf, size_t errlen)
{
	char buf[PATH_MAX];
	if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "path too long");
	for (char *p = buf + 1;; p++) {
		if (*p == '/' || *p == '\0') {
			char c = *p;
			*p = '\0';
			if (mkdir(buf, 0750) != 0 && errno != EEXIST)
				return arena_errf(errbuf, errlen, BATON_EIO, "mkdir %s: %s", buf,
				    strerror(errno));
			*p = c;
			if (!c)
				break;
		}
	}
	return 0;
}

/* The arena's directory: base's rule of who may have written what is in
 * it (baton_trust_dir). */
int arena_check_dir(const char *dir, char *errbuf, size_t errlen)
{
	return baton_trust_dir(dir, "arena directory", errbuf, errlen);
}

static void split_path(const char *path, char *dir, size_t dlen, const char **base)
{
	const char *slash = strrchr(path, '/');
	if (!slash) {
		snprintf(dir, dlen, ".");
		*base = path;
	} else if (slash == path) {
		snprintf(dir, dlen, "/");
		*base = slash + 1;
	} else {
		snprintf(dir, dlen, "%.*s", (int)(slash - path), path);
		*base = slash + 1;
	}
}

/* Under the lock: every PATH.tmp.* is a dead creator's. */
static void remove_stale(const char *dir, const char *base)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	char prefix[NAME_MAX + 8];
	int plen = snprintf(prefix, sizeof prefix, "%s.tmp.", base);
	if (plen > 0 && (size_t)plen < sizeof prefix) {
		struct dirent *de;
		while ((de = readdir(d)) != NULL) {
			const char *s = de->d_name;
			if (strncmp(s, prefix, (size_t)plen) != 0 || !s[plen])
				continue;
			/* PATH.tmp.<pid> only: not another arena named PATH.tmp.x */
			if (strspn(s + plen, "0123456789") == strlen(s + plen))
				unlinkat(dirfd(d), s, 0);
		}
	}
	closedir(d);
}

/* 1: a valid arena of this source is at path (generation in *gen);
 * 0: none or an invalid one (to be replaced; *old_gen set when readable);
 * BATON_EEXIST: a valid arena of another source, and no force. */
static int check_existing(const char *path, const struct arena_plan *p, int force,
    uint64_t *gen, uint64_t *bytes, uint64_t *old_gen, char *errbuf, size_t errlen)
{
	struct baton_arena *a;
	if (arena_open(path, &a, NULL, 0) != 0)
		return 0;
	struct baton_arena_shape s = *arena_shape(a);
	struct arena_file_header h;
	memcpy(&h, arena_base(a), sizeof h); /* validated by arena_open */
	*old_gen = arena_generation(a);
	int same = h.source_kind == p->source_kind && h.source_hash == p->source_hash &&
	    memcmp(&s, &p->shape, sizeof s) == 0;
	*gen = arena_generation(a);
	*bytes = arena_size(a);
	char src[ARENA_SOURCE_LEN];
	snprintf(src, sizeof src, "%s", arena_source(a));
	arena_close(a);
	if (force)
		return 0;
	if (same)
		return 1;
	return arena_errf(errbuf, errlen, BATON_EEXIST,
	    "%s holds another arena (%s); pass --force (force=1) to replace it", path, src);
}

struct fill_ctx {
	const struct arena_plan *plan;
	struct arena_file_entry *ents;
	uint8_t *map;
	int guard;                 /* guard.c's slot for map */
	pthread_mutex_t mu;
	uint64_t err_item;
	char msg[512];
	const struct baton_create_opts *opts; /* its progress callback */
	uint64_t done, total;                 /* blob bytes written, to write (under mu) */
};

static int fill_one(void *arg, uint64_t i)
{
	struct fill_ctx *c = arg;
	struct arena_file_entry *e = &c->ents[i];
	const struct arena_plan *p = c->plan;
	uint64_t nexp = (uint64_t)p->shape.layers * p->shape.experts;
	const struct arena_named *n = i < nexp ? NULL : &p->named[i - nexp];
	char msg[512] = "";
	int rc = 0;
	if (arena_guard_faults(c->guard))
		return BATON_EIO; /* the file system is full: write_tmp says so */
	if (n && n->role == BATON_ROLE_BLOB)
		memcpy(c->map + e->offset, n->data, n->bytes);
	else
		rc = p->fill(p->ctx, e, n, c->map + e->offset, msg, sizeof msg);
	if (rc) {
		pthread_mutex_lock(&c->mu);
		if (i < c->err_item) {
			c->err_item = i;
			snprintf(c->msg, sizeof c->msg, "%s", msg);
		}
		pthread_mutex_unlock(&c->mu);
		return rc;
	}
	e->checksum = arena_hash(c->map + e->offset, e->bytes);
	if (c->opts && c->opts->progress) {
		pthread_mutex_lock(&c->mu);
		c->done += e->bytes;
		c->opts->progress(c->opts->progress_ctx, c->done, c->total);
		pthread_mutex_unlock(&c->mu);
	}
	return 0;
}

static int write_tmp(const char *tmp, const struct arena_plan *p, struct arena_file_header *h,
    struct arena_file_entry *ents, const char *names, uint64_t old_gen,
    const struct baton_create_opts *opts, char *errbuf, size_t errlen)
{
	unsigned threads = opts->threads;
	int rc = 0;
	uint8_t *map = MAP_FAILED;
	int guard = -1;
	int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
	if (fd < 0)
		return arena_errf(errbuf, errlen, BATON_EIO, "%s: %s", tmp, strerror(errno));
	struct statfs sfs;
	int tmpfs = fstatfs(fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC;
	if (tmpfs) {
		/* tmpfs has no cheap fallocate (it zeroes every page under the
		 * inode lock); check the room instead, so a full /dev/shm is an
		 * error here and not a SIGBUS later. */
		struct statvfs vfs;
		if (fstatvfs(fd, &vfs) == 0 &&
		    (uint64_t)vfs.f_bavail * vfs.f_frsize < h->file_bytes) {
			rc = arena_errf(errbuf, errlen, BATON_EIO,
			    "%s: not enough room: need %" PRIu64 " MiB, %" PRIu64 " MiB free",
			    tmp, h->file_bytes >> 20, ((uint64_t)vfs.f_bavail * vfs.f_frsize) >> 20);
			goto out;
		}
	}
	if (ftruncate(fd, (off_t)h->file_bytes) != 0) {
		rc = arena_errf(errbuf, errlen, BATON_EIO, "%s: ftruncate: %s", tmp, strerror(errno));
		goto out;
	}
	if (!tmpfs && fallocate(fd, 0, 0, (off_t)h->file_bytes) != 0 &&
	    errno != EOPNOTSUPP && errno != ENOSYS) {
		rc = arena_errf(errbuf, errlen, BATON_EIO, "%s: fallocate: %s", tmp, strerror(errno));
		goto out;
	}
	map = mmap(NULL, h->file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		rc = arena_errf(errbuf, errlen, BATON_EIO, "%s: mmap: %s", tmp, strerror(errno));
		goto out;
	}
	madvise(map, h->file_bytes, MADV_HUGEPAGE);
	guard = arena_guard_add(map, h->file_bytes, 1);
	/* An unsealed header first: a creator that dies from here on leaves a
	 * file that open calls "not sealed" rather than "bad magic". */
	memcpy(map, h, sizeof *h);

	struct fill_ctx fc = { .plan = p, .ents = ents, .map = map, .guard = guard,
		.err_item = UINT64_MAX, .opts = opts };
	for (uint64_t i = 0; i < h->n_entries; i++)
		fc.total += ents[i].bytes;
	pthread_mutex_init(&fc.mu, NULL);
	rc = arena_parallel(threads, h->n_entries, fill_one, &fc);
	pthread_mutex_destroy(&fc.mu);
	if (arena_guard_faults(guard)) {
		/* tmpfs had no page to give a write (filled since the check
		 * above): SIGBUS without the guard. */
		rc = arena_errf(errbuf, errlen, BATON_EIO,
		    "%s: the file system ran out of room while the arena was written "
		    "(%" PRIu64 " MiB); free some or use a larger one", tmp, h->file_bytes >> 20);
		goto out;
	}
	if (rc) {
		arena_errf(errbuf, errlen, rc, "%s", fc.msg[0] ? fc.msg : "filling the arena failed");
		goto out;
	}

	size_t tbytes = (size_t)(h->n_entries * ARENA_ENTRY_BYTES);
	memcpy(map + h->table_offset, ents, tbytes);
	memcpy(map + h->names_offset, names, (size_t)h->names_bytes);
	/* The table checksum covers the names too: they say what a blob is. */
	h->table_checksum = arena_table_checksum(map + h->table_offset, tbytes,
	    map + h->names_offset, (size_t)h->names_bytes);
	memcpy(map, h, sizeof *h); /* not sealed yet */
	if (!tmpfs && (msync(map, h->file_bytes, MS_SYNC) != 0 || fdatasync(fd) != 0)) {
		rc = arena_errf(errbuf, errlen, BATON_EIO, "%s: sync: %s", tmp, strerror(errno));
		goto out;
	}

	/* The seal, last. */
	uint64_t gen = realtime_ns();
	if (gen <= old_gen)
		gen = old_gen + 1;
	h->created_ns = realtime_ns();
	h->generation = gen;
	h->sealed = ARENA_SEALED;
	h->header_checksum = arena_header_checksum(h);
	memcpy(map, h, sizeof *h);
	if (!tmpfs && (msync(map, ARENA_HEADER_BYTES, MS_SYNC) != 0 || fdatasync(fd) != 0)) {
		rc = arena_errf(errbuf, errlen, BATON_EIO, "%s: sync: %s", tmp, strerror(errno));
		goto out;
	}
out:
	if (!rc && arena_guard_faults(guard)) /* the table or the seal's page */
		rc = arena_errf(errbuf, errlen, BATON_EIO,
		    "%s: the file system ran out of room while the arena was written", tmp);
	arena_guard_remove(guard);
	if (map != MAP_FAILED)
		munmap(map, h->file_bytes);
	close(fd);
	return rc;
}

static void sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return;
	struct statfs sfs;
	if (fstatfs(fd, &sfs) == 0 && sfs.f_type != TMPFS_MAGIC)
		fsync(fd);
	close(fd);
}

/* The plan's metadata blobs by key, for opts->check. */
static int plan_blob(void *plan, const char *key, const void **data, uint64_t *len)
{
	const struct arena_plan *p = plan;
	for (uint64_t i = 0; i < p->n_named; i++)
		if (p->named[i].role == BATON_ROLE_BLOB && strcmp(p->named[i].name, key) == 0) {
			*data = p->named[i].data ? p->named[i].data : "";
			*len = p->named[i].bytes;
			return 0;
		}
	return BATON_ENOTFOUND;
}

int arena_build(const char *path, const struct arena_plan *p,
    const struct baton_create_opts *opts, struct baton_create_result *res,
    char *errbuf, size_t errlen)
{
	static const struct baton_create_opts no_opts;
	struct baton_create_result r = { 0 };
	double t0 = baton_now_s();
	struct arena_file_entry *ents = NULL;
	char *names = NULL;
	char dir[PATH_MAX], lockpath[PATH_MAX], tmp[PATH_MAX];
	const char *base;
	int rc, lockfd = -1, have_tmp = 0;
	uint64_t old_gen = 0;

	if (!opts)
		opts = &no_opts;
	if (!path || !*path || path[strlen(path) - 1] == '/')
		return arena_errf(errbuf, errlen, BATON_EINVAL, "bad arena path \"%s\"",
		    path ? path : "");
	split_path(path, dir, sizeof dir, &base);
	if (snprintf(lockpath, sizeof lockpath, "%s.lock", path) >= (int)sizeof lockpath ||
	    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "arena path too long");

	struct arena_file_header h = { 0 };
	uint32_t flags = p->flags;
	if ((rc = check_named(p, &flags, errbuf, errlen)))
		return rc;
	if (p->arch[0]) {
		int cfg = 0;
		for (uint64_t i = 0; i < p->n_named; i++)
			cfg |= p->named[i].role == BATON_ROLE_BLOB && strcmp(p->named[i].name, "config.json") == 0;
		if (!arena_arch_known(p->arch) || !cfg)
			return arena_errf(errbuf, errlen, BATON_EINVAL,
			    "a model of architecture \"%s\" needs a known architecture and a config.json",
			    p->arch);
		flags |= ARENA_F_MODEL;
	}
	/* The caller's checks of the blobs (the tokenizer), before anything
	 * is written: a refused import changes nothing. */
	if (opts->check && (rc = opts->check(opts->check_ctx, plan_blob, (void *)p, errbuf, errlen)))
		return rc;
	if ((rc = layout(p, &h, &ents, &names, errbuf, errlen)))
		return rc;
	memcpy(h.magic, ARENA_MAGIC, ARENA_MAGIC_LEN);
	h.version = ARENA_VERSION;
	h.header_bytes = ARENA_HEADER_BYTES;
	h.entry_bytes = ARENA_ENTRY_BYTES;
	h.source_hash = p->source_hash;
	h.source_kind = p->source_kind;
	h.flags = flags;
	snprintf(h.arch, sizeof h.arch, "%s", p->arch);
	h.layers = p->shape.layers;
	h.experts = p->shape.experts;
	h.top_k = p->shape.top_k;
	h.d_model = p->shape.d_model;
	h.d_ff = p->shape.d_ff;
	h.gate_dtype = p->layer_dt[ARENA_DT_GATE];
	h.up_dtype = p->layer_dt[ARENA_DT_UP];
	h.down_dtype = p->layer_dt[ARENA_DT_DOWN];
	h.router_dtype = h.norm_dtype = BATON_DT_F32; /* of layer 0's, when there */
	for (uint64_t i = 0; i < p->n_named; i++)
		if (p->named[i].layer == 0 && p->named[i].role == BATON_ROLE_ROUTER)
			h.router_dtype = p->named[i].dtype;
		else if (p->named[i].layer == 0 && p->named[i].role == BATON_ROLE_NORM)
			h.norm_dtype = p->named[i].dtype;
	memcpy(h.source, p->source, ARENA_SOURCE_LEN);
	h.source[ARENA_SOURCE_LEN - 1] = '\0';

	struct arena_plan pc = *p; /* the shape as the file will say it */
	pc.flags = flags;
	pc.shape.gate_dtype = h.gate_dtype;
	pc.shape.up_dtype = h.up_dtype;
	pc.shape.down_dtype = h.down_dtype;
	pc.shape.router_dtype = h.router_dtype;
	pc.shape.norm_dtype = h.norm_dtype;

	/* The directory first, even for the fast path: an arena already in a
	 * directory someone else controls is not to be reused. */
	if ((rc = mkdir_p(dir, errbuf, errlen)) || (rc = arena_check_dir(dir, errbuf, errlen)))
		goto done;
	/* Fast path: already there, no lock needed. */
	rc = check_existing(path, &pc, opts->force, &r.generation, &r.bytes, &old_gen,
	    errbuf, errlen);
	if (rc == 1) {
		r.reused = 1;
		rc = 0;
		goto done;
	}
	if (rc)
		goto done;

	/* O_NOFOLLOW: a link left at the lock's name is not followed. */
	lockfd = open(lockpath, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0640);
	if (lockfd < 0) {
		rc = arena_errf(errbuf, errlen, BATON_EIO, "%s: %s", lockpath, strerror(errno));
		goto done;
	}
	while (flock(lockfd, LOCK_EX) != 0)
		if (errno != EINTR) {
			rc = arena_errf(errbuf, errlen, BATON_EIO, "flock %s: %s", lockpath,
			    strerror(errno));
			goto done;
		}
	remove_stale(dir, base);
	/* Another creator may have finished while we waited. With force, a
	 * creator that waited still rebuilds: it was asked to. */
	rc = check_existing(path, &pc, opts->force, &r.generation, &r.bytes, &old_gen,
	    errbuf, errlen);
	if (rc == 1) {
		r.reused = 1;
		rc = 0;
		goto done;
	}
	if (rc)
		goto done;

	have_tmp = 1;
	if ((rc = write_tmp(tmp, &pc, &h, ents, names, old_gen, opts, errbuf, errlen)))
		goto done;
	if (rename(tmp, path) != 0) {
		rc = arena_errf(errbuf, errlen, BATON_EIO, "rename %s to %s: %s", tmp, path,
		    strerror(errno));
		goto done;
	}
	have_tmp = 0;
	sync_dir(dir);
	r.generation = h.generation;
	r.bytes = h.file_bytes;
done:
	if (have_tmp)
		unlink(tmp);
	if (lockfd >= 0)
		close(lockfd); /* releases the flock */
	free(ents);
	free(names);
	r.seconds = baton_now_s() - t0;
	if (res)
		*res = r;
	return rc;
}
