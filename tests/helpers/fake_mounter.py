"""An in-memory Mounter for plugin unit tests: no FUSE, no daemons, every call recorded."""

from __future__ import annotations

import os
import re

from gitxet.errors import MountError, MountSpecError
from gitxet.plugins.mounter import MountInfo, MountSpec, validate_spec

_SHA = re.compile(r"[0-9a-f]{40}")


class FakeMounter:
    """Implements the Mounter protocol over a dict.

    ``repos`` maps a repo name to its revisions (name or sha -> full sha); anything else is an
    unknown repo. ``fail_next`` makes the next mount raise that MountError. ``calls`` logs
    every protocol call; ``tokens`` the token each live mount got.
    """

    def __init__(self, repos: dict[str, dict[str, str]] | None = None) -> None:
        self.repos = repos if repos is not None else {}
        self.mounts: dict[str, MountInfo] = {}
        self.tokens: dict[str, str | None] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_next: MountError | None = None
        self.dead: set[str] = set()  # targets whose (pretend) daemon died
        self._pid = 1000

    def resolve(self, spec: MountSpec, target: str = "mount") -> str:
        revs = self.repos.get(spec.repo)
        if revs is None:
            raise MountSpecError(target, "repo", f"{spec.repo}: no such repository")
        if spec.commit in revs:
            return revs[spec.commit]
        if _SHA.fullmatch(spec.commit) and spec.commit in revs.values():
            return spec.commit
        raise MountSpecError(target, "commit", f"no such revision {spec.commit!r}")

    def mount(self, spec: MountSpec, target: str, *, timeout: float = 60) -> MountInfo:
        target = os.path.abspath(target)
        self.calls.append(("mount", target))
        validate_spec(spec, target)
        sha = self.resolve(spec, target)
        have = self.mounts.get(target)
        if have is not None and target in self.dead:  # a dead mount: replaced
            self.dead.discard(target)
            have = None
            del self.mounts[target]
        if have is not None:
            if have.spec == spec.without_token() or (
                have.commit_sha == sha and have.spec.repo == spec.repo
            ):
                if spec.token is not None:  # the real mounter hands it to the daemon
                    self.tokens[target] = spec.token
                return have
            raise MountError(target, "already mounted with another spec")
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        self._pid += 1
        info = MountInfo(target, spec.without_token(), sha, self._pid)
        self.mounts[target] = info
        self.tokens[target] = spec.token
        if spec.token_file is not None:  # what the daemon would read
            with open(spec.token_file, encoding="utf-8") as f:
                self.tokens[target] = f.read().strip()
        return info

    def unmount(self, target: str) -> None:
        target = os.path.abspath(target)
        self.calls.append(("unmount", target))
        self.mounts.pop(target, None)
        self.tokens.pop(target, None)
        self.dead.discard(target)

    def list(self) -> list[MountInfo]:
        return sorted(self.mounts.values(), key=lambda m: m.target)

    def is_mounted(self, target: str) -> bool:
        target = os.path.abspath(target)
        return target in self.mounts and target not in self.dead

    def health(self, target: str) -> str:
        target = os.path.abspath(target)
        if target not in self.mounts:
            return "absent"
        return "dead" if target in self.dead else "ok"
