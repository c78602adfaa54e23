"""One module per `trace-rl` command: its settings (the config class, defined here or, where a lower layer builds
it too, imported from there) and `run(cfg, yaml_text) -> summary`, what the command does from a resolved config to
its files and printout. `cli.py` holds only the command table and the dispatcher (parse, check, probe, run, map
errors to one line); nothing here parses a command line.

`yaml_text` is the resolved config as `config.yaml` (written by the commands that keep a run directory); the
summary is what the command also writes as its summary JSON where it has one, else a small dict of what it
wrote (serve-retriever serves until stopped and returns none). The table imports a module only for its own
command, so one command's layers never load for another; `sft` has no module here, since its layer's runner
(`train.sft.run_sft`) already has this signature. `compare` runs seeds x methods over another command, each run
through that command's `run` here (`train`'s or `rollout`'s).

Limits: the per-step loops themselves are still three (`testbed.simulate`, `commands.rollout`,
`train.trainer`); this package gathers each command's orchestration, not the loop."""
