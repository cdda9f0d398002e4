/*
 * door.h: the one door of the broker's OpenAI front door (broker/door/,
 * docs/front-door.md).
 *
 * The OpenAI-compatible API on the broker's HTTP address: POST
 * /v1/chat/completions and /v1/completions are forwarded, unchanged, to an
 * engine that serves the body's `model` (registered with its http URL);
 * streams pass through as they arrive. A model whose engine is released
 * is refilled first (the broker's refill, by its policies); two models
 * contending for one device are served in batches (door_quantum_s). GET
 * /v1/models lists every model with its state and engines. A stored
 * response's GET and DELETE /v1/responses/{id}, and a POST's
 * previous_response_id, go to the engine that made it (stored.c). The models of
 * the configuration's [model] sections are served by engines the door
 * starts, watches, restarts and stops itself (fleet.c,
 * docs/guides/fleet.md): a request for one whose engine is not running
 * starts it and waits.
 *
 * A face of the broker: it sees engines through the core's API
 * (broker_call) when the core's events (broker_observe) say they changed,
 * speaks through broker_emit, and is served by the HTTP face
 * (broker/api/api.h), where it registers its routes and metrics. Idle
 * release ([engine] keep_alive_s, door_keep_alive_s) is the core's
 * (docs/policies.md), not the door's.
 */
#ifndef BATON_BROKER_DOOR_H
#define BATON_BROKER_DOOR_H

#include <stddef.h>

#include "broker/api/api.h"
#include "broker/broker.h"

struct broker_door;

/* Subscribes to b's events and registers its routes and metrics on h
 * (before broker_start); BATON_ENOMEM or BATON_EINVAL with err. Its
 * dispatch thread starts with the first request. */
int broker_door_open(struct broker *b, struct broker_http *h, const struct broker_config *cfg,
    struct broker_door **out, char *err, size_t errlen);
/* Once the broker runs (broker_start): the dispatch thread and the fleet's
 * supervisor ([model] sections: docs/guides/fleet.md), which starts the
 * models to preload. BATON_ENOMEM when a thread cannot start. */
int broker_door_start(struct broker_door *d);
/* A reloaded configuration's door_quantum_s and door_queue_max (SIGHUP);
 * requests waiting keep their place. NULL d allowed. */
void broker_door_reload(struct broker_door *d, const struct broker_config *cfg);
/* Unsubscribes, answers what waits (503), cancels what is forwarded,
 * joins its threads and frees; NULL allowed. After broker_http_close
 * (no route reaches it then), before broker_close. */
void broker_door_close(struct broker_door *d);

#endif
