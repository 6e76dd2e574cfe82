"""Lines of JSON read so that nothing but a RecordError naming the file and the line escapes."""

from __future__ import annotations

import pytest

from kglightning.data.records import RecordError
from kglightning.data.sources.json_lines import decode_json_line, iter_json_lines


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"id": 1, "n": ' + b"9" * 5000 + b"}", "invalid JSON: a number that cannot be read (Exceeds the limit"),
        (b"[" * 100_000 + b"]" * 100_000, "invalid JSON: nested too deeply to read"),
        (b'{"id": ', "invalid JSON: Expecting value"),
        (b'{"id": "caf\xe9"}', "not valid UTF-8 (invalid continuation byte at byte 11)"),
    ],
)
def test_what_json_cannot_read_is_a_record_error(raw, reason):
    with pytest.raises(RecordError) as err:
        decode_json_line(raw, source="p.jsonl", line=3)
    assert (err.value.source, err.value.line) == ("p.jsonl", 3) and err.value.reason.startswith(reason)


def test_lines_are_yielded_with_their_number_and_errors_are_yielded_not_raised(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n   \n[' + b"[" * 50_000 + b"]" * 50_001 + b'\n"\\ud800"\n')
    got = list(iter_json_lines(path))
    assert [line for line, _ in got] == [1, 4, 5]
    assert got[0][1] == {"a": 1} and isinstance(got[1][1], RecordError) and got[2][1] == "\ud800"
    assert str(got[1][1]) == f"{path}:4: invalid JSON: nested too deeply to read"
    assert decode_json_line("\ufeff[1]", source="s", line=1) == [1]
