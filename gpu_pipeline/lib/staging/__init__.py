"""The minute level: gpu_minutes, the minute runs summed from it, gpu_daily, and the chunked pass
that computes them a range of GPUs at a time."""
