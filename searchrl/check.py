"""Everything a config needs on this machine, listed at once, before anything downloads or starts:

    searchrl check CONFIG [--config.x.y=value ...]        (or python -m searchrl.check)

CONFIG is configs/FILE.py:PRESET[,SETUP]. One entry per input: the model and its tokenizer, each dataset
split the run trains and evaluates on, the index, the retrieval server, this machine's devices against the
config's mesh, the memory a device needs (the ahead-of-time figures of docs/results/aot_setups.json) and the
free disk where the missing inputs go. Each has its state (ok; missing; no: there but not enough; -: nothing
to check), its size, and, for what is missing, the command that fetches or builds it. Exits 1 when anything is
missing or not enough (the launch scripts run it first), 0 when the run has all it needs.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from absl import flags
from ml_collections import config_flags

from searchrl import cli, experiment, run_config, task
from searchrl.run_config import RunConfig

AOT_RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "aot_setups.json"
HEALTH_TIMEOUT_S = 3.0  # a retrieval server's /health answers at once, or is not up
OK, MISSING, SHORT, NOTHING = "ok", "missing", "no", "-"
PROBLEMS = (MISSING, SHORT)
GIB = 2**30
WORLD = "build it with: searchrl world --config CONFIG (this check's CONFIG)"  # a miniature's missing input


@dataclasses.dataclass(frozen=True)
class Item:
    """One input of a run: what it is, its state (OK, MISSING, SHORT, NOTHING), where it is (a path, a URL,
    figures), its size and the command that makes it."""

    what: str
    state: str
    where: str
    size: str = ""
    remedy: str = ""
    path: str = ""  # where a missing input goes (for the disk space it needs)
    need_bytes: int = 0  # what it will take there, where that is known before fetching it


def _bytes(path: Path) -> int:
    """The size of a file, or of every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def one_line(error: BaseException) -> str:
    """An error's message on one line."""
    return " ".join(str(error.args[0] if error.args else error).split())


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"


def model_items(config: RunConfig) -> list[Item]:
    """The policy's weights and the tokenizer."""
    from searchrl import models  # local: JAX

    source = config.model
    if not source.path:
        items = [Item("model", NOTHING, f"preset {source.preset}, initialised at random: nothing to fetch")]
    elif (Path(source.path) / "config.json").is_file():
        items = [Item("model", OK, source.path, _size(_bytes(Path(source.path))))]
    else:  # the download: the preset's parameters at 2 bytes (the hub's bfloat16 safetensors)
        table = models.param_table(models.config_from_source(dataclasses.replace(source, path="")))
        count = sum(math.prod(spec.shape) for spec in table.values())
        hub = cli.hub_name(source.path)
        size = f"~{2 * count / GIB:.1f} GiB ({count / 1e9:.2f}B parameters{f', {hub}' if hub else ''})"
        items = [Item("model", MISSING, source.path, size, cli.fetch_model(source.path), source.path,
                      2 * count)]
    tokenizer = config.tokenizer or source.path
    if not tokenizer:
        return [*items, Item("tokenizer", MISSING, "none",
                             remedy="set config.tokenizer to a tokenizer folder")]
    from searchrl.text.tokenizer import TOKENIZER_FILES  # local: transformers

    there = any((Path(tokenizer) / name).is_file() for name in TOKENIZER_FILES)
    if tokenizer == source.path:
        where, remedy = f"{tokenizer} (the model's folder)", "comes with the model"
    else:
        where, remedy = tokenizer, WORLD if experiment.miniature(config) else cli.fetch_model(tokenizer)
    return [*items, Item("tokenizer", OK if there else MISSING, where, remedy="" if there else remedy)]


def data_items(config: RunConfig) -> list[Item]:
    """Each dataset split the run trains and evaluates on."""
    from searchrl.data import datasets

    data = config.data
    splits = [(name.strip(), split)
              for names, split in ((data.train, data.train_split), (data.eval, data.eval_split))
              for name in names.split(",") if name.strip()]
    items = []
    for name, split in dict.fromkeys(splits):
        what = f"dataset {name} ({split})"
        folder = Path(data.dir, name)
        try:
            if data.format == "qa":
                found = Path(datasets.dataset_path(data.dir, name, split))
            elif folder.is_dir():
                found = folder
            else:  # the format's reader names the file it misses and how to make it
                datasets.FORMATS.get(data.format).read(data.dir, name, split)
                found = folder
            items.append(Item(what, OK, str(found), _size(_bytes(found))))
        except cli.MissingInput as e:
            remedy = WORLD if experiment.miniature(config) else e.remedy
            items.append(Item(what, MISSING, e.path, remedy=remedy, path=data.dir))
        except FileNotFoundError as e:  # a reader that names what it misses, not how to make it
            remedy = WORLD if experiment.miniature(config) else one_line(e)
            items.append(Item(what, MISSING, str(folder), remedy=remedy, path=data.dir))
    return items


def retrieval_items(config: RunConfig) -> list[Item]:
    """The index the run searches, and the retrieval server it asks (or none)."""
    from searchrl.retrieval import index_kind

    retrieval = config.retrieval
    if retrieval.kind == "remote":
        return [_server(url.strip()) for url in retrieval.url.split(",")]
    if retrieval.kind != "local":
        return [Item("retriever", NOTHING, f"the task's own {retrieval.kind!r} (config.retrieval.kind)")]
    server = Item("retrieval server", NOTHING, "none: the index is searched in-process "
                  "(config.retrieval.kind=local; launch/gpu_host.sh serves it instead)")
    if not retrieval.index_dir:
        return [Item("index", MISSING, "none", remedy="set config.retrieval.index_dir"), server]
    path = Path(retrieval.index_dir)
    if path.is_dir():
        return [Item("index", OK, f"{path} ({index_kind(path)})", _size(_bytes(path))), server]
    remedy = WORLD if experiment.miniature(config) else cli.make_index(path)
    return [Item("index", MISSING, str(path), remedy=remedy, path=str(path)), server]


def _server(url: str) -> Item:
    """Whether a retrieval server answers at `url` (its /health, within HEALTH_TIMEOUT_S)."""
    health = url.rsplit("/", 1)[0] + "/health"
    try:
        with urllib.request.urlopen(health, timeout=HEALTH_TIMEOUT_S) as response:
            answer = json.load(response)
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return Item("retrieval server", MISSING, f"{url}: no answer ({reason})",
                    remedy="start it with: bash launch/retrieval_server.sh INDEX_DIR PORT")
    return Item("retrieval server", OK,
                f"{url}: serves {answer.get('kind', '?')} index {answer.get('index', '?')}")


def device_items(config: RunConfig, label: str, hosts: int = 1) -> list[Item]:
    """The run's devices (`hosts` hosts, each with this machine's) against the config's mesh, and the memory
    a device needs (AOT figures)."""
    import jax

    from searchrl import models

    devices = jax.devices()
    count = hosts * len(devices)
    here = ((f"{hosts} hosts x " if hosts > 1 else "")
            + f"{len(devices)} {jax.default_backend()} device(s) ({devices[0].device_kind})")
    mesh = config.mesh
    try:
        sizes = models.mesh_sizes(mesh.data, mesh.fsdp, mesh.tensor, count)
        sizes = dict(zip(("data", "fsdp", "tensor"), sizes))
        item = Item("devices vs mesh", OK, f"{here}: mesh {sizes}")
    except ValueError as e:
        item = Item("devices vs mesh", SHORT, f"{here}: {e}",
                    remedy="run it where the mesh divides the devices, or set --config.mesh.data/fsdp/tensor")
    return [item, memory_item(config, label, devices[0].device_kind, count)]


def aot_runs(label: str) -> list[tuple[str, str, dict]]:
    """(config, programs' signature, report) of each run of the AOT results that `label`
    ("FILE.py:PRESET[,SETUP]") names: that run, or the preset on each setup it was compiled for."""
    runs = json.loads(AOT_RESULTS.read_text())["runs"]
    reports = {run["config"]: run.get("report") for run in runs}
    return [(run["config"], run["signature"], reports[run.get("same_as", run["config"])]) for run in runs
            if run["config"] == label or run["config"].startswith(label + ",")]


def memory_item(config: RunConfig, label: str, device_kind: str, count: int) -> Item:
    """The memory a device needs for the config's programs on each setup the AOT results hold for it."""
    if not AOT_RESULTS.is_file():
        return Item("memory per device", NOTHING, f"no AOT figures here ({AOT_RESULTS} is in the repository)")
    runs = aot_runs(label)
    if not runs:
        return Item("memory per device", NOTHING, f"no AOT figures for {label} (python -m "
                    f"searchrl.benchmarks.aot --config configs/{label},SETUP compiles them)")
    from searchrl.benchmarks.aot_setups import budget_gib

    parts, state = [], NOTHING
    for name, _, report in runs:
        programs = report["programs"]
        peak = max(programs, key=lambda p: p["total_gib"])
        budget = budget_gib(report)
        fits = all(p["fits"] for p in programs)
        parts.append(f"{name.rpartition(',')[2]} ({report['devices']} x {report['device_kind']}): "
                     f"{peak['total_gib']:.1f} GiB ({peak['program']}) of {budget:.1f}")
        if (report["device_kind"], report["devices"]) == (device_kind, count):
            state = OK if fits else SHORT  # this machine is the one compiled for
    if [name for name, _, _ in runs] == [label]:  # one setup: are they the figures of this config's programs?
        from searchrl.benchmarks import aot

        if aot.program_signature(config) != runs[0][1]:
            parts.append("figures of the preset as published: this config's overrides change its programs")
    return Item("memory per device", state, "; ".join(parts))


def disk_item(items: Sequence[Item], workdir: str) -> Item:
    """The free space of each filesystem the missing inputs (and the run's workdir) go to, against what they
    will take where that is known."""
    places: dict[int, tuple[Path, int]] = {}
    going = [(item.path, item.need_bytes) for item in items if item.state == MISSING and item.path]
    for path, need in [*going, (workdir, 0)]:
        existing = Path(os.path.abspath(path))
        while not existing.exists():
            existing = existing.parent
        device = existing.stat().st_dev
        mount, before = places.get(device, (existing, 0))
        places[device] = (mount, before + need)
    parts, state = [], OK
    for mount, need in places.values():
        free = shutil.disk_usage(mount).free
        parts.append(f"{_size(free)} free at {mount}"
                     + (f", {_size(need)} needed (known sizes)" if need else ""))
        state = SHORT if free < need else state
    return Item("disk", state, "; ".join(parts))


def check(config: RunConfig, label: str, hosts: int = 1) -> list[Item]:
    """Every input of a run of `config` (`label`: its "FILE.py:PRESET[,SETUP]") on `hosts` hosts like this
    one, in the order it needs them."""
    items = [*model_items(config), *data_items(config), *retrieval_items(config),
             *device_items(config, label, hosts)]
    return [*items, disk_item(items, config.workdir)]


def render(items: Sequence[Item]) -> str:
    """One line per item (state, what, where, size), and under a missing one the command that makes it."""
    width = max(len(item.what) for item in items)
    lines = []
    for item in items:
        size = f"  [{item.size}]" if item.size else ""
        lines.append(f"{item.state:<7}  {item.what:<{width}}  {item.where}{size}")
        if item.remedy:
            lines.append(f"{'':<7}  {'':<{width}}  {item.remedy}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    config_flag = config_flags.DEFINE_config_file(
        "config", None, "configs/FILE.py:PRESET[,SETUP] (or the first argument)", flag_values=values)
    hosts = flags.DEFINE_integer("hosts", 1, "the hosts the run spans, each with this machine's devices (the "
                                 "cluster launchers' node count)", lower_bound=1, flag_values=values)
    words = list(sys.argv[1:] if argv is None else argv)
    if words and not words[0].startswith("-"):
        words = [f"--config={words[0]}", *words[1:]]  # CONFIG as the first argument
    try:  # config_flags loads the file and applies the overrides as it parses
        cli.parse(values, words, __doc__)
    except (AttributeError, KeyError, ValueError, TypeError, OSError) as e:
        cli.fail(f"--config: {one_line(e)}")
    if config_flag.value is None:
        cli.fail("no config: searchrl check configs/FILE.py:PRESET[,SETUP]")
    filename = config_flags.get_config_filename(values["config"])
    try:
        config = run_config.parse(config_flag.value)
    except (ValueError, OSError) as e:
        cli.fail(f"{filename}: {one_line(e)}")
    task.load_all()  # the data formats the tasks register
    label = f"{os.path.basename(filename.partition(':')[0])}:{filename.partition(':')[2]}"
    items = check(config, label, hosts.value)
    print(f"searchrl check {filename} ({config.task}, workdir {config.workdir})")
    print(render(items))
    problems = [item.what for item in items if item.state in PROBLEMS]
    if problems:
        cli.fail(f"{len(problems)} of {len(items)} not ready ({', '.join(problems)}): fetch or build each "
                 "with the command under it (a hub download's sizes: the same command with --dry_run)")
    print(f"all {len(items)} ready")


if __name__ == "__main__":
    cli.run(main)
