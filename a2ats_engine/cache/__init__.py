"""The A2ATS cache: config, RoPE, codebook, attention (pure functions), hooks, the cache, telemetry records, persistence."""
