"""The worker: a real model behind the dynamic batcher, served over HTTP (`tidal worker`).

`batching` (the batching rule in an asyncio shell), `runner` (the model on threads),
`models` (demo and user models), `app` (HTTP API), `metrics`, `reporter` (its stats per
window), `link` (its membership of a pool on the bus), `cli`.
"""
