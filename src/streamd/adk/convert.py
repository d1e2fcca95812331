"""ADK events back from the log, rebuilt without re-validating what the
service itself wrote (the way out, pydantic's own JSON carried as raw JSON and
so encoded once, is :func:`streamd.adk.codec.log_event`).

* ``Event.model_validate`` costs 31-38 us a typical event on a 2-core VM
  (``model_validate_json`` the same), for data that pydantic itself produced
  from a valid Event. :func:`event_from_json` rebuilds such data the way
  ``model_construct`` does (defaults, ``model_post_init``, private
  attributes, the set of fields given), model by model, from a plan compiled
  once per class, converting each value as validation would (enums by value,
  lists to sets, nested models), and running the after-validators the
  classes declare. Anything the plan does not know for certain how to treat
  (an unknown key, a value of an unexpected type, bytes, a union, a
  constrained field, a before-validator not known to leave a dict alone, a
  required field missing, an after-validator refusing a value) sends that
  model's data, and only that one, to ``model_validate``, which gives the
  result or the error it always gave.
* The plans are compiled here, in Python, from pydantic's metadata, and
  this module's plan interpreter is their definition; the compiled core
  (``streamd._native.ModelPlan``) runs a copy of each, two to three times
  faster, and hands back to the Python path whatever it cannot build (see
  "the compiled builder" below). ``tests/adk/test_convert.py`` compares the
  plans with ``model_validate``, and the compiled copies with the plans, on
  every kind of event and on random data.
"""

from __future__ import annotations

import enum
import functools
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import pydantic
from google.adk.events.event import Event
from pydantic_core import PydanticUndefined

from streamd import collector, plain

if TYPE_CHECKING:
    from streamd._native import ModelPlan

__all__ = [
    "compiled_plan", "copied", "copied_all", "event_from_json",
    "events_from_data", "rebuild",
]

_M = TypeVar("_M", bound=pydantic.BaseModel)

_decode = msgspec.json.Decoder().decode


def event_from_json(content: bytes | msgspec.Raw) -> Event:
    """The ADK event stored as ``content`` (see the module docstring)."""
    return rebuild(Event, _decode(content))


def events_from_data(datas: list[Any]) -> list[Event]:
    """The ADK events stored as these contents, already decoded from JSON,
    with the cyclic garbage collector paused meanwhile (see
    :mod:`streamd.collector`)."""
    with collector.paused():
        compiled = compiled_plan(Event)
        if compiled is None:
            return [rebuild(Event, data) for data in datas]
        built = compiled.build_all(datas)
        return [Event.model_validate(data) if model is None else model
                for data, model in zip(datas, built, strict=True)]


def copied(model: _M) -> _M:
    """``model.model_copy()`` (pydantic's shallow ``__copy__``: its own
    ``__dict__``, fields set, extra and private values, nested values
    shared), without ``copy.copy``'s dispatch on each of them."""
    cls = type(model)
    new = cls.__new__(cls)
    setattr_ = object.__setattr__
    setattr_(new, "__dict__", model.__dict__.copy())
    extra = model.__pydantic_extra__
    setattr_(new, "__pydantic_extra__", None if extra is None else extra.copy())
    setattr_(new, "__pydantic_fields_set__", model.__pydantic_fields_set__.copy())
    private = getattr(model, "__pydantic_private__", None)
    setattr_(new, "__pydantic_private__", None if private is None else {
        k: v for k, v in private.items() if v is not PydanticUndefined})
    return new


def copied_all(models: list[_M]) -> list[_M]:
    """:func:`copied` of each (by the compiled core where it runs)."""
    if _core is None or plain.asked():
        return [copied(model) for model in models]
    return _core.copy_models(models)


def rebuild(cls: type[pydantic.BaseModel], data: Any) -> Any:
    """``cls.model_validate(data)`` for data a ``cls`` was dumped to, built
    without validation where that gives the same model."""
    compiled = compiled_plan(cls)
    if compiled is None:
        built = _plan(cls).build(data)
        return cls.model_validate(data) if built is _NO else built
    built = compiled.build(data)
    return cls.model_validate(data) if built is None else built


# --- the compiled builder --------------------------------------------------
#
# The plans below are the definition; ``streamd._native.ModelPlan`` (the Rust
# core, native/src/python/rebuild.rs) runs a compiled copy of each, building
# the same models without interpreting Python per object (the plan
# interpreter below costs 12-17 us an event in a tight loop, most of a cold
# session load).
# Where it cannot build, it says so (None) and the Python path decides as it
# always did. Without the compiled module (an install without a Rust
# toolchain, or one built from other sources), or with ``STREAMD_NATIVE=0``,
# the Python plans run: the same models, slower.

# The ModelPlan calls this module makes (the module's REBUILD_INTERFACE).
REBUILD_INTERFACE = 1

try:
    from streamd import _native as _core
except ImportError:  # built without a Rust toolchain: the Python plans it is
    _core = None  # type: ignore[assignment]
if getattr(_core, "REBUILD_INTERFACE", None) != REBUILD_INTERFACE:
    _core = None  # type: ignore[assignment]  # an extension older than these sources

_compiled: dict[type, ModelPlan | None] = {}


def compiled_plan(cls: type[pydantic.BaseModel]) -> ModelPlan | None:
    """The compiled copy of ``cls``'s plan; None where the Python plans run
    (no usable compiled module, ``STREAMD_NATIVE=0``, a plan that cannot build)."""
    if _core is None or plain.asked():
        return None
    return _compiled_of(cls)


def _compiled_of(cls: type[pydantic.BaseModel]) -> ModelPlan | None:
    try:
        return _compiled[cls]
    except KeyError:
        pass
    plan = _plan(cls)
    compiled = None
    if plan.usable and _core is not None:
        compiled = _core.ModelPlan(
            cls,
            plan.template,
            [(name, _spec(rule), rule[2]) for name, rule in plan.fields.items()],
            plan.factories,
            sorted(plan.required),
            plan.after,
            plan.post_init,
            _NO,
        )
    _compiled[cls] = compiled
    return compiled


# --- plans -----------------------------------------------------------------

_NO: Any = object()
"""A value the plan cannot convert for certain: validate instead."""

Convert = Callable[[Any], Any]

# Model validators that run before validation and leave a plain dict of the
# model's own fields as it is: genai's warns about model instances of the
# wrong type (never in JSON), ADK's Event routes convenience keywords
# (``message``, ``state``, ...) that are not fields, so data holding one is
# refused as an unknown key before it gets here.
_HARMLESS_BEFORE = frozenset({"_check_field_type_mismatches", "_accept_convenience_kwargs"})
_IMMUTABLE = (type(None), bool, int, float, str, enum.Enum, tuple, frozenset)
# What an after-validator raises to refuse a value (a ValidationError is a
# ValueError): validation turns it into the model's ValidationError, with the
# value's place in it, so data refused so goes to validation.
_REFUSALS = (ValueError, AssertionError)

_plans: dict[type, _Plan] = {}


class _Plan:
    """How to build one model class from its dumped dict, or that it cannot be."""

    def __init__(self, cls: type[pydantic.BaseModel]) -> None:
        self.cls = cls
        self.usable = False
        self.fields: dict[str, Rule] = {}
        self.new = cls.__new__
        self.template: dict[str, Any] = {}
        self.factories: list[tuple[str, Callable[[], Any]]] = []
        self.required: frozenset[str] = frozenset()
        self.after: list[Callable[[Any], Any]] = []
        self.post_init = False

    def compile(self) -> None:
        cls = self.cls
        config = cls.model_config
        decorators = cls.__pydantic_decorators__
        if (
            config.get("extra") == "allow"
            or config.get("use_enum_values")
            or getattr(cls, "__pydantic_root_model__", False)
            or decorators.validators
            or decorators.root_validators
        ):
            return
        for dec in decorators.model_validators.values():
            if dec.info.mode == "after":
                self.after.append(getattr(cls, dec.cls_var_name))
            elif dec.info.mode != "before" or dec.cls_var_name not in _HARMLESS_BEFORE:
                return
        field_after: dict[str, list[Callable[[Any], Any]]] = {}
        for fdec in decorators.field_validators.values():
            if fdec.info.mode != "after" or _takes_info(fdec.func):
                return
            for name in fdec.info.fields:
                field_after.setdefault(name, []).append(getattr(cls, fdec.cls_var_name))
        required = []
        for name, field in cls.model_fields.items():
            if field.default_factory_takes_validated_data or field.validate_default:
                return
            rule = _NEVER if field.metadata else _rule(field.annotation)
            checks = field_after.get(name)
            if checks:
                rule = (_CALL, _then(_as_call(rule), checks), False)  # None: validate
            self.fields[name] = rule
            if field.is_required():
                required.append(name)
                self.template[name] = None
            elif field.default_factory is not None:
                self.template[name] = None
                # Takes no argument: a factory of the validated data was refused above.
                factory = typing.cast("Callable[[], Any]", field.default_factory)
                self.factories.append((name, factory))
            elif isinstance(field.default, _IMMUTABLE):
                self.template[name] = field.default
            else:
                self.template[name] = None
                self.factories.append(
                    (name, functools.partial(field.get_default, call_default_factory=True))
                )
        self.required = frozenset(required)
        self.post_init = cls.__pydantic_post_init__ is not None
        self.usable = True

    def build(self, data: Any) -> Any:
        if not self.usable or type(data) is not dict:
            return _NO
        fields = self.fields
        full = self.template.copy()  # in the fields' order, as validation makes it
        for key, value in data.items():
            rule = fields.get(key)
            if rule is None:
                return _NO  # not a field (by this name): validation decides
            kind, arg, nullable = rule
            if value is None:
                if not nullable:
                    return _NO
            elif kind is _TYPE:
                if type(value) is not arg:
                    return _NO
            elif kind is _CALL:
                value = arg(value)
                if value is _NO:
                    return _NO
            full[key] = value
        given = data.keys()
        if not self.required <= given:
            return _NO
        for name, factory in self.factories:
            if name not in given:
                full[name] = factory()
        model = self.new(self.cls)
        setattr_ = object.__setattr__
        setattr_(model, "__dict__", full)
        setattr_(model, "__pydantic_fields_set__", set(given))
        setattr_(model, "__pydantic_extra__", None)
        setattr_(model, "__pydantic_private__", None)
        if self.post_init:
            model.model_post_init(None)
        try:
            for check in self.after:
                model = check(model)
        except _REFUSALS:
            return _NO  # validation reports it, as its own error and in its place
        return model


def _plan(cls: type[pydantic.BaseModel]) -> _Plan:
    plan = _plans.get(cls)
    if plan is None:
        plan = _plans[cls] = _Plan(cls)  # registered first: models may nest themselves
        plan.compile()
    return plan


def _takes_info(func: Any) -> bool:
    code = getattr(getattr(func, "__func__", func), "__code__", None)
    return code is None or code.co_argcount != 2  # (cls, value)


def _then(convert: Convert, checks: list[Callable[[Any], Any]]) -> Convert:
    def checked(value: Any) -> Any:
        value = convert(value)
        if value is _NO:
            return value
        try:
            for check in checks:
                value = check(value)
        except _REFUSALS:
            return _NO  # validation reports it, as its own error and in its place
        return value

    return _noted(checked, ("then", _specs[convert], tuple(checks)))


# What each conversion below is, for the compiled builder: a tuple naming
# its kind and what it needs (read by native/src/python/rebuild.rs).
Spec = tuple[Any, ...]
_specs: dict[Convert, Spec] = {}


def _spec(rule: Rule) -> Spec:
    kind, arg, _ = rule
    if kind is _SAME:
        return ("same",)
    if kind is _TYPE:
        return ("type", arg)
    return _specs[arg]


def _noted(convert: Convert, spec: Spec) -> Convert:
    _specs[convert] = spec
    return convert


# A field's rule: (kind, arg, nullable). _SAME keeps the value, _TYPE keeps
# it if it is exactly of type ``arg``, _CALL converts it with ``arg`` (which
# returns _NO when it cannot); None is kept only where the field allows it.
_SAME, _TYPE, _CALL = "same", "type", "call"
Rule = tuple[str, Any, bool]


def _never(value: Any) -> Any:
    return _NO


_NEVER: Rule = (_CALL, _noted(_never, ("never",)), False)


def _as_call(rule: Rule) -> Convert:
    kind, arg, _ = rule
    if kind is _SAME:
        return _noted(lambda value: value, _spec(rule))
    if kind is _TYPE:
        return _noted(lambda value: value if type(value) is arg else _NO, _spec(rule))
    return arg


def _rule(annotation: Any) -> Rule:
    """How validation treats a JSON value for ``annotation``, where its rules
    are plain; :data:`_NEVER` for the rest."""
    if annotation is Any or annotation is object:
        return (_SAME, None, True)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            kind, arg, _ = _rule(rest[0])
            return (kind, arg, True)
        return _NEVER
    if annotation in (str, bool, int, float, dict, list):
        return (_TYPE, annotation, False)
    if isinstance(annotation, type) and origin is None:
        if issubclass(annotation, pydantic.BaseModel):
            return (_CALL, _model(annotation), False)
        if issubclass(annotation, enum.Enum):
            return (_CALL, _enum(annotation), False)
        return _NEVER
    if origin is list and len(args) == 1:
        item = _rule(args[0])
        if item[0] is _SAME:
            return (_TYPE, list, False)
        return (_CALL, _list(_as_call(item), item[2]), False)
    if origin is set and len(args) == 1:
        item = _rule(args[0])
        return (_CALL, _set(_as_call(item), item[2]), False)
    if origin is dict and len(args) == 2 and args[0] is str:
        item = _rule(args[1])
        if item[0] is _SAME:
            return (_TYPE, dict, False)
        return (_CALL, _dict(_as_call(item), item[2]), False)
    return _NEVER


def _model(cls: type[pydantic.BaseModel]) -> Convert:
    """A nested model: built by its own plan, else validated on its own (as
    the parent's validation would validate it), an error there sending the
    parent to validation too, so the error raised is the parent's."""
    found: list[_Plan] = []

    def validated(value: Any) -> Any:
        try:
            return cls.model_validate(value)
        except (pydantic.ValidationError, ValueError, TypeError):
            return _NO

    def convert(value: Any) -> Any:
        if not found:
            found.append(_plan(cls))
        built = found[0].build(value)
        return validated(value) if built is _NO else built

    # Compiled: the nested plan's compiled copy, asked for at first use (plans
    # nest), and validation for what that copy cannot build (where this plan
    # refuses too: validators are not run twice).
    return _noted(convert, ("model", functools.partial(_compiled_of, cls), validated))


def _enum(cls: type[enum.Enum]) -> Convert:
    members = cls._value2member_map_

    def convert(value: Any) -> Any:
        if type(value) is not str and type(value) is not int:
            return _NO
        return members.get(value, _NO)

    return _noted(convert, ("enum", members))


def _items(item: Convert, nullable: bool, values: Any) -> list[Any] | None:
    out = []
    for v in values:
        if v is None:
            if not nullable:
                return None
        else:
            v = item(v)
            if v is _NO:
                return None
        out.append(v)
    return out


def _list(item: Convert, nullable: bool) -> Convert:
    return _noted(_sequence(item, nullable, None), ("list", _specs[item], nullable))


def _set(item: Convert, nullable: bool) -> Convert:
    return _noted(_sequence(item, nullable, set), ("set", _specs[item], nullable))


def _sequence(
    item: Convert, nullable: bool, make: Callable[[list[Any]], Any] | None
) -> Convert:
    """A JSON array as a list (``make`` None) or as what ``make`` builds of it."""

    def convert(value: Any) -> Any:
        if type(value) is not list:
            return _NO
        out = _items(item, nullable, value)
        if out is None:
            return _NO
        return out if make is None else make(out)

    return convert


def _dict(item: Convert, nullable: bool) -> Convert:
    def convert(value: Any) -> Any:
        if type(value) is not dict:
            return _NO
        out = _items(item, nullable, value.values())
        return _NO if out is None else dict(zip(value, out, strict=True))

    return _noted(convert, ("dict", _specs[item], nullable))
