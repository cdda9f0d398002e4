/*
 * engine.h: where an engine named on the CLI listens (cli_engine.c),
 * for `baton gen`, `baton complete` and `baton chat` alike.
 */
#ifndef BATON_BROKER_CLI_ENGINE_H
#define BATON_BROKER_CLI_ENGINE_H

#include <stddef.h>

/*
 * `engine` is a control socket URL (it has "://": returned as it is) or an
 * engine's name, looked up in the STATUS of the broker at `broker` (its
 * `ctl`). 0: *url is set (free it). BATON_ENOTFOUND: the broker knows no
 * engine of that name. Else the call's error (the broker is not there,
 * did not answer in timeout_ms). BATON_EPERM: the socket's directory is
 * not one to trust (cli_socket_trusted). err says why, naming the engine
 * and the broker.
 */
int cli_engine_url(const char *broker, const char *engine, int timeout_ms, char **url, char *err,
    size_t errlen);

/*
 * Whether the CLI may talk to the ipc:// socket at url: its directory
 * must pass the arenas' trust rule (proto/base: this user's or root's,
 * writable by no one else but root's sticky /tmp). Whoever can write the
 * directory could put their own socket there and be sent root's commands
 * and prompts (issue 28). BATON_EPERM with the reason and the fix in err;
 * 0 for tcp://, for a directory that is not there (the call then says no
 * one listens), or one that passes.
 */
int cli_socket_trusted(const char *url, char *err, size_t errlen);

#endif
