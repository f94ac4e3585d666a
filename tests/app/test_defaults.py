"""One source per default (issue #34): no library function restates a default that a config dataclass holds.

The config dataclasses are the package's dataclasses named *Config, *Limits, *Params or *Source; a function or
method of the package whose parameter is named like one of their fields (with a default) may not give that
parameter a default of its own: the value comes from the config that feeds it, as a required argument or the
typed config group itself. `None` ("not given") never restates a value and is allowed; so is a default that is
a config dataclass built with its own defaults (`limits: Limits = Limits()`). The names that mean something
else where they appear, and the restatements not converted yet, are listed below, each with its reason.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from typing import Callable, Iterator

import searchrl

CONFIG_SUFFIXES = ("Config", "Limits", "Params", "Source")

# (function's qualified name, parameter): why its default is not a restatement.
SAME_NAME_OTHER_MEANING = {
    ("searchrl.benchmarks.interleave.compare", "rounds"): "benchmark rounds, not MutationConfig.rounds",
    ("searchrl.benchmarks.learn.synthetic_batch", "seed"): "a benchmark's data seed, not SFTConfig.seed",
    ("searchrl.benchmarks.retrieval.random_encoder", "seed"): "a benchmark's encoder seed",
    ("searchrl.benchmarks.lengths.search_r1_lengths", "seed"): "a benchmark's length-mix seed",
    ("searchrl.benchmarks.lengths.search_r1_episodes", "seed"): "a benchmark's length-mix seed",
    ("searchrl.benchmarks.lengths.packing_of", "seed"): "a benchmark's length-mix seed",
    ("searchrl.benchmarks.padding.run", "seed"): "a benchmark's length-mix seed",
    ("searchrl.benchmarks.attention.packed_ids", "seed"): "a benchmark's length-mix seed",
    ("searchrl.benchmarks.retrieval.synthetic_corpus", "vocab_size"): "a benchmark corpus's, not a demo's",
    ("searchrl.tasks.autosearch.baselines.evaluate_baselines", "options"): "the baselines' Options() with its "
                                                                           "defaults, not RetrievalConfig's",
    ("searchrl.retrieval.dense.DenseRetriever.build", "seed"): "the index builder's seed, not SFTConfig.seed",
    ("searchrl.retrieval.dense.DenseRetriever.build", "batch_size"): "encoder batch, not a run's batch",
    ("searchrl.retrieval.encoder.DenseEncoder.__init__", "batch_size"): "encoder batch, not a run's batch",
    ("searchrl.retrieval.encoder.DenseEncoder.__init__", "path"): "the encoder's directory, not the policy's",
    ("searchrl.demo.publish.intervals", "path"): "keys into a results tree, not ModelSource.path",
    ("searchrl.retrieval.encoder.DenseEncoder.from_pretrained", "batch_size"): "encoder batch",
    ("searchrl.retrieval.rerank.CrossEncoderReranker.__init__", "batch_size"): "reranker batch",
    ("searchrl.retrieval.rerank.CrossEncoderReranker.from_pretrained", "batch_size"): "reranker batch",
    ("searchrl.eval.harness.evaluate_checkpoint", "batch_size"): "0: the run config's train.batch_size",
    ("searchrl.eval.harness.evaluate_checkpoint", "budgets"): "(): no search-budget sweep, not the demo's",
    ("searchrl.tasks.autosearch.baselines.evaluate_baselines_checkpoint", "batch_size"): "0: the run's",
    ("searchrl.tasks.autosearch.pilot.run_pilot", "batch_size"): "0: the run config's train.batch_size",
    ("searchrl.demo.synthetic.generate_world", "questions_per_entity"): "the generic world's, not a demo's",
    ("searchrl.demo.synthetic.generate_world", "hop_fractions"): "the generic world's, not a demo's",
    ("searchrl.demo.synthetic.generate_world", "test_fraction"): "the generic world's, not a demo's",
    ("searchrl.demo.synthetic.generate_world", "pair_fraction"): "the generic world's, not a demo's",
    ("searchrl.tasks.deepretrieval.world.generate_world", "test_fraction"): "not RPLDemoConfig's",
    ("searchrl.tasks.rpl.globalqa.generate_tasks", "max_answer"): "the task generator's, not the demo's",
    ("searchrl.tasks.rpl.sdk.RetrievalSDK.sparse_retrieval", "top_k"): "the program SDK's documented default",
    ("searchrl.tasks.rpl.sdk.RetrievalSDK.dense_retrieval", "top_k"): "the program SDK's documented default",
    ("searchrl.tasks.deepretrieval.env.QueryRewriteEnv.target_response", "reasoning"): "a text, not the flag",
    ("searchrl.text.chat.messages", "assistant_prefix"): "'' is no prefix: a chat helper's neutral value",
    ("searchrl.tasks.deepretrieval.engines.PubMed.__init__", "page_size"): "ids a search API page, not KV slots",
    ("searchrl.tasks.deepretrieval.engines.ClinicalTrials.__init__", "page_size"): "studies a search API page",
}
ALLOWED = SAME_NAME_OTHER_MEANING


def _modules() -> list:
    """Every module of the package but the `__main__` entry points (they define absl flags on import)."""
    names = [m.name for m in pkgutil.walk_packages(searchrl.__path__, "searchrl.")
             if not m.name.endswith("__main__")]
    return [importlib.import_module(name) for name in names]


def _defined_in(module) -> Iterator[tuple[str, object]]:
    return ((name, obj) for name, obj in vars(module).items() if getattr(obj, "__module__", None) == module.__name__)


def config_defaults(modules: list) -> dict[str, list[tuple[str, object]]]:
    """Field name -> [(config class, its default)] over the config dataclasses' fields that have a default."""
    fields: dict[str, list[tuple[str, object]]] = {}
    for module in modules:
        for name, cls in _defined_in(module):
            if inspect.isclass(cls) and dataclasses.is_dataclass(cls) and name.endswith(CONFIG_SUFFIXES):
                for field in dataclasses.fields(cls):
                    if field.default is not dataclasses.MISSING:
                        fields.setdefault(field.name, []).append((f"{module.__name__}.{name}", field.default))
                    elif field.default_factory is not dataclasses.MISSING:
                        fields.setdefault(field.name, []).append((f"{module.__name__}.{name}",
                                                                  field.default_factory()))
    return fields


def functions(modules: list, *, fields: bool = False) -> Iterator[tuple[str, Callable]]:
    """(qualified name, function) of every function and method the package defines; a dataclass's generated
    __init__ is its fields, not a signature of its own (with `fields`, its fields are yielded too, as the
    dataclass's signature)."""
    for module in modules:
        for name, obj in _defined_in(module):
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj
            elif inspect.isclass(obj):
                if fields and dataclasses.is_dataclass(obj):
                    yield f"{module.__name__}.{obj.__qualname__}", obj
                for attr, member in vars(obj).items():
                    fn = getattr(member, "__func__", member)
                    generated = dataclasses.is_dataclass(obj) and attr == "__init__"
                    if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not generated:
                        yield f"{module.__name__}.{obj.__qualname__}.{attr}", fn


def _neutral(default: object) -> bool:
    """None, or a config dataclass built with its own defaults: neither restates a value."""
    cls = type(default)
    return default is None or (dataclasses.is_dataclass(cls) and cls.__name__.endswith(CONFIG_SUFFIXES)
                               and _defaults_only(cls) and cls() == default)


def _defaults_only(cls) -> bool:
    return all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
               for f in dataclasses.fields(cls))


def restated(fns: Iterator[tuple[str, Callable]], fields: dict) -> list[str]:
    """'function(param=default): config fields' for each parameter that restates a config field's default."""
    found = []
    for qualname, fn in fns:
        for param in inspect.signature(fn).parameters.values():
            if (param.default is not param.empty and param.name in fields and not _neutral(param.default)
                    and (qualname, param.name) not in ALLOWED):
                holders = ", ".join(f"{cls}.{param.name}={value!r}" for cls, value in fields[param.name])
                found.append(f"{qualname}({param.name}={param.default!r}): {holders}")
    return found


def rule_defaults(fns: Iterator[tuple[str, Callable]], tables: dict[str, object]) -> list[str]:
    """'function(param=name)' for each parameter whose default is one of the named sharding rule tables."""
    return [f"{qualname}({param.name}={name})" for qualname, fn in fns
            for param in inspect.signature(fn).parameters.values()
            for name, table in tables.items() if param.default is table]


def test_no_function_restates_a_config_default():
    modules = _modules()
    offenders = restated(functions(modules), config_defaults(modules))
    assert not offenders, ("parameters that restate a config field's default (make them required, or pass "
                           "the config group):\n  " + "\n  ".join(offenders))


def test_the_exceptions_are_still_there():
    """An entry of ALLOWED whose parameter lost its default (or vanished) is stale: remove it."""
    modules = _modules()
    fields = config_defaults(modules)
    defaults = {(name, p.name) for name, fn in functions(modules)
                for p in inspect.signature(fn).parameters.values()
                if p.default is not p.empty and p.name in fields}
    assert not sorted(set(ALLOWED) - defaults)


def test_the_check_catches_a_restated_default():
    """The issue's case: value_loss(clip_range=0.2) against RLConfig.value_clip=0.5, named as the field."""
    from searchrl.rl.config import RLConfig

    def value_loss(values, *, value_clip=0.2, loss_agg_mode="token-mean"):
        del values, value_clip, loss_agg_mode

    def value_loss_fixed(values, *, value_clip, loss_agg_mode):
        del values, value_clip, loss_agg_mode

    fields = config_defaults([importlib.import_module(RLConfig.__module__)])
    found = restated(iter([("value_loss", value_loss), ("value_loss_fixed", value_loss_fixed)]), fields)
    assert found == ["value_loss(value_clip=0.2): searchrl.rl.config.RLConfig.value_clip=0.5",
                     "value_loss(loss_agg_mode='token-mean'): "
                     "searchrl.rl.config.RLConfig.loss_agg_mode='token-mean'"]


def test_no_signature_defaults_to_named_sharding_rules():
    from searchrl.models import sharding
    offenders = rule_defaults(functions(_modules(), fields=True), sharding.RULES)
    assert not offenders, ("parameters that default to a named rule table (make them required: the rules "
                           "come from MeshConfig.train_rules / sample_rules):\n  " + "\n  ".join(offenders))


def test_the_rules_check_catches_a_defaulted_table():
    """A function and a dataclass field that default to the sampling rules; their fixed forms pass."""
    from searchrl.models import sharding

    def extend(state, rules=sharding.SAMPLE_RULES):
        del state, rules

    def extend_fixed(state, rules):
        del state, rules

    @dataclasses.dataclass(frozen=True)
    class Spec:
        steps: int
        rules: sharding.ShardingRules = sharding.SAMPLE_RULES

    @dataclasses.dataclass(frozen=True)
    class SpecFixed:
        steps: int
        rules: sharding.ShardingRules

    found = rule_defaults(iter([("extend", extend), ("extend_fixed", extend_fixed), ("Spec", Spec),
                                ("SpecFixed", SpecFixed)]), sharding.RULES)
    assert found == ["extend(rules=sample)", "Spec(rules=sample)"]
