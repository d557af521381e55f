"""PyTorch values: tensors, ``nn.Parameter``s, ``nn.Module``s and ``state_dict``s.

Imported by :mod:`varsync._adapters` only when such a value is seen, so PyTorch is already
loaded by then.

- A module stands for its ``state_dict()`` (parameters and buffers), and a ``state_dict``
  (any ``OrderedDict``) keeps its own key order: the flat order of the table is
  ``state_dict`` order, and a pull rebuilds an ``OrderedDict`` with the same dotted keys
  in the same order. Plain dicts in a nest of tensors sort their keys, as everywhere.
- A CPU tensor is read through ``Tensor.numpy()`` on its detached view: no copy.
  ``bfloat16`` and the float8 types are viewed as ``ml_dtypes``' types of the same width,
  also without copying. A tensor on another device (CUDA) is copied to the host once;
  :func:`_to_host` is the only place that happens.
- ``update`` copies into the existing tensors' memory in place (``np.copyto``, then the
  version counter bumped as ``copy_`` would), so parameters stay ``Parameter``s with
  their ``requires_grad``, and optimisers holding them keep working. A CUDA target
  receives the host array with one ``copy_`` to its device under ``torch.no_grad()``.
- ``pull(..., like=...)`` returns tensors on ``like``'s devices: over a backend whose
  pulled arrays are writable (Redis) they share the pulled memory; over one whose arrays
  are read-only views of the store (memory://, shm://) they are copies, because a tensor
  over read-only memory could be written through and corrupt what other readers see.
"""

from __future__ import annotations

import collections
import collections.abc
import concurrent.futures
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from varsync import _nest as nest_lib
from varsync._errors import SignatureError

__all__ = ["ADAPTER", "TorchAdapter"]

# torch dtypes numpy has no name for, stored as ml_dtypes' types through a same-width view.
_VIEWED: dict[Any, tuple[Any, str]] = {
    torch.bfloat16: (torch.int16, "bfloat16"),
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _VIEWED[getattr(torch, _name)] = (torch.uint8, _name)


_NUMPY_DTYPES: dict[Any, np.dtype] = {}


def _numpy_dtype(dtype: Any) -> np.dtype:
    found = _NUMPY_DTYPES.get(dtype)
    if found is not None:
        return found
    viewed = _VIEWED.get(dtype)
    if viewed is not None:
        import ml_dtypes

        found = np.dtype(getattr(ml_dtypes, viewed[1]))
    else:
        try:
            found = np.dtype(torch.empty((), dtype=dtype).numpy().dtype)
        except TypeError as exc:
            raise SignatureError(f"torch dtype {dtype} has no numpy equivalent ({exc})") from None
    _NUMPY_DTYPES[dtype] = found
    return found


_TORCH_DTYPES: dict[str, Any] = {}


def _torch_dtype(dtype: np.dtype) -> Any:
    """The torch dtype of a numpy (or ml_dtypes) dtype."""
    found = _TORCH_DTYPES.get(dtype.str + dtype.name)
    if found is None:
        for viewed, (_, name) in _VIEWED.items():
            if dtype.name == name:
                found = viewed
                break
        else:
            found = torch.from_numpy(np.zeros(1, dtype)).dtype
        _TORCH_DTYPES[dtype.str + dtype.name] = found
    return found


def _to_host(tensor: Any) -> Any:
    """The tensor on the CPU: itself if it is there, else one copy (the CUDA path)."""
    return tensor if tensor.device.type == "cpu" else tensor.to("cpu")


def _tensor_of(array: np.ndarray) -> Any:
    """A CPU tensor over ``array``'s memory (ml_dtypes types through a same-width view).
    ``array`` must be writable: torch has no read-only tensors."""
    dtype = _torch_dtype(array.dtype)
    viewed = _VIEWED.get(dtype)
    if viewed is None:
        return torch.from_numpy(array)
    width = np.dtype(np.int16 if viewed[0] is torch.int16 else np.uint8)
    return torch.from_numpy(array.view(width)).view(dtype)


def _writable_view(tensor: Any) -> np.ndarray:
    """A CPU tensor's own memory as a writable numpy array (ml_dtypes types through a
    same-width view)."""
    tensor = tensor.detach()
    viewed = _VIEWED.get(tensor.dtype)
    if viewed is None:
        return tensor.numpy()
    return tensor.view(viewed[0]).numpy().view(_numpy_dtype(tensor.dtype))


_bump_version = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)

# Large updates copy on as many threads as torch itself would (np.copyto releases the GIL):
# one thread reached 1.6x load_state_dict's two-thread copy_ at 100 MB, two match it.
_PARALLEL_FROM_BYTES = 4 << 20
_MAX_COPY_THREADS = 4
_POOL: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
_POOL_LOCK = threading.Lock()


def _copy_pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """The copy threads of this process (made again after a fork: a child has none)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[0] != os.getpid():
            pool = concurrent.futures.ThreadPoolExecutor(
                _MAX_COPY_THREADS, thread_name_prefix="varsync-torch-copy"
            )
            _POOL = (os.getpid(), pool)
        return _POOL[1]


def _copy_in_parallel(pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """``np.copyto(destination, source)`` for each pair, split over up to
    ``torch.get_num_threads()`` threads (at most 4) when the total is large."""
    total = sum(source.nbytes for _, source in pairs)
    workers = min(torch.get_num_threads(), _MAX_COPY_THREADS, len(pairs))
    if total < _PARALLEL_FROM_BYTES or workers < 2:
        for destination, source in pairs:
            np.copyto(destination, source)
        return
    shares: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for pair in sorted(pairs, key=lambda p: -p[1].nbytes):  # the largest to the least loaded
        least = loads.index(min(loads))
        shares[least].append(pair)
        loads[least] += pair[1].nbytes

    def copy(share: list[tuple[np.ndarray, np.ndarray]]) -> None:
        for destination, source in share:
            np.copyto(destination, source)

    for done in [_copy_pool(workers).submit(copy, share) for share in shares]:
        done.result()


class TorchAdapter:
    def handles(self, value: Any) -> bool:
        return isinstance(value, (torch.Tensor, torch.nn.Module))

    def shape_and_dtype(self, value: Any) -> tuple[tuple[int, ...], Any]:
        if isinstance(value, torch.nn.Module):
            raise SignatureError("a torch.nn.Module is a nest (its state_dict), not one value")
        return tuple(int(d) for d in value.shape), _numpy_dtype(value.dtype)

    def to_numpy(self, value: Any) -> Any:
        if isinstance(value, torch.nn.Module):
            raise TypeError("a torch.nn.Module is a nest (its state_dict), not one value")
        if value.device.type == "meta":
            raise TypeError(f"a tensor on the meta device is a spec, not a value: {value!r}")
        tensor = _to_host(value.detach()).resolve_conj().resolve_neg()
        viewed = _VIEWED.get(tensor.dtype)
        if viewed is None:
            return tensor.numpy()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        return tensor.view(viewed[0]).numpy().view(_numpy_dtype(tensor.dtype))

    def is_assignable(self, target: Any) -> bool:
        return isinstance(target, torch.Tensor) and target.device.type != "meta"

    def assign(self, target: Any, array: Any) -> None:
        self.assign_all([target], [array])

    def assign_all(self, targets: Sequence[Any], arrays: Sequence[np.ndarray]) -> None:
        """Copy each array into its tensor, in place. CPU tensors: ``np.copyto`` into the
        tensor's memory, straight from the pulled array (read-only or not: no copy of
        it), on as many threads as torch uses when the update is large, then the
        tensor's version counter is bumped as ``copy_`` would, so autograd still sees the
        change. Other devices: ``copy_`` under ``no_grad``, one host-to-device copy each."""
        here: list[tuple[Any, np.ndarray]] = []
        elsewhere: list[tuple[Any, np.ndarray]] = []
        for target, array in zip(targets, arrays):
            (here if target.device.type == "cpu" else elsewhere).append((target, array))
        _copy_in_parallel([(_writable_view(t), a) for t, a in here])
        if _bump_version is not None:
            for target, _ in here:
                _bump_version(target)
        if elsewhere:
            with torch.no_grad():
                for target, array in elsewhere:
                    source = array if array.flags.writeable else array.copy()
                    target.copy_(_tensor_of(np.asarray(source, order="C")))

    def patch_view(self, target: Any) -> np.ndarray | None:
        """A contiguous CPU tensor's own memory, for element patches applied in place
        (then :meth:`patched`); ``None`` on other devices, where the patch is applied to
        a host copy that is assigned (one copy each way)."""
        if not isinstance(target, torch.Tensor) or target.device.type != "cpu":
            return None
        return _writable_view(target) if target.is_contiguous() else None

    def assign_elements(self, target: Any, positions: np.ndarray, value: np.ndarray) -> None:
        """Write the elements of ``value`` at the flat ``positions`` into ``target`` on its
        device (one host-to-device copy of those elements, not of the tensor)."""
        if not target.is_contiguous():  # no flat view of its memory: the whole value
            self.assign_all([target], [value])
            return
        flat = target.detach().view(-1)
        index = torch.from_numpy(positions.astype(np.int64)).to(flat.device)
        picked = np.ascontiguousarray(value.reshape(-1)[positions])
        with torch.no_grad():
            flat[index] = _tensor_of(picked).to(flat.device)
        self.patched(target)

    def patched(self, target: Any) -> None:
        if _bump_version is not None:
            _bump_version(target)

    def from_numpy(self, array: np.ndarray, like: Any) -> Any:
        if not array.flags.writeable:
            array = array.copy()  # a read-only view of the store (see the module doc)
        tensor = _tensor_of(np.asarray(array, order="C"))
        device = getattr(like, "device", None)
        if device is not None and device.type not in ("cpu", "meta"):
            tensor = tensor.to(device)
        if isinstance(like, torch.nn.Parameter):
            tensor = torch.nn.Parameter(tensor, requires_grad=like.requires_grad)
        return tensor

    def structure(self, nest: Any, targets: bool = False) -> Any:
        """Modules become their ``state_dict``, ``OrderedDict``s keep their order; the rest
        of the nest is as :mod:`varsync._nest` walks it."""
        if isinstance(nest, torch.nn.Module):
            return nest_lib.Ordered(nest.state_dict())
        if isinstance(nest, collections.OrderedDict):
            return nest_lib.Ordered((k, self.structure(v, targets)) for k, v in nest.items())
        if isinstance(nest, collections.abc.Mapping):
            return {k: self.structure(v, targets) for k, v in nest.items()}
        if nest_lib.is_namedtuple(nest):
            return type(nest)(*(self.structure(v, targets) for v in nest))
        if isinstance(nest, (list, tuple)):
            return type(nest)(self.structure(v, targets) for v in nest)
        return nest

    def rebuild(self, like: Any, leaves: list[Any]) -> Any:
        return nest_lib.unflatten(self.structure(like), leaves)


ADAPTER = TorchAdapter()
