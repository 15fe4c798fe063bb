"""The git edge: the ``git`` binary, git's filter pipes, config, attributes and hooks.

Knows nothing about chunks or stores. Import the submodules directly; this package imports
nothing so that ``git xet filter-process`` starts fast.
"""
