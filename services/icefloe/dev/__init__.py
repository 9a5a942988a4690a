"""Development tools: local stack, demo, benchmarks. Not shipped in the wheel or the image."""
