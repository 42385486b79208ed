"""The command line, assembled: every command module registers on `app.app`, and `specli
--help` lists the commands in the order they are imported here."""

# isort: off
from specli.commands import run, pull, pairs, drafts, doctor, bench, serve  # noqa: F401 (each registers its commands)
# isort: on
from specli.commands.app import app


def main() -> None:
    """Entry point (`specli`, `python -m specli`)."""
    app()
