"""The one exception type for bad input: its message is a single line meant for a person."""


class UserError(ValueError):
    """Bad input. The CLI prints the message alone and exits with code 2."""


def pydantic_message(exc: Exception, where: str = "") -> str:
    """One line from a pydantic ValidationError: the first failing field and what is allowed."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return f"{where}{exc}"
    first = errors()[0]
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "value_error" and isinstance(
        first.get("ctx", {}).get("error"), UserError
    ):
        return f"{where}{msg}"  # our own message already names its field
    field = ".".join(str(p) for p in first.get("loc", ())) or "value"
    given = first.get("input")
    shown = "" if isinstance(given, dict | list) or given is None else f" (got {given!r})"
    return f"{where}{field}: {msg}{shown}"
