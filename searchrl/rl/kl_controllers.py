"""KL-coefficient controllers by name (`config.rl.kl_controller`), after Ziegler et al. 2019 (as verl's
FixedKLController / AdaptiveKLController): an entry of `KL_CONTROLLERS` takes the controller's options
(target, horizon) and gives a pure update of the coefficient's state, `update(state, current_kl, n_steps)`.

Updates are plain arithmetic and array methods on what they are given (JAX arrays in the learn step), so this
module imports no JAX: `RLConfig` checks the name when a config is parsed. `searchrl.rl.kl` starts and runs
them in the jitted train state.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

from searchrl.registry import Registry


class KLState(NamedTuple):
    """The KL coefficient, a float32 scalar (a pytree, so it can sit in a jitted train state)."""

    coef: Any  # a float32 jax.Array


Update = Callable[[KLState, Any, int], KLState]  # (state, current_kl: float32 array, n_steps) -> state
KL_CONTROLLERS: Registry[Callable[[float | None, float | None], Update]] = Registry(
    "KL controller", "config.rl.kl_controller")


@KL_CONTROLLERS.register("fixed")
def fixed(target: float | None = None, horizon: float | None = None) -> Update:
    """A coefficient that never changes (target and horizon are not read)."""
    return lambda state, current_kl, n_steps: state


@KL_CONTROLLERS.register("adaptive")
def adaptive(target: float | None, horizon: float | None) -> Update:
    """error = clip(kl / target - 1, -0.2, 0.2); coef *= 1 + error * n_steps / horizon. `n_steps` is the
    number of sequences the KL was measured on (verl passes the batch size)."""
    if target is None or horizon is None:
        raise ValueError("adaptive KL controller needs both target and horizon")
    if target <= 0:
        raise ValueError(f"adaptive KL controller: target must be > 0, got {target}")
    if horizon <= 0:
        raise ValueError(f"adaptive KL controller: horizon must be > 0, got {horizon}")

    def update(state: KLState, current_kl: Any, n_steps: int) -> KLState:
        error = (current_kl / target - 1.0).clip(-0.2, 0.2)
        return KLState(state.coef * (1.0 + error * n_steps / horizon))

    return update
