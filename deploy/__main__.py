"""`python -m deploy`: deploy without the console script (from a checkout, a bench script's subprocess)."""

from deploy.cli.main import main

main(prog_name="deploy")
