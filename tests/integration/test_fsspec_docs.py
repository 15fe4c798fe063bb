"""The Python examples of docs/python.md, run as written against a real pushed repository.

The examples use ``/srv/data.git``; this test builds a repository with the layout they assume
(``tables/sales.csv``, ``tables/events.parquet``, ``images/*.npy``, tag ``v1.0``) and runs
every ``python`` block in order, in one namespace, with that path replaced. Without torch
installed, a stand-in with the few names the PyTorch example uses takes its place (a map-style
Dataset and a DataLoader that stacks samples), so the example's own code still runs.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from gitxet.fsspec import XetFileSystem

DOC = Path(__file__).resolve().parents[2] / "docs" / "python.md"
DOC_REPO = "/srv/data.git"


def _fake_torch() -> dict[str, types.ModuleType]:
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch.utils")
    data = types.ModuleType("torch.utils.data")

    class DataLoader:
        def __init__(self, ds: Any, batch_size: int = 1, num_workers: int = 0) -> None:
            self.ds, self.batch_size = ds, batch_size

        def __iter__(self) -> Iterator[np.ndarray]:
            for i in range(0, len(self.ds), self.batch_size):
                yield np.stack(
                    [self.ds[j] for j in range(i, min(i + self.batch_size, len(self.ds)))]
                )

    data.Dataset = object  # type: ignore[attr-defined]
    data.DataLoader = DataLoader  # type: ignore[attr-defined]
    torch.Tensor = np.ndarray  # type: ignore[attr-defined]
    torch.from_numpy = np.asarray  # type: ignore[attr-defined]
    torch.utils = utils  # type: ignore[attr-defined]
    utils.data = data  # type: ignore[attr-defined]
    return {"torch": torch, "torch.utils": utils, "torch.utils.data": data}


@pytest.fixture
def doc_repo(tmp_path: Path) -> Iterator[tuple[Path, dict[str, bytes]]]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]

    def sh(*a: str, cwd: Path) -> None:
        r = subprocess.run(list(a), cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (a, r.stderr)

    remote, work = tmp_path / "data.git", tmp_path / "work"
    sh("git", "init", "-q", "--bare", str(remote), cwd=tmp_path)
    sh("git", "init", "-q", str(work), cwd=tmp_path)
    sh("git", "remote", "add", "origin", str(remote), cwd=work)
    sh("git-xet", "init", cwd=work)
    rng = np.random.default_rng(5)
    files: dict[str, bytes] = {}
    n = 40_000
    files["tables/sales.csv"] = (
        pd.DataFrame({"store": rng.integers(0, 50, n), "amount": rng.random(n)})
        .to_csv(index=False)
        .encode()
    )
    buf = io.BytesIO()
    events = pd.DataFrame(
        {"user": rng.integers(0, 1000, n), "ts": np.arange(n), "value": rng.random(n)}
    )
    events.to_parquet(buf, index=False, compression=None)
    files["tables/events.parquet"] = buf.getvalue()
    for i in range(3):
        b = io.BytesIO()
        np.save(b, rng.random((64, 64)))
        files[f"images/{i:03}.npy"] = b.getvalue()
    for p, d in files.items():
        (work / p).parent.mkdir(parents=True, exist_ok=True)
        (work / p).write_bytes(d)
    sh("git-xet", "add", ".", cwd=work)
    sh("git", "commit", "-q", "-m", "data", cwd=work)
    sh("git", "tag", "v1.0", cwd=work)
    sh("git", "push", "-q", "origin", "main", "v1.0", cwd=work)
    yield remote, files
    XetFileSystem().close()


def test_docs_python_examples_run(
    doc_repo: tuple[Path, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    remote, files = doc_repo
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 5
    try:
        import torch  # noqa: F401
    except ImportError:
        for name, mod in _fake_torch().items():
            monkeypatch.setitem(sys.modules, name, mod)
    ns: dict[str, Any] = {"__name__": "docs_python"}
    for code in blocks:
        exec(compile(code.replace(DOC_REPO, str(remote)), str(DOC), "exec"), ns)

    sales = pd.read_csv(io.BytesIO(files["tables/sales.csv"]))
    events = pd.read_parquet(io.BytesIO(files["tables/events.parquet"]))
    assert ns["header"] == "store,amount\n"
    assert ns["chunk"] == files["tables/sales.csv"][10:110]
    pd.testing.assert_frame_equal(ns["sales"], sales)
    pd.testing.assert_frame_equal(ns["events"], events[["user", "value"]])
    assert ns["table"].column("value").to_pylist() == events["value"].tolist()
    assert ns["meta"].num_rows == len(events)
    assert 0 < ns["fs"].fetch_stats.bytes < len(files["tables/events.parquet"])
    want = np.stack([np.load(io.BytesIO(files[f"images/{i:03}.npy"])) for i in range(2)])
    assert np.array_equal(np.asarray(ns["first"]), want)
    assert len(ns["ds"]) == 3
    assert pq.read_metadata(io.BytesIO(files["tables/events.parquet"])).num_rows == len(events)
