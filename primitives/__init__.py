"""Building blocks with no knowledge of the gateway, which every layer may import.

This package owns small, general mechanisms that would otherwise be written by hand in
several places, one module each: for instance `bounded_cache.BoundedCache` (the in-process
caches, bounded by size and optionally by age) and `single_flight.SingleFlight` (one run per
key at a time, and one more when asked while it runs). It imports nothing from the project
(`errors`, `storage`, `sessions`, `channels`, `gateway`), only the standard library and
third-party packages.
"""
