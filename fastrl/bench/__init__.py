"""Measurement room: `fastrl bench` (stage-by-stage throughput against the machine bound) and
`fastrl tune` (search for the worker/env/thread counts that are fastest on this box)."""
