"""The docs against what they describe: the running.md model example runs, the README lists every doc, the
notebooks name commands the pinned packages ship, and every AOT figure or claim in prose agrees with the
generated results (docs/results/aot_setups.json) and the tables made from them."""
import json
import re
import shutil
import sys
from pathlib import Path

import jax
import pytest

from searchrl import models
from searchrl.benchmarks import aot_setups

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def reports() -> list[dict]:
    """Every run's report (a run compiled as another has that one's)."""
    results = json.loads(aot_setups.RESULTS.read_text())
    by_key = {(r["config"], r["topology"]): r["report"] for r in results["runs"] if "report" in r}
    return [dict(by_key[r.get("same_as", r["config"]), r["topology"]], config=r["config"])
            for r in results["runs"]]


def on_device(report: dict) -> dict:
    return aot_setups.on_device_gib({row["program"]: row for row in report["programs"]})


def prose(path: Path) -> str:
    """The doc's text with its line breaks as spaces (sentences wrap)."""
    return " ".join(path.read_text().split())


def test_the_model_example_in_running_md_runs(tmp_path):
    block = re.search(r"```python\n(.*?models\.apply.*?)```", (DOCS / "running.md").read_text(), re.S).group(1)
    cfg = models.get_preset("tiny")
    models.save_hf(cfg, models.init_params(cfg, jax.random.key(0)), tmp_path / "model")
    code = block.replace("/path/to/Qwen2.5-3B", str(tmp_path / "model")).replace(
        "/path/to/export", str(tmp_path / "export"))
    scope: dict = {}
    exec(compile(code, "docs/running.md", "exec"), scope)
    assert scope["logits"].shape == (*scope["tokens"].shape, cfg.vocab_size)
    assert (tmp_path / "export" / "model.safetensors").is_file()


def test_the_readme_lists_every_doc():
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in sorted(DOCS.glob("*.md")) if f"](docs/{p.name})" not in readme] == []


def test_notebooks_name_the_hub_cli_the_pinned_hub_ships():
    text = (ROOT / "notebooks" / "05_bring_your_model.ipynb").read_text()
    assert "huggingface-cli" not in text and "`hf download " in text
    assert shutil.which("hf", path=str(Path(sys.executable).parent))


def test_the_hardware_table_is_generated_from_the_results():
    results = json.loads(aot_setups.RESULTS.read_text())
    block = re.search(r"<!-- generated: hardware -->\n(.*?)\n<!-- end generated -->",
                      (DOCS / "running.md").read_text(), re.S).group(1)
    assert block == aot_setups.hardware_table(results)


def test_running_md_fits_every_run_in_jax_default_fraction():
    assert "every hardware setup fits the papers' runs in JAX's 0.75" in prose(DOCS / "running.md")
    for report in reports():
        assert not report["memory_fraction"], report["config"]
        budget = aot_setups.budget_gib(report)
        assert all(g is not None and g <= budget for g in on_device(report).values()), report["config"]


def test_benchmarks_md_gpu_budget_and_decode_rows():
    text = prose(DOCS / "benchmarks.md")
    assert "GPU: 60 GiB of 80 by default" in text
    assert "Every run decodes all the episodes of its step at once (decode rows = episodes" in text
    for report in reports():
        if not report["device_kind"].startswith("TPU"):
            assert aot_setups.budget_gib(report) == pytest.approx(60.0, abs=0.3), report["config"]
        assert report["rollout"]["decode_rows"] == report["rollout"]["episodes"], report["config"]


@pytest.mark.parametrize("sentence, setup, model", [
    ("DeepRetrieval's 3B step on 2 A100s under the 60 GiB budget", "a100x2", "qwen2p5_3b"),
    ("The Coder-7B SQL step on 4 A100s keeps both models' Adam first moments in bfloat16", "a100x4",
     "qwen2p5_7b")])
def test_benchmarks_md_small_gpu_setups_fit(sentence, setup, model):
    assert sentence in prose(DOCS / "benchmarks.md")
    runs = [r for r in reports() if r["config"].endswith(f",{setup}") and r["model"] == model]
    assert runs
    for report in runs:
        step = [g for name, g in on_device(report).items() if name in aot_setups.STEP_PROGRAMS]
        assert step and all(g is not None and g <= 60.0 for g in step), report["config"]
