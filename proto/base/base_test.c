#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "proto/base/base.h"
#include "tests/t.h"

static void t_err_names_unique(void)
{
	T_EQ_STR(baton_strerror(BATON_OK), "success");
	T_EQ_STR(baton_errname(BATON_EBUSY), "busy");
	T_EQ_STR(baton_strerror(9999), "unknown error code");
	T_ASSERT(!baton_err_valid(-1));
#define CHECK_UNIQUE(e, n, name, msg) T_EQ_INT(e, n); T_ASSERT(baton_err_valid(n));
	BATON_ERRORS(CHECK_UNIQUE)
#undef CHECK_UNIQUE
}

/* The one error-text helper: formats, truncates with a terminator, and
 * writes nothing where the caller gave no room. */
static void t_errf(void)
{
	char buf[16];
	baton_errf(buf, sizeof buf, "slot %d of %s", 7, "gpu");
	T_EQ_STR(buf, "slot 7 of gpu");
	baton_errf(buf, 6, "%s", "truncated text");
	T_EQ_STR(buf, "trunc");
	memcpy(buf, "unchanged", 10);
	baton_errf(buf, 0, "%s", "x");
	T_EQ_STR(buf, "unchanged");
	baton_errf(NULL, 16, "%s", "x"); /* no crash */
}

static void t_fail(void)
{
	char buf[32];
	T_EQ_INT(baton_fail(buf, sizeof buf, BATON_ERANGE, "x is %d", 5), BATON_ERANGE);
	T_EQ_STR(buf, "x is 5");
	T_EQ_INT(baton_fail(NULL, 0, BATON_EIO, "%s", "no room"), BATON_EIO);
}

/* The number rule: decimal digits only, no sign, no prefix, no trailing
 * text, within the bounds (base.h). */
static void t_parse_u64(void)
{
	uint64_t v = 77;
	T_OK(baton_parse_u64("0", 0, UINT64_MAX, &v));
	T_EQ_INT(v, 0);
	T_OK(baton_parse_u64("010", 0, UINT64_MAX, &v));
	T_EQ_INT(v, 10); /* decimal: not octal 8 */
	T_OK(baton_parse_u64("18446744073709551615", 0, UINT64_MAX, &v));
	T_ASSERT(v == UINT64_MAX);
	v = 77;
	static const char *const bad[] = { "", "+5", "-1", " 5", "5 ", "0x10", "5k", "1e3", "1.5", "five", "--1" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		T_ASSERT_MSG(baton_parse_u64(bad[i], 0, UINT64_MAX, &v) == BATON_EINVAL && v == 77,
		    "'%s' was taken", bad[i]);
	T_EQ_ERR(baton_parse_u64(NULL, 0, 10, &v), BATON_EINVAL);
	T_EQ_ERR(baton_parse_u64("18446744073709551616", 0, UINT64_MAX, &v), BATON_ERANGE);
	T_EQ_ERR(baton_parse_u64("99999999999999999999999", 0, UINT64_MAX, &v), BATON_ERANGE);
	T_EQ_ERR(baton_parse_u64("11", 0, 10, &v), BATON_ERANGE);
	T_EQ_ERR(baton_parse_u64("0", 1, 10, &v), BATON_ERANGE);
	T_EQ_INT(v, 77);
	T_OK(baton_parse_u64("10", 1, 10, &v));
	T_EQ_INT(v, 10);
}

static void t_parse_i64(void)
{
	int64_t v = 77;
	T_OK(baton_parse_i64("-1", INT64_MIN, INT64_MAX, &v));
	T_EQ_INT(v, -1);
	T_OK(baton_parse_i64("-9223372036854775808", INT64_MIN, INT64_MAX, &v));
	T_ASSERT(v == INT64_MIN);
	T_OK(baton_parse_i64("9223372036854775807", INT64_MIN, INT64_MAX, &v));
	T_ASSERT(v == INT64_MAX);
	T_EQ_ERR(baton_parse_i64("9223372036854775808", INT64_MIN, INT64_MAX, &v), BATON_ERANGE);
	T_EQ_ERR(baton_parse_i64("-9223372036854775809", INT64_MIN, INT64_MAX, &v), BATON_ERANGE);
	T_EQ_ERR(baton_parse_i64("+5", INT64_MIN, INT64_MAX, &v), BATON_EINVAL);
	T_EQ_ERR(baton_parse_i64("-", INT64_MIN, INT64_MAX, &v), BATON_EINVAL);
	T_EQ_ERR(baton_parse_i64("--5", INT64_MIN, INT64_MAX, &v), BATON_EINVAL);
	T_EQ_ERR(baton_parse_i64("-5", 0, 10, &v), BATON_ERANGE);
	T_OK(baton_parse_i64("-010", -10, 10, &v));
	T_EQ_INT(v, -10);
	T_EQ_INT(BATON_MIB, 1048576);
	T_ASSERT(BATON_GIB == 1024 * BATON_MIB && BATON_MIB == 1024 * BATON_KIB);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* Monotonic time moves on; deadlines are normalized; a timed wait on a
 * baton_cond_init cond times out about when asked, never early. */
static void t_clock(void)
{
	double t0 = baton_now_s();
	T_ASSERT(t0 > 0 && baton_now_s() >= t0);
	T_ASSERT(baton_wall_s() > 1.6e9 && baton_wall_ms() > UINT64_C(1600000000000));
	struct timespec ts = baton_deadline(12.75);
	T_EQ_INT(ts.tv_sec, 12);
	T_EQ_INT(ts.tv_nsec, 750000000);
	ts = baton_deadline(3.9999999999);
	T_ASSERT(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000L);
	ts = baton_deadline(-1);
	T_ASSERT(ts.tv_sec == 0 && ts.tv_nsec == 0);
	pthread_cond_t cv;
	baton_cond_init(&cv);
	pthread_mutex_lock(&mu);
	T_EQ_INT(baton_cond_wait_for(&cv, &mu, 0), ETIMEDOUT);
	t0 = baton_now_s();
	int rc;
	do
		rc = baton_cond_wait_for(&cv, &mu, 0.05 - (baton_now_s() - t0));
	while (rc == 0);
	double dt = baton_now_s() - t0;
	T_EQ_INT(rc, ETIMEDOUT);
	T_ASSERT_MSG(dt >= 0.049 && dt < 2, "waited %.3f s", dt);
	t0 = baton_now_s();
	while (baton_cond_wait_until(&cv, &mu, t0 + 0.02) == 0)
		;
	T_ASSERT(baton_now_s() - t0 >= 0.019);
	pthread_mutex_unlock(&mu);
	pthread_cond_destroy(&cv);
}

static void t_states(void)
{
	T_EQ_STR(baton_state_name(BATON_STATE_READY), "ready");
	T_EQ_STR(baton_state_name(BATON_STATE_UNKNOWN), "unknown");
	T_EQ_STR(baton_state_name(999), "unknown");
	T_EQ_STR(baton_state_name(-1), "unknown");
	T_EQ_INT(baton_state_parse("refilling"), BATON_STATE_REFILLING);
	T_EQ_INT(baton_state_parse("unknown"), BATON_STATE_UNKNOWN);
	T_EQ_INT(baton_state_parse("Ready"), BATON_STATE_UNKNOWN);
	T_EQ_INT(baton_state_parse(NULL), BATON_STATE_UNKNOWN);
#define ROUND_TRIP(e, name) T_EQ_INT(baton_state_parse(baton_state_name(e)), e); T_EQ_STR(baton_state_name(e), name);
	BATON_STATES(ROUND_TRIP)
#undef ROUND_TRIP
	T_ASSERT(baton_state_moving(BATON_STATE_RESIZING) && baton_state_moving(BATON_STATE_LOADING));
	T_ASSERT(!baton_state_moving(BATON_STATE_READY) && !baton_state_moving(BATON_STATE_PARTIAL));
	T_ASSERT(baton_state_present(BATON_STATE_LOST) && !baton_state_present(BATON_STATE_DEAD) &&
	    !baton_state_present(BATON_STATE_STOPPED));
	T_ASSERT(baton_state_may_hold(BATON_STATE_PARTIAL) && !baton_state_may_hold(BATON_STATE_RELEASED) &&
	    !baton_state_may_hold(BATON_STATE_LOST));
	T_EQ_INT(baton_state_holds(BATON_STATE_READY, 10, 10), BATON_HOLDS_WHOLE);
	T_EQ_INT(baton_state_holds(BATON_STATE_READY, 5, 10), BATON_HOLDS_PART);
	T_EQ_INT(baton_state_holds(BATON_STATE_READY, 0, 10), BATON_HOLDS_NONE); /* shrunk to nothing */
	T_EQ_INT(baton_state_holds(BATON_STATE_PARTIAL, 0, 10), BATON_HOLDS_PART);
	T_EQ_INT(baton_state_holds(BATON_STATE_REFILLING, 3, 10), BATON_HOLDS_PART);
	T_EQ_INT(baton_state_holds(BATON_STATE_RELEASED, 0, 10), BATON_HOLDS_NONE);
}

/* The text format: escaped label values and help, labels in order, le last,
 * cumulative buckets. */
static void t_prom(void)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	T_ASSERT(f);
	baton_prom_family(f, "m", "gauge", "a \\ b\nc");
	baton_prom_u64(f, "m", (const char *[]){ "engine", "a\"b\\c\nd", "gpu", "g", NULL }, 7);
	baton_prom_u64(f, "n", NULL, 1);
	baton_prom_f(f, "s", (const char *[]){ "x", "y", NULL }, 3, 0.5);
	static const double le[3] = { 0.1, 1, 2.5 };
	struct baton_hist h = { { 0 }, 0, 0 };
	baton_hist_add(&h, le, 3, 0.1); /* le is inclusive */
	baton_hist_add(&h, le, 3, 2);
	baton_hist_add(&h, le, 3, 99);
	baton_prom_hist(f, "h", (const char *[]){ "model", "q", NULL }, le, 3, &h);
	baton_prom_hist(f, "z", NULL, le, 1, &h);
	baton_prom_one(f, "o_total", "counter", "one", 18446744073709551615ull);
	fclose(f);
	T_EQ_STR(buf,
	    "# HELP m a \\\\ b\\nc\n# TYPE m gauge\n"
	    "m{engine=\"a\\\"b\\\\c\\nd\",gpu=\"g\"} 7\n"
	    "n 1\n"
	    "s{x=\"y\"} 0.500\n"
	    "h_bucket{model=\"q\",le=\"0.1\"} 1\nh_bucket{model=\"q\",le=\"1\"} 1\n"
	    "h_bucket{model=\"q\",le=\"2.5\"} 2\nh_bucket{model=\"q\",le=\"+Inf\"} 3\n"
	    "h_sum{model=\"q\"} 101.100000\nh_count{model=\"q\"} 3\n"
	    "z_bucket{le=\"0.1\"} 1\nz_bucket{le=\"+Inf\"} 3\nz_sum 101.100000\nz_count 3\n"
	    "# HELP o_total one\n# TYPE o_total counter\no_total 18446744073709551615\n");
	free(buf);
}

/* The JSON reader policy of the model files: integers of any size parse,
 * whole numbers are integers or integral reals in range. */
static void t_json_policy(void)
{
	const char *js = "{\"big\": 1000000000000000019884624838656, \"n\": 256, \"r\": 256.0,"
	    " \"e\": 2.56e2, \"frac\": 2.5, \"neg\": -3, \"s\": \"7\", \"z\": null,"
	    " \"huge\": 1e300, \"two63\": 9223372036854775808, \"max\": 9007199254740992}";
	json_error_t je;
	T_ASSERT(json_loadb(js, strlen(js), 0, &je) == NULL); /* jansson alone refuses "big" */
	json_t *o = baton_json_load(js, strlen(js), JSON_REJECT_DUPLICATES, &je);
	T_ASSERT_MSG(o != NULL, "%s", je.text);
	int64_t x = -1;
	T_OK(baton_json_whole(json_object_get(o, "n"), 0, 1000, &x));
	T_EQ_INT(x, 256);
	T_OK(baton_json_whole(json_object_get(o, "r"), 0, 1000, &x));
	T_EQ_INT(x, 256);
	T_OK(baton_json_whole(json_object_get(o, "e"), 256, 256, &x));
	T_EQ_INT(x, 256);
	T_OK(baton_json_whole(json_object_get(o, "neg"), -5, 0, &x));
	T_EQ_INT(x, -3);
	T_OK(baton_json_whole(json_object_get(o, "max"), 0, INT64_MAX, &x));
	T_EQ_INT(x, (int64_t)1 << 53);
	x = 7;
	T_EQ_ERR(baton_json_whole(json_object_get(o, "n"), 0, 255, &x), BATON_ERANGE);
	T_EQ_ERR(baton_json_whole(json_object_get(o, "neg"), 0, 10, &x), BATON_ERANGE);
	T_EQ_ERR(baton_json_whole(json_object_get(o, "big"), 0, INT64_MAX, &x), BATON_ERANGE);
	T_EQ_ERR(baton_json_whole(json_object_get(o, "huge"), INT64_MIN, INT64_MAX, &x), BATON_ERANGE);
	T_EQ_ERR(baton_json_whole(json_object_get(o, "two63"), INT64_MIN, INT64_MAX, &x), BATON_ERANGE);
	T_EQ_ERR(baton_json_whole(json_object_get(o, "frac"), 0, 10, &x), BATON_EINVAL);
	T_EQ_ERR(baton_json_whole(json_object_get(o, "s"), 0, 10, &x), BATON_EINVAL);
	T_EQ_ERR(baton_json_whole(json_object_get(o, "z"), 0, 10, &x), BATON_EINVAL);
	T_EQ_ERR(baton_json_whole(NULL, 0, 10, &x), BATON_EINVAL);
	T_EQ_INT(x, 7); /* untouched on failure */
	json_t *i = json_integer(42);
	T_OK(baton_json_whole(i, 0, 42, &x));
	T_EQ_INT(x, 42);
	T_EQ_ERR(baton_json_whole(i, 43, 50, &x), BATON_ERANGE);
	json_decref(i);
	json_decref(o);
}

T_MAIN(T_CASE(t_err_names_unique), T_CASE(t_json_policy), T_CASE(t_errf), T_CASE(t_fail), T_CASE(t_parse_u64), T_CASE(t_parse_i64),
    T_CASE(t_clock), T_CASE(t_states), T_CASE(t_prom))
