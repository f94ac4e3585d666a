"""The static settings of a rollout (they fix every compiled shape): `config.rollout`. No JAX here, so that
building a config stays instant."""
from __future__ import annotations

import dataclasses

from searchrl.episode import SamplingParams


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Token budgets and sampling of a rollout."""

    max_prompt_tokens: int = 256
    max_len: int = 1024  # total slots a row may use: prompt + turns + observations
    max_turn_tokens: int = 128  # sampled tokens per policy turn
    max_obs_tokens: int = 256  # tokens per observation, after truncation
    obs_buckets: tuple[int, ...] = (64, 128, 256)  # observation chunks are right-padded to one of these
    chunk_steps: int = 32  # decode steps per jitted chunk
    # Prefill prompts in chunks of the widest observation bucket, as observations are appended, not in one
    # call: the same rollout, with the prefill's attention scores bounded by that width, not the prompt's.
    chunked_prefill: bool = False
    sampling: SamplingParams = SamplingParams()

    def slots(self, widest_chunk: int) -> int:
        """Token slots per row: `max_len`, plus room for the widest chunk that may be appended at the last
        one (`widest_chunk`, an observation bucket or more) or the prompt."""
        return self.max_len + max(widest_chunk, self.max_prompt_tokens)

    def __post_init__(self):
        if max(self.obs_buckets) < self.max_obs_tokens:
            raise ValueError(f"rollout.obs_buckets {self.obs_buckets} must cover "
                             f"rollout.max_obs_tokens={self.max_obs_tokens}.")
