#!/usr/bin/env bash
# Install everything the demo and the test suite need on a fresh Debian machine:
# system packages (FUSE, libnfs client tools, git) and a virtualenv with gitxet and its
# test extras. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(git git-lfs fuse3 libfuse3-dev pkg-config libnfs-utils docker.io busybox-static zsh fish)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps: missing system packages: ${missing[*]} (run as root or install them)" >&2
    exit 1
  fi
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

VENV=${GITXET_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
stamp="$VENV/.gitxet-deps"
want=$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || [ ! -f "$VENV/bin/git-xet" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  GITXET_REQUIRE_NATIVE=1 "$VENV/bin/python" -m pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi
# byte-compile once: git starts git-xet for every filter run and hook, and an editable
# install under PYTHONDONTWRITEBYTECODE would otherwise recompile gitxet each time
"$VENV/bin/python" -m compileall -q gitxet >/dev/null
# the C chunker and I/O thread must really be built: a silent fallback is a failure
GITXET_REQUIRE_NATIVE=1 "$VENV/bin/python" -c 'import gitxet.chunking as c, gitxet.util.bgio as b; assert c.NATIVE, "native chunker missing"; assert b.NATIVE, "C I/O thread missing"'
