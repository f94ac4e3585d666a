"""Watching a run: the progress line (in place on a terminal, plain lines elsewhere), the loggers a config
picks (verl's `trainer.logger=[console,wandb]` spelling kept) and W&B in offline mode."""
import io
import sys

import pytest

from searchrl.metric_writer import MetricWriter, read_metrics
from searchrl.progress import Progress, duration, progress_line
from searchrl.rl.config import TrainConfig
from searchrl.rl.trainer import throughput

METRICS = {"reward/mean": 0.25, **throughput(4.0, 32, 20.0)}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_step_line_shows_reward_throughput_step_time_and_eta():
    line = progress_line(3, 40, METRICS, eta_s=185)
    assert line == "step 3/40 | reward 0.250 | 160 tok/s | 8.00 ep/s | step 4.0s | ETA 3m05s"
    assert [duration(s) for s in (9.4, 65, 7260)] == ["9s", "1m05s", "2h01m"]


def test_off_a_terminal_progress_prints_plain_lines_every_n_seconds():
    now = [0.0]
    out = io.StringIO()
    progress = Progress(total=5, initial=0, every_s=30, stream=out, clock=lambda: now[0])
    for step, at in enumerate((4, 8, 40, 44, 48), start=1):
        now[0] = at
        progress.update(step, METRICS)
    progress.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # the first step, the first past 30 s after it, and the last
    assert [line.split(" | ")[0] for line in lines] == ["train step 1/5", "train step 3/5", "train step 5/5"]
    assert lines[1].endswith("ETA 27s")  # 40 s for 3 steps, 2 left
    assert lines[2].endswith("ETA 0s")


def test_on_a_terminal_progress_rewrites_one_line():
    out = Terminal()
    progress = Progress(total=2, initial=0, every_s=30, stream=out)
    progress.update(1, METRICS)
    progress.update(2, METRICS)
    progress.close()
    assert out.getvalue().count("\r") == 2 and out.getvalue().endswith("\n")
    assert out.getvalue().count("\n") == 1


@pytest.mark.parametrize("spelling", ["console,wandb", "[console,wandb]", "[console, 'wandb']"])
def test_loggers_take_verl_spelling(spelling):
    assert TrainConfig(logger=spelling).loggers == ("console", "wandb")


def test_an_unknown_logger_is_named():
    with pytest.raises(ValueError, match=r"train.logger: unknown logger\(s\) \['mlflow'\]"):
        TrainConfig(logger="console,mlflow")


def test_without_tensorboard_no_event_files(tmp_path):
    writer = MetricWriter(str(tmp_path), enabled=True, loggers=())
    writer.write(1, {"x": 1.0})
    writer.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "x": 1.0}]
    assert not (tmp_path / "tensorboard").exists()


def test_wandb_missing_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(RuntimeError, match="names wandb, which is not installed"):
        MetricWriter(str(tmp_path), enabled=True, loggers=("wandb",))


def test_wandb_offline_run_holds_the_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    writer = MetricWriter(str(tmp_path / "run"), enabled=True, loggers=("tensorboard", "wandb"),
                          project="searchrl-test", config={"seed": 3})
    run = writer._sinks[-1].run
    for step in (1, 2):
        writer.write(step, {"reward/mean": 0.5 * step})
    assert (run.name, run.project, run.config["seed"]) == ("run", "searchrl-test", 3)
    writer.close()
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*/*.wandb"))
    assert len(runs) == 1 and b"reward/mean" in runs[0].read_bytes()  # for `wandb sync`
    assert (tmp_path / "run" / "tensorboard").is_dir()


def test_curves_plots_the_named_metrics_of_a_run(tmp_path):
    from searchrl import curves

    writer = MetricWriter(str(tmp_path), enabled=True, loggers=())
    for step in (1, 2):
        writer.write(step, {"reward/mean": step / 2, "perf/step_seconds": float("nan") if step == 2 else 3.0})
    writer.write(2, {"eval/em": 0.5, "eval/f1": 0.6})
    writer.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert curves.series(rows, ["reward/mean", "eval/*", "perf/step_seconds", "absent"]) == {
        "reward/mean": ([1, 2], [0.5, 1.0]), "eval/em": ([2], [0.5]), "eval/f1": ([2], [0.6]),
        "perf/step_seconds": ([1], [3.0])}  # NaN left out
    curves.main([str(tmp_path), "--out", str(tmp_path / "c.png")])
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        curves.main([str(tmp_path / "none"), "--out", str(tmp_path / "d.png")])
