/*
 * chat_int.h: the known chat templates (chat_known.c, generated) that
 * chat.c's built-in renderers stand for.
 */
#ifndef BATON_TEXT_CHAT_INT_H
#define BATON_TEXT_CHAT_INT_H

#include <stddef.h>

struct chat_known {
	const char *family;  /* the renderer */
	const char *variant; /* the template it was recognised as */
	const char *text;
};

extern const struct chat_known tx_chat_known[];
extern const size_t tx_chat_n_known;

#endif
