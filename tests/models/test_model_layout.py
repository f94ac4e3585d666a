"""Parameter tables: each Flax module declares exactly its table's params (paths, shapes, logical axes), for
every decoder preset and both BERT variants, so the table and the modules cannot drift apart."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from searchrl.models import (PRESETS, TRAIN_RULES, AttentionConfig, Bert, BertConfig, Compute, Decoder,
                             ParamSpec, bert, init_params, layout,
                             param_table, unstack_layers)

TRAIN = Compute(TRAIN_RULES, AttentionConfig())  # a default run's training layout and attention


def _declared(module: nn.Module, *inputs, method) -> dict:
    """{path: (shape, logical axes)} of the params `module.init` declares (traced, nothing drawn)."""
    boxed = jax.eval_shape(lambda: module.init(jax.random.key(0), *inputs, method=method))["params"]
    leaves = jax.tree_util.tree_leaves_with_path(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    return {tuple(k.key for k in path): (box.value.shape, tuple(box.names)) for path, box in leaves}


def _tabled(table: layout.Table) -> dict:
    return {path: (spec.shape, spec.axes) for path, spec in table.items()}


def _decoder_inputs() -> tuple:
    one = jnp.zeros((1, 1), jnp.int32)
    return one, one, jnp.ones((1, 1), bool)


@pytest.mark.parametrize("value", [False, True], ids=["policy", "value"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_decoder_declares_its_param_table(preset, value):
    cfg = PRESETS[preset]
    got = _declared(Decoder(cfg, value=value, compute=TRAIN), *_decoder_inputs(),
                    method=Decoder.head)
    assert got == _tabled(param_table(cfg, value=value))


def test_unrolled_decoder_declares_the_unstacked_table():
    """`unrolled=True` declares each layer's slice of the stacked params as `layers_{i}`, which is what
    `unstack_layers` makes of them."""
    cfg = PRESETS["tiny"]
    stacked = _tabled(param_table(cfg))
    want = {path: spec for path, spec in stacked.items() if path[0] != "layers"}
    for i in range(cfg.num_layers):
        want |= {(f"layers_{i}", path[1]): (shape[1:], axes[1:])
                 for path, (shape, axes) in stacked.items() if path[0] == "layers"}
    assert _declared(Decoder(cfg, unrolled=True, compute=TRAIN), *_decoder_inputs(),
                     method=Decoder.head) == want
    unstacked = jax.eval_shape(lambda: unstack_layers(init_params(cfg, jax.random.key(0))))
    leaves = jax.tree_util.tree_leaves_with_path(unstacked)
    assert {tuple(k.key for k in path): x.shape for path, x in leaves} == \
        {path: shape for path, (shape, _) in want.items()}


@pytest.mark.parametrize("classifier", [False, True], ids=["encoder", "cross-encoder"])
def test_bert_declares_its_param_table(classifier):
    cfg = BertConfig(vocab_size=100, hidden_size=32, intermediate_size=37, num_layers=3, num_heads=4,
                     max_position_embeddings=64, num_labels=3)
    ids = jnp.zeros((1, 4), jnp.int32)
    got = _declared(Bert(cfg, classifier=classifier), ids, ids, ids, method=Bert.head)
    assert got == _tabled(bert.param_table(cfg, classifier=classifier))


def test_init_draws_each_param_by_its_spec():
    """Leaf i (sorted-key order) comes from fold_in(key, i) by its own initialiser: a param's values do not
    depend on the params declared after it."""
    table = {("b",): ParamSpec((3,), (None,), layout.zeros), ("a", "w"): ParamSpec((2, 2), (None, None),
                                                                                   layout.normal)}
    params = layout.init(table, jax.random.key(3), jnp.float32)
    assert (params["b"] == 0).all()
    expected = layout.normal(jax.random.fold_in(jax.random.key(3), 0), (2, 2), jnp.float32)
    assert (params["a"]["w"] == expected).all()
    with pytest.raises(ValueError, match="differ in rank"):
        ParamSpec((2, 2), ("embed",), layout.normal)
