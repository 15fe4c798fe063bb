"""Use cases of a gitxet repository: where git, the local store, the remotes and the data
engine meet. One module a job, each usable (and tested) on its own:

- :mod:`~gitxet.repo.repository`: :class:`~gitxet.repo.repository.XetRepo`, a repository
  opened with its store and remotes, composing the parts (and git's filter handler).
- :mod:`~gitxet.repo.filter`: git's clean/smudge handler (what git stores for a file's
  content, what it checks out for a pointer), the threshold, staging of a filter session.
- :mod:`~gitxet.repo.history`: where the data of history is (fsck, status), the repairing
  push, what a prune must keep.
- :mod:`~gitxet.repo.materialize`: pointer text in the work tree replaced by content and
  back, atomically per file, with git's index told the new stat (the index restat); the
  records that let the filter skip re-chunking an untouched materialized file.
- :mod:`~gitxet.repo.content`: the data behind pointers: fetched from whichever remote has
  it, reconstructed into a stream, uploaded.
- :mod:`~gitxet.repo.pointers`: pointer blobs in trees, the index and history.

The package's modules are layered too (import-linter contract "repo parts"): a module
imports only those listed after it.
"""
