/*
 * text_cmd.h: `baton complete` and `baton chat` (text_cmd.c), called by
 * the CLI's main with argv starting at the command word.
 */
#ifndef BATON_BROKER_TEXT_CMD_H
#define BATON_BROKER_TEXT_CMD_H

/* Runs the command and returns the CLI's exit status (or exits with it). */
int text_cmd_main(int argc, char **argv);

#endif
