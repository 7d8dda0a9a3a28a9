#!/bin/sh
# Runs a command (docker-compose.yml: `memstream worker`) and keeps Docker's
# `restart: on-failure` from restarting a configuration error: memstream exits 78
# (EX_CONFIG: a setting or the topics' layout is wrong; the log line names the fix), which
# a restart alone cannot mend, so it is turned into exit 0 here and the container stays
# stopped. Every other non-zero exit (70: a stage loop failed; 75: a transaction the broker
# refuses for good; 1; a signal) is passed on for Docker to restart. See docs/operations.md,
# "Exit codes". SIGTERM/SIGINT are forwarded to the command (under `init: true`, the init
# process hands them to this script).
"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM
trap 'kill -INT "$child" 2>/dev/null' INT
wait "$child"
code=$?
# a trapped signal ends `wait` early (code > 128): wait again for the command's own exit
# status (127 once it has been collected: the code in hand is then the command's)
while [ "$code" -gt 128 ]; do
  wait "$child"
  again=$?
  [ "$again" -eq 127 ] && break
  code=$again
  kill -0 "$child" 2>/dev/null || break
done
if [ "$code" -eq 78 ]; then
  echo "memstream exited 78 (a configuration error, see the line above): not restarted;" \
       "fix the setting, then start the container again (docker compose up -d)" >&2
  exit 0
fi
exit "$code"
