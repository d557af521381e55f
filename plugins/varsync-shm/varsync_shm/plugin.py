"""The module the ``varsync`` entry point names: it registers ``shm://`` and nothing more.

It names the backend class as a ``"module:Class"`` string, so listing backends does not
import it.
"""

from varsync.backend import BackendRegistry, hookimpl


@hookimpl
def varsync_register_backends(registry: BackendRegistry) -> None:
    registry.add(
        "shm",
        "varsync_shm.backend:ShmBackend",
        install_hint="pip install varsync-shm",
        description="processes of one host, through shared memory in /dev/shm; no server",
    )
