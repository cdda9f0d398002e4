/*
 * run_cmd.h: `baton run`, `baton lease`, `baton external`, `baton park`,
 * `baton resume` (run_cmd.c), called by the CLI's main with argv
 * starting at the command word.
 */
#ifndef BATON_BROKER_RUN_CMD_H
#define BATON_BROKER_RUN_CMD_H

#include <stdbool.h>

/* Whether word is one of its commands. */
bool run_cmd_is(const char *word);
/* Runs the command and returns the CLI's exit status (or exits with it);
 * baton run returns the job's. */
int run_cmd_main(int argc, char **argv);

#endif
