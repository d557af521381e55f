"""varsync-shm: the ``shm://<store>`` backend for varsync.

Processes of one host share tables through files in ``/dev/shm`` (a RAM-backed tmpfs):
pushes and pulls run at close to memory-copy speed and there is no server to run::

    import varsync
    learner = varsync.connect("shm://training")     # in the learner process
    actor = varsync.connect("shm://training")       # in each actor process

Installing this package is all the configuration there is: its ``varsync`` entry point
registers the scheme. Importing it imports neither numpy nor the backend.
"""

from varsync_shm.layout import DEFAULT_ROOT, remove_store, store_path

__version__ = "0.1.0"

__all__ = ["DEFAULT_ROOT", "store_path", "remove_store", "__version__"]
