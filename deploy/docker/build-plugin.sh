#!/usr/bin/env bash
# Build the gitxet managed Docker volume plugin and register it with the local engine.
#   deploy/docker/build-plugin.sh [PLUGIN_NAME]      (default: gitxet)
# Run from anywhere; needs docker and network access for the base image.
set -euo pipefail
name=${1:-gitxet}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

docker build -f "$here/Dockerfile" -t gitxet-docker-plugin-rootfs "$root"
cid=$(docker create gitxet-docker-plugin-rootfs)
mkdir -p "$work/plugin/rootfs"
docker export "$cid" | tar -x -C "$work/plugin/rootfs"
docker rm "$cid" >/dev/null
cp "$here/config.json" "$work/plugin/config.json"
docker plugin create "$name" "$work/plugin"
echo "created plugin $name; next: docker plugin set $name repos.source=/path/to/repos;" \
     "docker plugin enable $name"
