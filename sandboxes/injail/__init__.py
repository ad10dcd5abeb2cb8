"""The code that runs inside the jail, and nothing else: the trust boundary, as a directory.

Every module here but this one is copied into each jail (`/opt/sandboxes/`, read-only; the Docker image holds the
same files) and runs there as the worker `zygote.py` with its siblings, on the system Python with `-I -S`. So they
are stdlib-only and import each other by plain module name (`import frames`), never through this package
(`tests/sandboxes/test_injail.py` checks both). The host imports the three leaf modules it shares with the jail
through this package: `frames` (the wire format), `bpf_filter` and `landlock` (what `probe` reports).
"""
