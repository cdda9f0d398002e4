/*
 * trust_test.c: who may have written an arena (issue 14, item 4). The
 * arena's directory is made 0750 by Baton, or refused when it is a link,
 * belongs to another user, or others can write it; an arena file of
 * another user or writable by others is refused at open; new arenas are
 * 0640 and the lock file is never followed through a link; at open, the
 * directory is held to create's rules and a link is not followed (issue
 * 28, item 1). "Another
 * user" is uid 65534 (nobody): the cases that chown need root and say so
 * when skipped.
 */
#include <errno.h>
#include <sys/stat.h>

#include "arena/arena_int.h"
#include "tests/arena_util.h"

#define NOBODY 65534

static char dir[PATH_MAX - 256];

static int create(const char *path, char *msg, size_t len)
{
	struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC, .synth = au_small() };
	msg[0] = '\0';
	return arena_create(path, &src, NULL, NULL, msg, len);
}

static int is_root(const char *what)
{
	if (geteuid() == 0)
		return 1;
	printf("     (skipped %s: needs root to chown)\n", what);
	return 0;
}

/* Made by Baton: 0750 directories (missing parents too), a 0640 arena. */
static void t_modes_of_new_files(void)
{
	au_tmpdir(dir, sizeof dir);
	umask(022);
	char sub[PATH_MAX - 192], deep[PATH_MAX - 128], path[PATH_MAX - 64], msg[512];
	snprintf(sub, sizeof sub, "%s/baton", dir);
	snprintf(deep, sizeof deep, "%s/deep", sub);
	snprintf(path, sizeof path, "%s/m.arena", deep);
	T_ASSERT_MSG(create(path, msg, sizeof msg) == 0, "%s", msg);
	struct stat st;
	T_ASSERT(stat(sub, &st) == 0);
	T_EQ_INT(st.st_mode & 07777, 0750);
	T_ASSERT(stat(deep, &st) == 0);
	T_EQ_INT(st.st_mode & 07777, 0750);
	T_ASSERT(stat(path, &st) == 0);
	T_EQ_INT(st.st_mode & 07777, 0640);
	char lock[PATH_MAX];
	snprintf(lock, sizeof lock, "%s.lock", path);
	T_ASSERT(stat(lock, &st) == 0);
	T_EQ_INT(st.st_mode & 07777, 0640);
	struct baton_arena *a;
	T_OK(arena_open(path, &a, msg, sizeof msg));
	arena_close(a);
	unlink(path);
	unlink(lock);
	rmdir(deep);
	rmdir(sub);
	au_rmdir(dir);
}

/* Another user made the directory first (it is empty after every boot):
 * creating there is refused, and an arena they put there is not reused. */
static void t_dir_of_another_user(void)
{
	if (!is_root("t_dir_of_another_user"))
		return;
	au_tmpdir(dir, sizeof dir);
	char sub[PATH_MAX - 192], path[PATH_MAX - 64], msg[512];
	snprintf(sub, sizeof sub, "%s/baton", dir);
	snprintf(path, sizeof path, "%s/m.arena", sub);
	T_ASSERT(mkdir(sub, 0755) == 0);
	T_ASSERT(chown(sub, NOBODY, NOBODY) == 0);
	T_EQ_ERR(create(path, msg, sizeof msg), BATON_EPERM);
	T_ASSERT_MSG(strstr(msg, "belongs to uid 65534") != NULL, "%s", msg);
	T_ASSERT(access(path, F_OK) != 0); /* nothing written there */
	/* Their arena already there (made while the directory was ours): not
	 * reused by a create, though it matches. */
	T_ASSERT(chown(sub, 0, 0) == 0);
	T_ASSERT_MSG(create(path, msg, sizeof msg) == 0, "%s", msg);
	T_ASSERT(chown(sub, NOBODY, NOBODY) == 0);
	T_EQ_ERR(create(path, msg, sizeof msg), BATON_EPERM);
	T_ASSERT(chown(sub, 0, 0) == 0);
	char lock[PATH_MAX];
	snprintf(lock, sizeof lock, "%s.lock", path);
	unlink(path);
	unlink(lock);
	rmdir(sub);
	au_rmdir(dir);
}

/* Writable by the group or others: refused, even when it is ours; root's
 * sticky directory (as /dev/shm and /tmp) is fine. */
static void t_dir_writable_by_others(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX - 64], msg[512];
	snprintf(path, sizeof path, "%s/m.arena", dir);
	T_ASSERT(chmod(dir, 0770) == 0);
	T_EQ_ERR(create(path, msg, sizeof msg), BATON_EPERM);
	T_ASSERT_MSG(strstr(msg, "writable by its group") != NULL, "%s", msg);
	T_ASSERT(chmod(dir, 0757) == 0);
	T_EQ_ERR(create(path, msg, sizeof msg), BATON_EPERM);
	T_ASSERT_MSG(strstr(msg, "writable by others") != NULL, "%s", msg);
	T_ASSERT(access(path, F_OK) != 0);
	T_ASSERT(chmod(dir, 01777) == 0);
	if (geteuid() == 0)
		T_ASSERT_MSG(create(path, msg, sizeof msg) == 0, "%s", msg);
	T_ASSERT(chmod(dir, 0700) == 0);
	T_ASSERT_MSG(create(path, msg, sizeof msg) == 0, "%s", msg);
	au_rmdir(dir);
}

/* A link where the directory should be: refused (the link may be
 * changed to point elsewhere between checks); a link at the lock's name
 * is not followed. */
static void t_symlinks(void)
{
	au_tmpdir(dir, sizeof dir);
	char real[PATH_MAX - 192], link[PATH_MAX - 192], path[PATH_MAX - 64], msg[512];
	snprintf(real, sizeof real, "%s/real", dir);
	snprintf(link, sizeof link, "%s/baton", dir);
	T_ASSERT(mkdir(real, 0750) == 0);
	T_ASSERT(symlink(real, link) == 0);
	snprintf(path, sizeof path, "%s/m.arena", link);
	T_EQ_ERR(create(path, msg, sizeof msg), BATON_EPERM);
	T_ASSERT_MSG(strstr(msg, "symbolic link") != NULL, "%s", msg);
	snprintf(path, sizeof path, "%s//m.arena", link); /* lstat("link/") follows */
	T_EQ_ERR(create(path, msg, sizeof msg), BATON_EPERM);
	T_ASSERT_MSG(strstr(msg, "symbolic link") != NULL, "%s", msg);
	rmdir(real);
	unlink(link);

	char victim[PATH_MAX - 192], lock[PATH_MAX];
	snprintf(path, sizeof path, "%s/m.arena", dir);
	snprintf(lock, sizeof lock, "%s/m.arena.lock", dir);
	snprintf(victim, sizeof victim, "%s/victim", dir);
	au_write(victim, "keep", 4);
	T_ASSERT(symlink(victim, lock) == 0);
	T_EQ_ERR(create(path, msg, sizeof msg), BATON_EIO);
	T_ASSERT(access(path, F_OK) != 0);
	size_t n;
	uint8_t *b = au_read(victim, &n);
	T_EQ_INT(n, 4);
	free(b);
	au_rmdir(dir);
}

/* At open: an arena of another user, or one others can write, is not
 * loaded; one of root is (the engine's user reads root's arenas). */
static void t_open_checks_owner_and_mode(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX - 64], msg[512];
	snprintf(path, sizeof path, "%s/m.arena", dir);
	T_ASSERT_MSG(create(path, msg, sizeof msg) == 0, "%s", msg);
	struct baton_arena *a = NULL;
	T_ASSERT(chmod(path, 0646) == 0);
	T_EQ_ERR(arena_open(path, &a, msg, sizeof msg), BATON_EPERM);
	T_ASSERT_MSG(strstr(msg, "writable by others") != NULL, "%s", msg);
	T_ASSERT(a == NULL);
	T_ASSERT(chmod(path, 0660) == 0); /* the group may write: the service group */
	T_OK(arena_open(path, &a, msg, sizeof msg));
	arena_close(a);
	a = NULL;
	if (is_root("the other-owner half of t_open_checks_owner_and_mode")) {
		T_ASSERT(chown(path, NOBODY, NOBODY) == 0);
		T_EQ_ERR(arena_open(path, &a, msg, sizeof msg), BATON_EPERM);
		T_ASSERT_MSG(strstr(msg, "belongs to uid 65534") != NULL, "%s", msg);
		T_ASSERT(a == NULL);
		T_ASSERT(chown(path, 0, 0) == 0);
		T_OK(arena_open(path, &a, msg, sizeof msg));
		arena_close(a);
	}
	au_rmdir(dir);
}

/* At open, create's rules too (issue 28): a user who made the directory
 * first chooses nothing. Their link `qwen.arena` to root's arena of
 * another model is not followed, in their directory or in ours, and a
 * root-owned arena in their directory is not loaded either. */
static void t_open_refuses_a_chosen_arena(void)
{
	au_tmpdir(dir, sizeof dir);
	char real[PATH_MAX - 64], alias[PATH_MAX - 64], sub[PATH_MAX - 192],
	    theirs[PATH_MAX - 64], msg[512];
	snprintf(real, sizeof real, "%s/mixtral.arena", dir);
	snprintf(alias, sizeof alias, "%s/qwen.arena", dir);
	T_ASSERT_MSG(create(real, msg, sizeof msg) == 0, "%s", msg);
	struct baton_arena *a = NULL;
	T_ASSERT(symlink(real, alias) == 0);
	T_EQ_ERR(arena_open(alias, &a, msg, sizeof msg), BATON_EPERM);
	T_ASSERT_MSG(strstr(msg, "symbolic link") != NULL, "%s", msg);
	T_ASSERT(a == NULL);
	/* A link to a directory of arenas: refused, however the path is spelt. */
	char ldir[PATH_MAX - 64], via[PATH_MAX];
	snprintf(ldir, sizeof ldir, "%s.link", dir);
	T_ASSERT(symlink(dir, ldir) == 0);
	snprintf(via, sizeof via, "%s//mixtral.arena", ldir);
	T_EQ_ERR(arena_open(via, &a, msg, sizeof msg), BATON_EPERM);
	T_ASSERT_MSG(strstr(msg, "symbolic link") != NULL, "%s", msg);
	unlink(ldir);
	/* A directory writable by others (not root's sticky one): refused. */
	T_ASSERT(chmod(dir, 0777) == 0);
	T_EQ_ERR(arena_open(real, &a, msg, sizeof msg), BATON_EPERM);
	T_ASSERT_MSG(strstr(msg, "writable by others") != NULL, "%s", msg);
	T_ASSERT(chmod(dir, 0700) == 0);
	T_OK(arena_open(real, &a, msg, sizeof msg));
	arena_close(a);
	a = NULL;
	if (is_root("the other-user directory half of t_open_refuses_a_chosen_arena")) {
		snprintf(sub, sizeof sub, "%s/baton", dir);
		T_ASSERT(mkdir(sub, 0755) == 0);
		snprintf(theirs, sizeof theirs, "%s/qwen.arena", sub);
		T_ASSERT(symlink(real, theirs) == 0);
		T_ASSERT(lchown(theirs, NOBODY, NOBODY) == 0);
		T_ASSERT(chown(sub, NOBODY, NOBODY) == 0);
		T_EQ_ERR(arena_open(theirs, &a, msg, sizeof msg), BATON_EPERM);
		T_ASSERT_MSG(strstr(msg, "belongs to uid 65534") != NULL, "%s", msg);
		T_ASSERT(a == NULL);
		/* Root's own arena, moved into their directory: still theirs to swap. */
		unlink(theirs);
		T_ASSERT(link(real, theirs) == 0);
		T_EQ_ERR(arena_open(theirs, &a, msg, sizeof msg), BATON_EPERM);
		T_ASSERT(a == NULL);
		unlink(theirs);
		rmdir(sub);
	}
	au_rmdir(dir);
}

T_MAIN(T_CASE(t_modes_of_new_files), T_CASE(t_dir_of_another_user),
    T_CASE(t_dir_writable_by_others), T_CASE(t_symlinks), T_CASE(t_open_checks_owner_and_mode),
    T_CASE(t_open_refuses_a_chosen_arena))
