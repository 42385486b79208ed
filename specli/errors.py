"""Typed errors. The library raises these; only the CLI turns them into exit codes."""

from __future__ import annotations


class SpecliError(Exception):
    """An error the user can act on: a one-line message plus an optional hint."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} (hint: {self.hint})"


class UsageError(SpecliError):
    """Options that cannot work together; exits 2, like any other usage error."""

    exit_code = 2


class ModelFileError(SpecliError):
    """A model path that is missing, not a file, not a GGUF, or that llama.cpp cannot load."""


class VocabMismatchError(SpecliError):
    """The draft model's vocabulary cannot be used to draft for the target."""


class PromptError(SpecliError):
    """The prompt is empty or does not fit in the context."""


class ConfigError(SpecliError):
    """A settings or registry file that does not validate."""


class UnknownPairError(SpecliError):
    """A pair name that is in no registry file."""


class HubError(SpecliError):
    """A download from the Hugging Face Hub failed."""


class OfflineError(HubError):
    """A file is needed that is not in the cache and downloads are disabled."""


class CalibrationError(SpecliError):
    """The machine was too busy to measure a model's costs: nothing was stored."""


class MtpUnavailableError(UsageError):
    """Drafting with a target's own NextN (multi-token prediction) layers cannot work: this
    build of llama.cpp lacks its MTP API, or the target has no NextN layers."""


class Interrupted(SpecliError):
    """Ctrl-C before there was anything to stop gracefully (a server still loading): exits 130."""

    exit_code = 130
