"""What every layer shares and none owns: the errors the CLI turns into one line (`errors.py`) and
where deploy keeps its files (`paths.py`). Imports nothing of deploy, so ops, schedules, toolchain
and devices can all import it without importing each other."""
