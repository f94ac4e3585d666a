"""One package per paper, each registering its `searchrl.task.Task`: `search_r1` (the common baseline),
`autosearch`, `deepretrieval` and `rpl`."""
