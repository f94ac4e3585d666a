"""`searchrl.tasks.deepretrieval.prepare`: the Spider train merge and the MS MARCO domain subsets, on tiny
fake releases, read back by the readers the DeepRetrieval presets use."""
import json
import sqlite3

import pytest

from searchrl.data.jsonl import DataFormatError
from searchrl.tasks.deepretrieval import data, prepare

SPIDER = [{"db_id": "shop", "question": "How many items?", "query": "SELECT count(*) FROM item"},
          {"db_id": "shop", "question": "Item names?", "query": "SELECT name FROM item"}]
OTHERS = [{"db_id": "shop", "question": "Cheapest item?", "query": "SELECT min(price) FROM item"}]


def _spider(root, others=OTHERS):
    (root / "database" / "shop").mkdir(parents=True)
    with sqlite3.connect(root / "database" / "shop" / "shop.sqlite") as db:
        db.execute("CREATE TABLE item (name TEXT, price REAL)")
    (root / "train_spider.json").write_text(json.dumps(SPIDER))
    if others is not None:
        (root / "train_others.json").write_text(json.dumps(others))


def test_spider_train_merges_both_files_in_the_public_order(tmp_path, capsys):
    root = tmp_path / "spider"
    _spider(root)
    prepare.main(["spider_train", f"--spider_dir={root}"])
    assert json.loads(capsys.readouterr().out) == {"command": "spider_train", "train.json": 3}
    records = data.read_spider(str(tmp_path), "spider", "train")  # what the `sql` preset's data.train reads
    assert [r["question"] for r in records] == ["How many items?", "Item names?", "Cheapest item?"]
    assert [r["gold_sql"] for r in records][-1] == "SELECT min(price) FROM item"


def test_spider_train_names_a_missing_or_malformed_file(tmp_path, capsys):
    root = tmp_path / "spider"
    _spider(root, others=None)
    with pytest.raises(SystemExit) as exit_:
        prepare.main(["spider_train", f"--spider_dir={root}"])
    assert exit_.value.code == 1 and "train_others.json" in capsys.readouterr().err
    (root / "train_others.json").write_text('{"db_id": "shop"}')
    with pytest.raises(DataFormatError, match="train_others.json.*JSON list"):
        prepare.merge_spider_train(root)
    assert not (root / "train.json").exists()


def _msmarco(root):
    """Six training and three dev queries; q5 and d3 have no judgements, q6 no domain."""
    root.mkdir()
    (root / "queries.train.tsv").write_text("q1\tflu symptoms\nq2\tquantum spin\nq3\tcold remedy\n"
                                            "q4\tgpu memory\nq5\tfever in kids\nq6\tcapital of france\n")
    (root / "qrels.train.tsv").write_text("q1\t0\tp1\t1\nq1\t0\tp7\t1\nq2\t0\tp2\t1\nq3\t0\tp3\t1\n"
                                          "q4\t0\tp4\t1\nq6\t0\tp6\t1\n")
    (root / "queries.dev.tsv").write_text("d1\tvaccine safety\nd2\tneutron star\nd3\tsore throat\n")
    (root / "qrels.dev.tsv").write_text("d1\t0\tp9\t1\nd2\t0\tp8\t1\n")
    domains = root / "domains.tsv"
    domains.write_text("q1\thealth\nq2\tscience\nq3\thealth\nq4\ttech\nq5\thealth\n"
                       "d1\thealth\nd2\tscience\nd3\thealth\n")
    return domains


def test_msmarco_subsets_keep_the_judged_queries_of_each_domain(tmp_path, capsys):
    domains = _msmarco(tmp_path / "msmarco")
    out = tmp_path / "beir"
    prepare.main(["msmarco_subsets", f"--msmarco_dir={tmp_path / 'msmarco'}", f"--domains={domains}",
                  f"--out={out}"])
    assert json.loads(capsys.readouterr().out) == {
        "command": "msmarco_subsets", "msmarco_health": {"train": 2, "test": 1},
        "msmarco_science": {"train": 1, "test": 1}, "msmarco_tech": {"train": 1, "test": 0}}
    # What the classic_msmarco_<domain> presets read (format "beir", train split "train", eval split "test").
    train = data.read_beir(str(out), "msmarco_health", "train")
    assert [(r["id"], r["question"], r["qrels"]) for r in train] == [
        ("q1", "flu symptoms", {"p1": 1, "p7": 1}), ("q3", "cold remedy", {"p3": 1})]
    test = data.read_beir(str(out), "msmarco_health", "test")
    assert [(r["id"], r["question"], r["qrels"]) for r in test] == [("d1", "vaccine safety", {"p9": 1})]
    assert [r["id"] for r in data.read_beir(str(out), "msmarco_science", "test")] == ["d2"]
    assert (out / "msmarco_tech" / "qrels" / "test.tsv").read_text() == "query-id\tcorpus-id\tscore\n"


def test_msmarco_subsets_refuse_a_query_in_two_domains(tmp_path):
    domains = tmp_path / "domains.tsv"
    domains.write_text("q1\thealth\nq1\ttech\n")
    with pytest.raises(DataFormatError, match=r"domains.tsv:2.*'health' and 'tech'"):
        prepare.read_domains(domains)
    domains.write_text("q1 health\n")
    with pytest.raises(DataFormatError, match=r"domains.tsv:1.*2 tab-separated fields, got 1"):
        prepare.read_domains(domains)
