"""Integrations of varsync with other libraries' extension points.

Each submodule imports its library, and is imported only by those who use it:
``import varsync`` imports none of them.

- :mod:`varsync.integrations.torchrl`: a TorchRL weight-sync scheme over a varsync URL.
- :mod:`varsync.integrations.vllm`: a vLLM weight-transfer engine over a varsync table,
  and the trainer side that pushes to it.
"""
