"""Generated blocks of the docs: text between `<!-- generated: NAME -->` and `<!-- end generated -->` lines is
written from a results file by a command, never typed (`searchrl.demo.publish`, `searchrl.benchmarks.aot_setups`,
`searchrl.benchmarks.project`, `searchrl.benchmarks.rollout_report`)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

END = "<!-- end generated -->"


def replace_block(text: str, name: str, body: str, where: Path) -> str:
    """`text` with the block named `name` holding `body`; an error naming `where` when it has none."""
    pattern = re.compile(rf"(<!-- generated: {re.escape(name)} -->\n)(?:.*?\n)?({re.escape(END)})", re.S)
    if not pattern.search(text):
        raise ValueError(f"{where}: no '<!-- generated: {name} -->' ... '{END}' block")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text, count=1)


def checkout_commit(root: Path) -> str:
    """The short commit of the checkout at `root`, which a results file names ("unknown" outside git)."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"
