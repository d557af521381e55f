"""The portable form of a signature: JSON text (format ``varsync.signature``), versioned
and never pickled (:func:`to_json` / :func:`from_json`).

Version 1 has the node kinds ``spec``, ``dict`` (sorted keys), ``list``, ``tuple`` and
``namedtuple``. Version 2 adds ``odict`` (a mapping in its own key order: a PyTorch
``state_dict``) and ``none`` (a node without leaves: JAX's ``None``). A signature that
needs neither is still written as version 1, so older varsync readers keep reading
every table they could read before; one that needs them is version 2, which those
readers refuse with a message saying to upgrade, rather than misread.

Stored text is untrusted: anything that is not such a document is ``CorruptDataError``,
and a stored namedtuple becomes a class only of names already imported, never an import.
"""

from __future__ import annotations

import collections
import collections.abc
import json
import sys
from collections.abc import Sequence
from typing import Any

from varsync import _nest as nest_lib
from varsync._errors import CorruptDataError, SignatureError
from varsync._spec import Spec

__all__ = ["to_json", "from_json", "namedtuple_type", "FORMAT", "FORMAT_VERSION"]

FORMAT = "varsync.signature"
FORMAT_VERSION = 2  # the newest version this module reads and writes
_READS = (1, 2)
_VERSION_2_KINDS = ("odict", "none")


def to_json(signature: Any) -> str:
    """The signature as portable JSON text (format ``varsync.signature``; version 1 unless
    it holds an ordered mapping or an empty node)."""
    structure = _encode(signature)
    text = json.dumps(structure, separators=(",", ":"), sort_keys=True)
    version = 2 if any(f'{{"{kind}":' in text for kind in _VERSION_2_KINDS) else 1
    document = {"format": FORMAT, "version": version, "structure": structure}
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


def _encode(node: Any) -> Any:
    if isinstance(node, Spec):
        return {"spec": {"shape": list(node.shape), "dtype": node.dtype.name}}
    if node is nest_lib.EMPTY:
        return {"none": None}
    if isinstance(node, nest_lib.Ordered):
        return {"odict": [[k, _encode(v)] for k, v in node.items()]}
    if isinstance(node, collections.abc.Mapping):
        return {"dict": [[k, _encode(node[k])] for k in nest_lib.sorted_keys(node)]}
    if nest_lib.is_namedtuple(node):
        return {
            "namedtuple": {
                "name": type(node).__name__,
                "module": type(node).__module__,
                "fields": list(type(node)._fields),
                "values": [_encode(v) for v in node],
            }
        }
    kind = "list" if isinstance(node, list) else "tuple"
    return {kind: [_encode(v) for v in node]}


def from_json(text: str) -> Any:
    """The signature stored as :func:`to_json` text; ``CorruptDataError`` if it is not one."""
    try:
        document = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise CorruptDataError(
            f"stored signature is not JSON ({exc}): {str(text)[:80]!r}"
        ) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CorruptDataError(f"stored signature is not a {FORMAT} document: {str(text)[:80]!r}")
    version = document.get("version")
    if isinstance(version, bool) or version not in _READS:
        raise CorruptDataError(
            f"stored signature has format version {document.get('version')!r}; this varsync "
            f"reads versions {', '.join(map(str, _READS))} (upgrade varsync to read newer "
            "tables)"
        )
    try:
        return _decode(document["structure"])
    except CorruptDataError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError, SignatureError) as exc:
        raise CorruptDataError(f"stored signature is malformed: {exc}") from None


def _decode(node: Any) -> Any:
    if not isinstance(node, dict) or len(node) != 1:
        raise CorruptDataError(f"stored signature node is malformed: {str(node)[:80]!r}")
    ((kind, body),) = node.items()
    if kind == "spec":
        return Spec(body["shape"], body["dtype"])
    if kind in ("dict", "odict"):
        decoded = {}
        for key, child in body:
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise CorruptDataError(f"stored dict key {key!r} is not a str or int")
            if key in decoded:
                raise CorruptDataError(f"stored dict key {key!r} appears twice")
            decoded[key] = _decode(child)
        if kind == "odict":
            return nest_lib.Ordered(decoded)
        return {k: decoded[k] for k in nest_lib.sorted_keys(decoded)}
    if kind == "none":
        if body is not None:
            raise CorruptDataError(f"stored empty node carries {str(body)[:40]!r}")
        return nest_lib.EMPTY
    if kind == "namedtuple":
        made = namedtuple_type(body["name"], body["fields"], body.get("module", "__varsync__"))
        values = [_decode(v) for v in body["values"]]
        if len(values) != len(made._fields):
            raise CorruptDataError(f"stored namedtuple {body['name']} has the wrong field count")
        return made(*values)
    if kind == "list":
        return [_decode(v) for v in body]
    if kind == "tuple":
        return tuple(_decode(v) for v in body)
    raise CorruptDataError(f"stored signature has an unknown node kind {kind!r}")


_NAMEDTUPLES: dict[tuple[str, tuple[str, ...], str], type] = {}


def namedtuple_type(name: str, fields: Sequence[str], module: str) -> type[Any]:
    """A namedtuple class for a stored structure (also the one a signature built from a
    namedtuple or attrs class holds, so that it reads back the same).

    A namedtuple of that name and fields in an *already imported* module is reused (so a
    pull returns the user's own class); otherwise one is made, once per name and fields.
    Nothing is ever imported.
    """
    fields = tuple(fields)
    found = getattr(sys.modules.get(module), name, None)
    if (
        isinstance(found, type)
        and issubclass(found, tuple)
        and getattr(found, "_fields", None) == fields
    ):
        return found
    key = (name, fields, module)
    if key not in _NAMEDTUPLES:
        try:
            made = collections.namedtuple(name, fields)  # type: ignore[misc]
        except ValueError as exc:
            raise CorruptDataError(
                f"stored namedtuple {name}{fields} is not valid: {exc}"
            ) from None
        made.__module__ = module
        _NAMEDTUPLES[key] = made
    return _NAMEDTUPLES[key]
