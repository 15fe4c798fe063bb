def find_candidates(
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    prev: bytes | bytearray | memoryview = ...,
    /,
) -> bytes: ...
