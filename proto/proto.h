/*
 * proto.h: the public door of Baton's protocol component: the error enum
 * every component shares, the messages, their msgpack codec, and the nng
 * transport.
 */
#ifndef BATON_PROTO_H
#define BATON_PROTO_H

#include "proto/err.h"

#endif
