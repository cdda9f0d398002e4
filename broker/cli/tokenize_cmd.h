/*
 * tokenize_cmd.h: `baton tokenize` / `baton detokenize` (tokenize_cmd.c),
 * called first thing from baton's main.
 */
#ifndef BATON_BROKER_TOKENIZE_CMD_H
#define BATON_BROKER_TOKENIZE_CMD_H

/* The exit status when argv's command is tokenize or detokenize (after
 * baton's leading flags), else -1 (not ours: main goes on). */
int tokenize_cmd_main(int argc, char **argv);

#endif
