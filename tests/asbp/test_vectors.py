"""tests/vectors/frames.json, the codec vectors the TypeScript client also runs.

The file is generated (``python -m tests.support.vectors``); these tests fail
when it no longer says what the Python codec does, so the two codecs are held
to one behaviour through one file.
"""

from __future__ import annotations

import json
from pathlib import Path

from asbp import decode
from tests.support.vectors import CASES, Repeat, vectors

VECTORS = Path(__file__).parents[1] / "vectors" / "frames.json"


def test_the_file_matches_the_python_codec() -> None:
    assert json.loads(VECTORS.read_text("utf-8")) == vectors(), (
        "regenerate: python -m tests.support.vectors > tests/vectors/frames.json"
    )


def test_every_kind_of_vector_is_there() -> None:
    document = vectors()
    assert len(document["valid"]) >= 40
    assert len(document["invalid"]) >= 60
    codes = {entry["code"] for entry in document["invalid"]}
    assert codes == {1101, 1104, 1105, 1106, 1201, 1203}
    assert {entry["code"] for entry in document["unencodable"]} >= {1104, 1105, 1106, 1201, 1203}


def test_repeat_writes_the_long_frame() -> None:
    assert Repeat("c=", "n", 3, ";").frame() == b"c=nnn;"
    largest = Repeat("c=x;", "b", 256 * 1024 - 4, "")
    assert (largest, None) in CASES
    assert decode(largest.frame()).body == b"b" * largest.times
