"""Test and benchmark helpers shared by tests/ and bench/ (never shipped): loopback S3 and HTTP servers
(:mod:`.servers`), local Ray clusters (:mod:`.ray_cluster`), a multi-process rank harness
(:mod:`.distributed`), and seeded real photographs made offline (:mod:`.photos`)."""
