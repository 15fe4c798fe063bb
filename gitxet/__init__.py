"""gitxet: versioned datasets for git, stored as Xet chunks, xorbs and shards.

This module deliberately imports nothing so that `git xet filter-process` starts fast.
"""

__version__ = "0.1.0"
