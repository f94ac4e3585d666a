"""The static settings of a rollout (they fix every compiled shape): `config.rollout`. No JAX here, so that
building a config stays instant."""
from __future__ import annotations

from searchrl.configlib import group, ranged
from searchrl.episode import SamplingParams, SideBranch


SCHEDULES = ("continuous", "lockstep")
BRANCH_PROMPT_ROOM = 64  # tokens a side branch's prompt may take, appended after an observation


@group
class RolloutConfig:
    """Token budgets and sampling of a rollout."""

    max_prompt_tokens: int = ranged(256, "[1, inf)")
    max_len: int = ranged(1024, "[1, inf)")  # total slots a row may use: prompt + turns + observations
    max_turn_tokens: int = ranged(128, "[1, inf)")  # sampled tokens per policy turn
    max_obs_tokens: int = ranged(256, "[1, inf)")  # tokens per observation, after truncation
    # observation chunks are right-padded to one of these
    obs_buckets: tuple[int, ...] = ranged((64, 128, 256), "[1, inf)")
    chunk_steps: int = ranged(32, "[1, inf)")  # decode steps per jitted chunk
    # Prefill prompts in chunks of the widest observation bucket, as observations are appended, not in one
    # call: the same rollout, with the prefill's attention scores bounded by that width, not the prompt's.
    chunked_prefill: bool = False
    sampling: SamplingParams = SamplingParams()
    # Scheduling (`RolloutEngine`): "continuous" keeps `decode_rows` rows decoding, refills a row as soon as
    # its episode ends and appends each observation when it arrives; "lockstep" runs the rows' turns together
    # (a row waits for the batch's slowest) and refills only once every row is free. Episodes are the same.
    schedule: str = "continuous"
    # rows decoded at once (the compiled batch); 0: one row per episode of a rollout
    decode_rows: int = ranged(0, "[0, inf)")
    # host threads running the env's `parse_action` / `observe` calls concurrently
    env_workers: int = ranged(8, "[1, inf)")
    # Rows per append call (observations, prompts): the rows ready go in calls of this many (the last one
    # filled up with rows that append nothing), each computing only its rows; 0: every decode row, one call.
    extend_rows: int = ranged(8, "[0, inf)")
    # Continuous schedule: rows whose episodes wait for the env are copied into up to this many parked rows
    # (a second cache, on device) while episodes wait for a decode row, so that the row decodes another
    # episode; a parked episode moves back into a free row when its observation is in. 0: none.
    parked_rows: int = ranged(0, "[0, inf)")
    # The paged KV cache (`searchrl.rollout.pages`). 16 slots a page: vLLM's default block size, a multiple
    # of the Pallas kernels' tiles, and at most 15 slots of a row's last page unused.
    page_size: int = ranged(16, "[1, inf)")
    # Pages per device (per block of rows): the KV memory of a rollout, whatever its rows and max_len. 0:
    # enough for every row (decode and parked) at its largest, so no row ever waits for pages. With fewer,
    # a row that finds none free waits (sits out a decode chunk; its observation or prompt waits a round)
    # while the oldest episode always goes on: nothing is dropped. At least one episode at its largest.
    pool_pages: int = ranged(0, "[0, inf)")

    def slots(self, widest_chunk: int) -> int:
        """Token slots per row: `max_len`, plus room for the widest chunk that may be appended at the last
        one (`widest_chunk`, an observation bucket or more) or the prompt."""
        return self.max_len + max(widest_chunk, self.max_prompt_tokens)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"rollout.schedule={self.schedule!r} is not one of {SCHEDULES}.")
        if self.pool_pages and self.parked_rows:
            raise ValueError(f"rollout.parked_rows={self.parked_rows} needs rollout.pool_pages=0 (a pool for "
                             "every row): a parked episode could wait for a decode row held by episodes "
                             "that wait for its pages.")
        if max(self.obs_buckets) < self.max_obs_tokens:
            raise ValueError(f"rollout.obs_buckets {self.obs_buckets} must cover "
                             f"rollout.max_obs_tokens={self.max_obs_tokens}.")


def chunk_widths(config: RolloutConfig, branch: SideBranch | None) -> tuple[int, ...]:
    """The widths appended chunks are padded to, narrowest first: the observation buckets, and for a side
    branch that continues the trajectory (`branch`, the env's declared one), the widest with room for the
    branch's prompt. The widest sets a row's slots (`RolloutConfig.slots`)."""
    widths = tuple(sorted(config.obs_buckets))
    if branch is None or branch.separate_prompt:
        return widths
    return widths + (widths[-1] + BRANCH_PROMPT_ROOM,)
