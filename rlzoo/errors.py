"""User-facing errors. The CLI prints these as plain messages (no traceback) and exits 1."""

from __future__ import annotations


class RlzooError(Exception):
    """Base of every error a user is expected to read and act on."""


class ConfigError(RlzooError):
    """One or more problems in a run config; each problem is ``(dotted.location, message)``."""

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        head = f"invalid config {source}" if source else "invalid config"
        lines = [f"{head}:"] + [f"  {loc}: {msg}" if loc else f"  {msg}" for loc, msg in problems]
        super().__init__("\n".join(lines))


class RegistryError(RlzooError):
    """A problem with the set of installed plugins or a component lookup."""


class UnknownComponentError(RegistryError):
    def __init__(
        self,
        kind: str,
        name: str,
        valid: list[str],
        suggestion: str | None,
        failed_plugins: list[str] | None = None,
        peer: str | None = None,
    ) -> None:
        self.kind, self.name, self.valid, self.suggestion = kind, name, valid, suggestion
        msg = f"unknown {kind} {name!r}"
        if suggestion:  # peer: where another framework calls the suggestion `name` (e.g. verl's loss_mode=vanilla)
            msg += f"; did you mean {suggestion!r}" + (f" ({peer})?" if peer else "?")
        msg += f" Valid {kind} names: {', '.join(valid) if valid else '(none installed)'}"
        if failed_plugins:  # the name may be one of theirs
            msg += ". Not loaded, so their components are missing: " + "; ".join(failed_plugins)
        super().__init__(msg)


class DuplicateComponentError(RegistryError):
    def __init__(self, kind: str, name: str, first: str, second: str) -> None:
        self.kind, self.name, self.first, self.second = kind, name, first, second
        super().__init__(
            f"{kind} {name!r} is registered twice: by {first} and by {second}. "
            "Uninstall one of the two distributions (or drop the script from plugins) or rename one component."
        )


class DataError(RlzooError):
    """Malformed user data (a dataset file, a row)."""
