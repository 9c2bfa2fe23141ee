"""A narrow Docker socket for workers: only the calls a worker makes, only on its own containers and
networks, and only container bodies that match the sandbox hardening."""
