"""The two-rank fixture and helpers (tests/two_ranks.py)."""

from tests.two_ranks import free_port, local_hosts, local_launch, two_ranks

__all__ = ["free_port", "local_hosts", "local_launch", "two_ranks"]
