#!/bin/sh
# Entrypoint of the managed plugin: keep `git-xet docker-plugin "$@"` running.
#
# Docker runs a managed plugin as a container whose first process is its entrypoint. If
# that were the plugin itself, a plugin crash would end the container and kill every
# mount daemon with it. This loop is the first process instead: a crashed plugin is
# restarted in the same container, adopts the daemons that kept serving, and containers
# keep their volumes. SIGTERM (docker plugin disable) is passed on and ends the loop.
set -u
child=0
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM INT
while :; do
  /opt/gitxet/bin/git-xet docker-plugin "$@" &
  child=$!
  wait "$child"
  echo "gitxet-plugin-supervise: plugin exited with status $?; restarting in 1 s" >&2
  sleep 1
done
