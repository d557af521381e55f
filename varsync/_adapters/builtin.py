"""varsync's own framework adapters, registered through the same hook as a plugin's."""

from __future__ import annotations

from varsync._hookspecs import Registry, hookimpl


@hookimpl
def varsync_register_adapters(registry: Registry) -> None:
    registry.add(
        "tensorflow",
        "varsync._adapters.tensorflow:ADAPTER",
        modules=["tensorflow", "keras", "tf_keras"],
    )
    registry.add("torch", "varsync._adapters.torch:ADAPTER", modules=["torch"])
    registry.add("jax", "varsync._adapters.jax:ADAPTER", modules=["jax", "jaxlib", "flax", "optax"])
