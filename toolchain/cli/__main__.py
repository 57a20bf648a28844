"""`python -m toolchain.cli`: deploy from a checkout without the console script."""

from toolchain.cli.main import main

main(prog_name="deploy")
