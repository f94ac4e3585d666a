"""JSON Lines reading with errors that name the file, the line and the field."""
from __future__ import annotations

import pathlib
from typing import Any, Iterator

from searchrl.retrieval.corpus import JSONError, parse_json


class DataFormatError(ValueError):
    """A malformed row of a data file."""

    def __init__(self, location: str, message: str, field: str | None = None):
        self.location, self.field = location, field
        prefix = f"{location}: field {field!r}" if field else location
        super().__init__(f"{prefix}: {message}")


def read_jsonl(path: str | pathlib.Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yields ("file:line", JSON object) for every non-blank line; a bad line (not UTF-8, not JSON, nested too
    deeply, an over-long integer, not an object) raises DataFormatError."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            location = f"{path}:{line_no}"
            try:
                row = parse_json(raw)
            except JSONError as e:
                raise DataFormatError(location, str(e)) from None
            if not isinstance(row, dict):
                raise DataFormatError(location, f"expected a JSON object, got {type(row).__name__}")
            yield location, row


def string_field(row: dict[str, Any], field: str, location: str, *, required: bool = True,
                 allow_empty: bool = False, allow_int: bool = False) -> str:
    """row[field] as a string; ints are accepted (and converted) only for ids."""
    if field not in row or row[field] is None:
        if required:
            raise DataFormatError(location, "missing", field)
        return ""
    value = row[field]
    if allow_int and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise DataFormatError(location, f"expected a string, got {type(value).__name__} {value!r}", field)
    if not allow_empty and not value.strip():
        raise DataFormatError(location, "empty", field)
    return value


def unique_id(seen: dict[str, str], id_: str, location: str, field: str) -> str:
    """Records where each id was first seen; a repeated id raises DataFormatError."""
    if id_ in seen:
        raise DataFormatError(location, f"duplicate id {id_!r} (first at {seen[id_]})", field)
    seen[id_] = location
    return id_
