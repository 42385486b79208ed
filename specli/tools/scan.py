"""Where a JSON value ends in text that may still be growing (a call's arguments, streamed)."""

from __future__ import annotations


def json_end(text: str, start: int) -> int | None:
    """The index just past the JSON object or array that starts at `start` (after spaces), or
    None where it has not ended yet (or no object or array starts there)."""
    depth, in_string, escaped = 0, False, False
    position = start
    while position < len(text) and text[position] in " \n\t\r":
        position += 1
    if position >= len(text) or text[position] not in "{[":
        return None
    for index in range(position, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return index + 1
    return None
