/*
 * engine.c: an engine's control URL from its name, asked of the
 * broker (see cli_engine.h). The broker's status lists each engine's ctl.
 */
#include "broker/cli/engine.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

int cli_socket_trusted(const char *url, char *err, size_t errlen)
{
	if (strncmp(url, "ipc://", 6) != 0)
		return 0;
	char why[512];
	int rc = baton_trust_dir_of(url + 6, "the socket directory", why, sizeof why);
	if (rc != BATON_EPERM)
		return 0;
	snprintf(err, errlen, "%s: refusing to talk to %s (another user could have put their socket there)",
	    why, url);
	return BATON_EPERM;
}

static int engine_url(const char *broker, const char *engine, int timeout_ms, char **url, char *err,
    size_t errlen)
{
	*url = NULL;
	if (strstr(engine, "://")) {
		*url = strdup(engine);
		if (!*url) {
			snprintf(err, errlen, "out of memory");
			return BATON_ENOMEM;
		}
		return 0;
	}
	int trc = cli_socket_trusted(broker, err, errlen);
	if (trc)
		return trc;
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_STATUS);
	/* A lookup, not the command: at most 5 s of it. */
	int rc = proto_call(broker, &req, &rep, timeout_ms < 5000 ? timeout_ms : 5000, NULL);
	if (rc) {
		snprintf(err, errlen, "cannot ask the broker at %s where engine '%s' is: %s "
		    "(give its URL instead, or --broker URL)", broker, engine, baton_strerror(rc));
		proto_msg_free(&rep);
		return rc;
	}
	for (uint32_t i = 0; i < rep.engines.n && !*url; i++)
		if (!strcmp(rep.engines.v[i].name, engine) && rep.engines.v[i].ctl[0])
			*url = strdup(rep.engines.v[i].ctl);
	proto_msg_free(&rep);
	if (!*url) {
		snprintf(err, errlen, "the broker at %s knows no engine '%s' (baton engines lists them)", broker,
		    engine);
		return BATON_ENOTFOUND;
	}
	return 0;
}

int cli_engine_url(const char *broker, const char *engine, int timeout_ms, char **url, char *err,
    size_t errlen)
{
	int rc = engine_url(broker, engine, timeout_ms, url, err, errlen);
	if (rc == 0 && (rc = cli_socket_trusted(*url, err, errlen)) != 0) {
		free(*url);
		*url = NULL;
	}
	return rc;
}
