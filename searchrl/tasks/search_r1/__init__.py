"""Search-R1 (arXiv 2503.09516): PPO with an outcome reward over a top-k retriever; the common baseline the
other tasks build on. `env` (prompt, actions, observations, `REWARDS`) and `rewards` (the EM and
format-aware scores)."""
from searchrl.task import TASKS, Task
from searchrl.tasks.search_r1 import env

TASKS.register("search_r1")(Task(env.Config, env.make))
