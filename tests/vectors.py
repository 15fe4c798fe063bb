"""Golden vectors from the Xet protocol reference (§12.2), shared by several test modules."""

from __future__ import annotations

import random


def R(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


THREE_MIB = R(3, 3 * 1024 * 1024)

# (name, input, expected Xet file hash, expected chunk count or None)
FILE_VECTORS: list[tuple[str, bytes, str, int | None]] = [
    ("empty", b"", "0" * 64, 0),
    ("one-byte", R(1, 1), "4dcdc14acf08331e9796e19a375ada4a62e9f9230dcb9135e71f7d43b4c914e7", 1),
    (
        "hello",
        b"Hello World!",
        "a9dae0ad88b060bdd7e7c87abdcf95b132c95a0414b06d4f6beb68d287b87165",
        1,
    ),
    ("8191", R(7, 8191), "f2a01b0645a632e2f35940405b3b0bf32c21c59a423b3be95c22170623c0eaf6", 1),
    ("8192", R(8, 8192), "8fc1578b779b54c83904dafdc6b194c67d6512cfb7231222d13693abfc135fee", 1),
    ("100k", R(100, 102400), "c8a1f4e118bfe056673c794ac82312ca84550e16f474b078764974f35d70c647", 1),
    ("131073", R(9, 131073), "300bc3c176426ebf38972fd4098796d86d66301a649328eb2f107fefa0013146", 3),
    ("3mib", THREE_MIB, "80f8f184331cb96d89ec5d345cabdca9700dc0a5faa3dd5c3909180f38a3d3a8", 52),
    (
        "zeros5m",
        bytes(5 * 1024 * 1024),
        "cb734480fbf82ac5292d8b0da056c30b4982ea4ef0f7d68b40c8369ea9fb3dde",
        40,
    ),
    (
        "repeat20",
        R(20, 1024 * 1024) * 20,
        "b52fb55639a5221a949cbcd70fe4a1387cfe9a793cdd24b5fa00b2dde5a0aa79",
        360,
    ),
    (
        "3mib+500k",
        THREE_MIB + R(10, 512000),
        "fa94c3f695511ec0ea17ce8c1e44a60b966f8610bd421db000ff67327d338c76",
        None,
    ),
]

THREE_MIB_FIRST_SIZES = [131072, 30570, 97676, 104794, 85214, 42657]
THREE_MIB_LAST_SIZE = 37276
THREE_MIB_XORB = "f25a42b0442dbbc1341d3a56e1c339b4d38ee40f4385e9149301f949b280210e"
THREE_MIB_VERIFICATION = "5ef3f1632501907cc7de493b58532d50bef899b25806fc7e706e9cf25bd8b733"
THREE_MIB_FIRST_CHUNK = "46633d6f73fd3f244e0ba1d34ca3bb1831967ba3295801624794898859c6ecd1"
