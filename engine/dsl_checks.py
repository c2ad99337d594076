"""The DSL's argument checks (engine/dsl.py): a helper or @cell option given the wrong kind of value is refused as a
CellGraphError that names the field and says what to write, never Python's TypeError.
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
from typing import Callable

from .dims import DIMS, STATE_DIMS
from .errors import CellGraphError, Problem


def check_name(name, helper: str, argument: str = "name") -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise CellGraphError(Problem(f"{helper}() needs a name that is a Python identifier, got {name!r}",
                                     field=argument, hint=f"e.g. {helper}(\"W_ih\"): letters, digits and '_', "
                                                          "not starting with a digit"))
    return name


def check_dim(dim, helper: str, argument: str, allowed: tuple[str, ...] = DIMS) -> str:
    if not isinstance(dim, str) or dim not in allowed:
        raise CellGraphError(Problem(f"{helper}() argument '{argument}' must be one of {allowed}, got {dim!r}",
                                     field=argument, hint="'H' (hidden size) is the default; 'I' is the input "
                                                          "size, 'P' the projection size"))
    return dim


def finite_number(value, where: str) -> float:
    """A Python or NumPy real number as a finite float, else a CellGraphError naming `where`."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if math.isfinite(number):
            return number
        shown = (f"an integer of {int(value).bit_length()} bits" if isinstance(value, numbers.Integral)
                 else shown_value(value))
        raise CellGraphError(Problem(f"{where} must be a finite number, got {shown}"[:200], field=where,
                                     hint="use a finite number within float range, such as 0.5"))
    raise CellGraphError(Problem(f"{where} must be a number, got {type(value).__name__} {shown_value(value)}"[:200],
                                 field=where, hint="use a number such as 0.5, or a cell value"))


def shown_value(value) -> str:
    try:
        return repr(value)[:120]
    except (ValueError, RecursionError):
        return f"<{type(value).__name__}>"


def is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def arguments_checked(fn: Callable) -> Callable:
    """Refuse a call with arguments the helper does not take as a CellGraphError (not Python's TypeError)."""
    signature = inspect.signature(fn)
    usage = fn.__name__ + str(signature.replace(parameters=[p.replace(annotation=p.empty)
                                                            for p in signature.parameters.values()],
                                                return_annotation=signature.empty))

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        try:
            signature.bind(*args, **kwargs)
        except TypeError as e:
            raise CellGraphError(Problem(f"{fn.__name__}(): {e}", field="args", hint=f"write {usage}")) from None
        return fn(*args, **kwargs)
    return checked


def check_options(fn, name, output, doc, input_is_hidden, state_dims) -> list[str]:
    """The @cell function's parameter names, once every option of cell() is of the right type."""
    if not callable(fn):
        raise CellGraphError(Problem(f"@cell needs a function, got {type(fn).__name__} {fn!r}"[:200], field="fn",
                                     hint="def my_cell(x, h): ...; then cell(my_cell)"))
    for option, value in (("name", name), ("doc", doc)):
        if value is not None and not isinstance(value, str):
            raise CellGraphError(Problem(f"cell() option '{option}' must be a string, got {value!r}"[:200],
                                         field=option, hint=f"e.g. {option}=\"my_cell\""))
    if not isinstance(output, str):
        raise CellGraphError(Problem(f"cell() option 'output' must be a state name, got {output!r}"[:200],
                                     field="output", hint="the state that is the layer's output, usually \"h\""))
    if not isinstance(input_is_hidden, bool):
        raise CellGraphError(Problem(f"cell() option 'input_is_hidden' must be True or False, got "
                                     f"{input_is_hidden!r}"[:200], field="input_is_hidden",
                                     hint="True when the cell adds x to hidden-sized values"))
    if state_dims is not None and not isinstance(state_dims, dict):
        raise CellGraphError(Problem(f"cell() option 'state_dims' must be a dict, got {state_dims!r}"[:200],
                                     field="state_dims", hint="e.g. state_dims={\"h\": \"P\"}"))
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:          # builtins and some C callables have no signature
        raise CellGraphError(Problem(f"@cell cannot read the parameters of {fn!r}: {e}"[:200], field="fn",
                                     hint="decorate a plain Python function")) from None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [p.name for p in signature.parameters.values() if p.kind in positional]
    if len(params) < 2:
        raise CellGraphError("an @cell function takes the input first, then one argument per state",
                             field="signature", hint="e.g. def my_cell(x, h): ...")
    for state, dim in (state_dims or {}).items():
        if state not in params[1:]:
            raise CellGraphError(Problem(f"state_dims names '{state}', which is not a state of the function",
                                         node=str(state), field="state_dims", hint=f"states are {params[1:]}"))
        check_dim(dim, "cell", f"state_dims['{state}']", STATE_DIMS)
    return params
