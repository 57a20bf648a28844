"""The `deploy` command line (`main.py` assembles it): the only room that prints or plots. Each
command parses its options, calls the rooms below and shows what they return."""
