"""Plain data conversion: dataclasses and pydantic models to dicts.

Only conversion lives here. The JSON form, its canonical order and the
fingerprint are computed in Rust by idem-core.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any


def plain(value: Any) -> Any:
    """``value`` as a dict, list or scalar, or a ``TypeError``.

    A dataclass instance becomes a dict of its fields, a pydantic model the
    dict of ``model_dump(mode="json")``; their fields are converted in turn.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    # pydantic is looked up only if the program imported it.
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(
        f"{type(value).__name__} is not JSON: use dict, list, tuple, str, int, "
        "float, bool, None, a dataclass or a pydantic model"
    )
