"""Soak: a writer and several readers per backend, for a bounded time, every pulled value
checked. Not part of ``make test``; ``make soak`` runs it (60 s per backend by default).

    scripts/loopback-only .venv/bin/python -m tools.soak --seconds 60
    .venv/bin/python -m tools.soak --seconds 10 --backends memory,redis,shm

Per backend (memory: threads of one process; reverb, redis, shm: one process each, the
servers started and stopped here, on 127.0.0.1 under ``scripts/loopback-only``):

- the writer pushes nests whose every element holds the push's number, as fast as it
  can, and checks that push n returns version n;
- the readers (one blocked in ``wait_for``, the others polling ``pull_if_newer``) check
  every value they get: every element of every leaf the same number (no torn value),
  that number equal to the version it came with and above the one held before (no
  older value taken for newer, no value under another version's number), versions
  strictly increasing;
- memory: resident set size (VmRSS) of the writer, of each reader and of the server
  (redis-server's process, Reverb's server process; for shm, the store's bytes in
  /dev/shm), after a warm-up and at the end.

Then, by default, the same with faults (faulty.py: interrupts and lost replies, and a
count of what they left behind; fault_figures.py: its columns and notes). Prints one
table; exits 1 if any value was inconsistent, any call failed or anything leaked.

The modules: clean.py (the clean loops and their summary), servers.py (what each backend
runs on), faulty.py, fault_figures.py, __main__.py (the command and its table).
"""
