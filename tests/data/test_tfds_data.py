"""The data path: `load_examples` prepares each split once as a TFDS dataset and reads back exactly what the
format's reader returns, prepares again when the files or the readers change, and survives two processes
preparing the same split at once."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchrl import cli
from searchrl.data import DataFormatError, datasets, flashrag, tfds_records
from searchrl.data.tfds_records import Records
from searchrl.tasks.deepretrieval import data as retrieval_tasks
from tests.data.retrieval_helpers import beir_dir, bird_dir, literature_dir, spider_dir, write_jsonl

REPO = Path(__file__).resolve().parents[2]
METADATA = {"hops": 2, "big": 2**70, "x": 0.1, "neg": -0.0, "nan": float("nan"), "flag": False, "none": None,
            "nested": {"list": [1, "two", [3.5, None], {}], "empty": ""}, "unicode": "é\u2028\x00"}


def _qa_rows(n):
    """FlashRAG rows with what must round-trip: int ids, NUL and line-separator characters, empty and
    nested metadata (big ints, -0.0, NaN, None), several answers."""
    return [{"id": i if i % 3 == 0 else f"q{i}\x00", "question": f" question {i} é\u2028?\x00 ",
             "golden_answers": [f"answer {i}", "x" * (i % 3 + 1)][: 1 + i % 2],
             "metadata": [None, {}, METADATA][i % 3]} for i in range(n)]


def _search_r1_parquet(path, n):
    prompt = "Answer the given question. Question: {}\n"
    pq.write_table(pa.table({
        "data_source": ["nq"] * n,
        "prompt": [[{"role": "user", "content": prompt.format(f"q{i}?")}] for i in range(n)],
        "ability": ["fact-reasoning"] * n,
        "reward_model": [{"style": "rule", "ground_truth": {"target": ["a", f"b{i}"]}} for i in range(n)],
        "extra_info": [{"split": "train", "index": i} for i in range(n)],
    }), path)


def _expected(records, name):
    return [{**r, "dataset": name} for r in records]


def _qa(root):
    path = write_jsonl(root / "nq" / "train.jsonl", _qa_rows(30))
    return "qa", "nq", "train", flashrag.read_flashrag_jsonl(path)


def _parquet(root):
    (root / "nq").mkdir(parents=True)
    _search_r1_parquet(root / "nq" / "train.parquet", 12)
    return "qa", "nq", "train", flashrag.read_search_r1_parquet(root / "nq" / "train.parquet")


def _beir(root):
    path = beir_dir(root)
    (path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t2\nq1\td1\t-1\nq2\td1\t0\n")
    return "beir", "scifact", "test", retrieval_tasks.read_beir_task(path, "test")


def _literature(root):
    return "literature", "pubmed", "test", retrieval_tasks.read_literature_jsonl(
        literature_dir(root) / "test.jsonl")


def _spider(root):
    return "spider", "spider", "dev", retrieval_tasks.read_sql_task(spider_dir(root), "dev", "spider")


def _bird(root):
    return "bird", "bird", "dev", retrieval_tasks.read_sql_task(bird_dir(root), "dev", "bird")


@pytest.mark.parametrize("make", [_qa, _parquet, _beir, _literature, _spider, _bird])
def test_each_format_reads_back_what_its_reader_returns(tmp_path, make):
    fmt, name, split, direct = make(tmp_path)
    records = datasets.load_examples(str(tmp_path), name, split, fmt, "")[name]
    expected = _expected(direct, name)
    assert isinstance(records, Records) and len(records) == len(expected)
    assert list(records) == expected  # same dicts, same order
    assert [records[i] for i in range(len(records))] == expected  # random access
    assert records[-1] == expected[-1] and records[1:3] == expected[1:3]
    with pytest.raises(IndexError):
        records[len(records)]
    assert [p.name for p in (tmp_path / ".tfds" / fmt / name).iterdir()] == [
        f"{split}-{datasets._source_key(str(tmp_path / name), fmt, split)}"]


def test_storing_records_prints_no_progress_bars(tmp_path, capfd):
    """TFDS's generating and shuffling bars (tqdm.auto: "IProgress not found" in a notebook) were noise."""
    _qa(tmp_path)
    datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")
    out, err = capfd.readouterr()
    assert "Shuffling" not in out + err and "Generating" not in out + err and "%|" not in out + err


def test_a_prepared_split_is_read_without_its_reader(tmp_path, monkeypatch):
    _, _, _, direct = _qa(tmp_path)
    datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")
    monkeypatch.setattr(datasets, "_read", lambda *args: pytest.fail("read the files again"))
    assert list(datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")["nq"]) == _expected(direct, "nq")
    assert "tensorflow" not in sys.modules


def test_a_changed_file_is_prepared_again(tmp_path):
    row = {"id": "a", "question": "q", "golden_answers": ["x"]}
    path = write_jsonl(tmp_path / "nq" / "train.jsonl", [row])
    assert datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")["nq"][0]["golden_answers"] == ["x"]
    stat = path.stat()
    write_jsonl(path, [{**row, "golden_answers": ["y"]}])  # the same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # and one nanosecond later
    assert datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")["nq"][0]["golden_answers"] == ["y"]
    assert len(list((tmp_path / ".tfds" / "qa" / "nq").iterdir())) == 2  # the stale copy is not read


def _damage(build: Path, how: str) -> None:
    shard = next(build.glob("*.array_record*"))
    if how == "torn_info":
        (build / "dataset_info.json").write_text('{"name": ')
    elif how == "info_list":
        (build / "dataset_info.json").write_text("[1]")
    elif how == "torn_features":
        (build / "features.json").write_text('{"x')
    elif how == "truncated_shard":
        os.truncate(shard, shard.stat().st_size // 2)
    elif how == "overwritten_shard":
        shard.write_bytes(np.random.default_rng(0).bytes(shard.stat().st_size))
    else:
        shard.unlink()


def test_a_damaged_prepared_copy_names_the_folder_to_delete(tmp_path, capsys):
    """Damage to any file of a prepared copy: one line naming its folder, from `load_examples`, from a read
    after the damage and from a tool (no Riegeli, protobuf or JSON error on its own)."""
    _qa(tmp_path)
    records = datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")["nq"]
    (build,) = (tmp_path / ".tfds" / "qa" / "nq").iterdir()
    _damage(build, "overwritten_shard")
    with pytest.raises(cli.Damaged, match=f"TFDS copy {build} is damaged .*delete it and run again"):
        list(records)
    for how in ("torn_info", "info_list", "torn_features", "truncated_shard", "overwritten_shard", "gone"):
        shutil.rmtree(build)
        datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")
        _damage(build, how)
        with pytest.raises(cli.Damaged) as e:
            datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")
        assert str(e.value).startswith(f"the prepared TFDS copy {build} is damaged ("), how
        assert "\n" not in str(e.value)

    def tool(argv):
        datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")

    with pytest.raises(SystemExit) as exit:
        cli._failing_on_bad_input(tool)([])
    assert exit.value.code == 1
    err = capsys.readouterr().err  # TFDS's progress bars, then the one line
    assert err.split("\n")[-2].split("\r")[-1] == f"error: {e.value}" and "Traceback" not in err


def test_changed_readers_or_a_moved_folder_prepare_again(tmp_path, monkeypatch):
    spider_dir(tmp_path / "a")
    datasets.load_examples(str(tmp_path / "a"), "spider", "dev", "spider", "")
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # file times kept, its prepared copy too
    moved = datasets.load_examples(str(tmp_path / "b"), "spider", "dev", "spider", "")["spider"]
    assert moved[0]["db_path"] == str(tmp_path / "b" / "spider" / "database" / "concert" / "concert.sqlite")
    monkeypatch.setattr(datasets, "_code_hash", lambda module: "another reader")
    datasets.load_examples(str(tmp_path / "b"), "spider", "dev", "spider", "")
    assert len(list((tmp_path / "b" / ".tfds" / "spider" / "spider").iterdir())) == 3


def test_a_file_changed_while_read_is_not_stored(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "nq" / "train.jsonl", _qa_rows(3))
    read = datasets._read

    def read_then_change(*args):
        records = read(*args)
        write_jsonl(path, _qa_rows(4))
        return records

    monkeypatch.setattr(datasets, "_read", read_then_change)
    with pytest.raises(RuntimeError, match="nq changed while it was being read"):
        datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")
    assert not (tmp_path / ".tfds").exists()


def test_a_process_that_loses_the_race_reads_the_winners_copy(tmp_path, monkeypatch):
    _, _, _, direct = _qa(tmp_path)
    read, calls = datasets._read, []

    def racing_read(*args):  # the first reader is overtaken: another "process" prepares the split meanwhile
        calls.append(args)
        if len(calls) == 1:
            datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")
        return read(*args)

    monkeypatch.setattr(datasets, "_read", racing_read)
    records = datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")["nq"]
    assert len(calls) == 2 and list(records) == _expected(direct, "nq")
    assert len(os.listdir(tmp_path / ".tfds" / "qa" / "nq")) == 1  # one build, no temporary folder left


def test_two_processes_prepare_one_split_at_once(tmp_path):
    write_jsonl(tmp_path / "nq" / "train.jsonl", _qa_rows(3000))
    script = ("import sys; from searchrl.data import datasets; "
              "records = datasets.load_examples(sys.argv[1], 'nq', 'train', 'qa', '')['nq']; "
              "print(len(records), records[2999]['id'])")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert out.split() == ["3000", "q2999\x00"]
    assert len(os.listdir(tmp_path / ".tfds" / "qa" / "nq")) == 1


def test_a_malformed_line_fails_with_the_readers_error(tmp_path):
    rows = _qa_rows(2) + [{"id": "z", "question": "q", "golden_answers": "x"}]
    write_jsonl(tmp_path / "nq" / "train.jsonl", rows)
    with pytest.raises(DataFormatError, match=r"nq/train.jsonl:3: field 'golden_answers'"):
        datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")
    assert not (tmp_path / ".tfds").exists()  # nothing stored, nothing half-built


def test_values_that_would_not_read_back_the_same_fail(tmp_path):
    (tmp_path / "nq").mkdir()
    _search_r1_parquet(tmp_path / "nq" / "train.parquet", 3)
    table = pq.read_table(tmp_path / "nq" / "train.parquet")
    pq.write_table(table.append_column("metadata", pa.array([{"raw": b"\x00"}] * 3)),
                   tmp_path / "nq" / "train.parquet")
    stored = r"nq \(train\): record 0 \(id 'nq_train_0'\): field 'metadata': cannot be stored"
    with pytest.raises(DataFormatError, match=stored):
        datasets.load_examples(str(tmp_path), "nq", "train", "qa", "")
    beir_dir(tmp_path)
    # A relevance past int64 is refused where it is read (qrels.tsv and its line), before anything is stored.
    (tmp_path / "scifact" / "qrels" / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\nq1\td1\t{2**63}\n")
    with pytest.raises(ValueError, match=r"test.tsv:2: relevance must be an integer of at most 18 digits"):
        datasets.load_examples(str(tmp_path), "scifact", "test", "beir", "")


def test_tfds_dir_and_empty_splits(tmp_path):
    write_jsonl(tmp_path / "data" / "nq" / "train.jsonl", _qa_rows(4))
    (tmp_path / "data" / "hotpotqa").mkdir()
    (tmp_path / "data" / "hotpotqa" / "train.jsonl").write_text("\n\n")  # no records: nothing to store
    sets = datasets.load_examples(str(tmp_path / "data"), "nq,hotpotqa", "train", "qa",
                                  str(tmp_path / "c"))
    assert len(sets["nq"]) == 4 and list(sets["hotpotqa"]) == [] and sets["hotpotqa"][:] == []
    assert not (tmp_path / "data" / ".tfds").exists() and (tmp_path / "c" / "qa" / "nq").is_dir()
    both = Records.concatenate([sets["hotpotqa"], sets["nq"], sets["nq"]])
    assert len(both) == 8 and both[5] == sets["nq"][1] and list(both) == [*sets["nq"], *sets["nq"]]
    assert json.dumps(both[0], ensure_ascii=False)  # plain Python values


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                    max_leaves=10)
QA_RECORDS = st.fixed_dictionaries({"id": st.text(), "question": st.text(),
                                    "golden_answers": st.lists(st.text()),
                                    "metadata": st.dictionaries(st.text(), JSON, max_size=4)})
QRELS = st.dictionaries(st.text(), st.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max), max_size=4)
LITERATURE_RECORDS = st.fixed_dictionaries({"id": st.text(), "question": st.text(), "qrels": QRELS,
                                            "max_date": st.text()})


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(qa=st.lists(QA_RECORDS, min_size=1, max_size=40),
       literature=st.lists(LITERATURE_RECORDS, min_size=1, max_size=40))
def test_any_record_reads_back_exactly(tmp_path_factory, qa, literature):
    """Any text (NUL, line separators, astral characters), any JSON metadata (NaN, infinities, -0.0, big
    ints, nesting) and any int64 relevance come back the same: equal reprs, so types and key order too."""
    for record_type, records in ((flashrag.QARecord, qa), (retrieval_tasks.LiteratureRecord, literature)):
        records = [{k: r[k] for k in record_type.__annotations__} for r in records]  # the readers' order
        build = str(tmp_path_factory.mktemp("tfds") / "build")
        read = tfds_records.prepared(build, lambda: records, record_type, "generated", {})
        assert repr(list(read)) == repr(records) and repr(read[len(records) - 1]) == repr(records[-1])
