/*
 * door_cmd.h: the CLI through the broker's front door over HTTP
 * (door_cmd.c): `baton models`, and chat and complete by model name.
 */
#ifndef BATON_BROKER_CLI_DOOR_CMD_H
#define BATON_BROKER_CLI_DOOR_CMD_H

#include <stddef.h>

/* The door's HOST:PORT: flag, else $BATON_HTTP, else BROKER_DEFAULT_HTTP. */
void door_addr(const char *flag, char *out, size_t n);
/* The bearer token: token_file's first line, else http.token beside the
 * ipc:// control socket broker (NULL: $BATON_BROKER, else the default);
 * "" when there is none. */
void door_token(const char *broker, const char *token_file, char *out, size_t n);
/* One request to http://addr (body NULL: none); *status and *reply (the
 * body, de-chunked; free it) on 0. BATON_ECONN (nothing listens),
 * BATON_ETIMEDOUT, BATON_EMSG (not HTTP), BATON_ENOMEM with err. */
int door_http(const char *addr, const char *method, const char *path, const char *token, const char *body,
    int timeout_ms, int *status, char **reply, char *err, size_t errlen);
/* `baton models`: argv from the command word on; the exit status. */
int models_cmd_main(int argc, char **argv);

#endif
