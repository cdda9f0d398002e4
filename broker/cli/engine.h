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
 * did not answer in timeout_ms). err says why, naming the engine and the
 * broker.
 */
int cli_engine_url(const char *broker, const char *engine, int timeout_ms, char **url, char *err,
    size_t errlen);

#endif
