"""ResponseCache shared by several writers: process-safe appends, torn lines of others, unencodable text."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from kglightning.llm.backends import Generation, ResponseCache


def _write_many(path: str, writer: int, n: int) -> None:
    cache = ResponseCache(path)
    for i in range(n):
        cache.put(f"{writer}-{i}", Generation(text=f"answer {writer} {i} " + "x" * (i % 7) * 500))
    cache.close()


def test_several_processes_append_to_one_file(tmp_path: Path):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_write_many, args=(str(tmp_path), w, 150)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = ResponseCache(tmp_path)
    assert len(cache) == 600 and cache.n_corrupt == 0
    assert cache.get("3-149").text.startswith("answer 3 149 ")


def test_a_line_torn_by_another_writer_does_not_swallow_ours(tmp_path: Path):
    cache = ResponseCache(tmp_path)
    cache.put("first", Generation(text="one"))
    with open(cache.path, "ab") as other:  # another process died in the middle of its line
        other.write(b'{"key": "theirs", "generation": {"te')
    cache.put("second", Generation(text="two"))
    again = ResponseCache(tmp_path)
    assert again.get("first").text == "one" and again.get("second").text == "two"
    assert again.n_corrupt == 1 and "theirs" not in again


def test_text_that_utf8_cannot_encode_is_stored_and_read_back(tmp_path: Path):
    with ResponseCache(tmp_path) as cache:
        cache.put("k", Generation(text="a\ud800b", tokens=["\udfff"], token_logprobs=[-1.0]))
    again = ResponseCache(tmp_path)
    assert again.get("k").text == "a\ud800b" and again.get("k").tokens == ["\udfff"] and again.n_corrupt == 0


def test_an_append_waits_for_the_file_lock(tmp_path: Path):
    """A writer that holds the lock (another process, another rank) keeps our append out until it lets go."""
    import threading

    from filelock import FileLock

    cache = ResponseCache(tmp_path)
    other = FileLock(str(cache.path) + ".lock")  # its own file descriptor: a lock as another process holds it
    other.acquire()
    writer = threading.Thread(target=cache.put, args=("k", Generation(text="v")))
    writer.start()
    writer.join(0.5)
    assert writer.is_alive() and (not cache.path.exists() or cache.path.read_text() == "")
    other.release()
    writer.join(10)
    assert not writer.is_alive() and ResponseCache(tmp_path).get("k").text == "v"
