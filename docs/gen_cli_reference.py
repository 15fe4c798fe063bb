#!/usr/bin/env python3
"""Regenerate docs/cli.md, man/ (the manual pages) and completions/ from the CLI itself.

``--check``: fail when any of them is stale (tests/unit/test_cli_docs.py runs it).
"""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = os.path.join(HERE, "cli.md")
COMPLETIONS = os.path.join(os.path.dirname(HERE), "completions")
MAN = os.path.join(os.path.dirname(HERE), "man")

EXIT_CODES = [
    "",
    "## Exit codes",
    "",
    "| code | meaning | for example |",
    "|---|---|---|",
    "| 0 | success | also `status` and `ls-files` before the first commit |",
    "| 1 | error | a server that cannot be reached (also when data missing here may be on "
    "it), git refusing a push, a missing optional package (`FUSE mounts need pyfuse3: pip "
    "install 'gitxet[mount]'`) |",
    "| 2 | usage | an unknown command or option, a missing argument, a command run outside a "
    "git repository, a mountpoint that is not an empty directory (without `--nonempty`), "
    "no remote to push to, `add` before `init` |",
    "| 3 | integrity | data whose hash does not match (corrupt or tampered), a damaged local "
    "store (`fsck`) |",
    "| 4 | not found | a remote, revision, path, repository, mount, token id or file data "
    "that does not exist (`fetch nosuch`, `checkout missing.bin`, `unmount /not/mounted`, "
    "`ls-files nosuchrev`) |",
    "| 5 | access denied | a missing, wrong or expired token, or one whose scope does not "
    "allow the request |",
    "",
    "A git command that gitxet runs for you (`git xet push`, `pull`, `clone`) prints git's "
    "own message; its failure exits 1. An interrupted command exits 128 + the signal "
    "(130 for Ctrl-C). No message ever holds a token: URLs are shown without credentials.",
    "`tests/integration/test_cli_errors.py` runs each of these mistakes.",
]


# git-lfs verb by verb (every porcelain verb of `git lfs --help`, git-lfs 3.3, and the
# pointer plumbing): (verb, gitxet equivalent or "", notes). A row with an equivalent has a
# test named test_lfs_<verb> in tests/integration/test_lfs_parity.py (a test checks).
LFS_VERBS: list[tuple[str, str, str]] = [
    (
        "checkout",
        "`git xet checkout [PATH...]`",
        "writes pointer files from data here or on any remote",
    ),
    (
        "dedup",
        "`git xet dedup FILE...`",
        "different: gitxet already stores each chunk once, across "
        "files and versions; `dedup` shows how much given files share. The copy-on-write clones "
        "of work-tree files that `git lfs dedup` makes have no counterpart",
    ),
    (
        "env",
        "`git xet env [--json]`",
        "variables, config keys, remotes and where each token comes from (never a token)",
    ),
    (
        "ext",
        "",
        "no pointer extensions: the Xet pointer format is fixed, and content transforms "
        "belong in git's own filters",
    ),
    ("fetch", "`git xet fetch [REMOTE] [REFS...] [--all] [--recent] [-I/-X]`", ""),
    ("fsck", "`git xet fsck [--all]`", "re-hashes the store and says where each file's data is"),
    ("install", "`git xet install [--local|--system] [--skip-smudge]`", ""),
    (
        "lock",
        "",
        "no file locking: it needs a lock service on the server, and dataset files "
        "are added, not merged; use your branch protection or a lock file in the repository",
    ),
    ("locks", "", "no file locking (see lock)"),
    ("logs", "`git xet logs [last|show NAME|clear]`", "errors of the filter and hooks"),
    ("ls-files", "`git xet ls-files [--all] [--deleted] [-s] [-n] [-l] [--json]`", ""),
    (
        "migrate",
        "`git xet migrate [import|info|export] [--dry-run]`",
        "import (git-lfs or plain files to pointers), info (a preview), export (pointers back "
        "to plain files)",
    ),
    (
        "prune",
        "`git xet prune [--dry-run] [--verify-remote]`",
        "keeps the checkout, recent refs, unpushed commits and what mounts serve",
    ),
    (
        "pull",
        "`git xet pull [-I/-X] [--rebase] [--ff-only]`",
        "runs git pull, then writes the files (with -I/-X only the matching ones)",
    ),
    (
        "push",
        "`git xet push [--all] [-u] [--force] [--tags] [--dry-run]`",
        "the pre-push "
        "hook uploads on every git push; this also repairs refs pushed without their data",
    ),
    ("status", "`git xet status [--porcelain|--json]`", ""),
    (
        "track",
        "`git xet track [PATTERN...]`",
        "alone: lists the rules (patterns and the size threshold)",
    ),
    ("uninstall", "`git xet uninstall [--local|--system]`", ""),
    ("unlock", "", "no file locking (see lock)"),
    ("untrack", "`git xet untrack PATTERN...`", ""),
    (
        "update",
        "`git xet install` (in the repository)",
        "repairs the hooks; the filter also installs a missing pre-push hook itself",
    ),
    ("version", "`git xet --version`", "also names the chunker (native C or Python)"),
    ("pointer", "`git xet pointer [--file F] [--pointer P] [--check]`", "plumbing"),
]


def lfs_table() -> list[str]:
    """The "git-lfs equivalents" section of docs/cli.md."""
    rows = [f"| `git lfs {verb}` | {ours or 'none'} | {notes} |" for verb, ours, notes in LFS_VERBS]
    return [
        "",
        "## git-lfs equivalents",
        "",
        "Every porcelain verb of `git lfs` (3.3), what to run instead, or why there is none.",
        "Each row with an equivalent has a test (`tests/integration/test_lfs_parity.py`).",
        "",
        "| git-lfs | gitxet | notes |",
        "|---|---|---|",
        *rows,
    ]


def completions() -> dict[str, str]:
    """The shell scripts, from the one place that defines them (gitxet/cli/completion.py)."""
    from gitxet.cli.completion import FILES, script

    return {path: script(shell) for shell, path in FILES.items()}


_HELP_SCRIPT = r"""
import contextlib, io, json, sys
from gitxet.cli.app import app
out = []
for args in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
        app([*args, "--help"], prog_name="git-xet", standalone_mode=False)
    out.append(buf.getvalue())
sys.stdout.write(json.dumps(out))
"""


def help_texts(arg_lists: list[list[str]]) -> dict[tuple[str, ...], str]:
    """``git xet ARGS --help`` of each of ``arg_lists``, rendered in one process (a fresh
    one, so typer reads the terminal settings below, whoever runs this)."""
    import json

    env = dict(
        os.environ, COLUMNS="100", TERM="dumb", NO_COLOR="1", _TYPER_FORCE_DISABLE_TERMINAL="1"
    )
    out = subprocess.run(
        [sys.executable, "-c", _HELP_SCRIPT, json.dumps(arg_lists)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    texts = json.loads(out)
    return {
        tuple(args): "\n".join(line.rstrip() for line in text.strip().splitlines())
        for args, text in zip(arg_lists, texts, strict=True)
    }


def commands() -> list[str]:
    """Visible commands and command groups (``token``, ``repo``), sorted."""
    from gitxet.cli.app import app

    names = [c.name for c in app.registered_commands if c.name and not c.hidden]
    names += [g.name for g in app.registered_groups if g.name and not g.hidden]
    return sorted(names)


def configuration() -> list[str]:
    """The "Configuration" section, from gitxet.settings (the one place that defines it)."""
    from gitxet.settings import VARIABLES

    rows = [f"| `{name}` | {what} | {default} |" for name, what, default in VARIABLES]
    return [
        "",
        "## Configuration",
        "",
        "Every command, the mount daemons, `xet://` paths and the Docker/CSI plugins read the",
        "same settings (`gitxet/settings.py`); a command-line option beats its variable.",
        "",
        "| variable | sets | default |",
        "|---|---|---|",
        *rows,
        "| `GITXET_TRACEBACK` | `1`: show the traceback of an error (for bug reports) | unset |",
        "| `GITXET_SKIP_PREPUSH` | `1`: the pre-push hook uploads nothing (`git xet push` sets "
        "it for the git push it runs after uploading) | unset |",
        "",
        "gitxet also sets variables for its own child processes; they are not settings:",
        "`GITXET_STATS_FILE` (where `git xet add`'s filter writes its dedup counts),",
        "`GITXET_RECEIVE_CAS` and `GITXET_RECEIVE_TOKEN` (the CAS and the token",
        "`git xet serve` gives its pre-receive hook). Building from source,",
        "`GITXET_REQUIRE_NATIVE=1` makes a C chunker that fails to compile an error",
        "(default: fall back to pure Python).",
        "",
        "git config keys gitxet reads (`git config KEY VALUE`; `git xet env` shows them):",
        "",
        "| key | sets | default |",
        "|---|---|---|",
        "| `xet.threshold` | files at least this big become pointers (a size); kept in the "
        "committed `.xetconfig` (`git xet init --threshold`, `git xet track --threshold`), so "
        "every clone cleans alike | `256k` |",
        "| `xet.lazy` | checkouts leave pointers; `git xet checkout` writes files (a boolean; "
        "`install --skip-smudge` sets it; `GITXET_LAZY` beats it) | `false` |",
        "| `xet.remote` | the remote asked first for data and pushed to by default | `origin`, "
        "else the only remote |",
        "| `xet.recentRefsDays` | branches committed to in this many days are recent: `prune` "
        "keeps their files, `fetch --recent` fetches them | `7` |",
        "| `xet.cloneUnfinished` | set by `git xet clone` until its last file is written: the "
        "clone run again, or `git xet checkout`, finishes a clone stopped half-way | unset |",
        "| `filter.xet.*` | git's filter configuration, written by `git xet install`/`init` | - |",
        "",
        "Sizes are a whole number with an optional binary unit: `1048576`, `256k`, `20g`,",
        "`10GiB`, `4 MB` (no fractions, no bare `B`). Booleans are git's: `true/yes/on/1`,",
        "`false/no/off/0`.",
        "",
        "### Tokens",
        "",
        "The token for an http(s) server is looked up in this order; the first one found is",
        "used: an explicit token (a Docker `token`/`token_file` option, a CSI secret, the",
        "`token=` option of `xet://`) > `GITXET_TOKEN` > the keyring entry `git xet login URL`",
        "stored for the server (`scheme://host:port`) > the password in the URL.",
        "",
        "`git xet install` also registers `git-xet credential` as a git credential helper (after",
        "the helpers you have), so plain `git clone`, `fetch` and `push` of a gitxet server",
        "authenticate with the same token, with none in the URL. It answers for servers with a",
        "keyring entry, and with `GITXET_TOKEN` for servers that identify as gitxet servers",
        '(their 401 carries `realm="gitxet"`); other hosts get no answer, so your other helpers',
        "work as before. Without a token git fails at once with one line naming",
        "`git xet login`. A token put in a URL is never written further: mount records,",
        "`git xet mounts`, `git xet env`, logs, messages and the mount daemon's arguments show",
        "the URL without it (the daemon gets the token through its environment).",
        "",
        "`GITXET_TOKEN` goes to every server that identifies as a gitxet server, which any",
        "server can claim. Where a job clones repositories someone else wrote (whose submodule",
        "URLs name servers of their choosing), bind it: `GITXET_TOKEN_HOSTS=data.example.org`",
        "(`host` or `host:port`, comma-separated) gives it to those servers only, in git's",
        "credential helper and in every other token lookup alike; docs/security.md has more.",
    ]


# ---- man pages (installed into share/man/man1: `man git-xet-mount`, `git xet --help`) ----------


def _roff(text: str) -> str:
    """Text as roff: backslashes and hyphens escaped, no line read as a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-").replace("\b", "")
    return "\n".join("\\&" + ln if ln.startswith((".", "'")) else ln for ln in text.split("\n"))


def _roff_paragraphs(text: str) -> list[str]:
    """Help text (paragraphs, '- ' lists, indented examples) as roff."""
    out: list[str] = []
    for para in text.strip().split("\n\n"):
        lines = para.replace("\b", "").strip("\n").split("\n")
        if all(ln.startswith("    ") for ln in lines if ln.strip()):
            out += [".PP", ".RS 4", ".nf", *(_roff(ln[4:]) for ln in lines), ".fi", ".RE"]
            continue
        out.append(".PP")
        for ln in lines:
            if ln.startswith(("- ", "* ")):
                out += [".IP \\(bu 2", _roff(ln[2:].strip())]
            else:
                out.append(_roff(ln.strip()))
    return out


_METAVARS = {"int": "N", "float": "SECONDS", "Path": "PATH", "bool": ""}


def _param_lines(cmd, heading: str) -> list[str]:  # type: ignore[no-untyped-def]
    """ARGUMENTS and OPTIONS of a click command as roff; ``heading`` is the macro of their
    titles (``.SH`` on a command's page, ``.SS`` under a group's subcommand)."""
    args = [p for p in cmd.params if p.param_type_name == "argument"]
    opts = [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]
    out: list[str] = []
    if args:
        out.append(f"{heading} ARGUMENTS")
        for p in args:
            out += [".TP", f"\\fI{p.name.upper()}\\fR" + ("" if p.required else " (optional)")]
            out.append(_roff(p.help or ""))
    out.append(f"{heading} OPTIONS")
    for p in opts:
        names = ", ".join(f"\\fB{_roff(o)}\\fR" for o in [*p.opts, *p.secondary_opts])
        if not p.is_flag and not p.count:
            names += f" \\fI{_METAVARS.get(p.bare_type(), 'TEXT')}\\fR"
        help_text = p.help or ""
        if p.default not in (None, False, (), "") and not p.is_flag and p.show_default is not False:
            help_text += f" (default: {p.default})"
        if p.envvar:
            help_text += f" (environment: {p.envvar})"
        out += [".TP", names, _roff(help_text)]
    out += [".TP", "\\fB\\-h\\fR, \\fB\\-\\-help\\fR", "Show the help and exit."]
    return out


def _usage(cmd, path: str) -> str:  # type: ignore[no-untyped-def]
    pieces = ["[OPTIONS]"] if any(p.param_type_name == "option" for p in cmd.params) else []
    for p in cmd.params:
        if p.param_type_name == "argument":
            name = p.name.upper() + ("..." if p.nargs == -1 else "")
            pieces.append(name if p.required else f"[{name}]")
    if hasattr(cmd, "commands"):
        pieces.append("COMMAND [ARGS]...")
    return f"\\fB{_roff(path)}\\fR " + _roff(" ".join(pieces))


def _header(name: str, summary: str) -> list[str]:
    return [
        '.\\" Generated by docs/gen_cli_reference.py from the CLI; do not edit.',
        f'.TH "{name.upper()}" "1" "" "gitxet" "gitxet manual"',
        ".SH NAME",
        f"{_roff(name)} \\- {_roff(summary)}",
    ]


def _command_page(name: str, cmd) -> str:  # type: ignore[no-untyped-def]
    path = f"git xet {name}"
    help_text = (cmd.help or "").strip()
    summary = help_text.split("\n\n")[0]
    out = _header(f"git-xet-{name}", summary.rstrip("."))
    out += [".SH SYNOPSIS", _usage(cmd, path), ".SH DESCRIPTION"]
    out += _roff_paragraphs(help_text)
    subs = getattr(cmd, "commands", None)
    if subs:
        for sub_name, sub in subs.items():
            sub_path = f"{path} {sub_name}"
            out += [f".SH {_roff(sub_path.upper())}", _usage(sub, sub_path)]
            out += _roff_paragraphs(sub.help or "")
            out += _param_lines(sub, ".SS")
    else:
        out += _param_lines(cmd, ".SH")
    out += [
        ".SH EXIT STATUS",
        "0 success, 1 error, 2 usage, 3 integrity error, 4 not found, 5 access denied;",
        "see \\fBgit\\-xet\\fR(1).",
        ".SH SEE ALSO",
        "\\fBgit\\-xet\\fR(1)",
    ]
    return "\n".join(out) + "\n"


def _main_page(group) -> str:  # type: ignore[no-untyped-def]
    from gitxet.settings import VARIABLES

    out = _header("git-xet", "versioned datasets in git: content-defined chunks, lazy mounts")
    out += [
        ".SH SYNOPSIS",
        "\\fBgit xet\\fR \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".br",
        "\\fBgit xet\\fR \\fICOMMAND\\fR \\fB\\-\\-help\\fR",
        ".SH DESCRIPTION",
        *_roff_paragraphs(
            "gitxet versions large datasets in git. It cuts large files into content-defined "
            "chunks, stores each distinct chunk once (the Xet protocol's xorbs and shards) and "
            "keeps only a small pointer in git. Any commit can be mounted read-only and read "
            "lazily.\n\n"
            "Each command has its own page: man git-xet-<command> (for example man "
            "git-xet-mount), and 'git xet <command> --help' (or 'git xet help <command>') "
            "shows the same text."
        ),
        ".SH COMMANDS",
    ]
    for name in commands():
        cmd = group.commands[name]
        short = (cmd.help or "").strip().split("\n\n")[0]
        out += [".TP", f"\\fBgit\\-xet\\-{_roff(name)}\\fR(1)", _roff(short)]
    out += [".SH EXIT STATUS"]
    for row in EXIT_CODES:
        if row.startswith("| ") and row[2].isdigit():
            code, meaning, example = (c.strip() for c in row.strip("|").split(" | "))
            out += [".TP", code, _roff(f"{meaning}: {example}".replace("`", ""))]
    out += [".SH ENVIRONMENT"]
    for name, what, default in VARIABLES:
        text = f"{what} (default: {default})".replace("`", "")
        out += [".TP", f"\\fB{_roff(name)}\\fR", _roff(text)]
    out += [
        ".TP",
        "\\fBGITXET_TRACEBACK\\fR",
        "1: show the traceback of an error (for bug reports).",
        ".SH SEE ALSO",
        "\\fBgit\\fR(1), \\fBgitattributes\\fR(5)",
    ]
    return "\n".join(out) + "\n"


def man_pages() -> dict[str, str]:
    """``git-xet.1`` and one ``git-xet-<command>.1`` per visible command."""
    import typer.main

    from gitxet.cli.app import app

    group = typer.main.get_command(app)
    pages = {"git-xet.1": _main_page(group)}
    for name in commands():
        pages[f"git-xet-{name}.1"] = _command_page(name, group.commands[name])
    return pages


def render() -> str:
    pages = [[name, *sub] for name in commands() for sub in ([], *([s] for s in subcommands(name)))]
    help_of = help_texts([[], *pages])
    parts = [
        "# `git xet` command reference",
        "",
        "Generated by `python docs/gen_cli_reference.py` from the CLI itself; a test fails when",
        "it is stale. Errors are one line on stderr (`git-xet: ...`), sometimes followed by a",
        "`hint: ...` line, never a traceback (set `GITXET_TRACEBACK=1` to see one), and exit",
        "with the codes below.",
        "",
        "```text",
        help_of[()],
        "```",
        *EXIT_CODES,
    ]
    parts += lfs_table()
    parts += configuration()
    from gitxet.cli._json import documentation

    parts += documentation()
    for name in commands():
        parts += ["", f"## `git xet {name}`", "", "```text", help_of[(name,)], "```"]
        for sub in subcommands(name):
            parts += ["", f"### `git xet {name} {sub}`", "", "```text"]
            parts += [help_of[(name, sub)], "```"]
    return "\n".join(parts) + "\n"


def subcommands(group: str) -> list[str]:
    """The commands of a command group (``token create``, ...), in their order."""
    from gitxet.cli.app import app

    for g in app.registered_groups:
        if g.name == group and g.typer_instance is not None:
            return [c.name for c in g.typer_instance.registered_commands if c.name]
    return []


def main() -> None:
    files = {TARGET: render()}
    files.update({os.path.join(COMPLETIONS, k): v for k, v in completions().items()})
    files.update({os.path.join(MAN, k): v for k, v in man_pages().items()})
    if "--check" in sys.argv:
        for path, text in files.items():
            try:
                with open(path, encoding="utf-8") as f:
                    current = f.read()
            except FileNotFoundError:
                current = None
            if current != text:
                sys.exit(f"{path} is stale: run python docs/gen_cli_reference.py")
        return
    os.makedirs(MAN, exist_ok=True)
    for name in os.listdir(MAN):  # pages of commands that are gone
        if os.path.join(MAN, name) not in files:
            os.unlink(os.path.join(MAN, name))
    for path, text in files.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
