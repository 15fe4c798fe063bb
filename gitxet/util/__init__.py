"""Small shared utilities at the bottom layer (below everything but ``gitxet.errors``).

One of each: the atomic file writer (``atomic``), the JSON record directory (``records``),
the state-dir lock and stale-socket probe (``statelock``), the retry helper (``retry``) and
the bounded LRU (``lru``). Anything above may import them; they import only
``gitxet.errors``.
"""
