"""Specs and signatures: what a table holds, and the checks made before any write.

A :class:`Spec` is a fixed shape and a numpy dtype (:mod:`varsync._spec`). A signature is
a nest of specs; it can be built from a nest of example values or of specs (see
:func:`signature_of`). Values are checked against a signature leaf by leaf, in the
signature's structure, and turned into the flat list of arrays a backend stores (see
:func:`flatten_values`).

Signatures travel as JSON (:func:`to_json` / :func:`from_json`, in
:mod:`varsync._signature_json`): portable, versioned and never pickled. Every name of
those two modules that this one lists is importable from here too.
"""

from __future__ import annotations

import collections.abc
import math
import numbers
from typing import Any, Callable

import numpy as np

from varsync import _adapters as adapters
from varsync import _nest as nest_lib
from varsync._errors import SignatureError, SignatureMismatchError
from varsync._signature_json import FORMAT as FORMAT
from varsync._signature_json import FORMAT_VERSION as FORMAT_VERSION
from varsync._signature_json import from_json, namedtuple_type, to_json
from varsync._spec import ML_DTYPE_NAMES, SUPPORTED_DTYPES, Spec, native_dtype
from varsync._spec import canonical_dtype as canonical_dtype

__all__ = [
    "Spec",
    "SUPPORTED_DTYPES",
    "signature_of",
    "flatten_values",
    "flatten_targets",
    "flatten_like",
    "assign",
    "assign_all",
    "flat_specs",
    "same_structure",
    "to_json",
    "from_json",
    "describe",
]


# ---------------------------------------------------------------------------------------
# Building a signature


def signature_of(example: Any) -> Any:
    """The signature (a nest of :class:`Spec`) of a nest of example values or specs.

    Leaves may be :class:`Spec`, numpy arrays and scalars, Python bool/int/float/complex
    (numpy's default dtypes: bool, int64, float64, complex128), and with TensorFlow
    installed ``tf.TensorSpec``, ``tf.Variable`` and tensors.
    """
    try:
        example = adapters.structure(example)
        with_paths = nest_lib.flatten_with_paths(example)
    except TypeError as exc:
        raise SignatureError(f"cannot build a signature: {exc}") from None
    specs = [_spec_of_leaf(path, leaf) for path, leaf in with_paths]
    return _plain_structure(example, specs)


def _spec_of_leaf(path: nest_lib.Path, leaf: Any) -> Spec:
    if isinstance(leaf, Spec):
        return leaf
    where = nest_lib.format_path(path)
    adapter = adapters.adapter_for(leaf)
    try:
        if adapter is not None:
            shape, dtype = adapter.shape_and_dtype(leaf)
            return Spec(shape, dtype)
        if leaf is None:
            raise SignatureError("None is not a value")
        if isinstance(leaf, (str, bytes)):
            raise SignatureError(f"{type(leaf).__name__} is not a numeric value")
        try:
            array = np.asarray(leaf)
        except Exception as exc:  # arbitrary objects may fail in arbitrary ways
            raise SignatureError(f"it is not an array ({type(exc).__name__}: {exc})") from None
        return Spec(array.shape, array.dtype)
    except SignatureError as exc:
        raise SignatureError(
            f"cannot build a signature: the leaf at {where} ({_describe_value(leaf)}): {exc}"
        ) from None


def _plain_structure(structure: Any, leaves: list[Any]) -> Any:
    """``structure`` rebuilt from ``leaves`` with mappings as plain, sorted dicts."""
    items = iter(leaves)

    def build(node: Any) -> Any:
        if not nest_lib.is_nested(node):
            return next(items)
        if node is nest_lib.EMPTY:
            return node
        if isinstance(node, collections.abc.Mapping):
            for key in node:
                if not isinstance(key, (str, int)) or isinstance(key, bool):
                    raise SignatureError(
                        f"dict key {key!r} ({type(key).__name__}) cannot be stored in a "
                        "signature; expected str or int keys"
                    )
            if isinstance(node, nest_lib.Ordered):
                return nest_lib.Ordered((k, build(v)) for k, v in node.items())
            return {k: build(node[k]) for k in nest_lib.sorted_keys(node)}
        kids = [build(child) for _, child in nest_lib.children(node)]
        if nest_lib.is_namedtuple(node) or nest_lib.is_attrs(node):
            fields = [name for (_, name), _ in nest_lib.children(node)]
            return namedtuple_type(type(node).__name__, fields, type(node).__module__)(*kids)
        return list(kids) if isinstance(node, list) else tuple(kids)

    return build(structure)


def flat_specs(signature: Any) -> list[Spec]:
    return nest_lib.flatten(signature)


# ---------------------------------------------------------------------------------------
# Checking values against a signature


def flatten_values(signature: Any, values: Any) -> list[np.ndarray]:
    """Check ``values`` against ``signature``; return its leaves as arrays, in flat order.

    Every array returned is C-contiguous, in native byte order and of exactly its spec's
    dtype and shape; arrays the caller passed that already qualify are returned as they
    are, not copied. Raises :class:`SignatureMismatchError` naming the path of the first
    difference, before anything else happens.
    """
    out: list[Any] = []
    # Values of adapters that read many at once (``to_numpy_all``: TensorFlow variables in
    # one graph call), by adapter: their place in ``out``, spec, value and path.
    batches: dict[int, tuple[Any, list[tuple[int, Spec, Any, nest_lib.Path]]]] = {}

    def leaf(spec: Spec, value: Any, path: nest_lib.Path) -> Any:
        if isinstance(value, np.ndarray):
            if (
                type(value) is np.ndarray
                and value.dtype == spec.dtype
                and value.shape == spec.shape
                and value.flags.c_contiguous
            ):
                return value  # already qualifies: what _leaf_array returns, without its checks
            return _leaf_array(spec, value, path)
        adapter = adapters.adapter_for(value)
        bulk = getattr(adapter, "to_numpy_all", None)
        if bulk is None or not _fits(adapter, spec, value):
            return _leaf_array(spec, value, path)  # converted, or the mismatch raised
        batches.setdefault(id(adapter), (adapter, []))[1].append((len(out), spec, value, path))
        return None  # filled in below, once the whole nest has been checked

    _check(signature, adapters.structure(values), (), out, leaf)
    for adapter, items in batches.values():
        try:
            arrays = adapter.to_numpy_all([value for _, _, value, _ in items])
        except Exception:  # one leaf at a time, for an error that names the leaf
            arrays = [value for _, _, value, _ in items]
        for (index, spec, _, path), array in zip(items, arrays):
            out[index] = _leaf_array(spec, array, path)
    return out


def _fits(adapter: Any, spec: Spec, value: Any) -> bool:
    """Whether ``value`` (the adapter's) has ``spec``'s shape and dtype."""
    try:
        shape, dtype = adapter.shape_and_dtype(value)
        return tuple(shape) == spec.shape and native_dtype(np.dtype(dtype)) == spec.dtype
    except Exception:  # _leaf_array says what is wrong
        return False


def flatten_targets(signature: Any, variables: Any) -> list[Any]:
    """Check that ``variables`` can receive a value of ``signature`` in place; return
    them in flat order. Each must be a writable numpy array (or a framework's variable:
    a ``tf.Variable``, a torch tensor, a ``torch.nn.Module``'s state) of its spec's dtype
    and shape; else :class:`SignatureMismatchError`."""
    out: list[Any] = []
    _check(signature, adapters.structure(variables, targets=True), (), out, _leaf_target)
    return out


def flatten_like(signature: Any, like: Any) -> Any:
    """Check that ``like`` has ``signature``'s structure (its leaves are not looked at:
    they say only what kind of value to return); return ``like`` made plain
    (:func:`varsync._adapters.structure`) and its leaves in flat order."""
    plain = adapters.structure(like)
    leaves: list[Any] = []
    _check(signature, plain, (), leaves, lambda spec, value, path: value)
    return plain, leaves


def assign(target: Any, array: np.ndarray) -> None:
    """Copy ``array`` into ``target``, one of :func:`flatten_targets`' results."""
    adapters.assign_all([target], [array])


def assign_all(targets: list[Any], arrays: list[np.ndarray]) -> None:
    """Copy each array into its target (:func:`flatten_targets`' results), framework
    variables in one batch per framework."""
    adapters.assign_all(targets, arrays)


LeafCheck = Callable[[Spec, Any, nest_lib.Path], Any]


def _check(expected: Any, got: Any, path: nest_lib.Path, out: list[Any], leaf: LeafCheck) -> None:
    """Walk ``got`` in ``expected``'s structure, appending ``leaf(spec, value, path)``."""
    if isinstance(expected, Spec):
        out.append(leaf(expected, got, path))
        return
    where = nest_lib.format_path(path)
    if isinstance(expected, collections.abc.Mapping):
        if not isinstance(got, collections.abc.Mapping):
            raise SignatureMismatchError(
                f"structure differs at {where}: expected a dict with keys "
                f"{sorted(expected)!r}, got {_describe_value(got)}"
            )
        missing = [k for k in expected if k not in got]
        extra = [k for k in got if k not in expected]
        if missing or extra:
            raise SignatureMismatchError(
                f"structure differs at {where}: expected keys {sorted(expected)!r}, got keys "
                f"{_safe_sorted(got)!r} (missing {missing!r}, unexpected {extra!r})"
            )
        for (_, key), child in nest_lib.children(expected):  # flat order, hand-made or not
            _check(child, got[key], path + (("key", key),), out, leaf)
        return
    if expected is nest_lib.EMPTY:
        if got is not None and got is not nest_lib.EMPTY:
            raise SignatureMismatchError(
                f"structure differs at {where}: expected None (a node without leaves), got "
                f"{_describe_value(got)}"
            )
        return
    if not _is_sequence(got) or len(nest_lib.children(got)) != len(expected):
        raise SignatureMismatchError(
            f"structure differs at {where}: expected a sequence of "
            f"{_count(len(expected), 'item')}, got {_describe_value(got)}"
        )
    got_children = nest_lib.children(got)
    for i, (child_spec, (entry, child)) in enumerate(zip(expected, got_children)):
        step = entry if entry[0] == "field" else ("index", i)
        _check(child_spec, child, path + (step,), out, leaf)


def _is_sequence(value: Any) -> bool:
    return nest_lib.is_nested(value) and not isinstance(value, collections.abc.Mapping)


def _safe_sorted(keys: Any) -> list[Any]:
    try:
        return sorted(keys)
    except TypeError:
        return list(keys)


def _mismatch(spec: Spec, path: nest_lib.Path, reason: str) -> SignatureMismatchError:
    return SignatureMismatchError(
        f"value at {nest_lib.format_path(path)} does not match the signature: expected "
        f"{spec.dtype.name} of shape {spec.shape}, got {reason}"
    )


def _not_a_nest(spec: Spec, value: Any, path: nest_lib.Path) -> None:
    if nest_lib.is_nested(value):
        raise _mismatch(
            spec,
            path,
            f"{_describe_value(value)} (a list, tuple or dict is a nest, not an array; "
            "pass np.asarray(...) for array data)",
        )


def _leaf_target(spec: Spec, target: Any, path: nest_lib.Path) -> Any:
    _not_a_nest(spec, target, path)
    adapter = adapters.adapter_for(target)
    if adapter is not None and adapter.is_assignable(target):
        shape, dtype = adapter.shape_and_dtype(target)
        if tuple(shape) != spec.shape or np.dtype(dtype) != spec.dtype:
            raise _mismatch(
                spec, path, f"a variable of dtype {np.dtype(dtype).name} and shape {tuple(shape)}"
            )
        return target
    if isinstance(target, np.ndarray):
        if not target.flags.writeable:
            raise _mismatch(spec, path, "a read-only array (update assigns in place)")
        if target.shape != spec.shape or native_dtype(target.dtype) != spec.dtype:
            raise _mismatch(spec, path, _describe_value(target))
        return target
    reason = getattr(adapter, "not_assignable", None) or (
        "expected a writable numpy array, a tf.Variable or a torch tensor"
    )
    raise _mismatch(
        spec, path, f"{_describe_value(target)}, which cannot be assigned in place ({reason})"
    )


def _leaf_array(spec: Spec, value: Any, path: nest_lib.Path) -> np.ndarray:
    def mismatch(reason: str) -> SignatureMismatchError:
        return _mismatch(spec, path, reason)

    _not_a_nest(spec, value, path)
    given = value  # describe a tensor as given (e.g. dtype=string), not its numpy copy
    adapter = adapters.adapter_for(value)
    if adapter is not None:
        try:
            value = adapter.to_numpy(value)
        except Exception as exc:
            raise mismatch(f"{_describe_value(value)}, which has no value ({exc})") from None
    elif isinstance(value, (bool, int, float, complex)) and not isinstance(value, np.generic):
        return _python_scalar(spec, value, mismatch)
    if value is None or isinstance(value, (str, bytes)):
        raise mismatch(_describe_value(value))
    try:
        array = np.asarray(value)
    except Exception as exc:  # arbitrary objects may fail in arbitrary ways
        raise mismatch(f"{_describe_value(value)}, which is not an array ({exc})") from None
    if array.dtype.kind in "OUSVMm" and array.dtype.name not in ML_DTYPE_NAMES:
        raise mismatch(
            f"{_describe_value(given)}, which cannot be an array of a fixed numeric dtype"
        )
    if native_dtype(array.dtype) != spec.dtype:
        raise mismatch(f"dtype {native_dtype(array.dtype).name} (shape {array.shape})")
    if array.shape != spec.shape:
        raise mismatch(f"shape {array.shape} ({array.dtype.name})")
    if array.dtype.byteorder not in ("=", "|"):
        array = array.astype(spec.dtype)
    return np.asarray(array, order="C")


def _python_scalar(spec: Spec, value: Any, mismatch: Any) -> np.ndarray:
    """Python scalars are weakly typed, as in TensorFlow: they take the spec's dtype when
    it holds them exactly (an int into any int, uint or float table; a float into a float
    table; ...)."""
    if spec.shape != ():
        raise mismatch(f"a Python {type(value).__name__} scalar")
    kind = "f" if spec.dtype.name in ML_DTYPE_NAMES else spec.dtype.kind  # bfloat16: "V"
    if kind not in _PYTHON_SCALAR_KINDS[_python_type(value)]:
        raise mismatch(f"Python {type(value).__name__} {value!r}")
    if kind in "iu" and isinstance(value, numbers.Integral):
        info = np.iinfo(spec.dtype)
        if not info.min <= int(value) <= info.max:
            raise mismatch(f"{value!r}, outside {spec.dtype.name}'s range [{info.min}, {info.max}]")
    try:
        with np.errstate(over="raise"):
            array = np.asarray(value, dtype=spec.dtype)
    except (OverflowError, FloatingPointError):  # e.g. 1e300 into float32, 10**400 into float64
        raise mismatch(f"{value!r}, too large for {spec.dtype.name}") from None
    if kind == "f" and not np.isfinite(array) and math.isfinite(value):  # ml_dtypes: no raise
        raise mismatch(f"{value!r}, too large for {spec.dtype.name}")
    if kind in "fc" and isinstance(value, numbers.Integral):
        held = array.real.item()
        if not math.isfinite(held) or int(held) != value:
            raise mismatch(
                f"Python int {value!r}, which {spec.dtype.name} cannot hold exactly "
                f"(it would become {held!r}); pass a float or an array of the table's dtype "
                "if rounding is intended"
            )
    return array


_PYTHON_SCALAR_KINDS = {bool: "b", int: "iufc", float: "fc", complex: "c"}


def _python_type(value: Any) -> type:
    for kind in (bool, int, float, complex):  # bool first: it is also an int
        if isinstance(value, kind):
            return kind
    raise TypeError(value)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _describe_value(value: Any) -> str:
    if isinstance(value, collections.abc.Mapping):
        return f"a {type(value).__name__} with keys {_safe_sorted(value)!r}"
    if nest_lib.is_namedtuple(value) or nest_lib.is_attrs(value):
        return f"a {type(value).__name__} of {_count(len(nest_lib.children(value)), 'field')}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {_count(len(value), 'item')}"
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def same_structure(a: Any, b: Any) -> bool:
    """Signature equality: same structure (list and tuple alike), same specs."""
    return bool(_structure_key(a) == _structure_key(b))


def _structure_key(node: Any) -> Any:
    if isinstance(node, Spec):
        # .str alone is "<V1" for every float8 type: the name tells them apart.
        return ("spec", node.shape, node.dtype.str, node.dtype.name)
    if node is nest_lib.EMPTY:
        return ("none",)
    if isinstance(node, nest_lib.Ordered):
        return ("odict", tuple((k, _structure_key(v)) for k, v in node.items()))
    if isinstance(node, collections.abc.Mapping):
        return ("dict", tuple((k, _structure_key(node[k])) for k in nest_lib.sorted_keys(node)))
    return ("seq", tuple(_structure_key(child) for _, child in nest_lib.children(node)))


def describe(signature: Any) -> str:
    """A signature as readable lines: ``['policy'][0]  float32  (64, 32)``."""
    rows = [
        f"{nest_lib.format_path(path)}  {spec.dtype.name}  {spec.shape}"
        for path, spec in nest_lib.flatten_with_paths(signature)
    ]
    return "\n".join(rows) if rows else "(no leaves)"
