"""Numbers for config models that refuse booleans.

Pydantic's lax mode turns ``true`` into 1 for an ``int`` or ``float`` field, so ``port: true``
would serve on port 1 and ``gpu: true`` would break GPU 1. Strict mode is no answer: flags and
``GPUMON_…`` variables arrive as strings that must still parse. These types keep lax parsing of
strings and refuse only booleans.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError


def refuse_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", "Input should be a number, not a boolean")
    return value


NoBool = BeforeValidator(refuse_bool)
"""For a union (``Annotated[float | str, NoBool]``): one error, not one per member."""
Int = Annotated[int, NoBool]
Float = Annotated[float, NoBool]
