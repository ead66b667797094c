"""The `fragc` command line: one module per command (run, ir, bench, sweep, video, plot, launch; lists.py for
policies, algos and envs), the options they share (options.py), the config files (config_file.py), and
commands.py, which reads the command line and runs a command, importing its module only then (commands.py says
why)."""

from .commands import COMMANDS, console_main, main

__all__ = ["COMMANDS", "console_main", "main"]
