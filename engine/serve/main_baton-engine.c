/*
 * baton-engine: one model on one device, serving GEN and control commands
 * on its own nng REP socket. This program parses the flags, resolves the
 * arena's path and the listen URL, and wires signals and systemd to the
 * serve loop (engine/serve/serve.h), which does the rest.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <systemd/sd-daemon.h>

#include "arena/arena.h"
#include "engine/serve/serve.h"
#include "http/http.h"
#include "proto/proto.h"

static const char usage[] =
    "usage: baton-engine --name NAME --shared-expert-arena PATH [options]\n"
    "\n"
    "  --name NAME                 engine name (letters, digits, '-', '_', '.')\n"
    "  --shared-expert-arena PATH  the model's arena (made by baton-arena create)\n"
    "  --listen URL                control socket (default ipc:///run/baton/engine-NAME.sock;\n"
    "                              ipc:// only with --broker; its directory must be this user's\n"
    "                              or root's and writable by no one else)\n"
    "  --backend host|cuda|auto    device backend (default auto: cuda when a GPU is present)\n"
    "  --device N                  device index (default 0)\n"
    "  --cache-mib N|auto          expert cache size (default auto: the model, or what fits)\n"
    "  --vram-segment-mib N        cache segment size (default 256, or the model when smaller)\n"
    "  --expert-cache-release      allow RELEASE and REFILL\n"
    "  --cache-release-idle SECS   release after SECS idle (implies --expert-cache-release)\n"
    "  --vram-elastic              allow VRAM (resize with a reserve)\n"
    "  --vram-reserve-mib N        device memory to leave free when growing (default 0)\n"
    "  --verify-refill             read back every refilled slot and compare checksums\n"
    "  --host-device-mib N         capacity of the host backend's device\n"
    "  --peer-device N             a second cache tier on device N of the same backend\n"
    "                              (another GPU, read over NVLink/PCIe; with the host\n"
    "                              backend, host device N): it holds what the broker\n"
    "                              lends with PEER requests, and nothing until then\n"
    "  --broker URL                register with a broker (e.g. ipc:///run/baton/broker.sock);\n"
    "                              the engine then opens cold and asks before it maps memory;\n"
    "                              it exits 3 when the broker refuses it (the name is taken)\n"
    "                              and 4 when no broker answers within --broker-wait\n"
    "  --broker-wait SECS          how long to wait for the broker at start (default 10)\n"
    "  --broker-optional           no broker at start: serve alone (it registers when the\n"
    "                              broker comes; --broker-wait defaults to 2 then)\n"
    "  --priority N                priority told to the broker (higher is kept longer; default 0)\n"
    "  --ctx N                     a whole model's context: KV cache positions, held on the\n"
    "                              device with the dense weights (default: the model's\n"
    "                              max_position_embeddings, at most 4096)\n"
    "  --kv-blocks N               the KV cache's pool: blocks of 16 positions shared by the\n"
    "                              sequences in flight (default: from the device: --max-seqs\n"
    "                              contexts, at most a sixteenth of its memory and what is\n"
    "                              free, at least one context)\n"
    "  --no-prefix-cache           read every prompt whole: keep no full KV blocks for later\n"
    "                              requests (default: a prompt that starts as an earlier one\n"
    "                              did reads only the rest; usage.prompt_tokens_details)\n"
    "  --kv-host-mib N             a release of everything keeps up to N MiB of the prefix\n"
    "                              cache's blocks in host memory (pinned), most recently used\n"
    "                              first, and the refill puts them back; 0: drop them\n"
    "                              (default 4096)\n"
    "  --max-seqs N                sequences decoded together in each step (default 16)\n"
    "  --step-tokens N             tokens a step reads, one a decoding sequence and the rest\n"
    "                              from prompts (16 to 4096; default 512, or half as many\n"
    "                              down to 64 on a device too small for their activations):\n"
    "                              a step is one forward pass of up to N rows\n"
    "  --max-queue N               requests waiting for KV blocks or a free slot; more are\n"
    "                              answered busy (HTTP 503 with Retry-After) (default 64)\n"
    "  --http ADDR                 serve the OpenAI-compatible API on ADDR (HOST:PORT, port 0:\n"
    "                              any; prints \"http: URL\"); loopback only unless a token is set;\n"
    "                              with --broker and no token file, every request needs a token\n"
    "                              the engine makes and gives to the broker's front door alone\n"
    "  --http-token-file FILE      clients must send \"Authorization: Bearer TOKEN\" (the file's\n"
    "                              first line; a regular file\n"
    "                              others cannot read, as the broker's)\n"
    "  --special-tokens-in-content a special token's text in a message (<|im_start|>) is that\n"
    "                              token, as Hugging Face makes it (default: text; only the\n"
    "                              chat template makes control tokens)\n"
    "  --max-n N                   choices one chat or completion request may ask for (\"n\",\n"
    "                              each its own sequence; default 8, at most 128)\n"
    "  --served-model-name NAME    the model id clients send (default: the arena's file name\n"
    "                              without .arena)\n"
    "  --no-access-log             no log line per request (model, status, tokens, time to\n"
    "                              first token, duration); default: one at info level\n"
    "  --cors-origins LIST         origins (scheme://host[:port], comma-separated) whose web\n"
    "                              pages may call --http from a browser (the token is still\n"
    "                              required); default none\n"
    "  --help, --version\n";

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("baton-engine: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputs("\n(see baton-engine --help)\n", stderr);
	va_end(ap);
	exit(2);
}

/* --cors-origins a,b: a NULL-terminated list, in static storage (the
 * process's lifetime); each is checked when the server starts. */
static const char **split_origins(const char *v)
{
	static char copy[4096];
	static const char *list[17];
	if (strlen(v) >= sizeof copy)
		usage_error("--cors-origins: longer than %zu bytes", sizeof copy - 1);
	snprintf(copy, sizeof copy, "%s", v);
	size_t k = 0;
	for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		while (*t == ' ')
			t++;
		if (!*t)
			continue;
		if (k == 16)
			usage_error("--cors-origins: at most 16 origins");
		list[k++] = t;
	}
	if (k == 0)
		usage_error("--cors-origins wants origins such as https://app.example.com");
	list[k] = NULL;
	return list;
}

static uint64_t parse_uint(const char *flag, const char *v, uint64_t max)
{
	uint64_t x;
	if (baton_parse_u64(v, 0, max, &x))
		usage_error("%s wants an integer from 0 to %" PRIu64 ", got '%s'", flag, max, v);
	return x;
}

/* The bearer token: the file's first line, by the broker's rules
 * (http_token_read: no symlink, not readable by others). */
static const char *read_token(const char *path)
{
	static char tok[HTTP_TOKEN_FILE_MAX];
	char err[512];
	if (http_token_read(path, tok, sizeof tok, err, sizeof err) != 0)
		usage_error("--http-token-file %s", err);
	return tok;
}

static void parse_args(int argc, char **argv, struct baton_serve_config *o)
{
	enum { O_NAME = 1, O_ARENA, O_LISTEN, O_BACKEND, O_DEVICE, O_CACHE, O_SEG, O_RELEASE,
	       O_IDLE, O_ELASTIC, O_RESERVE, O_VERIFY, O_HOSTMIB, O_BROKER, O_PRIORITY, O_PEER,
	       O_CTX, O_BWAIT, O_BOPT, O_KVB, O_MAXSEQS, O_STEPT, O_MAXQ, O_HTTP, O_HTOKEN, O_SERVED, O_CSPECIAL, O_CORS, O_MAXN,
	       O_NOPREFIX, O_KVHOST, O_NOACCESS,
	       O_HELP, O_VERSION };
	static const struct option lo[] = {
		{ "name", required_argument, 0, O_NAME },
		{ "shared-expert-arena", required_argument, 0, O_ARENA },
		{ "listen", required_argument, 0, O_LISTEN },
		{ "backend", required_argument, 0, O_BACKEND },
		{ "device", required_argument, 0, O_DEVICE },
		{ "cache-mib", required_argument, 0, O_CACHE },
		{ "vram-segment-mib", required_argument, 0, O_SEG },
		{ "expert-cache-release", no_argument, 0, O_RELEASE },
		{ "cache-release-idle", required_argument, 0, O_IDLE },
		{ "vram-elastic", no_argument, 0, O_ELASTIC },
		{ "vram-reserve-mib", required_argument, 0, O_RESERVE },
		{ "verify-refill", no_argument, 0, O_VERIFY },
		{ "host-device-mib", required_argument, 0, O_HOSTMIB },
		{ "broker", required_argument, 0, O_BROKER },
		{ "broker-wait", required_argument, 0, O_BWAIT },
		{ "broker-optional", no_argument, 0, O_BOPT },
		{ "priority", required_argument, 0, O_PRIORITY },
		{ "peer-device", required_argument, 0, O_PEER },
		{ "ctx", required_argument, 0, O_CTX },
		{ "kv-blocks", required_argument, 0, O_KVB },
		{ "no-prefix-cache", no_argument, 0, O_NOPREFIX },
		{ "kv-host-mib", required_argument, 0, O_KVHOST },
		{ "max-seqs", required_argument, 0, O_MAXSEQS },
		{ "step-tokens", required_argument, 0, O_STEPT },
		{ "max-queue", required_argument, 0, O_MAXQ },
		{ "http", required_argument, 0, O_HTTP },
		{ "http-token-file", required_argument, 0, O_HTOKEN },
		{ "served-model-name", required_argument, 0, O_SERVED },
		{ "cors-origins", required_argument, 0, O_CORS },
		{ "max-n", required_argument, 0, O_MAXN },
		{ "special-tokens-in-content", no_argument, 0, O_CSPECIAL },
		{ "no-access-log", no_argument, 0, O_NOACCESS },
		{ "help", no_argument, 0, O_HELP },
		{ "version", no_argument, 0, O_VERSION },
		{ 0, 0, 0, 0 },
	};
	memset(o, 0, sizeof *o);
	o->backend = "auto";
	o->kv_host_mib = 4096;
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case O_NAME: o->name = optarg; break;
		case O_ARENA: o->arena = optarg; break;
		case O_LISTEN: o->listen = optarg; break;
		case O_BACKEND:
			if (strcmp(optarg, "host") && strcmp(optarg, "cuda") && strcmp(optarg, "auto"))
				usage_error("--backend wants host, cuda or auto, got '%s'", optarg);
			o->backend = optarg;
			break;
		case O_DEVICE: o->device = (int)parse_uint("--device", optarg, 255); break;
		case O_PEER:
			o->peer_device = (int)parse_uint("--peer-device", optarg, 255);
			o->use_peer = 1;
			break;
		case O_CACHE:
			o->cache_mib = strcmp(optarg, "auto") == 0 ? 0 :
			    parse_uint("--cache-mib", optarg, 16u << 20);
			if (strcmp(optarg, "auto") && o->cache_mib == 0)
				usage_error("--cache-mib wants a positive size or auto, got '%s'", optarg);
			break;
		case O_SEG:
			o->segment_mib = parse_uint("--vram-segment-mib", optarg, 65536);
			if (o->segment_mib == 0)
				usage_error("--vram-segment-mib must be positive");
			break;
		case O_RELEASE: o->release = 1; break;
		case O_IDLE: {
			char *end;
			errno = 0;
			double s = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(s > 0) || s > 1e7)
				usage_error("--cache-release-idle wants seconds > 0, got '%s'", optarg);
			o->idle_s = s;
			o->release = 1;
			break;
		}
		case O_ELASTIC: o->elastic = 1; break;
		case O_RESERVE: o->reserve_mib = parse_uint("--vram-reserve-mib", optarg, 16u << 20); break;
		case O_VERIFY: o->verify = 1; break;
		case O_CTX:
			o->ctx = (uint32_t)parse_uint("--ctx", optarg, 1u << 20);
			if (o->ctx < 16)
				usage_error("--ctx wants at least 16 positions, got '%s'", optarg);
			break;
		case O_KVB:
			o->kv_blocks = (uint32_t)parse_uint("--kv-blocks", optarg, 1u << 24);
			if (o->kv_blocks == 0)
				usage_error("--kv-blocks must be positive");
			break;
		case O_NOPREFIX: o->no_prefix_cache = 1; break;
		case O_KVHOST: o->kv_host_mib = parse_uint("--kv-host-mib", optarg, 16u << 20); break;
		case O_MAXSEQS:
			o->max_seqs = (uint32_t)parse_uint("--max-seqs", optarg, 1024);
			if (o->max_seqs == 0)
				usage_error("--max-seqs must be positive");
			break;
		case O_STEPT:
			o->step_tokens = (uint32_t)parse_uint("--step-tokens", optarg, 4096);
			if (o->step_tokens < 16)
				usage_error("--step-tokens wants 16 to 4096 tokens, got '%s'", optarg);
			break;
		case O_MAXQ:
			o->max_queue = (uint32_t)parse_uint("--max-queue", optarg, 1u << 20);
			if (o->max_queue == 0)
				usage_error("--max-queue must be positive");
			break;
		case O_MAXN:
			o->max_n = (uint32_t)parse_uint("--max-n", optarg, 128);
			if (o->max_n == 0)
				usage_error("--max-n must be positive");
			break;
		case O_HTTP: o->http = optarg; break;
		case O_CSPECIAL: o->content_special = 1; break;
		case O_NOACCESS: o->no_access_log = 1; break;
		case O_HTOKEN: o->http_token = read_token(optarg); break;
		case O_CORS: o->cors_origins = split_origins(optarg); break;
		case O_SERVED:
			if (!optarg[0] || strlen(optarg) > 200 || strpbrk(optarg, " \t\r\n\"\\"))
				usage_error("--served-model-name wants 1 to 200 characters without spaces or quotes, "
				    "got '%s'", optarg);
			o->served_model = optarg;
			break;
		case O_HOSTMIB:
			o->host_mib = parse_uint("--host-device-mib", optarg, 16u << 20);
			if (o->host_mib == 0)
				usage_error("--host-device-mib must be positive");
			break;
		case O_BROKER:
			if (strncmp(optarg, "ipc://", 6) != 0 && strncmp(optarg, "tcp://", 6) != 0)
				usage_error("--broker wants ipc://PATH or tcp://HOST:PORT, got '%s'", optarg);
			o->broker = optarg;
			break;
		case O_BWAIT: {
			char *end;
			errno = 0;
			double sec = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(sec > 0) || sec > 86400)
				usage_error("--broker-wait wants seconds > 0 (at most 86400), got '%s'", optarg);
			o->broker_wait_s = sec;
			break;
		}
		case O_BOPT: o->broker_optional = 1; break;
		case O_PRIORITY: {
			int64_t v;
			if (baton_parse_i64(optarg, -1000000, 1000000, &v))
				usage_error("--priority wants a whole number, got '%s'", optarg);
			o->priority = (int32_t)v;
			break;
		}
		case O_HELP:
			fputs(usage, stdout);
			exit(0);
		case O_VERSION:
			printf("baton-engine %s\n", baton_version());
			exit(0);
		case ':':
			usage_error("%s needs a value", argv[optind - 1]);
		default:
			usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
	if (!o->name)
		usage_error("--name is required");
	if (!proto_name_valid(o->name, strlen(o->name)))
		usage_error("--name '%s': use 1 to 64 letters, digits, '-', '_' or '.'", o->name);
	if (!o->arena)
		usage_error("--shared-expert-arena is required");
	if ((o->broker_wait_s > 0 || o->broker_optional) && !o->broker)
		usage_error("%s needs --broker", o->broker_optional ? "--broker-optional" : "--broker-wait");
	if (o->http_token && !o->http)
		usage_error("--http-token-file needs --http");
	if (o->cors_origins && !o->http)
		usage_error("--cors-origins needs --http");
	/* nng has no token: a tcp:// control socket lets any local user
	 * release, refill and compute on this engine around the broker */
	if (o->broker && o->listen && strncmp(o->listen, "ipc://", 6) != 0)
		usage_error("--listen %s: an engine under a broker listens on ipc:// only (a tcp:// control "
		    "socket would let any local user drive it around the broker)", o->listen);
	if (o->use_peer && o->peer_device == o->device)
		usage_error("--peer-device %d is the engine's own --device", o->peer_device);
}

int main(int argc, char **argv)
{
	struct baton_serve_config cfg = { 0 };
	parse_args(argc, argv, &cfg);
	/* A bare NAME (no '/', not ending in .arena) is
	 * /dev/shm/baton/NAME.arena, as for baton-arena and the README. */
	static char arena_buf[PATH_MAX];
	size_t an = strlen(cfg.arena);
	if (!strchr(cfg.arena, '/') && !(an > 6 && strcmp(cfg.arena + an - 6, ".arena") == 0) &&
	    arena_default_path(cfg.arena, arena_buf, sizeof arena_buf) == 0)
		cfg.arena = arena_buf;
	char listen[PATH_MAX];
	if (cfg.listen)
		snprintf(listen, sizeof listen, "%s", cfg.listen);
	else
		snprintf(listen, sizeof listen, "ipc:///run/baton/engine-%s.sock", cfg.name);

	/* Signals go to the main thread only: block them before any thread
	 * (ours or nng's) starts. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	cfg.listen = listen;
	struct serve *sv = NULL;
	enum serve_broker_fail bf;
	int rc = serve_open(&cfg, &sv, &bf);
	if (rc) {
		/* 3 and 4: a second engine of one name, a wrong --broker (docs/reference/engine.md) */
		if (bf == SERVE_BROKER_REFUSED)
			return 3;
		if (bf == SERVE_BROKER_ABSENT)
			return 4;
		return rc == BATON_EINVAL || rc == BATON_ENODEV ? 2 : 1;
	}
	/* Ready: tests and scripts wait for this line; the OpenAI API's URL
	 * follows it (with --http). */
	printf("ready %s\n", serve_url(sv));
	if (serve_http_url(sv)[0])
		printf("http: %s\n", serve_http_url(sv));
	if (serve_warning(sv)[0])
		printf("warning: %s\n", serve_warning(sv));
	fflush(stdout);
	/* systemd (Type=notify): a no-op without $NOTIFY_SOCKET. */
	sd_notifyf(0, "READY=1\nSTATUS=listening on %s%s%s", serve_url(sv),
	    serve_warning(sv)[0] ? "; WARNING: " : "", serve_warning(sv));

	for (;;) {
		struct timespec tick = { .tv_sec = 0, .tv_nsec = 100 * 1000 * 1000 };
		int sig = sigtimedwait(&sigs, NULL, &tick);
		if (sig > 0)
			break;
		serve_tick(sv);
	}
	sd_notify(0, "STOPPING=1");
	serve_close(sv);
	/* A close that nng 1.5.2 left hanging would hang exit() in its atexit
	 * handler too (proto.h, "Closing"). */
	if (proto_nng_wedged())
		_exit(0);
	return 0;
}
