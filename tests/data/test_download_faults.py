"""`searchrl.data.download` against a broken or hostile hub, a full disk, a torn stamps file and a second
download into the same folder (issue 67, causes 10-13): each failure is one line on stderr, damaged bytes are
never cached or used, and no hidden partial file outlives a run."""
import errno
import gzip
import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from searchrl.data import download, layout
from tests.data.test_download import flashrag, hub, jsonl, run  # noqa: F401 (fixtures)

TEST = "nq/test.jsonl"


def fails(capsys, *argv: str) -> str:
    """The one line a failing download prints last (exit status 1, no traceback; progress bars before it
    are redrawn with carriage returns)."""
    with pytest.raises(SystemExit) as e:
        run(*argv)
    assert e.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.split("\n") if line and "\r" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def hidden(folder: Path) -> list[str]:
    """Hidden files in `folder` other than the download's lock and stamps: partial files left behind."""
    return sorted(p.name for p in folder.rglob(".*") if p.name not in (layout.LOCK, layout.STAMPS))


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def cache_holds(tmp_path: Path, data: bytes) -> bool:
    return any(p.read_bytes() == data for p in (tmp_path / "hf_home").rglob("*") if p.is_file())


@pytest.fixture
def disk(monkeypatch):
    """Sets the free space every filesystem reports: disk(n)."""
    def set_free(free: int) -> None:
        monkeypatch.setattr(layout.shutil, "disk_usage", lambda path: type("Usage", (), {"free": free}))
    return set_free


# ---------------------------------------------------------------- cause 10: the disk


def test_disk_check_counts_the_decompressed_layout(hub, tmp_path, capsys, disk):
    corpus = b'{"_id": "d", "title": "", "text": "' + b"a" * 200_000 + b'"}\n'
    packed = gzip.compress(corpus)
    hub.add("dataset", "BeIR/tiny", {"corpus.jsonl.gz": packed, "queries.jsonl": jsonl([{"_id": "q"}])})
    hub.add("dataset", "BeIR/tiny-qrels", {"test.tsv": b"query-id\tcorpus-id\tscore\nq\td\t1\n"})
    disk(20_000)  # holds the download (the .gz is ~300 B) but not the corpus decompressed
    out = tmp_path / "beir"
    err = fails(capsys, "beir", "--names", "tiny", "--out", str(out))
    assert "not enough disk space" in err and "the files made from the download" in err
    assert not (out / "tiny" / "corpus.jsonl").exists() and hidden(out) == []


def test_disk_check_counts_the_concatenation_beside_the_download(hub, tmp_path, capsys, disk):
    """Two 2 kB pieces: 4 kB downloaded and 4 kB concatenated on one filesystem need 8 kB."""
    hub.add("dataset", download.WIKI18_CORPUS_REPO, {"wiki-18.jsonl": b"{}\n"})
    hub.add("dataset", download.WIKI18_INDEX_REPO, {"part_aa": b"a" * 2000, "part_ab": b"b" * 2000})
    disk(6000)
    err = fails(capsys, "wiki18", "--out", str(tmp_path / "wiki18"))
    assert "the download, in the hub cache" in err and "must fit" in err
    assert hub.downloads() == []  # refused before anything was fetched


def test_negative_size_in_the_listing_is_refused(flashrag, hub, tmp_path, capsys):
    hub.listed_size[TEST] = -10**12
    err = fails(capsys, "qa", "--names", "nq", "--out", str(tmp_path / "out"))
    assert f"lists {TEST} with size -1000000000000, not a count of bytes" in err


def test_disk_full_while_writing_leaves_no_partial(hub, tmp_path, capsys, monkeypatch):
    corpus = jsonl([{"_id": "d1", "title": "", "text": "one"}])
    hub.add("dataset", "BeIR/tiny", {"corpus.jsonl.gz": gzip.compress(corpus), "queries.jsonl": b""})
    hub.add("dataset", "BeIR/tiny-qrels", {"test.tsv": b"query-id\tcorpus-id\tscore\n"})
    out = tmp_path / "beir"
    (out / "tiny").mkdir(parents=True)
    (out / "tiny" / ".corpus.jsonl.partial").write_bytes(b"left by a killed run")

    def fill_disk(src, dest, raw, bar):
        dest.write(src.read(4))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(layout, "_copy_stream", fill_disk)
    err = fails(capsys, "beir", "--names", "tiny", "--out", str(out))
    assert f"no space left on the device while writing {out / 'tiny' / 'corpus.jsonl'}" in err
    assert hidden(out) == [] and not (out / "tiny" / "corpus.jsonl").exists()


# ---------------------------------------------------------------- cause 11: verification


@pytest.mark.parametrize("plain", [False, True], ids=["lfs_sha256", "git_object_id"])
def test_same_size_wrong_bytes_are_rejected_and_not_cached(hub, tmp_path, capsys, plain):
    good = jsonl([{"id": "0", "question": "q", "golden_answers": ["a"]}])
    bad = good.replace(b'"a"', b'"b"')
    hub.add("dataset", download.FLASHRAG_REPO, {TEST: good}, plain=(TEST,) if plain else ())
    hub.served[TEST] = bad
    out = tmp_path / "out"
    err = fails(capsys, "qa", "--names", "nq", "--out", str(out))
    algorithm, digest = ("git-sha1", hashlib.sha1(b"blob %d\0" % len(good) + good)) if plain else (
        "sha256", hashlib.sha256(good))
    assert f"nq/test.jsonl as downloaded is damaged: its {algorithm} is " in err
    assert f"the hub lists {digest.hexdigest()}" in err
    assert not cache_holds(tmp_path, bad) and not (out / TEST).exists()
    del hub.served[TEST]  # the hub mends: the next run fetches and uses the true bytes
    run("qa", "--names", "nq", "--out", str(out))
    assert (out / TEST).read_bytes() == good


def test_a_damaged_cached_gz_is_fetched_again(hub, tmp_path, capsys):
    """A cache an older version filled with bad bytes: the copy fails its check, is deleted and fetched
    again, instead of failing every rerun."""
    corpus = jsonl([{"_id": "d1", "title": "", "text": "one"}])
    packed = gzip.compress(corpus)
    hub.add("dataset", "BeIR/tiny", {"corpus.jsonl.gz": packed, "queries.jsonl": b""})
    hub.add("dataset", "BeIR/tiny-qrels", {"test.tsv": b"query-id\tcorpus-id\tscore\n"})
    out = tmp_path / "beir"
    run("beir", "--names", "tiny", "--out", str(out))
    blob = next(p for p in (tmp_path / "hf_home").rglob("*") if p.is_file() and p.read_bytes() == packed)
    blob.write_bytes(b"\0" * len(packed))
    (out / "tiny" / "corpus.jsonl").unlink()
    sent = len(hub.downloads())
    capsys.readouterr()
    run("beir", "--names", "tiny", "--out", str(out))
    assert "the cached copy of dataset:BeIR/tiny" in capsys.readouterr().err
    assert (out / "tiny" / "corpus.jsonl").read_bytes() == corpus and len(hub.downloads()) == sent + 1
    for made in (out / "tiny" / "corpus.jsonl", out / layout.STAMPS):  # as any new file: not owner-only
        assert made.stat().st_mode & 0o044 == 0o044 & ~umask()


def test_a_gz_the_hub_lists_as_it_is_but_cannot_decompress_names_it(hub, tmp_path, capsys):
    hub.add("dataset", "BeIR/tiny", {"corpus.jsonl.gz": gzip.compress(b"{}\n")[:-6], "queries.jsonl": b""})
    hub.add("dataset", "BeIR/tiny-qrels", {"test.tsv": b"query-id\tcorpus-id\tscore\n"})
    err = fails(capsys, "beir", "--names", "tiny", "--out", str(tmp_path / "beir"))
    assert "BeIR/tiny corpus.jsonl.gz as downloaded is damaged: it is not a valid .gz file" in err


@pytest.mark.parametrize("fault", ["cut_short", "redirect_loop", "size"])
def test_a_failed_transfer_is_one_line(flashrag, hub, tmp_path, capsys, monkeypatch, fault):
    monkeypatch.setattr(time, "sleep", lambda s: None)  # huggingface_hub's pauses between its retries
    if fault == "size":
        hub.served[TEST] = flashrag[TEST] + b"x"
    else:
        getattr(hub, fault).add(TEST)
    out = tmp_path / "out"
    err = fails(capsys, "qa", "--names", "nq", "--out", str(out))
    assert f"downloading dataset {download.FLASHRAG_REPO} {TEST} failed: " in err
    assert {"cut_short": "peer closed connection", "redirect_loop": "redirects",
            "size": "should be of size 100 but has size 101"}[fault] in err
    assert not (out / TEST).exists() and hidden(out) == []


# ---------------------------------------------------------------- cause 12: the stamps file


@pytest.mark.parametrize("stamps", [b'{"nq/test.jsonl": {"sources": [', b"[1, 2]"], ids=["torn", "list"])
def test_an_unreadable_stamps_file_is_remade(flashrag, hub, tmp_path, capsys, stamps):
    out = tmp_path / "out"
    run("qa", "--names", "nq", "--out", str(out))
    (out / layout.STAMPS).write_bytes(stamps)
    capsys.readouterr()
    run("qa", "--names", "nq", "--out", str(out))
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and f"warning: {out / layout.STAMPS}" in warnings[0]
    assert set(json.loads((out / layout.STAMPS).read_text())) == {"nq/test.jsonl", "nq/train.jsonl"}
    assert (out / TEST).read_bytes() == flashrag[TEST]


def test_stamps_are_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    layout.write_stamps(tmp_path, {"a": 1})

    def crash(src, dst):
        raise KeyboardInterrupt  # killed between writing and renaming

    monkeypatch.setattr(layout.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        layout.write_stamps(tmp_path, {"a": 2})
    assert layout.read_stamps(tmp_path) == {"a": 1} and hidden(tmp_path) == []
    monkeypatch.undo()
    (tmp_path / f".{layout.STAMPS}.1a2b.partial").write_text("{")  # left by a run killed with SIGKILL
    layout.write_stamps(tmp_path, {"a": 3})
    assert layout.read_stamps(tmp_path) == {"a": 3} and hidden(tmp_path) == []


# ---------------------------------------------------------------- cause 13: two downloads, one folder


def test_a_second_download_into_a_locked_folder_waits_then_says_why(flashrag, hub, tmp_path, capsys):
    out = tmp_path / "out"
    with layout.folder_lock(out, wait_s=0):
        start = time.monotonic()
        err = fails(capsys, "qa", "--names", "nq", "--out", str(out), "--lock_wait_s", "0.3")
        assert 0.3 <= time.monotonic() - start < 5
    assert f"another download is writing {out}" in err and layout.LOCK in err


def test_two_downloads_into_one_folder_both_finish(flashrag, hub, tmp_path):
    out, errors = tmp_path / "out", []

    def one() -> None:
        try:
            download.fetch(download.qa_targets(["nq"], [], "main"), out)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert (out / TEST).read_bytes() == flashrag[TEST] and hidden(out) == []
