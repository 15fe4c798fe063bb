"""One idea, one place (issue 15): each of these is defined in exactly one module of the
package, and a second copy anywhere else fails here, naming the file and line.

The checks read the source (``ast``), so they catch copies by what the code does, not only
by name: a temp file renamed into place is an atomic writer, an ``OrderedDict`` reordered
on use is an LRU, a directory of JSON files read one by one is a record store.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import gitxet

PACKAGE = Path(gitxet.__file__).resolve().parent
GENERATED = {"plugins/csi/csi_pb2.py", "plugins/csi/csi_pb2_grpc.py"}


@dataclass(frozen=True)
class Hit:
    module: str  # path below gitxet/, e.g. "util/atomic.py"
    line: int
    what: str

    def __str__(self) -> str:
        return f"gitxet/{self.module}:{self.line}: {self.what}"


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in GENERATED:
            yield rel, ast.parse(path.read_text(encoding="utf-8"), str(path))


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return ""


def calls(tree: ast.AST) -> Iterator[tuple[str, ast.Call]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield dotted(node.func), node


def functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def constant_int(node: ast.AST) -> int | None:
    """The value of an integer expression of literals (``10 << 30``, ``10 * 1024**3``)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp):
        a, b = constant_int(node.left), constant_int(node.right)
        if a is None or b is None:
            return None
        ops: dict[type, Callable[[int, int], int]] = {
            ast.LShift: lambda x, y: x << y if y < 64 else 0,
            ast.Mult: lambda x, y: x * y,
            ast.Pow: lambda x, y: x**y if y < 8 else 0,
        }
        op = ops.get(type(node.op))
        return op(a, b) if op else None
    return None


def strings(tree: ast.AST) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value, node.lineno


# ---- the ideas -------------------------------------------------------------------------


def atomic_writers(rel: str, tree: ast.Module) -> Iterator[Hit]:
    """A function that makes a temp file and renames it over a path; or one named so."""
    for fn in functions(tree):
        names = {name for name, _ in calls(fn)}
        temp = names & {"tempfile.mkstemp", "tempfile.NamedTemporaryFile", "mkstemp"}
        rename = names & {"os.replace", "os.rename"}
        if (temp and rename) or "atomic" in fn.name.lower():
            yield Hit(rel, fn.lineno, f"{fn.name}: writes a temp file and renames it")


def lrus(rel: str, tree: ast.Module) -> Iterator[Hit]:
    """An ordered dict kept in use order: ``OrderedDict`` with ``move_to_end`` or
    ``popitem(last=False)``, or a class named like an LRU."""
    uses_od = any(
        dotted(n) in ("OrderedDict", "collections.OrderedDict")
        for n in ast.walk(tree)
        if isinstance(n, ast.Name | ast.Attribute)
    )
    for name, call in calls(tree):
        last_false = any(
            k.arg == "last" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in call.keywords
        )
        reordered = name.endswith(".move_to_end") or (name.endswith(".popitem") and last_false)
        if reordered and uses_od:
            yield Hit(rel, call.lineno, f"{name}: an OrderedDict kept in use order")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and re.search(r"lru", node.name, re.I):
            yield Hit(rel, node.lineno, f"class {node.name}")


def record_stores(rel: str, tree: ast.Module) -> Iterator[Hit]:
    """A function that lists a directory and parses a JSON file per entry; or a class
    that implements ``RecordDir`` again."""
    for fn in functions(tree):
        names = {name.rsplit(".", 1)[-1] for name, _ in calls(fn)}
        lists = names & {"listdir", "scandir", "iterdir", "glob"}
        if lists and any(n in ("json.load", "json.loads") for n, _ in calls(fn)):
            yield Hit(rel, fn.lineno, f"{fn.name}: a JSON file per directory entry")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "RecordDir":
            yield Hit(rel, node.lineno, "class RecordDir")


def state_locks(rel: str, tree: ast.Module) -> Iterator[Hit]:
    """A non-blocking exclusive lock on a state directory's lock file, or a probe that
    connects to a unix socket and unlinks it when nobody answers."""
    for fn in functions(tree):
        names = {name for name, _ in calls(fn)}
        text = ast.unparse(fn)
        if "AF_UNIX" in text and (names & {"os.unlink", "os.remove"}) and ".connect" in text:
            yield Hit(rel, fn.lineno, f"{fn.name}: a stale-socket probe")
        if "fcntl.flock" in names and re.search(r"state", fn.name + text[:400], re.I):
            yield Hit(rel, fn.lineno, f"{fn.name}: a state-directory lock")


_UNIT_CLASS = re.compile(r"\[[^\]]*k[^\]]*m[^\]]*g[^\]]*\]", re.I)


def size_parsers(rel: str, tree: ast.Module) -> Iterator[Hit]:
    """A function named like a size parser, or a regular expression with a k/m/g unit
    class (the size grammar written again)."""
    for fn in functions(tree):
        if re.fullmatch(r"_?parse_size|_?size_from\w*|_?to_bytes", fn.name):
            yield Hit(rel, fn.lineno, f"def {fn.name}")
    for text, line in strings(tree):
        if _UNIT_CLASS.search(text) and re.search(r"[0-9\\]", text):
            yield Hit(rel, line, f"a size regular expression {text[:40]!r}")


TEN_G = 10 << 30
_TEN_G_TEXT = re.compile(r"10\s*g(i?b)?", re.I)


def cache_size_defaults(rel: str, tree: ast.Module) -> Iterator[Hit]:
    """The node cache's 10 GiB written as a number or as a size string."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp | ast.Constant) and constant_int(node) == TEN_G:
            yield Hit(rel, node.lineno, "10 GiB as a number")
    for text, line in strings(tree):
        if _TEN_G_TEXT.fullmatch(text.strip()):
            yield Hit(rel, line, f"{text!r}")


def state_and_cache_dir_defaults(rel: str, tree: ast.Module) -> Iterator[Hit]:
    """Where the state and cache directories default to (XDG variables, ~/.local/state,
    ~/.cache)."""
    for text, line in strings(tree):
        if text in ("XDG_STATE_HOME", "XDG_CACHE_HOME", ".cache", ".local/state"):
            yield Hit(rel, line, repr(text))


def token_lookups(rel: str, tree: ast.Module) -> Iterator[Hit]:
    """Reading a token: from the keyring, or the token variables by name."""
    for name, call in calls(tree):
        if name.endswith("get_password"):
            yield Hit(rel, call.lineno, f"{name}()")
    for text, line in strings(tree):
        if text in ("GITXET_TOKEN", "GITXET_TOKEN_FILE"):
            yield Hit(rel, line, repr(text))
    for fn in functions(tree):
        if fn.name in ("keyring_token", "read_token_file", "token_source"):
            yield Hit(rel, fn.lineno, f"def {fn.name}")


def fork_waits(rel: str, tree: ast.Module) -> Iterator[Hit]:
    """How long a fork waits for other threads, as a module constant."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Name) and "FORK_WAIT" in target.id:
                yield Hit(rel, node.lineno, target.id)


#: idea -> (finder, the one module allowed to hold it)
IDEAS: dict[str, tuple[Callable[[str, ast.Module], Iterator[Hit]], str]] = {
    "atomic writer": (atomic_writers, "util/atomic.py"),
    "LRU": (lrus, "util/lru.py"),
    "record store": (record_stores, "util/records.py"),
    "state lock": (state_locks, "util/statelock.py"),
    "size parser": (size_parsers, "settings.py"),
    "cache size default": (cache_size_defaults, "settings.py"),
    "state and cache dir defaults": (state_and_cache_dir_defaults, "settings.py"),
    "token lookup": (token_lookups, "settings.py"),
    "fork wait": (fork_waits, "util/forks.py"),
}

_TREES = list(modules())


@pytest.mark.parametrize("idea", sorted(IDEAS))
def test_one_definition(idea: str) -> None:
    find, home = IDEAS[idea]
    hits = [hit for rel, tree in _TREES for hit in find(rel, tree)]
    at_home = [h for h in hits if h.module == home]
    elsewhere = [str(h) for h in hits if h.module != home]
    assert at_home, f"the {idea} is not in gitxet/{home} any more (moved? update IDEAS)"
    assert not elsewhere, f"a second {idea} (use gitxet/{home}):\n" + "\n".join(elsewhere)


@pytest.mark.parametrize(
    ("idea", "source"),
    [
        (
            "atomic writer",
            "def save(p, b):\n    fd, t = tempfile.mkstemp()\n    os.replace(t, p)\n",
        ),
        ("LRU", "d = OrderedDict()\ndef get(k):\n    d.move_to_end(k)\n"),
        (
            "record store",
            "def load(d):\n    return [json.loads(open(e).read()) for e in os.listdir(d)]\n",
        ),
        (
            "state lock",
            "def probe(p):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect(p)\n"
            "    os.unlink(p)\n",
        ),
        ("size parser", "SIZE = re.compile(r'([0-9]+)([kmgt])?')\n"),
        ("cache size default", "def cache(max_bytes=10 << 30): ...\n"),
        ("state and cache dir defaults", "base = os.environ.get('XDG_CACHE_HOME')\n"),
        ("token lookup", "t = keyring.get_password('gitxet', url)\n"),
        ("fork wait", "FORK_WAIT = 10.0\n"),
    ],
)
def test_a_copy_is_caught(idea: str, source: str) -> None:
    """Each finder recognises the idea written again (so the test above can fail)."""
    find, _ = IDEAS[idea]
    assert list(find("elsewhere.py", ast.parse(source)))
