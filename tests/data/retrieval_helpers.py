"""Tiny on-disk datasets of DeepRetrieval's task families: literature JSONL, BEIR, Spider and BIRD."""
import json
import sqlite3

PICO = {"P": "Adults with asthma", "I": "Inhaled corticosteroids", "C": "", "O": "Exacerbations"}
SPIDER_SCHEMA_SQL = """PRAGMA foreign_keys = ON;

CREATE TABLE "singer" (
"Singer_ID" int,
"Name" text,
"Insert_Date" text,
PRIMARY KEY ("Singer_ID")
);

INSERT INTO "singer" VALUES (1,"Joe Sharp","2001");
insert into singer values (2, 'Timbaland', '2002');

"""
CONCERT_SCHEMA = 'PRAGMA foreign_keys = ON;\n\nCREATE TABLE "singer" (\n"Singer_ID" int,\n"Name" text,\n' \
                 'PRIMARY KEY ("Singer_ID")\n);'  # every line containing "insert" (any case) is dropped
PETS_TABLES = ("CREATE TABLE pet (id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT)",
               "CREATE TABLE owner (id INTEGER PRIMARY KEY, name TEXT, pet_id INTEGER)")
SHOP_TABLES = ("CREATE TABLE `product` (id INTEGER PRIMARY KEY AUTOINCREMENT, cost REAL)",
               'CREATE TABLE "order" (id INTEGER, product_id INTEGER REFERENCES product(id))')


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def write_json(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1), encoding="utf-8")
    return path


def make_db(path, tables, rows_sql=(), wal=False):
    """A SQLite database with these CREATE TABLE statements (plus an index and a view, not tables)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    for statement in (*tables, *rows_sql):
        conn.execute(statement)
    conn.execute("CREATE VIEW everything AS SELECT 1 AS one")
    conn.commit()
    conn.close()
    return path


def literature_rows():
    return [{"id": "r1", "pico": PICO, "relevant_ids": ["123", 456], "max_date": "2019/05/01"},
            {"id": 7, "question": " statins after stroke ", "relevant_ids": ["NCT00000001"]}]


def literature_dir(root, name="pubmed", split="test"):
    write_jsonl(root / name / f"{split}.jsonl", literature_rows())
    return root / name


def beir_dir(root, name="scifact"):
    write_jsonl(root / name / "corpus.jsonl", [{"_id": "d1", "title": "", "text": "Aspirin."}])
    write_jsonl(root / name / "queries.jsonl", [{"_id": "q1", "text": "does aspirin help"},
                                                 {"_id": "q2", "text": "unjudged"}])
    (root / name / "qrels").mkdir()
    (root / name / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\n")
    return root / name


def spider_questions():
    return [{"db_id": "concert", "question": "How many singers are there? ",
             "query": "SELECT count(*) FROM singer", "query_toks": ["SELECT"], "sql": {}},
            {"db_id": "pets", "question": "List every pet kind.", "query": "SELECT kind FROM pet"},
            {"db_id": "concert", "question": "Names of singers?", "query": "SELECT Name FROM singer"}]


def spider_dir(root, name="spider", split="dev"):
    """concert has a schema.sql; pets (a WAL-mode database with AUTOINCREMENT) has none."""
    spider = root / name
    write_json(spider / f"{split}.json", spider_questions())
    write_json(spider / "tables.json", [{"db_id": "concert"}])
    make_db(spider / "database" / "concert" / "concert.sqlite",
            ['CREATE TABLE "singer" ("Singer_ID" int, "Name" text, "Insert_Date" text, '
             'PRIMARY KEY ("Singer_ID"))'],
            ["INSERT INTO singer VALUES (1, 'Joe Sharp', '2001')"])
    (spider / "database" / "concert" / "schema.sql").write_text(SPIDER_SCHEMA_SQL, encoding="utf-8")
    make_db(spider / "database" / "pets" / "pets.sqlite", PETS_TABLES,
            ["CREATE INDEX pet_kind ON pet(kind)", "INSERT INTO pet(kind) VALUES ('cat')"], wal=True)
    return spider


def bird_questions():
    return [{"question_id": 0, "db_id": "shop", "question": "What is the cheapest product?",
             "evidence": "cheapest refers to MIN(cost)",
             "SQL": "SELECT id FROM product ORDER BY cost LIMIT 1", "difficulty": "simple"},
            {"question_id": 1, "db_id": "shop", "question": "How many orders?", "evidence": "",
             "SQL": "SELECT count(*) FROM `order`", "difficulty": "simple"}]


def bird_dir(root, name="bird", split="dev"):
    """BIRD's own layout: <split>.json, <split>_tables.json and <split>_databases/<db_id>/<db_id>.sqlite."""
    bird = root / name
    write_json(bird / f"{split}.json", bird_questions())
    write_json(bird / f"{split}_tables.json", [{"db_id": "shop"}])
    make_db(bird / f"{split}_databases" / "shop" / "shop.sqlite", SHOP_TABLES,
            ["INSERT INTO product(cost) VALUES (2.5)"], wal=True)
    return bird


def file_snapshot(root):
    """{relative path: bytes} of every file under root."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
