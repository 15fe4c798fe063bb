#!/usr/bin/env bash
# The main job end to end on the embedded store (no server): make a dataset repo, add three
# versions of a large file, push to a bare remote, clone it, mount a commit read-only and
# read the data back. Everything happens in a temp directory that is removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GITXET_VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
demo=$(mktemp -d /tmp/gitxet-demo.XXXXXX)
export HOME="$demo/home" GIT_CONFIG_NOSYSTEM=1 GITXET_STATE_DIR="$demo/state"
mkdir -p "$HOME"
git config --global user.name "gitxet demo"
git config --global user.email demo@gitxet.invalid
git config --global init.defaultBranch main
cleanup() {
  git-xet unmount "$demo/mnt" >/dev/null 2>&1 || true
  rm -rf "$demo"
}
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "git xet --version"
git xet --version

step "a dataset repository with a bare remote"
git init -q --bare "$demo/remote.git"
git init -q "$demo/work"
cd "$demo/work"
git remote add origin "$demo/remote.git"
git xet init

step "three versions of a 64 MiB file with small edits, plus a growing CSV"
python3 - <<'PY'
import random
r = random.Random(7)
data = bytearray(r.randbytes(64 << 20))
open("model.bin", "wb").write(data)
open("metrics.csv", "w").write("".join(f"{i},{r.random():.5f}\n" for i in range(50000)))
PY
git xet add model.bin metrics.csv
git commit -qm "v1"
for v in 2 3; do
  python3 - "$v" <<'PY'
import random, sys
r = random.Random(int(sys.argv[1]))
data = bytearray(open("model.bin", "rb").read())
at = r.randrange(len(data)); data[at:at] = r.randbytes(3000)
open("model.bin", "wb").write(data)
open("metrics.csv", "a").write("".join(f"{i},{r.random():.5f}\n" for i in range(10000)))
PY
  git xet add model.bin metrics.csv
  git commit -qm "v$v"
done
git xet hash model.bin
git xet ls-files

step "push (data first, through the pre-push hook)"
git push -q origin main
du -sh "$demo/remote.git/xet" | sed 's/^/remote CAS: /'

step "clone elsewhere: files materialize"
git xet clone "$demo/remote.git" "$demo/clone"
cmp "$demo/clone/model.bin" "$demo/work/model.bin" && echo "clone: model.bin is byte-identical"

step "mount the first commit read-only and read it back"
mkdir -p "$demo/mnt"
first=$(git -C "$demo/work" rev-list --max-parents=0 HEAD)
git xet mount "$demo/remote.git" "$first" "$demo/mnt"
git xet mounts
ls -l "$demo/mnt"
echo "sha256 read through the mount: $(sha256sum < "$demo/mnt/model.bin" | cut -d' ' -f1)"
echo "sha256 the commit's pointer records: $(git -C "$demo/work" cat-file -p "$first:model.bin" | sed -n 's/^oid sha256://p')"
git xet unmount "$demo/mnt"

step "done: every step above ran on the embedded store, no server"
