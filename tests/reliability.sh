#!/bin/sh
# reliability.sh SCRIPT...: run each given test script (python or sh) in its
# own process with a time limit ($TEST_LIMIT, default 1800 s) and add up
# their "N passed, N failed" lines: tests/run.sh's runner and summing, with
# each script's time; the last line is the total. Used by make
# test-reliability and make test-tsan.
TEST_LIMIT=${TEST_LIMIT:-1800}
export TEST_LIMIT
exec "$(dirname "$0")/run.sh" --scripts "$@"
