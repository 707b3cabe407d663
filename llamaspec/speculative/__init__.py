"""The speculative loop: engine, verification, adaptive draft length, metrics, drafters, pipeline, bench."""
