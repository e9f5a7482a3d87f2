"""DRA device selectors (CEL) evaluated against devices a node template will publish.

Kubernetes selects devices for a ResourceClaim with CEL expressions, in the claim's request and in
its DeviceClass, over one variable ``device`` (``resource.k8s.io/v1`` ``CELDeviceSelector``):
``device.driver``, ``device.attributes["<domain>"].<name>`` and ``device.capacity["<domain>"].<name>``,
where an unknown domain is an empty map, an unknown name an error, and a capacity a Kubernetes
*quantity*. Anything but a boolean result is an error, and the scheduler's allocation stops on it.

The CEL itself is cel-python (``celpy``: a pure Python implementation of the CEL specification,
docs/autoscaling.md says why this one). Kubernetes' quantity library is an extension of cel-go
(k8s.io/apiserver ``pkg/cel/library/quantity.go``); it is given here as functions over exact
decimals, with the same names and meaning: ``quantity``, ``isQuantity``, ``compareTo``,
``isGreaterThan``, ``isLessThan``, ``isInteger``, ``asInteger``, ``asApproximateFloat``, ``sign``,
``add``, ``sub``, and ``==`` by value. Any other extension (semver, ext strings, lists, sets...) is
an unknown function to celpy, so an expression using it is an error here: reported as
unevaluable, never guessed.

celpy imports logging and os, so this module is outside the controller's pure core: the shell
compiles selectors here and hands the core a :class:`~gpumon.controller.core.demand.Selector`,
a value holding the expression and its compiled predicate.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from gpumon.k8s.dra import SliceDevice
from gpumon.k8s.resources import quantity as parse_quantity

__all__ = ["Quantity", "SelectorError", "compile_selector"]


class SelectorError(ValueError):
    """An expression that does not parse, or a device it cannot be evaluated on."""


@dataclass(frozen=True, slots=True)
class Quantity:
    """A Kubernetes quantity inside CEL: an exact decimal, equal by value as cel-go's is."""

    value: Decimal

    def __str__(self) -> str:
        return f"quantity({self.value})"


def _cel_error(message: str) -> CELEvalError:
    return CELEvalError(message, TypeError, None)


def _quantity(text: Any) -> Quantity | CELEvalError:
    if not isinstance(text, str):
        return _cel_error("quantity() takes a string")
    value = parse_quantity(text)
    return _cel_error(f"invalid quantity {text!r}") if value is None else Quantity(value)


def _is_quantity(text: Any) -> celtypes.BoolType | CELEvalError:
    if not isinstance(text, str):
        return _cel_error("isQuantity() takes a string")
    return celtypes.BoolType(parse_quantity(text) is not None)


def _binary(name: str) -> Any:
    def check(a: Any, b: Any) -> tuple[Decimal, Decimal] | CELEvalError:
        if not isinstance(a, Quantity):
            return _cel_error(f"no such overload: {name} on {type(a).__name__}")
        if isinstance(b, Quantity):
            return a.value, b.value
        if name in ("add", "sub") and isinstance(b, int) and not isinstance(b, bool):
            return a.value, Decimal(int(b))
        return _cel_error(f"no such overload: {name}({type(b).__name__})")

    return check


def _compare(name: str, result: Any) -> Any:
    check = _binary(name)

    def fn(a: Any, b: Any) -> Any:
        pair = check(a, b)
        if isinstance(pair, CELEvalError):
            return pair
        x, y = pair
        return result((x > y) - (x < y))

    return fn


def _arith(name: str, sign: int) -> Any:
    check = _binary(name)

    def fn(a: Any, b: Any) -> Any:
        pair = check(a, b)
        return pair if isinstance(pair, CELEvalError) else Quantity(pair[0] + sign * pair[1])

    return fn


def _unary(name: str, fn: Any) -> Any:
    def call(a: Any) -> Any:
        if not isinstance(a, Quantity):
            return _cel_error(f"no such overload: {name} on {type(a).__name__}")
        return fn(a.value)

    return call


def _as_integer(v: Decimal) -> Any:
    if v != v.to_integral_value() or not -(2**63) <= v < 2**63:
        return _cel_error("cannot convert value to integer")
    return celtypes.IntType(int(v))


_FUNCTIONS: Mapping[str, Any] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": _compare("compareTo", celtypes.IntType),
    "isGreaterThan": _compare("isGreaterThan", lambda c: celtypes.BoolType(c > 0)),
    "isLessThan": _compare("isLessThan", lambda c: celtypes.BoolType(c < 0)),
    "add": _arith("add", 1),
    "sub": _arith("sub", -1),
    "isInteger": _unary(
        "isInteger",
        lambda v: celtypes.BoolType(v == v.to_integral_value() and -(2**63) <= v < 2**63),
    ),
    "asInteger": _unary("asInteger", _as_integer),
    "asApproximateFloat": _unary("asApproximateFloat", lambda v: celtypes.DoubleType(float(v))),
    "sign": _unary("sign", lambda v: celtypes.IntType((v > 0) - (v < 0))),
}


class _Domains(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: a domain nothing is published in reads as an
    empty map (the API's documented behaviour), a missing name inside one is an error."""

    def __getitem__(self, key: Any) -> Any:
        if key not in self.keys():
            return celtypes.MapType({})
        return super().__getitem__(key)


def _cel_value(value: bool | int | str) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    return celtypes.StringType(value)


def _grouped(values: Mapping[str, Any], convert: Any) -> _Domains:
    groups: dict[str, dict[Any, Any]] = {}
    for qualified, value in values.items():
        domain, _, name = qualified.rpartition("/")
        groups.setdefault(domain, {})[celtypes.StringType(name)] = convert(value)
    return _Domains({celtypes.StringType(d): celtypes.MapType(v) for d, v in groups.items()})


def device_variable(device: SliceDevice) -> celtypes.MapType:
    """The ``device`` variable a selector sees for ``device``."""
    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(device.ref.driver),
            celtypes.StringType("attributes"): _grouped(device.attributes, _cel_value),
            celtypes.StringType("capacity"): _grouped(device.capacity, lambda v: Quantity(Decimal(int(v)))),
            # Consumable capacity (several allocations of one device) is not published by the
            # templates gpumon plans with.
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(False),
        }
    )


_ENV = celpy.Environment()


@functools.lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Any:
    """A predicate ``device -> bool`` for ``expression``; it raises :class:`SelectorError` when
    the expression is not a boolean on that device (an error, a missing attribute, an unknown
    function). Raises :class:`SelectorError` at once when the expression does not parse.
    Cached: the pods of one workload repeat the same expressions."""
    try:
        program = _ENV.program(_ENV.compile(expression), functions=dict(_FUNCTIONS))
    except CELParseError as e:
        raise SelectorError(f"CEL expression does not parse: {_first_line(e)}") from None

    def matches(device: SliceDevice) -> bool:
        try:
            result = program.evaluate({"device": device_variable(device)})
        except CELEvalError as e:
            raise SelectorError(f"CEL error on device {device.ref.device}: {_message(e)}") from None
        if isinstance(result, CELEvalError):
            raise SelectorError(f"CEL error on device {device.ref.device}: {_message(result)}")
        if not isinstance(result, celtypes.BoolType):
            raise SelectorError(f"CEL expression is not a boolean on device {device.ref.device}")
        return bool(result)

    return matches


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _message(e: CELEvalError) -> str:
    """celpy's error text, without the activation it dumps for unknown names."""
    args = e.args
    text = str(args[0]) if args else type(e).__name__
    if "undeclared reference" in text:
        name = args[2][0] if len(args) > 2 and args[2] else text.split("'")[1]
        return f"unknown function or variable {name!r}"
    return text[:200]
